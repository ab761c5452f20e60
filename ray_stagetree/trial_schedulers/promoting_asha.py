"""ASHA as Li et al. (MLSys 2020) define it: trials are *promoted* to the
next rung, as the Hippo paper re-implemented it for Ray Tune.

Ray's ``ASHAScheduler`` decides once, when a trial reaches a rung: it goes
on if it is in the top ``1 / reduction_factor`` of the results recorded at
that rung so far, and is stopped otherwise, for good. The paper's ASHA
(its Algorithm 2, ``get_job``) never decides against a trial early: a trial
that reaches rung ``k`` waits there, and whenever a worker is free the
scheduler promotes a waiting trial that is in the top
``floor(n_k / reduction_factor)`` of the ``n_k`` results of rung ``k``
(highest rung first, best result first within it), and only when none is
promotable starts a new trial. A trial that was not good enough when it
arrived is promoted later, once enough worse results reach its rung; the
trials never promoted are stopped when nothing can change any more.

`PromotingASHAScheduler` is a Ray Tune ``TrialScheduler`` with the
constructor of Tune's ``ASHAScheduler`` (``time_attr``, ``metric``,
``mode``, ``max_t``, ``grace_period``, ``reduction_factor``): waiting at a
rung is a PAUSE, a promotion is ``choose_trial_to_run`` returning the
paused trial. It runs under ``ray.tune.Tuner`` as it is, and under
``ray_stagetree.Tuner`` and the simulator through
`ray_stagetree.trial_schedulers.hyperband.PromotingASHAAdapter`, which
requests each trial up to its next rung.

Rungs are ``grace_period * reduction_factor**k`` below ``max_t``; a trial
that reaches ``max_t`` is stopped there (it is done).
"""

from __future__ import annotations

import math
from typing import Any

from ray.tune.schedulers.trial_scheduler import TrialScheduler

from ray_stagetree.validation import Options, Real, check

_PAUSED, _PENDING, _RUNNING = "PAUSED", "PENDING", "RUNNING"  # Tune's Trial statuses


class PromotingASHAScheduler(TrialScheduler):
    """Asynchronous successive halving that promotes trials (see the module
    docstring).

    Parameters
    ----------
    time_attr:
        The result field that measures progress (rungs and ``max_t`` are in
        its units); must increase from result to result.
    metric, mode:
        The result field compared at rungs and whether higher ("max") or
        lower ("min") is better; None: set by the Tuner's ``TuneConfig``.
    max_t:
        A trial stops when ``time_attr`` reaches it.
    grace_period:
        The first rung.
    reduction_factor:
        ``eta``: rungs grow by it, and the top ``1 / eta`` of a rung is promoted.

    Examples
    --------
    >>> PromotingASHAScheduler(metric="loss", mode="min", max_t=120, grace_period=15, reduction_factor=4).milestones
    [15, 60]
    """

    def __init__(
        self,
        time_attr: str = "training_iteration",
        metric: str | None = None,
        mode: str | None = None,
        max_t: float = 100,
        grace_period: float = 1,
        reduction_factor: float = 4,
    ) -> None:
        super().__init__()
        if not isinstance(time_attr, str) or not time_attr:
            raise ValueError(f"time_attr must be a non-empty str (a result field), got {time_attr!r}")
        if metric is not None and (not isinstance(metric, str) or not metric):
            raise ValueError(f"metric must be a non-empty str or None, got {metric!r}")
        check("mode", mode, Options(("min", "max")), None)
        check("max_t", max_t, Real(low=0, closed="neither"))
        check("grace_period", grace_period, Real(low=0, high=max_t, closed="right"))
        check("reduction_factor", reduction_factor, Real(low=1, closed="neither"))
        self._time_attr = time_attr
        self._metric: str | None = metric
        self._mode: str | None = mode
        self.max_t, self.grace_period, self.reduction_factor = max_t, grace_period, reduction_factor
        self.milestones: list[float] = []
        rung = grace_period
        while rung < max_t:
            self.milestones.append(rung)
            rung *= reduction_factor
        #: per rung, trial id -> its score there (higher is better whatever the mode)
        self.rungs: list[dict[str, float]] = [{} for _ in self.milestones]
        self._reached: dict[str, int] = {}  # trial id -> the highest rung it recorded
        self._trials: dict[str, Any] = {}  # trial id -> Tune's Trial (or the host's proxy)

    @property
    def time_attr(self) -> str:
        return self._time_attr

    @property
    def mode(self) -> str | None:
        return self._mode

    def set_search_properties(self, metric: str | None, mode: str | None, **spec: Any) -> bool:
        if (self._metric and metric) or (self._mode and mode):
            return False
        self._metric = metric or self._metric
        self._mode = mode or self._mode
        return True

    # -- the rule -------------------------------------------------------------------------

    def top(self, rung: int) -> list[str]:
        """The trials of ``rung`` that may leave it: its best
        ``floor(n / reduction_factor)`` of ``n`` results, best first (ties
        in the order the results arrived)."""
        scores = self.rungs[rung]
        ranked = sorted(scores, key=lambda trial_id: -scores[trial_id])  # stable: arrival order breaks ties
        return ranked[: math.floor(len(ranked) / self.reduction_factor)]

    def promotable(self) -> list[str]:
        """Paused trials that may be promoted now, in promotion order:
        highest rung first, best result first within a rung."""
        return [
            trial_id
            for rung in reversed(range(len(self.milestones)))
            for trial_id in self.top(rung)
            if self._reached.get(trial_id) == rung and self._status(trial_id) == _PAUSED
        ]

    def _status(self, trial_id: str) -> str | None:
        trial = self._trials.get(trial_id)
        return None if trial is None else trial.status

    def _score(self, result: dict[str, Any]) -> float:
        value = float(result[self._metric])
        return value if self._mode == "max" else -value

    # -- Tune's TrialScheduler -------------------------------------------------------------

    def on_trial_add(self, tune_controller: Any, trial: Any) -> None:
        if self._metric is None or self._mode is None:
            raise ValueError(
                f"{type(self).__name__} needs a metric and a mode: pass metric= and mode= to it or to TuneConfig "
                f"(got metric={self._metric!r}, mode={self._mode!r})"
            )
        self._trials[trial.trial_id] = trial
        self._reached.setdefault(trial.trial_id, -1)

    def on_trial_result(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> str:
        if self._time_attr not in result or self._metric not in result:
            return TrialScheduler.CONTINUE  # as Ray's ASHA: a row without them decides nothing
        progress = result[self._time_attr]
        if progress >= self.max_t:
            return TrialScheduler.STOP
        reached = self._reached.get(trial.trial_id, -1)
        rung = reached
        while rung + 1 < len(self.milestones) and progress >= self.milestones[rung + 1]:
            rung += 1
            self.rungs[rung][trial.trial_id] = self._score(result)
        if rung == reached:
            return TrialScheduler.CONTINUE  # between rungs
        self._reached[trial.trial_id] = rung
        # It goes on at once when get_job would pick it: it is in its rung's
        # top and no waiting trial of a higher rung comes first.
        if trial.trial_id in self.top(rung) and not any(self._reached[other] > rung for other in self.promotable()):
            return TrialScheduler.CONTINUE
        return TrialScheduler.PAUSE

    def choose_trial_to_run(self, tune_controller: Any) -> Any:
        promotable = self.promotable()
        if promotable:
            return self._trials[promotable[0]]
        trials = tune_controller.get_trials()
        for trial in trials:
            if trial.status == _PENDING:
                return trial
        self._stop_if_settled(tune_controller, trials)
        return None

    def _stop_if_settled(self, tune_controller: Any, trials: list[Any]) -> None:
        """Nothing runs, nothing waits to start and the search has no more
        trials: no rung gets another result, so no waiting trial is ever
        promoted; they stop (Tune would otherwise wait for them forever).
        A controller whose search cannot say so (ray_stagetree's, which
        closes the paused trials at the study's end itself) is left alone."""
        is_finished = getattr(getattr(tune_controller, "search_alg", None), "is_finished", None)
        if not callable(is_finished) or not is_finished():
            return
        if any(trial.status in (_PENDING, _RUNNING) for trial in trials):
            return
        for trial in trials:
            if trial.status == _PAUSED:
                tune_controller.stop_trial(trial)

    def on_trial_complete(self, tune_controller: Any, trial: Any, result: dict[str, Any]) -> None:
        self._trials.pop(trial.trial_id, None)

    def on_trial_remove(self, tune_controller: Any, trial: Any) -> None:
        self._trials.pop(trial.trial_id, None)

    def on_trial_error(self, tune_controller: Any, trial: Any) -> None:
        self._trials.pop(trial.trial_id, None)

    def debug_string(self) -> str:
        rungs = ", ".join(f"{milestone:g}: {len(scores)}" for milestone, scores in zip(self.milestones, self.rungs))
        return f"Using PromotingASHA: reduction factor {self.reduction_factor:g}, results per rung {{{rungs}}}."
