"""Trial ids kept apart between the studies of one shared plan.

Each study draws its trial ids on its own driver (a random prefix and a
counter, or whatever a searcher or a restored study brings). On a plan
service they meet in one search plan, where a trial id names one trial:
two studies proposing the same id would have their trials merged (the
plan refuses the second, or its results go to the first study). A study's
trial source is therefore wrapped: an id already taken in the shared plan is
renamed for the study's trial, and the searcher still hears of it under
the id it proposed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

logger = logging.getLogger(__name__)


class UniqueTrialIds:
    """A `planning.lifecycle.TrialSource` whose ids are unique in a shared plan.

    Parameters
    ----------
    trial_source:
        The study's own trial source (`searchers.sources`).
    taken:
        Whether an id is in use in the shared plan (any study's trial).
    suffix:
        Appended to a colliding id (the study's id in the service: unique there).
    """

    def __init__(self, trial_source: Any, taken: Callable[[str], bool], suffix: str) -> None:
        self.trial_source = trial_source
        self.taken = taken
        self.suffix = suffix
        self.proposed: dict[str, str] = {}  # renamed id -> the id its source proposed

    def next_trial(self) -> tuple[str, dict[str, Any]] | str | None:
        proposal = self.trial_source.next_trial()
        if not isinstance(proposal, tuple) or not self.taken(proposal[0]):
            return proposal
        trial_id, config = proposal
        renamed = f"{trial_id}-{self.suffix}"
        self.proposed[renamed] = trial_id
        logger.warning(
            "trial id %s is another study's on this plan service; this study's trial is %s", trial_id, renamed
        )
        return renamed, config

    def on_result(self, trial_id: str, result: dict[str, Any]) -> None:
        self.trial_source.on_result(self.proposed.get(trial_id, trial_id), result)

    def on_complete(self, trial_id: str, result: dict[str, Any] | None, error: bool = False) -> None:
        self.trial_source.on_complete(self.proposed.get(trial_id, trial_id), result, error=error)

    def __getattr__(self, name: str) -> Any:
        # The rest (remaining, peek, searcher) is the trial source's.
        return getattr(self.trial_source, name)
