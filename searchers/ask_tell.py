"""Bring your own HPO algorithm, written as batches of ask and tell.

Ultron-AutoML's clients write an algorithm as two methods: sample ``n``
candidate configurations, and update the algorithm's state with candidates
and their validation scores. `AskTellAlgorithm` is that interface;
`AskTellSearcher` runs one as a Ray Tune ``Searcher``, so it works wherever
Tune's searchers do (``TuneConfig(search_alg=...)``, ``num_samples``,
restore) and its trials share stages as any others.

Batches are synchronous, as in Ultron's master: ``ask(batch_size)``, run
those trials, ``tell`` all their results, then ask again. Trials share
stages within a batch; the study's workers wait for the batch's last trial
before the next batch is asked for.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import Any

from ray.tune.search import Searcher

from ray_stagetree.searchers.variants import to_tune_space
from ray_stagetree.validation import Int, check


class AskTellAlgorithm(ABC):
    """An HPO algorithm that proposes configurations in batches and learns from their scores.

    Subclass it and implement `ask` and `tell`; run it with
    ``TuneConfig(search_alg=AskTellSearcher(MyAlgorithm(...), batch_size=8))``,
    or name it in a job spec (``search_alg: {name: "my_module:MyAlgorithm"}``).

    Attributes set by `setup` before the first `ask`: ``space`` (the study's
    param_space as Tune searchers see it: sequences as nested dicts of their
    parameters, Tune domains at the leaves), ``metric`` and ``mode``.
    """

    space: dict[str, Any] = {}
    metric: str | None = None
    mode: str | None = None

    def setup(self, space: dict[str, Any], metric: str | None, mode: str | None) -> None:
        """Called once, before the first `ask`, with the search space, the
        metric and whether it is minimised ("min") or maximised ("max")."""
        self.space, self.metric, self.mode = space, metric, mode

    @abstractmethod
    def ask(self, n: int) -> list[dict[str, Any]]:
        """Up to ``n`` configurations to try next, each a dict giving a value to
        some or all of the space's searched leaves (the rest of the space is
        kept; sequences may be given whole). An empty list ends the search."""

    @abstractmethod
    def tell(self, results: list[tuple[dict[str, Any], float | None]]) -> None:
        """The batch's outcome: ``(configuration as asked, score)`` for every
        configuration of the last `ask` that ran, where the score is the
        trial's last ``metric`` value, or None if it failed or never reported it."""


class AskTellSearcher(Searcher):
    """A Ray Tune ``Searcher`` running an `AskTellAlgorithm` in batches.

    Parameters
    ----------
    algorithm:
        The `AskTellAlgorithm`.
    batch_size:
        Configurations per `AskTellAlgorithm.ask` (Ultron's parallelism
        factor); every batch is told before the next is asked for.
    metric, mode:
        As for any Tune searcher; by default ``TuneConfig``'s.
    """

    def __init__(
        self, algorithm: AskTellAlgorithm, batch_size: int = 4, metric: str | None = None, mode: str | None = None
    ) -> None:
        if not isinstance(algorithm, AskTellAlgorithm):
            raise TypeError(f"algorithm must be an AskTellAlgorithm, got {type(algorithm).__name__}")
        check("batch_size", batch_size, Int(low=1))
        if mode not in (None, "min", "max"):
            raise ValueError(f"mode must be 'min', 'max' or None, got {mode!r}")
        super().__init__(metric=metric, mode=mode)
        self.algorithm = algorithm
        self.batch_size = batch_size
        self._queue: list[dict[str, Any]] = []
        self._running: dict[str, dict[str, Any]] = {}
        self._told: list[tuple[dict[str, Any], float | None]] = []
        self._finished = False
        self._ready = False

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        if self._ready:
            return False
        self._metric = self._metric or metric
        self._mode = self._mode or mode
        if self._metric is None:
            raise ValueError(f"{type(self.algorithm).__name__} needs a metric: pass TuneConfig(metric=..., mode=...)")
        self.algorithm.setup(config, self._metric, self._mode or "max")
        self._ready = True
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        if not self._queue:
            if self._running:
                return None  # the batch is still running; the next is asked for once it is told
            if self._finished:
                return Searcher.FINISHED
            self._queue = self._ask()
            if not self._queue:
                self._finished = True
                return Searcher.FINISHED
        config = self._queue.pop(0)
        self._running[trial_id] = config
        return to_tune_space(config)  # sequences given whole, as the nested dicts they are rebuilt from

    def _ask(self) -> list[dict[str, Any]]:
        name = type(self.algorithm).__name__
        batch = self.algorithm.ask(self.batch_size)
        if not isinstance(batch, list) or not all(isinstance(config, Mapping) for config in batch):
            raise TypeError(f"{name}.ask({self.batch_size}) must return a list of dicts, got {batch!r}")
        if len(batch) > self.batch_size:
            raise ValueError(f"{name}.ask({self.batch_size}) returned {len(batch)} configurations")
        return [dict(config) for config in batch]

    def on_trial_complete(self, trial_id: str, result: dict | None = None, error: bool = False) -> None:
        config = self._running.pop(trial_id, None)
        if config is None:
            return
        score = None if error or not result else result.get(self._metric)
        self._told.append((config, score))
        if not self._running and not self._queue:
            told, self._told = self._told, []
            self.algorithm.tell(told)
