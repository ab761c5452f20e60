"""Adapters for the HyperBand family: ASHA, synchronous HyperBand and the
promoting ASHA (`ray_stagetree.trial_schedulers.promoting_asha`).

Both feed Ray's own object (`ray_stagetree.trial_schedulers.tune_fed`) and
add what makes stage trees pay under them: a trial is requested only up to
its next decision point (its next ASHA rung, or its HyperBand bracket's
current milestone), so no iteration past a rung is spent on a trial that
will be stopped there. The rungs are Ray's private state; each adapter
reads it in `_bracket_milestones` and its ``max_t`` in `max_t`.

Synchronous HyperBand pauses trials at a milestone, where their request
ends anyway; when it picks a paused trial to run again, the request moves
on to the next milestone and training resumes from the checkpoint there.
"""

from __future__ import annotations

import abc
import bisect
import math
from typing import Any

from ray_stagetree.trial_schedulers.tune_fed import TuneFedAdapter


class _MilestoneAdapter(TuneFedAdapter):
    """A family whose brackets decide at iterations known in advance, when
    its time attribute counts iterations."""

    needs_metric = True

    def __init__(self, scheduler: Any, horizon: float, exact: bool) -> None:
        super().__init__(scheduler, horizon, exact)
        # Rungs in other units (seconds) cannot size requests in iterations.
        self._counts_iterations = self._time_attr(scheduler) == "training_iteration"

    @classmethod
    def _time_attr(cls, scheduler: Any) -> str:
        return cls._ray_field(scheduler, "_time_attr")

    @property
    def decides_at_milestones(self) -> bool:
        # A subclass may override on_trial_result and decide elsewhere.
        return self.exact and self._counts_iterations

    def next_decision(self, trial_id: str, iteration: int) -> float:
        milestones = self._milestones(trial_id)
        position = bisect.bisect_right(milestones, iteration)
        return milestones[position] if position < len(milestones) else self.horizon

    def _milestones(self, trial_id: str) -> list[int]:
        if not self._counts_iterations:
            return []
        # A rung at t decides on the first result with training_iteration >= t.
        return sorted(math.ceil(m) for m in self._bracket_milestones(trial_id) if 0 < m < self.horizon)

    @abc.abstractmethod
    def _bracket_milestones(self, trial_id: str) -> list[float]:
        """The decision points of the trial's bracket, none once it left it."""


class AsyncHyperBandAdapter(_MilestoneAdapter):
    """``AsyncHyperBandScheduler`` (``ASHAScheduler``): decides at each rung
    of the trial's bracket."""

    @classmethod
    def max_t(cls, scheduler: Any) -> float | None:
        return cls._ray_field(scheduler, "_max_t")

    def _bracket_milestones(self, trial_id: str) -> list[float]:
        # Ray 2.60: _trial_info maps trial ids to brackets, whose _rungs are
        # (milestone, recorded results) pairs.
        bracket = self._ray_field(self.scheduler, "_trial_info").get(trial_id)
        rungs = [] if bracket is None else self._ray_field(self.scheduler, "_rungs", owner=bracket)
        return [milestone for milestone, _ in rungs]


class HyperBandAdapter(_MilestoneAdapter):
    """``HyperBandScheduler`` (synchronous): decides at the current milestone
    of the trial's bracket, which moves on as the bracket halves."""

    @classmethod
    def max_t(cls, scheduler: Any) -> float | None:
        return cls._ray_field(scheduler, "_max_t_attr")

    def _bracket_milestones(self, trial_id: str) -> list[float]:
        # Ray 2.60: _trial_info maps Trial objects (here their TrialProxy) to
        # (bracket, band index); a bracket's _cumul_r is its current milestone.
        placed = self._ray_field(self.scheduler, "_trial_info").get(self._trials.get(trial_id))
        return [] if placed is None else [self._ray_field(self.scheduler, "_cumul_r", owner=placed[0])]


class PromotingASHAAdapter(_MilestoneAdapter):
    """`PromotingASHAScheduler`: decides at each rung, where a trial not
    promoted at once pauses (its request ends there) until the scheduler
    promotes it; its state is its own public fields, none of Ray's."""

    @classmethod
    def check(cls, scheduler: Any, metric: str | None, mode: str | None, exact: bool) -> None:
        name = type(scheduler).__name__
        if (scheduler.metric or metric) is None or (scheduler.mode or mode) is None:
            raise ValueError(f"{name} needs a metric and a mode: pass metric= and mode= to TuneConfig or to it")

    @classmethod
    def max_t(cls, scheduler: Any) -> float | None:
        return scheduler.max_t

    @classmethod
    def _time_attr(cls, scheduler: Any) -> str:
        return scheduler.time_attr

    def _bracket_milestones(self, trial_id: str) -> list[float]:
        return list(self.scheduler.milestones)
