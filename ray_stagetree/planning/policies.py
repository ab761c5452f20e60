"""Execution policies: which stages idle workers run next (thesis section 4.3).

A policy turns a stage tree into stage batches, in priority order, and hands
the first ready ones to idle workers. It keeps no state of its own: each call
builds a fresh stage tree from the plan, and dispatching marks the batch's
requests ``SCHED`` in the plan.

* `CriticalPathPolicy` (default): repeatedly take the root-to-leaf path with
  the longest estimated time among unscheduled stages and run it as one batch,
  so the worker keeps the model in memory across its stages.
* `ThroughputPolicy` (THR): stages with the most descendant stages first.
* `BreadthFirstPolicy` (BFS): stages in breadth-first order.

THR and BFS dispatch one stage at a time, as the thesis' baselines do; any
policy can be told otherwise with ``batch_stages``.
"""

from __future__ import annotations

import abc
import heapq
import itertools
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterator

from ray_stagetree.planning._gc import gc_paused
from ray_stagetree.planning.cost import CostModel
from ray_stagetree.planning.stage_tree import Source, Stage, StageTree, build_stage_tree

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
    after: "StageBatch | None" = None
    batch_id: int | None = field(default=None)

    @property
    def ready(self) -> bool:
        return self.stages[0].ready

    @property
    def source(self) -> Source | None:
        """The checkpoint (or initialization) the first stage loads."""
        first = self.stages[0]
        if first.parent is not None:
            return Source(first.parent.node, first.parent.stop)
        return first.source

    @property
    def iterations(self) -> int:
        return sum(stage.iterations for stage in self.stages)

    @property
    def segments(self) -> list[tuple["PlanNode", int, int]]:
        """``(node, start, stop)`` runs, consecutive stages of a node merged."""
        merged: list[tuple[PlanNode, int, int]] = []
        for stage in self.stages:
            if merged and merged[-1][0] is stage.node and merged[-1][2] == stage.start:
                merged[-1] = (stage.node, merged[-1][1], stage.stop)
            else:
                merged.append((stage.node, stage.start, stage.stop))
        return merged

    @property
    def requests(self) -> list["Request"]:
        return [request for stage in self.stages for request in stage.requests]

    @property
    def checkpoint_points(self) -> list[tuple["PlanNode", int]]:
        """Where the worker must save: branch points other batches start
        from, and the end (a trial is often extended from its last step)."""
        points = []
        for position, stage in enumerate(self.stages):
            successor = self.stages[position + 1] if position + 1 < len(self.stages) else None
            if successor is None or any(child is not successor for child in stage.children):
                points.append((stage.node, stage.stop))
        return points

    def __repr__(self) -> str:
        path = ", ".join(f"H{s.node.node_id}:{s.start}->{s.stop}" for s in self.stages)
        return f"StageBatch([{path}], ~{self.estimated_seconds:g}s)"


def _top_down(tree: StageTree) -> list[Stage]:
    order = list(tree.roots)
    for stage in order:
        order.extend(stage.children)
    return order


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

    def __init__(self, cost_model: CostModel | None = None, batch_stages: bool | None = None) -> None:
        self.cost_model = cost_model if cost_model is not None else CostModel()
        self.batch_stages = self.default_batch_stages if batch_stages is None else bool(batch_stages)

    @abc.abstractmethod
    def priorities(self, tree: StageTree, costs: dict[Stage, float]) -> dict[Stage, float]:
        """Higher runs first; a batch follows the highest-priority child."""

    def order(self, tree: StageTree) -> list[StageBatch]:
        """Every stage of ``tree`` in batches, highest priority first."""
        with gc_paused():
            return list(self._batches(tree))

    def _batches(self, tree: StageTree) -> Iterator[StageBatch]:
        """`order`'s batches, made as they are taken: `select` stops at the
        first ready ones instead of batching a whole study's tree."""
        costs = {
            stage: self.cost_model.stage_seconds(stage.node, stage.start, stage.stop) for stage in tree.stages
        }
        priority = self.priorities(tree, costs)
        tie_break = itertools.count()
        heap = [(-priority[root], next(tie_break), root, None) for root in tree.roots]
        heapq.heapify(heap)
        while heap:
            _, _, stage, after = heapq.heappop(heap)
            path = [stage]
            while self.batch_stages and path[-1].children:
                path.append(max(path[-1].children, key=priority.__getitem__))
            batch = StageBatch(path, sum(costs[s] for s in path), after=after)
            yield batch
            on_path = set(map(id, path))
            for member in path:
                for child in member.children:
                    if id(child) not in on_path:
                        heapq.heappush(heap, (-priority[child], next(tie_break), child, batch))

    def select(
        self, plan: "SearchPlan", idle_workers: int, admit: Callable[[StageBatch], bool] | None = None
    ) -> list[StageBatch]:
        """Dispatch up to ``idle_workers`` ready batches: they are marked
        scheduled in ``plan`` and carry their ``batch_id``. ``admit``, when
        given, skips the batches it refuses (a plan service's share bound,
        `planning.fair_share`); it is asked in priority order."""
        if isinstance(idle_workers, bool) or not isinstance(idle_workers, int) or idle_workers < 0:
            raise ValueError(f"idle_workers must be an int >= 0, got {idle_workers!r}")
        if idle_workers == 0:
            return []
        self.cost_model.fit(plan)
        chosen: list[StageBatch] = []
        with gc_paused():
            for batch in self._batches(build_stage_tree(plan)):
                if batch.ready and (admit is None or admit(batch)):
                    chosen.append(batch)
                    if len(chosen) == idle_workers:
                        break
        for batch in chosen:
            batch.batch_id = plan.mark_scheduled(batch.segments)
        return chosen

    def __repr__(self) -> str:
        return f"{type(self).__name__}(batch_stages={self.batch_stages})"


class CriticalPathPolicy(ExecutionPolicy):
    """Longest estimated root-to-leaf path first (the default)."""

    name = "critical_path"

    def priorities(self, tree: StageTree, costs: dict[Stage, float]) -> dict[Stage, float]:
        longest: dict[Stage, float] = {}
        for stage in reversed(_top_down(tree)):
            longest[stage] = costs[stage] + max((longest[c] for c in stage.children), default=0.0)
        return longest


class ThroughputPolicy(ExecutionPolicy):
    """THR: the stage with the most descendant stages first."""

    name = "thr"
    default_batch_stages = False

    def priorities(self, tree: StageTree, costs: dict[Stage, float]) -> dict[Stage, float]:
        descendants: dict[Stage, float] = {}
        for stage in reversed(_top_down(tree)):
            descendants[stage] = sum(1 + descendants[c] for c in stage.children)
        return descendants


class BreadthFirstPolicy(ExecutionPolicy):
    """BFS: shallow stages first, in the order the tree lists them."""

    name = "bfs"
    default_batch_stages = False

    def priorities(self, tree: StageTree, costs: dict[Stage, float]) -> dict[Stage, float]:
        order = _top_down(tree)
        return {stage: -float(position) for position, stage in enumerate(order)}


POLICIES: dict[str, type[ExecutionPolicy]] = {
    policy.name: policy for policy in (CriticalPathPolicy, ThroughputPolicy, BreadthFirstPolicy)
}


def get_policy(policy: "str | ExecutionPolicy") -> ExecutionPolicy:
    """An `ExecutionPolicy` from an instance or one of the names in `POLICIES`."""
    if isinstance(policy, ExecutionPolicy):
        return policy
    try:
        return POLICIES[policy]()
    except (KeyError, TypeError):
        raise ValueError(
            f"execution policy must be an ExecutionPolicy or one of {sorted(POLICIES)}, got {policy!r}"
        ) from None
