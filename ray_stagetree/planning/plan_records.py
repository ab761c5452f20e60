"""The search plan's records (`plan.SearchPlan` holds them): its nodes
(`PlanNode`), the requests trials make on them (`Request`, `RequestState`),
each trial's record, checkpoints, running batches, the runs and timings
the cost model and the monitor read. Pure Python."""

from __future__ import annotations

import enum
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Protocol

from ray_stagetree.planning._deprecated import renamed_attributes
from ray_stagetree.planning.config import TrialConfig


class RequestState(str, enum.Enum):
    NOT_SCHED = "NOT_SCHED"
    SCHED = "SCHED"


@dataclass(frozen=True)
class CheckpointInfo:
    """A checkpoint the plan can start stages from: its durable copy's
    ``path`` (relative to the experiment directory; None while only an
    in-memory copy exists), size and checksum. Only plain values, all of
    them persisted: where the runtime keeps the in-memory copy is the
    checkpoint store's business, not the plan's."""

    path: str | None = None
    size_bytes: int = 0
    checksum: str | None = None


@renamed_attributes(step="iteration")
@dataclass(eq=False)
class Request:
    """Train ``node`` up to ``iteration`` and report: serves one or more trials."""

    node: PlanNode
    iteration: int
    trials: set[str] = field(default_factory=set)
    state: RequestState = RequestState.NOT_SCHED
    batch_id: int | None = None

    @property
    def answered(self) -> bool:
        return self.iteration in self.node.metrics

    @property
    def cancellable(self) -> bool:
        """A scheduled request whose trials were all removed."""
        return not self.trials

    def __repr__(self) -> str:
        return (
            f"Request(node={self.node.node_id}, iteration={self.iteration}, "
            f"state={self.state.value}, trials={sorted(self.trials)})"
        )


@renamed_attributes(fork_step="fork_iteration")
class PlanNode:
    """One configuration, forked from ``parent`` at ``fork_iteration``."""

    __slots__ = (
        "node_id",
        "config",
        "parent",
        "fork_iteration",
        "children",
        "_checkpoints",
        "parked",
        "metrics",
        "requests",
        "running",
        "trained",
        "trials",
    )

    def __init__(self, node_id: int, config: TrialConfig, parent: PlanNode | None, fork_iteration: int):
        self.node_id = node_id
        self.config = config
        self.parent = parent
        self.fork_iteration = fork_iteration
        self.children: dict[tuple, PlanNode] = {}
        # Written by the SearchPlan alone (`record_checkpoint`, `drop_checkpoint`),
        # which keeps the stage trees' change log; everyone else reads `checkpoints`.
        self._checkpoints: dict[int, CheckpointInfo] = {}
        # Steps where a trainable that keeps no checkpoint waits, alive, on a
        # worker (`record_parked`): a stage of this node can continue from
        # there. Runtime state: never persisted.
        self.parked: set[int] = set()
        self.metrics: dict[int, dict[str, Any]] = {}
        self.requests: dict[int, Request] = {}
        # batch id -> (start, stop) segment of this node a running batch trains
        self.running: dict[int, tuple[int, int]] = {}
        # batch id -> the last iteration that batch has trained on this node so far
        self.trained: dict[int, int] = {}
        # trials whose current request is on this node
        self.trials: set[str] = set()

    @property
    def checkpoints(self) -> Mapping[int, CheckpointInfo]:
        """Iteration -> the checkpoint there, read-only (a view, made per call,
        so that a node still pickles)."""
        return MappingProxyType(self._checkpoints)

    def running_batch_through(self, iteration: int) -> int | None:
        """A running batch that will reach ``iteration`` on this node, if any (one
        that passed it already serves it only with the checkpoint it left)."""
        for batch_id, (start, stop) in self.running.items():
            trained = self.trained.get(batch_id, start)
            if start < iteration <= stop and (trained < iteration or iteration in self._checkpoints):
                return batch_id
            # At the end of its segment a batch hears first whether it goes
            # on, and then saves the end's checkpoint if it stops there.
            if iteration == stop == self.trained.get(batch_id):
                return batch_id
        return None

    def latest_running_stop(self, before: int) -> tuple[int, int] | None:
        """``(stop, batch_id)`` of the running segment on this node that ends
        last before ``before``: a checkpoint that will exist there."""
        ends = [(stop, batch_id) for batch_id, (_, stop) in self.running.items() if stop < before]
        return max(ends, default=None)

    def ancestors(self) -> Iterator[PlanNode]:
        node = self.parent
        while node is not None:
            yield node
            node = node.parent

    def __repr__(self) -> str:
        parent = None if self.parent is None else self.parent.node_id
        return f"PlanNode({self.node_id}, parent={parent}, fork_iteration={self.fork_iteration})"


@renamed_attributes(study="share_key")
@dataclass(eq=False)
class TrialRecord:
    trial_id: str
    config: TrialConfig
    share_key: str
    request: Request


@dataclass(eq=False)
class RunningBatch:
    """A dispatched stage batch: the segments it trains and the requests it serves."""

    batch_id: int
    segments: list[tuple[PlanNode, int, int]]
    requests: list[Request] = field(default_factory=list)


@dataclass(frozen=True)
class BatchRun:
    """When a stage batch ran and on which worker, for the monitor's
    timeline: ``segments`` ``(node_id, start, stop)`` as dispatched,
    ``began`` and ``ended`` wall-clock seconds (``time.time()``), ``worker``
    the worker's number (1, 2, ...) and ``outcome`` ("done", "failed" or
    "released": its batch was handed back unrun or cut short)."""

    batch_id: int
    worker: int
    segments: tuple[tuple[int, int, int], ...]
    began: float
    ended: float
    outcome: str = "done"
    # Seconds by phase (`runtime.workers.phases`: dispatch, fetch, restore, train, save, report, the trainable's own).
    phases: tuple[tuple[str, float], ...] = ()


@dataclass(frozen=True)
class Timing:
    """Profile of one trained segment, input of the cost model."""

    node_id: int
    start: int
    stop: int
    seconds: float


class OpenTrialsWatcher(Protocol):
    """Told when trials start or stop waiting on an open (unanswered)
    request, so that counts over open requests are kept without walking
    them (`planning.fair_share`)."""

    def opened(self, trial_ids: Iterable[str]) -> None: ...

    def closed(self, trial_ids: Iterable[str]) -> None: ...
