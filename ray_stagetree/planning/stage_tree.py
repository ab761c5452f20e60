"""Stage trees: the transient scheduling view of a search plan (Algorithm 1).

From the plan's unscheduled requests and its checkpoints, build the stages
that serve every request exactly once:

1. Walk back from each request to the latest usable starting point: a
   checkpoint on the same node, the parent's fork point, or initialization.
   The walk is memoised, so shared prefixes are visited once.
2. On each node, sort the points reached (requests, fork points of children,
   starting checkpoints) and cut a stage between each point and the one before
   it. Stages therefore split exactly at fork points and requested iterations.

A point that a running batch will reach is not trained again: stages hanging
from it wait for that batch (``Stage.waits_for``).
"""

from __future__ import annotations

import bisect
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from ray_stagetree.planning._deprecated import moved_names, renamed_attributes
from ray_stagetree.planning._gc import without_gc
from ray_stagetree.planning.plan import PlanNode, Request, RequestState

if TYPE_CHECKING:
    import networkx

    from ray_stagetree.planning.plan import SearchPlan


@renamed_attributes(step="iteration")
@dataclass(frozen=True)
class CheckpointSource:
    """Where a root stage starts: ``(node, iteration)``'s checkpoint, or a fresh
    model when ``node`` is None. (Not a `lifecycle.TrialSource`, where a
    study's trials come from.)"""

    node: PlanNode | None
    iteration: int

    @property
    def is_initialization(self) -> bool:
        return self.node is None


@dataclass(eq=False)
class Stage:
    """Train ``node``'s configuration over iterations ``[start, stop)``."""

    node: PlanNode
    start: int
    stop: int
    parent: Stage | None = None
    source: CheckpointSource | None = None
    waits_for: int | None = None
    requests: list[Request] = field(default_factory=list)
    children: list[Stage] = field(default_factory=list)

    @property
    def iterations(self) -> int:
        return self.stop - self.start

    @property
    def ready(self) -> bool:
        """Can start now: a root stage whose source exists."""
        return self.parent is None and self.waits_for is None

    def __repr__(self) -> str:
        return f"Stage(H{self.node.node_id}, {self.start}->{self.stop})"


@dataclass
class StageTree:
    roots: list[Stage]
    stages: list[Stage]

    @property
    def iterations(self) -> int:
        return sum(stage.iterations for stage in self.stages)

    def requests(self) -> Iterator[Request]:
        for stage in self.stages:
            yield from stage.requests

    def to_networkx(self) -> networkx.DiGraph:
        """The tree as a directed graph of stages (edges parent -> child)."""
        import networkx

        graph = networkx.DiGraph()
        for stage in self.stages:
            graph.add_node(stage, node_id=stage.node.node_id, start=stage.start, stop=stage.stop)
            if stage.parent is not None:
                graph.add_edge(stage.parent, stage)
        return graph


def top_down(tree: StageTree) -> list[Stage]:
    """The tree's stages, every parent before its children."""
    order = list(tree.roots)
    for stage in order:
        order.extend(stage.children)
    return order


def trials_served(tree: StageTree) -> dict[Stage, int]:
    """Each stage's trials: those whose requests end in it or under it."""
    served: dict[Stage, int] = {}
    for stage in reversed(top_down(tree)):
        own = sum(len(request.trials) for request in stage.requests)
        served[stage] = own + sum(served[child] for child in stage.children)
    return served


def _reach(plan_targets: dict[PlanNode, set[int]], node: PlanNode, iteration: int, from_request: bool) -> None:
    """Record that ``(node, iteration)`` must be reached, and what it needs first."""
    while True:
        if not from_request and (iteration in node.checkpoints or iteration in node.parked):
            return
        from_request = False
        targets = plan_targets.setdefault(node, set())
        if iteration in targets:
            return
        targets.add(iteration)
        if node.running_batch_through(iteration) is not None:
            return
        if any(node.fork_iteration < saved < iteration for saved in node.checkpoints) or any(
            node.fork_iteration < parked < iteration for parked in node.parked
        ):
            return
        running = node.latest_running_stop(iteration)
        if running is not None and running[0] > node.fork_iteration:
            return
        if node.parent is None:
            return
        node, iteration = node.parent, node.fork_iteration


def _open(request: Request) -> bool:
    """A request the stage tree serves: unscheduled, and some trial needs it."""
    return request.state is RequestState.NOT_SCHED and bool(request.trials)


def starts_unit(node: PlanNode) -> bool:
    """True when no stage under ``node`` can hang from a stage above it: it is
    a plan root, or it forks at a checkpoint of its parent that no open
    request there trains again (`_reach` stops at that checkpoint). Its
    subtree, down to the next such nodes, is then a unit of replanning: a
    checkpoint at a branch point splits one root's stages into independent
    units, so trials that all share iteration 0 are not one unit."""
    parent = node.parent
    if parent is None:
        return True
    if node.fork_iteration not in parent.checkpoints:
        return False
    request = parent.requests.get(node.fork_iteration)
    return request is None or not _open(request)


def unit_of(node: PlanNode) -> PlanNode:
    """The node that starts the unit of replanning ``node`` is in."""
    while not starts_unit(node):
        node = node.parent  # type: ignore[assignment]  # a root starts its unit: every node above one has a parent
    return node


def _unit_nodes(units: Iterable[PlanNode]) -> list[PlanNode]:
    """The nodes of ``units`` (nodes that `starts_unit`), each down to the
    next unit, in the plan's (id) order."""
    found = []
    pending = list(units)
    while pending:
        node = pending.pop()
        found.append(node)
        pending.extend(child for child in node.children.values() if not starts_unit(child))
    return sorted(found, key=lambda node: node.node_id)


@without_gc
def build_stage_tree(plan: SearchPlan, units: Iterable[PlanNode] | None = None) -> StageTree:
    """Stages serving every unscheduled request of ``plan`` that some trial needs.

    With ``units`` (nodes that `starts_unit`), only their stages: stages
    never cross units, so the stage tree of a whole plan is the union of its
    units' trees, and a caller can rebuild just the units that changed.
    """
    targets: dict[PlanNode, set[int]] = {}
    for node in plan.nodes if units is None else _unit_nodes(units):
        for iteration, request in node.requests.items():
            if _open(request):
                _reach(targets, node, iteration, from_request=True)

    stage_at: dict[tuple[int, int], Stage] = {}
    pending_at: dict[tuple[int, int], int] = {}
    ordered = sorted(targets.items(), key=lambda item: item[0].fork_iteration)
    for node, iterations in ordered:
        for iteration in iterations:
            batch_id = node.running_batch_through(iteration)
            if batch_id is not None:
                pending_at[(node.node_id, iteration)] = batch_id
            else:
                stage = Stage(node, iteration, iteration)
                served = node.requests.get(iteration)
                if served is not None and _open(served):
                    stage.requests.append(served)
                stage_at[(node.node_id, iteration)] = stage

    # Link each stage to the point before it. Parents fork no later than their
    # children, but the points a stage links to were all created above.
    stages: list[Stage] = []
    roots: list[Stage] = []
    for node, iterations in ordered:
        points = sorted(iterations)
        saved = sorted(iteration for iteration in {*node.checkpoints, *node.parked} if iteration > node.fork_iteration)
        for index, iteration in enumerate(points):
            linked = stage_at.get((node.node_id, iteration))
            if linked is None:
                continue
            stage = linked
            previous_target = points[index - 1] if index else None
            position = bisect.bisect_left(saved, iteration)
            previous_saved = saved[position - 1] if position else None
            _link(stage, node, previous_target, previous_saved, stage_at, pending_at)
            stages.append(stage)
            if stage.parent is None:
                roots.append(stage)
            else:
                stage.parent.children.append(stage)
    return StageTree(roots=roots, stages=stages)


def _link(
    stage: Stage,
    node: PlanNode,
    previous_target: int | None,
    previous_saved: int | None,
    stage_at: dict[tuple[int, int], Stage],
    pending_at: dict[tuple[int, int], int],
) -> None:
    """Connect ``stage`` to the latest point before its stop: a target on its
    node (parent stage), a checkpoint, the end of a running segment (wait for
    it), or the parent's fork point."""
    running = node.latest_running_stop(stage.stop)
    previous_running = running[0] if running is not None else None
    candidates = {node.fork_iteration: "fork"}
    for point, kind in ((previous_running, "running"), (previous_saved, "saved"), (previous_target, "target")):
        if point is not None and point >= node.fork_iteration:
            candidates[point] = kind
    start = max(candidates)
    kind = candidates[start] if start > node.fork_iteration else "fork"
    stage.start = start
    if kind == "saved":
        stage.source = CheckpointSource(node, start)
        return
    if kind == "running":
        assert running is not None  # "running" is a candidate only when there is a running segment
        stage.source, stage.waits_for = CheckpointSource(node, start), running[1]
        return
    if kind == "target":
        anchor = node
    elif node.parent is None:
        stage.source = CheckpointSource(None, 0)
        return
    else:
        anchor = node.parent
    key = (anchor.node_id, start)
    if key in pending_at:
        stage.waits_for = pending_at[key]
        stage.source = CheckpointSource(anchor, start)
    elif key in stage_at:
        stage.parent = stage_at[key]
    else:
        stage.source = CheckpointSource(anchor, start)


# `CheckpointSource` was called `Source` before the vocabulary rename.
__getattr__ = moved_names(__name__, {"Source": f"{__name__}.CheckpointSource"})
