"""Where a study's trials come from: grid / random variants (drawn as the
study admits them), or a Ray Tune ``Searcher`` hosted on sequences.

A Tune searcher never sees a sequence: the search space it gets is the
param_space with every sequence flattened into its declarative spec (nested
dicts whose leaves are Tune domains, which every Tune searcher understands),
and each suggestion is merged back into that spec and rebuilt into
sequences. Values a searcher cannot take (``tune.sample_from`` functions,
objects) reach it as Tune's placeholders, resolved in each suggestion, as
Tune does. Results and completions are forwarded as Tune forwards them.
"""

from __future__ import annotations

import collections
import copy
import logging
import math
import types
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from ray_stagetree.planning.config import TrialConfig
from ray_stagetree.planning.lifecycle import WAIT
from ray_stagetree.searchers.variants import (
    VariantStream,
    _resolve_nested,
    from_tune_config,
    to_tune_space,
)

logger = logging.getLogger(__name__)

#: Tune's searchers name a parameter by its path of dict keys (Optuna joins
#: them with "/"), so a domain inside a list, such as a `MultiStep`'s
#: milestones, has no name they accept. Such lists reach them as dicts keyed
#: by position, marked so that suggestions turn them back into lists.
_LIST_MARK = "__stagetree_list__"


def searchable_space(space: Any) -> Any:
    """``space`` (sequences already flattened into specs) with every list that
    holds a Tune domain turned into a marked dict keyed ``"0"``, ``"1"``, ..."""
    if isinstance(space, Mapping):
        return {key: searchable_space(value) for key, value in space.items()}
    if isinstance(space, list):
        items = [searchable_space(value) for value in space]
        if any(_holds_domain(item) for item in items):
            return {_LIST_MARK: True, **{str(index): item for index, item in enumerate(items)}}
        return items
    return space


def from_searchable(config: Any) -> Any:
    """Inverse of `searchable_space` on a suggested config."""
    if isinstance(config, Mapping):
        if config.get(_LIST_MARK) is True:
            return [from_searchable(config[str(index)]) for index in range(len(config) - 1)]
        return {key: from_searchable(value) for key, value in config.items()}
    if isinstance(config, list):
        return [from_searchable(value) for value in config]
    return config


def _holds_domain(value: Any) -> bool:
    from ray.tune.search.sample import Domain

    if isinstance(value, Domain):
        return True
    if isinstance(value, Mapping):
        return any(_holds_domain(item) for item in value.values())
    return isinstance(value, list) and any(_holds_domain(item) for item in value)


class VariantSource:
    """Trials of a grid or random search: a list, or a `VariantStream` that
    draws them as the study admits them.

    ``skip_repeats``: an open-ended stream (``num_samples=-1``) skips a
    config drawn before (one whose values all equal an earlier one's, so
    that under stage sharing it trains nothing new: without this, a space of
    few configs would give trials without end, each answered at once) and
    ends once `EXHAUSTED_AFTER` draws in a row repeat earlier configs (the
    space is searched through).
    """

    #: Draws in a row that repeat earlier configs before an open-ended stream ends.
    EXHAUSTED_AFTER = 1000

    def __init__(
        self, configs: Iterable[dict[str, Any]], trial_ids: list[str] | None = None, skip_repeats: bool = False
    ) -> None:
        self._configs = configs if isinstance(configs, VariantStream) else VariantStream(configs)
        self._trial_ids = None if trial_ids is None else collections.deque(trial_ids)
        self._prefix = uuid.uuid4().hex[:5]
        self._taken = 0
        self._seen: set[tuple] | None = set() if skip_repeats and self.open_ended else None
        self._exhausted = False

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Snapshots of studies saved before variants could be drawn without end hold neither.
        state.setdefault("_seen", None)
        state.setdefault("_exhausted", False)
        self.__dict__.update(state)

    @property
    def open_ended(self) -> bool:
        """Drawn without end (``num_samples=-1``)."""
        return math.isinf(self._configs.remaining)

    def next_trial(self) -> tuple[str, dict[str, Any]] | str | None:
        config = self._next_config()
        if config is None:
            return None
        trial_id = self._trial_ids.popleft() if self._trial_ids is not None else f"{self._prefix}_{self._taken:05d}"
        self._taken += 1
        return trial_id, config

    def _next_config(self) -> dict[str, Any] | None:
        if self._seen is None:
            return next(self._configs, None)
        for _ in range(self.EXHAUSTED_AFTER):
            config = next(self._configs)
            try:
                identity = TrialConfig.from_config(config).identity
            except (TypeError, ValueError):
                return config  # the study refuses it by name when it plans it
            if identity not in self._seen:
                self._seen.add(identity)
                return config
        self._exhausted = True
        return None

    @property
    def remaining(self) -> float:
        return 0 if self._exhausted else self._configs.remaining

    def drawn(self) -> list[dict[str, Any]]:
        """The configs drawn and not yet taken, next first: the points to
        evaluate and a repeat of the grid, before the study starts."""
        return self._configs.drawn()

    def peek(self) -> dict[str, Any] | None:
        """The next trial's config, if one is drawn."""
        drawn = self._configs.drawn()
        return drawn[0] if drawn else None

    def pending_limit(self, setting: int | None, max_concurrent_trials: int | None) -> int | None:
        """How many of its trials may wait for a worker at once: ``setting``
        (``TUNE_MAX_PENDING_TRIALS_PG``) if given, as Tune bounds its
        variants. Else, for a stream drawn without end, ``max_concurrent_trials``
        or 1, as for a searcher (the study then holds what its workers run, not
        trials that would never start); else no limit: variants learn nothing
        from results, and the plan shares more the more of them it holds (Tune's
        automatic bound of 200 paces placement groups)."""
        if setting is not None:
            return setting
        if self.open_ended and not self._exhausted:
            return max_concurrent_trials or 1
        return None

    def on_result(self, trial_id: str, result: dict[str, Any]) -> None:
        pass

    def on_complete(self, trial_id: str, result: dict[str, Any] | None, error: bool = False) -> None:
        pass


def _set_search_properties(
    searcher: Any, metric: str | None, mode: str | None, space: dict[str, Any], spec: Mapping[str, Any]
) -> bool:
    """``searcher.set_search_properties`` as Tune calls it: with the
    experiment's spec, or, for a custom searcher written without ``**spec``,
    with the space alone (and Tune's warning)."""
    try:
        return searcher.set_search_properties(metric, mode, space, **spec)
    except TypeError as error:
        if "set_search_properties() got an unexpected keyword argument" not in str(error):
            raise
        logger.warning(
            "Please update custom Searcher to take in function signature as "
            "``def set_search_properties(metric, mode, config, **spec) -> bool``."
        )
        return searcher.set_search_properties(metric, mode, space)


class SearcherSource:
    """A Tune ``Searcher`` proposing up to ``num_samples`` trials.

    Parameters
    ----------
    searcher:
        Any ``ray.tune.search.Searcher`` (OptunaSearch, HyperOptSearch,
        ConcurrencyLimiter, Repeater, ...).
    param_space:
        The Tuner's param_space, sequences included.
    metric, mode:
        From ``TuneConfig``; given to the searcher unless it has its own.
    num_samples:
        Total trials to run (Tune's meaning when a searcher is used; -1 runs
        until the searcher returns ``Searcher.FINISHED`` or the time budget ends).
    spec:
        What Tune passes to ``set_search_properties`` besides the space
        (``stop``, ``num_samples``, ``time_budget_s``), and ``max_t``: the
        most iterations the study's scheduler lets a trial run, None if it
        sets no limit, for searchers that model whole trials (`StructuredBO`);
        Tune's searchers take ``**spec`` and ignore what they do not read.
    """

    #: Path -> Tune's resolvers of the placeholders in the space. A source
    #: saved with a study before placeholders existed has none (read-only).
    _placeholders: Mapping[tuple, list] = types.MappingProxyType({})

    def __init__(
        self,
        searcher: Any,
        param_space: dict[str, Any],
        metric: str | None,
        mode: str | None,
        num_samples: int,
        spec: Mapping[str, Any] | None = None,
    ):
        from ray.tune.impl.placeholder import create_resolvers_map, inject_placeholders

        self.searcher = searcher
        placeholders = create_resolvers_map()
        self._space = inject_placeholders(searchable_space(to_tune_space(copy.deepcopy(param_space))), placeholders)
        self._placeholders = placeholders
        self._num_samples = math.inf if num_samples < 0 else num_samples
        self._suggested = 0
        self._finished = False
        self._prefix = uuid.uuid4().hex[:5]
        self._completed: set[str] = set()
        if not _set_search_properties(searcher, metric, mode, self._space, spec or {}):
            if searcher.metric is None and metric is None:
                raise ValueError(
                    f"{type(searcher).__name__} needs a metric: pass TuneConfig(metric=..., mode=...) "
                    "or give it to the searcher"
                )

    @property
    def remaining(self) -> float:
        """Trials still to propose: 0 once the searcher said FINISHED, infinite
        for ``num_samples=-1`` (Tune's "until the searcher or the time budget ends")."""
        return 0 if self._finished else self._num_samples - self._suggested

    def pending_limit(self, setting: int | None, max_concurrent_trials: int | None) -> int:
        """How many of its trials may wait for a worker at once, as Tune's
        controller decides it: ``setting`` (``TUNE_MAX_PENDING_TRIALS_PG``)
        if given, else a `ConcurrencyLimiter`'s ``max_concurrent`` in the
        searcher's chain, else ``max_concurrent_trials`` (which Tune applies
        as such a limiter), else 1. The searcher is asked for a trial only
        below it, so that it hears results between its suggestions."""
        from ray.tune.search import ConcurrencyLimiter

        if setting is not None:
            return setting
        searcher = self.searcher
        while searcher is not None:
            if isinstance(searcher, ConcurrencyLimiter):
                return searcher.max_concurrent
            searcher = getattr(searcher, "searcher", None)
        return max_concurrent_trials or 1

    def next_trial(self) -> tuple[str, dict[str, Any]] | str | None:
        from ray.tune.impl.placeholder import resolve_placeholders
        from ray.tune.search import Searcher
        from ray.tune.utils.util import merge_dicts

        if self._finished or self._suggested >= self._num_samples:
            return None
        trial_id = f"{self._prefix}_{self._suggested:05d}"
        suggestion = self.searcher.suggest(trial_id)
        if suggestion == Searcher.FINISHED:
            self._finished = True
            return None
        if suggestion is None:
            return WAIT
        self._suggested += 1
        # Suggestions hold the searched leaves; constants come from the space.
        config = merge_dicts(self._space, suggestion)
        resolve_placeholders(config, self._placeholders)
        config = from_tune_config(from_searchable(config))
        return trial_id, _resolve_nested(config, None)

    # A trial the searcher was told is complete (an errored one that a
    # restore runs again) is not reported to it a second time: searchers
    # forget completed trials.
    def on_result(self, trial_id: str, result: dict[str, Any]) -> None:
        if trial_id not in self._completed:
            self.searcher.on_trial_result(trial_id, result)

    def on_complete(self, trial_id: str, result: dict[str, Any] | None, error: bool = False) -> None:
        if trial_id not in self._completed:
            self._completed.add(trial_id)
            self.searcher.on_trial_complete(trial_id, result=result, error=error)
