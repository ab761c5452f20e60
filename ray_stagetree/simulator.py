"""A discrete-event simulation of stage execution on W workers.

It drives the real planner: the execution policy dispatches stage batches to
idle simulated workers; a worker saves the checkpoints the plan asks for as it
passes them (so a waiting branch starts as soon as its fork is trained, not
when the whole batch ends); answered requests, checkpoints, timings and
released batches go back into the plan as the Ray runtime reports them. Only
time is simulated: an iteration costs what ``seconds_per_iteration`` says.

Use it to compare execution policies, or sharing against trial-by-trial
execution, at a scale no test machine has.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field
from typing import Callable

from ray_stagetree.plan import CheckpointInfo, PlanNode, SearchPlan
from ray_stagetree.policy import CriticalPathPolicy, ExecutionPolicy, StageBatch, get_policy
from ray_stagetree.stage_tree import build_stage_tree


@dataclass(frozen=True)
class SimulationResult:
    makespan: float
    worker_seconds: float
    iterations: int
    batches: int
    lower_bound: float
    """max(longest root-to-leaf path, unique work / workers): no schedule is faster."""

    @property
    def makespan_ratio(self) -> float:
        return self.makespan / self.lower_bound if self.lower_bound else 1.0


def _unit_cost(node: PlanNode, step: int) -> float:
    return 1.0


@dataclass
class Simulation:
    """A simulated cluster.

    Parameters
    ----------
    workers:
        Number of simulated workers (GPUs).
    seconds_per_iteration:
        Cost of iteration ``step`` of plan node ``node``; one unit by default.
    checkpoint_load_seconds:
        Paid when a batch starts from a stored checkpoint rather than from scratch.

    Example
    -------
    >>> from ray_stagetree import MultiStep, SearchPlan
    >>> plan = SearchPlan()
    >>> _ = plan.add_trials([(f"t{m}", {"lr": MultiStep(0.1, [m], 0.1)}, 100) for m in (30, 60, 90)])
    >>> Simulation(workers=2).run(plan).makespan
    100.0
    """

    workers: int
    seconds_per_iteration: Callable[[PlanNode, int], float] = _unit_cost
    checkpoint_load_seconds: float = 0.0
    _events: list = field(default_factory=list, init=False, repr=False)

    def __post_init__(self) -> None:
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 1:
            raise ValueError(f"workers must be an int >= 1, got {self.workers!r}")
        if not self.checkpoint_load_seconds >= 0:
            raise ValueError(f"checkpoint_load_seconds must be >= 0, got {self.checkpoint_load_seconds!r}")

    def _seconds(self, node: PlanNode, start: int, stop: int) -> float:
        return sum(self.seconds_per_iteration(node, step) for step in range(start, stop))

    def lower_bound(self, plan: SearchPlan) -> float:
        """max(longest root-to-leaf path, unique work / workers) of the open requests."""
        tree = build_stage_tree(plan)
        costs = {stage: self._seconds(stage.node, stage.start, stage.stop) for stage in tree.stages}
        longest = CriticalPathPolicy().priorities(tree, costs)
        return max(max(longest.values(), default=0.0), sum(costs.values()) / self.workers)

    def run(self, plan: SearchPlan, policy: str | ExecutionPolicy = "critical_path") -> SimulationResult:
        """Train every open request of ``plan`` on the simulated workers."""
        policy = get_policy(policy)
        bound = self.lower_bound(plan)
        events: list[tuple[float, int, Callable[[], None]]] = []
        tie_break = itertools.count()
        now = busy = 0.0
        idle, iterations, batches = self.workers, 0, 0

        def finish(batch: StageBatch) -> None:
            nonlocal idle
            for node, step in plan.checkpoints_needed(batch.batch_id):
                _save(plan, node.node_id, step)
            for request in plan.scheduled_requests(batch.batch_id):
                plan.record_metrics(request.node.node_id, request.step, {"time_total_s": now})
            for node, start, stop in batch.segments:
                plan.record_timing(node.node_id, start, stop, self._seconds(node, start, stop))
            plan.release_batch(batch.batch_id)
            idle += 1

        while True:
            for batch in policy.select(plan, idle):
                idle -= 1
                batches += 1
                iterations += batch.iterations
                end = self._queue_checkpoints(plan, batch, now, events, tie_break)
                busy += end - now
                heapq.heappush(events, (end, next(tie_break), lambda batch=batch: finish(batch)))
            if not events:
                break
            now, _, action = heapq.heappop(events)
            action()
        return SimulationResult(now, busy, iterations, batches, bound)

    def _queue_checkpoints(self, plan: SearchPlan, batch: StageBatch, now: float, events: list, tie_break) -> float:
        """Queue a save at each stage end the plan needs when the worker gets
        there; returns when the batch ends."""
        source = batch.source
        elapsed = now + (0.0 if source is None or source.is_initialization else self.checkpoint_load_seconds)
        for stage in batch.stages:
            elapsed += self._seconds(stage.node, stage.start, stage.stop)

            def save(node: PlanNode = stage.node, step: int = stage.stop, batch_id: int = batch.batch_id) -> None:
                if batch_id in plan.running_batches and (node, step) in plan.checkpoints_needed(batch_id):
                    _save(plan, node.node_id, step)

            heapq.heappush(events, (elapsed, next(tie_break), save))
        return elapsed


def _save(plan: SearchPlan, node_id: int, step: int) -> None:
    plan.record_checkpoint(node_id, step, CheckpointInfo(path=f"simulated://{node_id}/{step}"))
