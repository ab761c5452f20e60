"""The study controller's stage workers: which are placed, which are idle,
which batch runs where and since when, how many the cluster still holds.

Ray-free: the controller gives it what starts a worker (an actor of
`spec.WorkerSpec.start`; a test passes anything) and what signals that Ray
placed one (a call that returns once the actor runs), and tells it when a
worker died and how many the cluster's nodes now hold
(`resources.workers_that_fit`); this keeps the books.

A batch only ever goes to a placed worker. A started actor may wait for
Ray to place it for as long as the cluster is full (other studies' workers
hold it, or a lost node was still counted when it started): a batch sent to
it would wait as long, while a placed worker of the same study sat idle,
and studies that each held the other's resources this way waited for ever
(issue 31, four concurrent studies).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ray_stagetree.execution.batches import BatchSpec
from ray_stagetree.planning.policies import StageBatch


@dataclass
class Running:
    """A batch dispatched to a worker, until its outcome is read."""

    worker: Any
    batch: StageBatch
    spec: BatchSpec
    dispatched: float  # the pool's clock() when it was dispatched


class WorkerPool:
    """A study's stage workers.

    Parameters
    ----------
    start:
        Starts one more worker: the pool keeps ``capacity`` of them, and
        starts one in place of a worker that died or was retired at once.
    capacity:
        How many workers the study has, and how many batches run at once
        (``StudySpec.num_workers``); fewer once nodes are lost (`lost`).
    placement:
        What signals that Ray placed a worker: called once per worker, it
        returns a reference that resolves once the worker runs (the
        controller awaits it and then calls `placed`).
    clock:
        Seconds now (``time.monotonic``; a test passes its own).
    """

    def __init__(
        self,
        start: Callable[[], Any],
        capacity: int,
        placement: Callable[[Any], Any],
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._start = start
        self.capacity = capacity
        self._placement = placement
        self._clock = clock
        self.workers: list[Any] = []  # every live worker, placed or not, in the order they started
        self.idle: list[Any] = []  # placed workers without a batch, the longest idle first
        self.starting: dict[Any, Any] = {}  # the placement signal of each worker not placed yet -> the worker
        self.running: dict[Any, Running] = {}  # the reference of each running batch's outcome -> the batch
        self._of_batch: dict[int, Any] = {}  # batch id -> its worker, until the batch's outcome is folded in
        self._heard: dict[int, float] = {}  # batch id -> clock() of its last report
        # Workers are started in place of those that go only between `adopt` and `shut_down`.
        self._replacing = False

    def adopt(self, workers: Iterable[Any]) -> None:
        """The workers started with the controller: each is idle once placed
        (and more start if the capacity grew before, `grow`)."""
        for worker in workers:
            self._add(worker)
        self._replacing = True
        self._fill()

    def _add(self, worker: Any) -> None:
        self.workers.append(worker)
        self.starting[self._placement(worker)] = worker

    def _fill(self) -> None:
        """Start workers until the study has ``capacity`` of them."""
        while self._replacing and len(self.workers) < self.capacity:
            self._add(self._start())

    def placed(self, signal: Any) -> None:
        """The worker behind ``signal`` (see ``placement``) runs: it may take
        batches. (One whose actor died before it ran is placed too: its batch
        fails as a dead worker's, `lost`, and the trials it served are retried.)"""
        worker = self.starting.pop(signal)
        if worker in self.workers:  # not lost or shut down meanwhile
            self.idle.append(worker)

    def grow(self, capacity: int) -> None:
        """Run up to ``capacity`` batches at once (a plan service's new study asks for more workers)."""
        if capacity > self.capacity:
            self.capacity = capacity
            self._fill()

    def idle_count(self) -> int:
        """How many more batches may start now: on placed idle workers."""
        return max(0, min(len(self.idle), self.capacity - len(self.running)))

    def take(self) -> Any:
        """A placed idle worker (`idle_count` says how many there are)."""
        # The longest idle first: at the start, the first placed worker takes
        # the highest-priority batch, the oldest trial in admission order,
        # which then reports first, as Tune's first trial does (issue 31).
        return self.idle.pop(0)

    def take_parked(self, worker: Any) -> Any:
        """The idle ``worker``, whose parked trainable the next batch continues."""
        self.idle.remove(worker)
        return worker

    def dispatched(self, ref: Any, worker: Any, batch: StageBatch, spec: BatchSpec) -> None:
        """``batch`` runs on ``worker``; ``ref`` is what its outcome comes back through."""
        self._of_batch[batch.batch_id] = worker
        self.running[ref] = Running(worker, batch, spec, self._clock())

    def heard(self, batch_id: int) -> None:
        """The batch reported (`stalled` counts its silence from now)."""
        self._heard[batch_id] = self._clock()

    def worker_of(self, batch_id: int) -> Any | None:
        """The worker of a batch whose outcome is not folded in yet."""
        return self._of_batch.get(batch_id)

    def finished(self, ref: Any) -> Running:
        """The batch behind ``ref`` ended (its outcome, or its failure, is read now)."""
        running = self.running.pop(ref)
        self._heard.pop(running.batch.batch_id, None)
        return running

    def folded(self, batch_id: int) -> None:
        """The batch's outcome is folded in: its worker is no longer asked for its checkpoints."""
        self._of_batch.pop(batch_id, None)

    def returned(self, worker: Any) -> None:
        """``worker`` is idle again."""
        self.idle.append(worker)

    def retire(self, worker: Any) -> None:
        """``worker`` runs no more batches (a rank of its group failed): it
        goes, and a fresh one starts in its place."""
        self._forget(worker)
        self._fill()

    def lost(self, worker: Any, fits: float, most: int) -> None:
        """``worker`` died (its node may be gone): it goes, and the study has
        no more than ``fits`` workers (what the cluster's live nodes hold),
        at least one and at most ``most``, from now on; one starts in its
        place if that leaves room (it takes batches once Ray places it)."""
        self._forget(worker)
        self.capacity = max(1, min(most, fits))
        self._fill()

    def _forget(self, worker: Any) -> None:
        if worker in self.workers:  # not when the driver shut the workers down (an interrupted fit)
            self.workers.remove(worker)
        if worker in self.idle:
            self.idle.remove(worker)
        for signal in [signal for signal, starting in self.starting.items() if starting is worker]:
            del self.starting[signal]

    def running_workers(self) -> dict[int, Any]:
        """Batch id -> worker, of every running batch."""
        return {running.batch.batch_id: running.worker for running in self.running.values()}

    def stalled(self, after_s: float) -> list[tuple[StageBatch, float]]:
        """(batch, seconds) of each running batch that has reported nothing
        for ``after_s`` seconds, or not since it was dispatched."""
        now = self._clock()
        stalled = []
        for running in self.running.values():
            silent = now - self._heard.get(running.batch.batch_id, running.dispatched)
            if silent >= after_s:
                stalled.append((running.batch, silent))
        return stalled

    def shut_down(self, kill: Callable[[Any], None]) -> None:
        """``kill`` every worker; none starts after this."""
        self._replacing = False
        for worker in self.workers:
            kill(worker)
        self.workers.clear()
        self.idle.clear()
        self.starting.clear()
