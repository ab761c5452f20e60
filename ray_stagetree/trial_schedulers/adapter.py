"""The interface every scheduler family's adapter offers `SchedulerHost`.

An adapter turns one family of Ray Tune trial schedulers (FIFO and custom
schedulers, median stopping, ASHA, synchronous HyperBand, PBT) into the
decisions of `ray_stagetree.planning.decisions` and the decision
points requests are sized to. `ray_stagetree.trial_schedulers.registry`
picks the adapter by the scheduler's type. Whatever an adapter reads of
Ray's private state it reads through
`ray_stagetree.trial_schedulers.ray_fields.ray_field`, in one place.
"""

from __future__ import annotations

import abc
from collections.abc import Callable
from typing import Any

from ray_stagetree.planning.decisions import Decision, Exploit
from ray_stagetree.trial_schedulers.ray_fields import TESTED_WITH, ray_field


class SchedulerAdapter(abc.ABC):
    """One scheduler family hosted on the plan.

    Parameters
    ----------
    scheduler:
        The user's ``ray.tune`` ``TrialScheduler``, its metric and mode set.
    horizon:
        The most iterations a trial runs (``math.inf`` when open-ended).
    exact:
        True when ``scheduler`` is the family's own Ray class, False for a
        user's subclass (whose overrides may decide where the family's
        rule would not).
    """

    #: Whether the family cannot decide without a metric and a mode.
    needs_metric = False
    #: Whether the adapter hosts subclasses of the family's class: it does
    #: where it feeds the user's object (their overrides run), not where it
    #: re-implements the family's rule on the plan.
    hosts_subclasses = True
    #: Whether the scheduler may give trials other resources than the study's (`trial_resources`).
    changes_resources = False
    #: The Ray versions the adapter's private fields were tested against.
    tested_with = TESTED_WITH

    def __init__(self, scheduler: Any, horizon: float, exact: bool) -> None:
        self.scheduler = scheduler
        self.horizon = horizon
        self.exact = exact

    @classmethod
    def check(cls, scheduler: Any, metric: str | None, mode: str | None, exact: bool) -> None:
        """Raise a clear error for a scheduler that would fail at its first
        trial for want of a metric and mode."""
        if not (cls.needs_metric and exact):
            return
        name = type(scheduler).__name__
        if (scheduler.metric or metric) is None:
            raise ValueError(f"{name} needs a metric: pass metric= and mode= to TuneConfig or to the scheduler")
        if (cls._ray_field(scheduler, "_mode") or mode) is None:
            raise ValueError(f"{name} needs a mode ('min' or 'max'): pass mode= to TuneConfig or to the scheduler")

    @classmethod
    def wrapped(cls, scheduler: Any) -> Any:
        """The scheduler ``scheduler`` wraps and feeds (``ResourceChangingScheduler``'s
        base scheduler), checked as a study's own; None for most."""
        return None

    @classmethod
    def max_t(cls, scheduler: Any) -> float | None:
        """The most a trial runs under the scheduler (its ``max_t``), or None
        where the family has no such limit."""
        return None

    @classmethod
    def _ray_field(cls, scheduler: Any, name: str, owner: Any = None) -> Any:
        """A private field of Ray's, read on behalf of ``scheduler``: its own,
        or ``owner``'s (one of its brackets)."""
        return ray_field(scheduler if owner is None else owner, name, scheduler, cls.tested_with)

    @property
    def decides_at_milestones(self) -> bool:
        """Whether the scheduler decides only at points known in advance
        (rungs, milestones, perturbations); otherwise it may stop a trial
        at any result."""
        return False

    @property
    def order_sensitive(self) -> bool:
        """Whether the scheduler's decisions depend on the order in which
        trials run and report (it compares trials: ASHA's rungs, HyperBand,
        median stopping, PBT); only Ray's own FIFO never does."""
        return True

    def attach(self, on_stop: Callable[[str], None], searcher: Any = None) -> None:
        """Report the scheduler's stops of trials other than the one whose
        result it is processing (paused ones) to ``on_stop``, a callable
        taking the trial id; a family that never makes them ignores it.
        ``searcher`` is the study's Tune searcher, for schedulers that talk
        to it (HyperBandForBOHB tells it of pauses); None if there is none."""

    def trial_resources(self, trial_id: str) -> Any:
        """The resources the scheduler gave the trial in place of the study's
        (a ``PlacementGroupFactory``: ``ResourceChangingScheduler``); None if it kept them."""
        return None

    @abc.abstractmethod
    def on_add(self, trial_id: str, config: dict[str, Any]) -> None:
        """A new trial, with its config (which the family may complete)."""

    @abc.abstractmethod
    def on_result(self, trial_id: str, row: dict[str, Any], values: dict[str, Any] | None) -> Decision:
        """The decision on the trial's result ``row``; ``values`` are its
        hyper-parameters at this iteration (flattened), for families that read them."""

    @abc.abstractmethod
    def on_complete(self, trial_id: str, row: dict[str, Any] | None) -> None:
        """The trial ended (finished, or stopped)."""

    @abc.abstractmethod
    def on_error(self, trial_id: str) -> None:
        """The trial failed."""

    @abc.abstractmethod
    def resumable(self) -> list[tuple[str, Exploit | None]]:
        """Paused trials to run again, each with the `Exploit` it resumes with or None."""

    @abc.abstractmethod
    def next_decision(self, trial_id: str, iteration: int) -> float:
        """The next iteration after ``iteration`` at which the scheduler decides about
        the trial, else the horizon."""
