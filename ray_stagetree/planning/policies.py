"""Execution policies: which stages idle workers run next (thesis section 4.3).

A policy turns a stage tree into stage batches, in priority order, and hands
the first ready ones to idle workers; dispatching marks the batch's requests
``SCHED`` in the plan. Where a stage's priority depends only on the stages
under it (critical path, THR), `select` keeps the stage tree between calls
and rebuilds only the units of the plan that changed (`_StageForest`; a
plan root, split further at checkpointed fork points), so a dispatch costs
what changed, not the whole study: a study of many trials, independent or
branching from one trained prefix, is linear in their number.

* `CriticalPathPolicy` (default): repeatedly take the root-to-leaf path with
  the longest estimated time among unscheduled stages and run it as one batch,
  so the worker keeps the model in memory across its stages.
* `ThroughputPolicy` (THR): stages with the most descendant stages first.
* `BreadthFirstPolicy` (BFS): stages in breadth-first order.
* The time-sharing policies of `ray_stagetree.planning.time_sharing` (Hermes,
  round robin, SLAQ, FIFO) pre-empt running batches at quantum ends.

THR and BFS dispatch one stage at a time, as the thesis' baselines do; any
policy can be told otherwise with ``batch_stages``.
"""

from __future__ import annotations

import abc
import heapq
import itertools
import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ray_stagetree.planning._gc import gc_paused
from ray_stagetree.planning.cost import CostModel
from ray_stagetree.planning.stage_tree import (
    CheckpointSource,
    Stage,
    StageTree,
    build_stage_tree,
    starts_unit,
    top_down,
    trials_served,
    unit_of,
)
from ray_stagetree.validation import Int, Real, check

if TYPE_CHECKING:
    from ray_stagetree.planning.plan import PlanNode, Request, SearchPlan


@dataclass(eq=False)
class StageBatch:
    """A chain of stages one worker runs without reloading a checkpoint.

    ``after`` is the batch (of the same ordering) whose checkpoint the first
    stage starts from; ``batch_id`` is set when the batch is dispatched.
    """

    stages: list[Stage]
    estimated_seconds: float
    after: StageBatch | None = None
    batch_id: int | None = field(default=None)

    @property
    def ready(self) -> bool:
        return self.stages[0].ready

    @property
    def source(self) -> CheckpointSource | None:
        """The checkpoint (or initialization) the first stage loads."""
        first = self.stages[0]
        if first.parent is not None:
            return CheckpointSource(first.parent.node, first.parent.stop)
        return first.source

    @property
    def iterations(self) -> int:
        return sum(stage.iterations for stage in self.stages)

    @property
    def segments(self) -> list[tuple[PlanNode, int, int]]:
        """``(node, start, stop)`` runs, consecutive stages of a node merged."""
        merged: list[tuple[PlanNode, int, int]] = []
        for stage in self.stages:
            if merged and merged[-1][0] is stage.node and merged[-1][2] == stage.start:
                merged[-1] = (stage.node, merged[-1][1], stage.stop)
            else:
                merged.append((stage.node, stage.start, stage.stop))
        return merged

    @property
    def requests(self) -> list[Request]:
        return [request for stage in self.stages for request in stage.requests]

    @property
    def checkpoint_points(self) -> list[tuple[PlanNode, int]]:
        """Where the worker must save: branch points other batches start
        from, and the end (a trial is often extended from its last iteration)."""
        points = []
        for position, stage in enumerate(self.stages):
            successor = self.stages[position + 1] if position + 1 < len(self.stages) else None
            if successor is None or any(child is not successor for child in stage.children):
                points.append((stage.node, stage.stop))
        return points

    def __repr__(self) -> str:
        path = ", ".join(f"H{s.node.node_id}:{s.start}->{s.stop}" for s in self.stages)
        return f"StageBatch([{path}], ~{self.estimated_seconds:g}s)"


class ExecutionPolicy(abc.ABC):
    """Orders a stage tree into stage batches.

    Parameters
    ----------
    cost_model:
        Estimates stage durations; fitted to the plan's timings at each
        `select`. Defaults to one unit per iteration until timings exist.
    batch_stages:
        Dispatch whole root-to-leaf paths (True) or single stages (False).
    """

    name: str = ""
    default_batch_stages: bool = True
    #: True when `priorities` of a stage depend only on the stages under it:
    #: `select` then replans only the units of the plan that changed.
    local_priorities: bool = False
    #: Set (`admission_order`) for a study whose trial scheduler decides on
    #: results (ASHA, HyperBand, median stopping): ready batches go by the
    #: oldest trial they serve, the policy's priority only breaking ties.
    #: Ray Tune runs the oldest unfinished trials, each until its scheduler
    #: stops it; such a scheduler's decisions depend on the order in which
    #: trials reach its rungs, so ordering by anything else (estimated path
    #: length, node order) feeds it another study than Tune would.
    trial_order: bool = False
    #: The most iterations a trial of the study runs (`set_horizon`); critical path looks ahead to it.
    horizon: float = math.inf

    def __init__(self, cost_model: CostModel | None = None, batch_stages: bool | None = None) -> None:
        self.cost_model = cost_model if cost_model is not None else CostModel()
        self.batch_stages = self.default_batch_stages if batch_stages is None else bool(batch_stages)
        self._forest: _StageForest | None = None
        self._admissions: dict[str, int] = {}

    @abc.abstractmethod
    def priorities(self, tree: StageTree, costs: dict[Stage, float]) -> dict[Stage, float]:
        """Higher runs first; a batch follows the highest-priority child."""

    def order(self, tree: StageTree) -> list[StageBatch]:
        """Every stage of ``tree`` in batches, highest priority first."""
        with gc_paused():
            return list(self._batches(tree))

    def set_horizon(self, horizon: float | None) -> None:
        """The most iterations a trial of the study runs (None: open-ended)."""
        self.horizon = math.inf if horizon is None else float(horizon)
        self._forest = None

    def admission_order(self, on: bool = True) -> ExecutionPolicy:
        """Order ready batches by their trials' admission (see `trial_order`)."""
        self.trial_order = on
        self._forest = None
        return self

    def yields(self, plan: SearchPlan, serving: set[str], waiting: Iterable[Request]) -> bool:
        """Should a batch serving the trials ``serving``, at a decision point
        with every worker busy, stop there for other work, ``waiting`` being
        the requests not yet scheduled? Yes if any waits, unless in
        `trial_order`: then only for an older trial's, as Tune keeps a trial
        on its worker until it stops (the continuing batch would be chosen
        again, at the cost of a checkpoint round trip)."""
        if not self.trial_order:
            return any(True for _ in waiting)
        admitted = self._admitted(plan)
        assert admitted is not None  # in trial order
        oldest = min((admitted.get(trial_id, math.inf) for trial_id in serving), default=math.inf)
        return any(admitted.get(trial_id, math.inf) < oldest for request in waiting for trial_id in request.trials)

    def _costs_and_priorities(self, tree: StageTree) -> tuple[dict[Stage, float], dict[Stage, float]]:
        costs = {stage: self.cost_model.stage_seconds(stage.node, stage.start, stage.stop) for stage in tree.stages}
        return costs, self.priorities(tree, costs)

    def _ranks(self, tree: StageTree, admitted: dict[str, int] | None) -> dict[Stage, float]:
        """Each stage's rank: the admission position of the oldest trial it
        or a stage under it serves (0 for all without `trial_order`)."""
        if admitted is None:
            return dict.fromkeys(tree.stages, 0.0)
        ranks: dict[Stage, float] = {}
        for stage in reversed(top_down(tree)):
            own = (admitted.get(trial_id, math.inf) for request in stage.requests for trial_id in request.trials)
            ranks[stage] = min(itertools.chain(own, (ranks[child] for child in stage.children)), default=math.inf)
        return ranks

    def _admitted(self, plan: SearchPlan) -> dict[str, int] | None:
        """Trial id -> admission number, None without `trial_order`. The plan
        lists trials as they were added; numbers stay fixed as trials leave,
        so batches ranked at different calls compare."""
        if not self.trial_order:
            return None
        for trial_id in plan.trials:
            self._admissions.setdefault(trial_id, len(self._admissions))
        return self._admissions

    def _batch_from(
        self, stage: Stage, costs: dict[Stage, float], priority: dict[Stage, float], after: StageBatch | None = None
    ) -> StageBatch:
        """The batch starting at ``stage``: down its highest-priority children."""
        path = [stage]
        while self.batch_stages and path[-1].children:
            path.append(max(path[-1].children, key=priority.__getitem__))
        return StageBatch(path, sum(costs[s] for s in path), after=after)

    def _batches(self, tree: StageTree, admitted: dict[str, int] | None = None) -> Iterator[StageBatch]:
        """`order`'s batches, made as they are taken."""
        costs, priority = self._costs_and_priorities(tree)
        rank = self._ranks(tree, admitted)
        tie_break = itertools.count()
        heap: list[tuple[float, float, int, Stage, StageBatch | None]] = [
            (rank[root], -priority[root], next(tie_break), root, None) for root in tree.roots
        ]
        heapq.heapify(heap)
        while heap:
            _, _, _, stage, after = heapq.heappop(heap)
            batch = self._batch_from(stage, costs, priority, after)
            path = batch.stages
            yield batch
            on_path = set(map(id, path))
            for member in path:
                for child in member.children:
                    if id(child) not in on_path:
                        heapq.heappush(heap, (rank[child], -priority[child], next(tie_break), child, batch))

    def select(
        self, plan: SearchPlan, idle_workers: int, admit: Callable[[StageBatch], bool] | None = None
    ) -> list[StageBatch]:
        """Dispatch up to ``idle_workers`` ready batches: they are marked
        scheduled in ``plan`` and carry their ``batch_id``. ``admit``, when
        given, skips the batches it refuses (a plan service's share bound,
        `planning.fair_share`); it is asked in priority order."""
        check("idle_workers", idle_workers, Int(low=0))
        if idle_workers == 0:
            return []
        self.cost_model.fit(plan)
        chosen: list[StageBatch] = []
        with gc_paused():
            for batch in self._candidates(plan):
                if admit is None or admit(batch):
                    chosen.append(batch)
                    if len(chosen) == idle_workers:
                        break
        if self._forest is not None and self._forest.plan is plan:
            # A refit re-prices every ready batch of the forest: the next waits for as many new timings.
            self.cost_model.min_new_timings = self._forest.live_total
        for batch in chosen:
            batch.batch_id = plan.mark_scheduled(batch.segments)
        return chosen

    def _candidates(self, plan: SearchPlan) -> Iterator[StageBatch]:
        """The ready batches of the plan's stage tree, best first."""
        if self.local_priorities:
            if self._forest is None or self._forest.plan is not plan:
                self._forest = _StageForest(self, plan)
            return self._forest.ready_batches()
        return (batch for batch in self._batches(build_stage_tree(plan), self._admitted(plan)) if batch.ready)

    # -- time sharing: a stage-tree policy runs every batch to its end; the
    # time-sharing policies (planning/time_sharing.py) pre-empt at these
    # calls, which the runtime and the simulator make for every policy.

    def bind(self, workers: int) -> None:
        """The study runs on ``workers`` workers."""

    def started(self, batch: StageBatch, now: float) -> float | None:
        """``batch`` was dispatched at ``now``; returns when it may first be
        pre-empted (None: never)."""
        return None

    def quantum_deadline(self, batch_id: int) -> float | None:
        """When the running batch may next be pre-empted (None: never)."""
        return None

    def at_boundary(self, plan: SearchPlan, batch_id: int, node: PlanNode, iteration: int, now: float) -> bool:
        """The running batch has trained ``(node, iteration)``: True if it stops
        there (with a checkpoint) for other work."""
        return False

    def ended(self, plan: SearchPlan, batch_id: int, now: float, point: tuple[PlanNode, int] | None = None) -> None:
        """The batch ended at ``now``, at ``point`` if given (else the last
        one `at_boundary` saw); called before the plan releases it."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}(batch_stages={self.batch_stages})"


class _StageForest:
    """A plan's ready stage batches, kept between `ExecutionPolicy.select`
    calls of a policy with local priorities.

    The stage tree of a plan is the union of its units' trees (a plan root,
    or a node that forks at a checkpoint, down to the next such nodes:
    `stage_tree.starts_unit`). A unit's tree is rebuilt when the plan's
    change log names one of its nodes (`SearchPlan.touched_since`); a
    checkpoint at a fork point, or its loss, splits a unit or merges two;
    every unit is rebuilt when the cost model is refitted. Ready batches of
    all units go into one heap ordered as the whole tree's would be
    (priority, then node and start for ties). Entries of a unit rebuilt
    since they were pushed are stale and skipped.
    """

    def __init__(self, policy: ExecutionPolicy, plan: SearchPlan) -> None:
        self.policy, self.plan = policy, plan
        self.read_up_to = 0
        self.model_fits: tuple[int, int] | None = None
        self.generation: dict[int, int] = {}  # unit (its first node's id) -> its current build
        self.live: dict[int, int] = {}  # current unit -> its entries in the heap
        self.live_total = 0
        self.heap: list[tuple[float, float, int, int, int, int, int, StageBatch]] = []
        self.admitted: dict[str, int] | None = None
        self.tie_break = itertools.count()

    def ready_batches(self) -> Iterator[StageBatch]:
        """The ready batches, highest priority first, as they are asked for.
        What was looked at goes back into the heap when the caller stops:
        those it dispatched are stale once `mark_scheduled` touches their
        units, the others are still current."""
        self._refresh()
        seen = []
        try:
            while self.heap:
                entry = heapq.heappop(self.heap)
                if self.generation.get(entry[5]) == entry[6]:
                    seen.append(entry)
                    yield entry[7]
        finally:
            for entry in seen:
                heapq.heappush(self.heap, entry)

    def _refresh(self) -> None:
        model = self.policy.cost_model
        fits = (id(model), model.fits)
        units = set()
        for node in self.plan.touched_since(self.read_up_to):
            units.add(unit_of(node))
            # Children that start a unit and were not one, or the reverse.
            units.update(
                child for child in node.children.values() if starts_unit(child) != (child.node_id in self.live)
            )
        if fits != self.model_fits:  # new estimates: reorder every ready batch
            self.model_fits = fits
            units |= {self.plan.nodes[unit_id] for unit_id in self.live}
            self.heap.clear()
            self.live.clear()
            self.live_total = 0
        self.read_up_to = self.plan.changes
        if units:
            self.admitted = self.policy._admitted(self.plan)
        for unit in units:
            self._rebuild(unit)
        if len(self.heap) > 64 + 4 * self.live_total:
            self.heap = [entry for entry in self.heap if self.generation.get(entry[5]) == entry[6]]
            heapq.heapify(self.heap)

    def _rebuild(self, unit: PlanNode) -> None:
        """Replace the unit's entries; one no longer a unit (its stages are
        in the unit above it now) leaves none."""
        key = unit.node_id
        generation = self.generation[key] = self.generation.get(key, 0) + 1
        self.live_total -= self.live.pop(key, 0)
        if not starts_unit(unit):
            return
        tree = build_stage_tree(self.plan, [unit])
        costs, priority = self.policy._costs_and_priorities(tree)
        rank = self.policy._ranks(tree, self.admitted)
        ready = [stage for stage in tree.roots if stage.ready]
        self.live[key] = len(ready)
        self.live_total += len(ready)
        for stage in ready:
            batch = self.policy._batch_from(stage, costs, priority)
            entry = (
                rank[stage],
                -priority[stage],
                stage.node.node_id,
                stage.start,
                next(self.tie_break),
                key,
                generation,
                batch,
            )
            heapq.heappush(self.heap, entry)


class CriticalPathPolicy(ExecutionPolicy):
    """Longest estimated root-to-leaf path first (the default).

    A trial requested short of the study's `horizon` (up to a scheduler's
    rung or perturbation) may be extended up to it: its path counts as long
    as it may become, the missing iterations at its last stage's pace. The
    results a scheduler decides on more work with then come before work no
    decision waits for, so that work starts sooner; at equal paces, the
    stages furthest from the horizon go first.

    Paths whose estimates fall in one band count as equally long (the
    estimates are fitted timings, and past a rung the look-ahead is a
    guess); a band's upper end is ``1 + tie_tolerance`` times its lower
    end. In a band, the stage serving fewer trials goes first. Trials
    sharing a path reach a rung together, tied, so a scheduler that
    compares trials (a promoting ASHA) then hears from more distinct
    configurations for each trial that reaches its rung, and promotes fewer
    on thin evidence: a large tied group heard first fills a rung's top
    quantile on its own, and its trials all train on.
    (`release/bench_policies.py` compares the policy with and without
    looking ahead and with and without this rule, on the thesis' ResNet20
    study under a promoting ASHA.)

    Parameters
    ----------
    cost_model, batch_stages:
        As for `ExecutionPolicy`.
    tie_tolerance:
        The bands' relative width; 0 orders by the estimates alone.
    """

    name = "critical_path"
    local_priorities = True

    def __init__(
        self, cost_model: CostModel | None = None, batch_stages: bool | None = None, tie_tolerance: float = 0.1
    ) -> None:
        super().__init__(cost_model, batch_stages)
        self.tie_tolerance = check("tie_tolerance", tie_tolerance, Real(low=0))

    def priorities(self, tree: StageTree, costs: dict[Stage, float]) -> dict[Stage, float]:
        seconds = self.path_seconds(tree, costs)
        if self.tie_tolerance == 0:
            return seconds
        served = trials_served(tree)
        band_width = math.log1p(self.tie_tolerance)
        # The band (an integer) orders first; 1 / (1 + trials), under 1, orders within a band.
        return {
            stage: math.floor(math.log(max(length, _SHORTEST)) / band_width) + 1 / (1 + served[stage])
            for stage, length in seconds.items()
        }

    def path_seconds(self, tree: StageTree, costs: dict[Stage, float]) -> dict[Stage, float]:
        """Each stage's estimated longest path down from it, looking ahead to the horizon."""
        longest: dict[Stage, float] = {}
        for stage in reversed(top_down(tree)):
            below = max((longest[c] for c in stage.children), default=0.0)
            longest[stage] = costs[stage] + max(below, self._may_extend(stage, costs[stage]))
        return longest

    def _may_extend(self, stage: Stage, cost: float) -> float:
        """Estimated seconds the trials ending in ``stage`` may still be extended by."""
        if not stage.requests or math.isinf(self.horizon) or stage.iterations == 0:
            return 0.0
        short = max(self.horizon - request.iteration for request in stage.requests)
        return max(short, 0.0) * cost / stage.iterations

    def __repr__(self) -> str:
        return f"{type(self).__name__}(batch_stages={self.batch_stages}, tie_tolerance={self.tie_tolerance:g})"


_SHORTEST = 1e-9  # seconds: a path estimated at 0 still has a band


class ThroughputPolicy(ExecutionPolicy):
    """THR: the stage with the most descendant stages first."""

    name = "thr"
    default_batch_stages = False
    local_priorities = True

    def priorities(self, tree: StageTree, costs: dict[Stage, float]) -> dict[Stage, float]:
        descendants: dict[Stage, float] = {}
        for stage in reversed(top_down(tree)):
            descendants[stage] = sum(1 + descendants[c] for c in stage.children)
        return descendants


class BreadthFirstPolicy(ExecutionPolicy):
    """BFS: shallow stages first, in the order the tree lists them."""

    name = "bfs"
    default_batch_stages = False

    def priorities(self, tree: StageTree, costs: dict[Stage, float]) -> dict[Stage, float]:
        order = top_down(tree)
        return {stage: -float(position) for position, stage in enumerate(order)}


POLICIES: dict[str, type[ExecutionPolicy]] = {
    policy.name: policy for policy in (CriticalPathPolicy, ThroughputPolicy, BreadthFirstPolicy)
}


def get_policy(policy: str | ExecutionPolicy) -> ExecutionPolicy:
    """An `ExecutionPolicy` from an instance or one of the names in `POLICIES`."""
    if isinstance(policy, ExecutionPolicy):
        return policy
    try:
        return POLICIES[policy]()
    except (KeyError, TypeError):
        raise ValueError(
            f"execution policy must be an ExecutionPolicy or one of {sorted(POLICIES)}, got {policy!r}"
        ) from None
