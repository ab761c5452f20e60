"""Ray Tune trial schedulers, hosted on stage trees.

The user's own scheduler object (``ASHAScheduler``, ``MedianStoppingRule``,
``FIFOScheduler``, or a custom ``TrialScheduler`` subclass) makes every
decision: it receives each trial's results in order, exactly as Ray Tune
feeds them, and its CONTINUE / STOP answers are applied to the plan. What
changes is what gets trained: a trial is requested only up to its next
decision point (its next ASHA rung), so no iteration past a rung is spent on
a trial that will be stopped there, and trials that share a prefix train it
once.

A scheduler that pauses trials (synchronous HyperBand, synchronous PBT)
pauses them at a decision point, where their request ends anyway; when it
picks a paused trial to run again (``choose_trial_to_run``), the trial's
request moves on to its next decision point and training resumes from the
checkpoint there. Population-based training runs on the plan itself
(`ray_stagetree.trial_schedulers.pbt`). Schedulers that change resources, or replay or model
PBT (PB2, BOHB), are rejected with a clear error.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any, Callable

from ray_stagetree.planning.lifecycle import CONTINUE, ERROR, PAUSE, PAUSED, RUNNING, STOP, TERMINATED
from ray_stagetree.trial_schedulers.pbt import Exploit, PopulationBasedHost

#: Schedulers hosted and tested against Ray's own decisions.
HOSTED = (
    "FIFOScheduler",
    "AsyncHyperBandScheduler",
    "HyperBandScheduler",
    "MedianStoppingRule",
    "PopulationBasedTraining",
)
NOT_YET = ("HyperBandForBOHB", "PopulationBasedTrainingReplay", "PB2", "ResourceChangingScheduler")


@dataclass(eq=False)
class TrialProxy:
    """What Tune's schedulers read from a ``Trial``."""

    trial_id: str
    config: dict[str, Any]
    status: str = RUNNING
    last_result: dict[str, Any] = field(default_factory=dict)
    is_saving: bool = False

    def __hash__(self) -> int:
        return hash(self.trial_id)

    def __str__(self) -> str:
        return self.trial_id


class _ControllerFacade:
    """The few ``TuneController`` calls schedulers make."""

    def __init__(self, trials: dict[str, TrialProxy], on_stop: Callable[[str], None]) -> None:
        self._trials = trials
        self._on_stop = on_stop

    def stop_trial(self, trial: TrialProxy) -> None:
        self._on_stop(trial.trial_id)

    def get_live_trials(self) -> list[TrialProxy]:
        return [trial for trial in self._trials.values() if trial.status == RUNNING]

    def get_trials(self) -> list[TrialProxy]:
        return list(self._trials.values())


def _ignore_stop(trial_id: str) -> None:
    pass


def check_scheduler(scheduler: Any, metric: str | None = None, mode: str | None = None) -> None:
    """Raise a clear error for schedulers that cannot be hosted yet, or that
    would fail at their first trial for want of a metric and mode."""
    from ray.tune.schedulers import TrialScheduler

    if scheduler is None:
        return
    if not isinstance(scheduler, TrialScheduler):
        raise TypeError(f"TuneConfig.scheduler must be a ray.tune TrialScheduler, got {type(scheduler).__name__}")
    name = type(scheduler).__name__
    if name in NOT_YET:
        raise NotImplementedError(
            f"{name} changes trials' configs or resources, which ray_stagetree does not host yet; "
            f"supported: {', '.join(HOSTED)} and custom TrialSchedulers"
        )
    needs_metric = name in HOSTED and name != "FIFOScheduler"
    if needs_metric and (getattr(scheduler, "_metric", None) or metric) is None:
        raise ValueError(f"{name} needs a metric: pass metric= and mode= to TuneConfig or to the scheduler")
    if needs_metric and (getattr(scheduler, "_mode", None) or mode) is None:
        raise ValueError(f"{name} needs a mode ('min' or 'max'): pass mode= to TuneConfig or to the scheduler")


class SchedulerHost:
    """Feeds a Tune scheduler and tells the controller what to request.

    Parameters
    ----------
    scheduler:
        A ``ray.tune`` ``TrialScheduler`` instance (None means FIFO).
    metric, mode:
        From ``TuneConfig``, given to the scheduler if it has none.
    horizon:
        The most iterations a trial runs (``math.inf`` when trials are open-ended).
    on_stop:
        Called with a trial id when the scheduler stops a trial other than
        the one whose result it is processing (a paused one).
    """

    def __init__(
        self,
        scheduler: Any,
        metric: str | None,
        mode: str | None,
        horizon: float,
        on_stop: Callable[[str], None] | None = None,
    ) -> None:
        from ray.tune.schedulers import (
            AsyncHyperBandScheduler,
            FIFOScheduler,
            HyperBandScheduler,
            PopulationBasedTraining,
        )

        check_scheduler(scheduler, metric, mode)
        self.scheduler = scheduler or FIFOScheduler()
        self.horizon = horizon
        self._trials: dict[str, TrialProxy] = {}
        self._paused: set[str] = set()
        self._facade = _ControllerFacade(self._trials, on_stop or _ignore_stop)
        self.population = None
        if type(self.scheduler) is PopulationBasedTraining:
            self.population = PopulationBasedHost(self.scheduler, metric, mode, horizon)
        elif metric is not None or mode is not None:
            self.scheduler.set_search_properties(metric, mode)
        self._time_attr = getattr(self.scheduler, "_time_attr", "training_iteration")
        # Only these decide at points known in advance (rungs, milestones,
        # perturbations); any other scheduler may stop a trial at any result.
        milestone_types = (FIFOScheduler, AsyncHyperBandScheduler, HyperBandScheduler, PopulationBasedTraining)
        self.decides_at_milestones = type(self.scheduler) in milestone_types and (
            self._time_attr == "training_iteration" or type(self.scheduler) is FIFOScheduler
        )

    def __getstate__(self) -> dict[str, Any]:
        # Pickled into a study's snapshot without the controller it reports
        # to; the restoring controller reconnects it with `attach`.
        state = dict(self.__dict__)
        state["_facade"] = _ControllerFacade(self._trials, _ignore_stop)
        return state

    def attach(self, on_stop: Callable[[str], None]) -> None:
        """Report the scheduler's stops of paused trials to ``on_stop``."""
        self._facade._on_stop = on_stop

    def on_add(self, trial_id: str, config: dict[str, Any]) -> None:
        """A new trial; PBT samples the hyper-parameters it mutates that
        ``config`` lacks into it, as Ray's does."""
        proxy = self._trials[trial_id] = TrialProxy(trial_id, config)
        if self.population is not None:
            self.population.on_add(trial_id, config)
        else:
            self.scheduler.on_trial_add(self._facade, proxy)

    def on_result(self, trial_id: str, row: dict[str, Any], values: dict[str, Any] | None = None) -> str | Exploit:
        """The scheduler's decision; with PBT, an `Exploit`, PAUSE (synchronous
        PBT) or CONTINUE.
        ``values`` are the trial's hyper-parameters at this step (for PBT)."""
        if self.population is not None:
            return self.population.on_result(trial_id, row, values or {}) or CONTINUE
        proxy = self._trials[trial_id]
        proxy.last_result = row
        decision = self.scheduler.on_trial_result(self._facade, proxy, row)
        if decision == PAUSE:
            proxy.status = PAUSED
            self._paused.add(trial_id)
        return decision

    def on_complete(self, trial_id: str, row: dict[str, Any] | None) -> None:
        """The trial ended (finished, or stopped): tell the scheduler as Tune's
        controller does, ``on_trial_complete`` for a running trial with a
        result, ``on_trial_remove`` otherwise."""
        proxy = self._trials[trial_id]
        status, proxy.status = proxy.status, TERMINATED
        self._paused.discard(trial_id)
        if self.population is not None:
            self.population.on_complete(trial_id)
        elif row and status == RUNNING:
            self.scheduler.on_trial_complete(self._facade, proxy, row)
        else:
            self.scheduler.on_trial_remove(self._facade, proxy)

    def resumable(self) -> list[tuple[str, Exploit | None]]:
        """Paused trials the scheduler wants to run again, now marked running,
        each with the `Exploit` it resumes with (synchronous PBT) or None."""
        if self.population is not None:
            return self.population.resumable()
        chosen: list[tuple[str, Exploit | None]] = []
        # Tune's choose_trial_to_run scans every trial: asked only while one
        # is paused, it costs nothing per result in studies that never pause.
        while self._paused:
            proxy = self.scheduler.choose_trial_to_run(self._facade)
            if proxy is None or proxy.status != PAUSED:
                break
            proxy.status = RUNNING
            self._paused.discard(proxy.trial_id)
            chosen.append((proxy.trial_id, None))
        return chosen

    def on_error(self, trial_id: str) -> None:
        proxy = self._trials[trial_id]
        proxy.status = ERROR
        self._paused.discard(trial_id)
        if self.population is not None:
            self.population.on_complete(trial_id)
        else:
            self.scheduler.on_trial_error(self._facade, proxy)

    def next_decision(self, trial_id: str, step: int) -> int:
        """The next step after ``step`` at which the scheduler decides about
        the trial: its next ASHA rung or PBT perturbation, else the horizon."""
        if self.population is not None:
            return self.population.next_decision(trial_id, step)
        milestones = self._milestones(trial_id)
        position = bisect.bisect_right(milestones, step)
        return milestones[position] if position < len(milestones) else self.horizon

    def _milestones(self, trial_id: str) -> list[int]:
        """Decision points of a trial, from its scheduler bracket: ASHA's rungs,
        or synchronous HyperBand's current milestone."""
        if self._time_attr != "training_iteration":
            return []
        info = getattr(self.scheduler, "_trial_info", {})
        bracket = info.get(trial_id) or info.get(self._trials.get(trial_id))
        if isinstance(bracket, tuple):  # HyperBand keeps (bracket, band index)
            bracket = bracket[0]
        if hasattr(bracket, "_cumul_r"):
            milestones = [bracket._cumul_r]
        else:
            milestones = [milestone for milestone, _ in getattr(bracket, "_rungs", None) or []]
        # A rung at t decides on the first result with training_iteration >= t.
        return sorted(math.ceil(m) for m in milestones if 0 < m < self.horizon)
