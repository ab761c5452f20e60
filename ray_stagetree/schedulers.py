"""Ray Tune trial schedulers, hosted on stage trees.

The user's own scheduler object (``ASHAScheduler``, ``MedianStoppingRule``,
``FIFOScheduler``, or a custom ``TrialScheduler`` subclass) makes every
decision: it receives each trial's results in order, exactly as Ray Tune
feeds them, and its CONTINUE / STOP answers are applied to the plan. What
changes is what gets trained: a trial is requested only up to its next
decision point (its next ASHA rung), so no iteration past a rung is spent on
a trial that will be stopped there, and trials that share a prefix train it
once.

Schedulers that pause trials to run others (synchronous HyperBand, PBT) are
not hosted yet; they are rejected with a clear error.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

CONTINUE, STOP, PAUSE = "CONTINUE", "STOP", "PAUSE"

#: Schedulers known to decide only with CONTINUE / STOP and the hooks below.
HOSTED = ("FIFOScheduler", "AsyncHyperBandScheduler", "MedianStoppingRule")
NOT_YET = ("HyperBandScheduler", "HyperBandForBOHB", "PopulationBasedTraining", "PopulationBasedTrainingReplay", "PB2", "ResourceChangingScheduler")


@dataclass(eq=False)
class TrialProxy:
    """What Tune's schedulers read from a ``Trial``."""

    trial_id: str
    config: dict[str, Any]
    status: str = "RUNNING"
    last_result: dict[str, Any] = field(default_factory=dict)

    def __hash__(self) -> int:
        return hash(self.trial_id)

    def __str__(self) -> str:
        return self.trial_id


class _ControllerFacade:
    """The few ``TuneController`` queries schedulers make."""

    def __init__(self, trials: dict[str, TrialProxy]) -> None:
        self._trials = trials

    def get_live_trials(self) -> list[TrialProxy]:
        return [trial for trial in self._trials.values() if trial.status == "RUNNING"]

    def get_trials(self) -> list[TrialProxy]:
        return list(self._trials.values())


def check_scheduler(scheduler: Any) -> None:
    """Raise a clear error for schedulers that cannot be hosted yet."""
    from ray.tune.schedulers import TrialScheduler

    if scheduler is None:
        return
    if not isinstance(scheduler, TrialScheduler):
        raise TypeError(f"TuneConfig.scheduler must be a ray.tune TrialScheduler, got {type(scheduler).__name__}")
    name = type(scheduler).__name__
    if name in NOT_YET:
        raise NotImplementedError(
            f"{name} pauses trials to run others, which ray_stagetree does not host yet; "
            f"supported: {', '.join(HOSTED)} and custom TrialSchedulers that answer CONTINUE or STOP"
        )


class SchedulerHost:
    """Feeds a Tune scheduler and tells the controller what to request.

    Parameters
    ----------
    scheduler:
        A ``ray.tune`` ``TrialScheduler`` instance (None means FIFO).
    metric, mode:
        From ``TuneConfig``, given to the scheduler if it has none.
    horizon:
        The most iterations a trial runs.
    """

    def __init__(self, scheduler: Any, metric: str | None, mode: str | None, horizon: int) -> None:
        from ray.tune.schedulers import FIFOScheduler

        check_scheduler(scheduler)
        self.scheduler = scheduler or FIFOScheduler()
        self.horizon = horizon
        self._trials: dict[str, TrialProxy] = {}
        self._facade = _ControllerFacade(self._trials)
        if metric is not None or mode is not None:
            self.scheduler.set_search_properties(metric, mode)
        self._time_attr = getattr(self.scheduler, "_time_attr", "training_iteration")

    def on_add(self, trial_id: str, config: dict[str, Any]) -> None:
        proxy = self._trials[trial_id] = TrialProxy(trial_id, config)
        self.scheduler.on_trial_add(self._facade, proxy)

    def on_result(self, trial_id: str, row: dict[str, Any]) -> str:
        proxy = self._trials[trial_id]
        proxy.last_result = row
        decision = self.scheduler.on_trial_result(self._facade, proxy, row)
        if decision == PAUSE:
            raise NotImplementedError(
                f"{type(self.scheduler).__name__} paused trial {trial_id}; pausing is not supported yet "
                "(answer CONTINUE or STOP)"
            )
        return decision

    def on_complete(self, trial_id: str, row: dict[str, Any] | None) -> None:
        proxy = self._trials[trial_id]
        proxy.status = "TERMINATED"
        if row:
            self.scheduler.on_trial_complete(self._facade, proxy, row)
        else:
            self.scheduler.on_trial_remove(self._facade, proxy)

    def on_stopped(self, trial_id: str) -> None:
        """A trial the scheduler (or a stop criterion) stopped."""
        self._trials[trial_id].status = "TERMINATED"

    def on_error(self, trial_id: str) -> None:
        proxy = self._trials[trial_id]
        proxy.status = "ERROR"
        self.scheduler.on_trial_error(self._facade, proxy)

    def next_decision(self, trial_id: str, step: int) -> int:
        """The next step after ``step`` at which the scheduler decides about
        the trial: its next ASHA rung, else the horizon."""
        milestones = self._milestones(trial_id)
        position = bisect.bisect_right(milestones, step)
        return milestones[position] if position < len(milestones) else self.horizon

    def _milestones(self, trial_id: str) -> list[int]:
        if self._time_attr != "training_iteration":
            return []
        bracket = getattr(self.scheduler, "_trial_info", {}).get(trial_id)
        rungs = getattr(bracket, "_rungs", None)
        if not rungs:
            return []
        # A rung at t decides on the first result with training_iteration >= t.
        return sorted(math.ceil(milestone) for milestone, _ in rungs if 0 < milestone < self.horizon)
