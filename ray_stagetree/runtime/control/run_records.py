"""The plan's runs: which worker trained which segments of a batch, from
when to when, and how the batch ended (`SearchPlan.record_run`, the
monitor's timeline); and its sharing figures as the progress line shows
them. Ray-free."""

from __future__ import annotations

import time

from ray_stagetree.execution.batches import BatchOutcome, BatchSpec
from ray_stagetree.planning.plan import SearchPlan
from ray_stagetree.runtime.control.experiment_state import STATE_COST_FACTOR


class RunRecords:
    """The running batches' runs, recorded into ``plan`` as each ends."""

    def __init__(self, plan: SearchPlan) -> None:
        self.plan = plan
        self._began: dict[int, tuple[int, float]] = {}  # batch id -> (worker number, wall-clock dispatch time)
        self._reached: dict[int, dict[int, int]] = {}  # batch id -> node id -> last iteration trained
        self._spent: dict[int, dict[str, float]] = {}  # batch id -> seconds by phase, as its worker reported them
        self.phase_seconds: dict[str, float] = {}  # the ended runs' seconds by phase, summed

    def began(self, batch_id: int, worker: int) -> None:
        """The batch went to worker number ``worker`` (from 1) now."""
        self._began[batch_id] = (worker, time.time())

    def began_at(self, batch_id: int) -> float:
        """The wall-clock time the batch was dispatched (now, if it was not recorded)."""
        return self._began.get(batch_id, (0, time.time()))[1]

    def reached(self, batch_id: int, node_id: int, iteration: int) -> None:
        """The batch trained ``node_id`` up to ``iteration``."""
        if batch_id in self._began:
            reached = self._reached.setdefault(batch_id, {})
            reached[node_id] = max(reached.get(node_id, 0), iteration)

    def spent(self, batch_id: int, phases: dict[str, float]) -> None:
        """The batch's worker reported these seconds by phase (`runtime.workers.phases`)."""
        if batch_id in self._began:
            spent = self._spent.setdefault(batch_id, {})
            for name, seconds in phases.items():
                spent[name] = spent.get(name, 0.0) + seconds

    def ended(self, spec: BatchSpec, outcome: BatchOutcome | None) -> None:
        """The batch's run into the plan: the segments it trained, as far as
        it trained them (``outcome`` None: its worker died or its outcome was lost)."""
        began = self._began.pop(spec.batch_id, None)
        if began is None:
            return
        worker, start_time = began
        reached = self._reached.pop(spec.batch_id, {})
        phases = self._spent.pop(spec.batch_id, {})
        end_time = max(time.time(), start_time)
        # What the worker did not spend in the batch: its dispatch, and its outcome's way back.
        phases["dispatch"] = max(0.0, end_time - start_time - sum(phases.values()))
        for name, seconds in phases.items():
            self.phase_seconds[name] = self.phase_seconds.get(name, 0.0) + seconds
        if outcome is None or outcome.source_lost is not None or outcome.trainable_unloadable:
            label = "released" if outcome is not None and outcome.source_lost is not None else "failed"
        else:
            label = "failed" if outcome.error is not None else "done"
        segments = [
            (node_id, start, min(stop, reached[node_id]))
            for node_id, start, stop in spec.segments
            if reached.get(node_id, 0) > start
        ]
        if segments or label != "done":
            self.plan.record_run(spec.batch_id, worker, segments, start_time, end_time, label, phases)


class SharingFigures:
    """The plan's unique and trial-by-trial iterations. Each walks every
    trial, so with many trials they are recomputed at most as often as keeps
    them under 5% of the loop's time."""

    def __init__(self, plan: SearchPlan) -> None:
        self.plan = plan
        self._figures: dict[str, int] = {}
        self._due = 0.0  # time.monotonic() after which they are computed again

    def now(self, exact: bool = False) -> dict[str, int]:
        """``unique_iterations`` and ``total_iterations``, as last computed (``exact``: computed now)."""
        started = time.monotonic()
        if exact or started >= self._due:
            self._figures = {
                "unique_iterations": self.plan.unique_iterations(),
                "total_iterations": self.plan.total_iterations(),
            }
            self._due = started + STATE_COST_FACTOR * (time.monotonic() - started)
        return self._figures
