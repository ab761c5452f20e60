"""Parked trainables: paused trials whose trainable keeps no checkpoint.

Synchronous HyperBand pauses a trial at each rung until the other trials of
its bracket get there, then resumes the best. A trial resumed from a
checkpoint costs a restore; one whose trainable keeps no checkpoint would
train again from scratch, as under Tune. Instead its batch ends with the
trainable parked: alive on its worker, waiting (`runtime.workers.worker`). The
worker takes other batches meanwhile. The plan knows the point as parked
(`SearchPlan.record_parked`), so the stage that continues the trial starts
there, and it goes to that worker only (`Parking.admit`), once it is idle.

A parked trainable holds its memory, a GPU model's included: a worker keeps
at most ``per_worker`` of them, releasing the oldest past that (its trial,
if resumed, trains again from scratch). One that no live trial needs any
more is released at once (`Parking.unneeded`).
"""

from __future__ import annotations

import collections
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ray_stagetree.planning.plan import PlanNode, SearchPlan
from ray_stagetree.planning.policies import StageBatch

#: Parked trainables one worker keeps by default.
PARKED_PER_WORKER = 16


@dataclass(eq=False)
class ParkedTrainable:
    worker: Any
    batch_id: int  # the batch it parked at the end of: the worker's name for it
    node: PlanNode
    iteration: int


class Parking:
    """The controller's record of parked trainables, by plan point and by worker."""

    def __init__(self, plan: SearchPlan, per_worker: int = PARKED_PER_WORKER) -> None:
        self.plan = plan
        self.per_worker = per_worker
        self._at: dict[tuple[int, int], ParkedTrainable] = {}
        self._by_worker: dict[Any, collections.deque[ParkedTrainable]] = collections.defaultdict(collections.deque)

    def __len__(self) -> int:
        return len(self._at)

    def wanted(self, node: PlanNode, iteration: int, paused: Callable[[str], bool]) -> bool:
        """Should a batch ending at ``(node, iteration)`` without a checkpoint park?
        Yes where a trial through that point is paused there, and parking is on."""
        return self.per_worker > 0 and any(paused(trial_id) for trial_id in self.plan.trials_through(node, iteration))

    def park(self, worker: Any, batch_id: int, node: PlanNode, iteration: int) -> list[ParkedTrainable]:
        """The batch ended parked; returns the ones to release to make room."""
        parked = ParkedTrainable(worker, batch_id, node, iteration)
        evicted = [self._at[(node.node_id, iteration)]] if (node.node_id, iteration) in self._at else []
        for old in evicted:
            self.take(old)
        self._at[(node.node_id, iteration)] = parked
        queue = self._by_worker[worker]
        queue.append(parked)
        self.plan.record_parked(node.node_id, iteration)
        while len(queue) > self.per_worker:
            oldest = queue[0]
            self.take(oldest)
            evicted.append(oldest)
        return evicted

    def source_of(self, batch: StageBatch) -> ParkedTrainable | None:
        """The parked trainable ``batch`` continues, if it starts from one."""
        source = batch.source
        if source is None or source.node is None:
            return None
        return self._at.get((source.node.node_id, source.iteration))

    def admit(self, idle: Iterable[Any]) -> Callable[[StageBatch], bool]:
        """An ``admit`` for `ExecutionPolicy.select`: a batch that continues a
        parked trainable only while its worker is idle, one such batch per worker."""
        free = set(idle)

        def admit(batch: StageBatch) -> bool:
            parked = self.source_of(batch)
            if parked is None:
                return True
            if parked.worker not in free:
                return False
            free.discard(parked.worker)
            return True

        return admit

    def take(self, parked: ParkedTrainable) -> None:
        """Forget ``parked``: it went on with a batch, or is being released."""
        if self._at.get((parked.node.node_id, parked.iteration)) is not parked:
            return
        del self._at[(parked.node.node_id, parked.iteration)]
        self._by_worker[parked.worker].remove(parked)
        if not self._by_worker[parked.worker]:
            del self._by_worker[parked.worker]
        self.plan.drop_parked(parked.node.node_id, parked.iteration)

    def unneeded(self, unfinished: Callable[[str], bool]) -> list[ParkedTrainable]:
        """Parked trainables no unfinished trial passes through any more, forgotten."""
        gone = [
            parked
            for parked in self._at.values()
            if not any(map(unfinished, self.plan.trials_through(parked.node, parked.iteration)))
        ]
        for parked in gone:
            self.take(parked)
        return gone

    def forget_worker(self, worker: Any) -> None:
        """The worker died, and its parked trainables with it."""
        for parked in list(self._by_worker.get(worker, ())):
            self.take(parked)
