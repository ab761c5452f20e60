"""The study controller's stage workers: which are idle, which batch runs
where and since when, how many the cluster still holds.

Ray-free: the controller gives it what starts a worker (an actor of
`spec.WorkerSpec.start`; a test passes anything) and tells it when a
worker died and how many the cluster's nodes now hold
(`resources.workers_that_fit`); this keeps the books.
"""

from __future__ import annotations

import math
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
        Starts one more worker (one that died is replaced when a batch needs it).
    capacity:
        How many batches run at once (``StudySpec.num_workers``); fewer once
        nodes are lost (`lost`).
    clock:
        Seconds now (``time.monotonic``; a test passes its own).
    """

    def __init__(self, start: Callable[[], Any], capacity: int, clock: Callable[[], float] = time.monotonic) -> None:
        self._start = start
        self.capacity = capacity
        self._clock = clock
        self.workers: list[Any] = []  # every live worker, in the order they started
        self.idle: list[Any] = []  # the longest idle first
        self.running: dict[Any, Running] = {}  # the reference of each running batch's outcome -> the batch
        self._of_batch: dict[int, Any] = {}  # batch id -> its worker, until the batch's outcome is folded in
        self._heard: dict[int, float] = {}  # batch id -> clock() of its last report
        self.starting: dict[Any, float] = {}  # a replacement worker not heard from yet -> clock() it started

    def adopt(self, workers: Iterable[Any]) -> None:
        """The workers started with the controller, all idle."""
        self.workers, self.idle = list(workers), list(workers)

    def idle_count(self) -> int:
        """How many more batches may start now."""
        return self.capacity - len(self.running)

    def take(self) -> Any:
        """An idle worker, or a new one in place of one that died."""
        if self.idle:
            # The longest idle first: at the start, the first started (and
            # likely first ready) worker takes the highest-priority batch, the
            # oldest trial in admission order, which then reports first, as
            # Tune's first trial does (issue 31).
            return self.idle.pop(0)
        worker = self._start()
        self.workers.append(worker)
        self.starting[worker] = self._clock()
        return worker

    def take_parked(self, worker: Any) -> Any:
        """The idle ``worker``, whose parked trainable the next batch continues."""
        self.idle.remove(worker)
        return worker

    def dispatched(self, ref: Any, worker: Any, batch: StageBatch, spec: BatchSpec) -> None:
        """``batch`` runs on ``worker``; ``ref`` is what its outcome comes back through."""
        self._of_batch[batch.batch_id] = worker
        self.running[ref] = Running(worker, batch, spec, self._clock())

    def heard(self, batch_id: int) -> None:
        """The batch reported (`stalled` counts its silence from now): its worker runs."""
        self._heard[batch_id] = self._clock()
        self.starting.pop(self._of_batch.get(batch_id), None)

    def worker_of(self, batch_id: int) -> Any | None:
        """The worker of a batch whose outcome is not folded in yet."""
        return self._of_batch.get(batch_id)

    def finished(self, ref: Any) -> Running:
        """The batch behind ``ref`` ended (its outcome, or its failure, is read now)."""
        running = self.running.pop(ref)
        self._heard.pop(running.batch.batch_id, None)
        self.starting.pop(running.worker, None)
        return running

    def folded(self, batch_id: int) -> None:
        """The batch's outcome is folded in: its worker is no longer asked for its checkpoints."""
        self._of_batch.pop(batch_id, None)

    def returned(self, worker: Any) -> None:
        """``worker`` is idle again."""
        self.idle.append(worker)

    def retire(self, worker: Any) -> None:
        """``worker`` runs no more batches (a rank of its group failed): it
        goes, and a fresh one starts when a batch needs it (`take`)."""
        self.workers.remove(worker)

    def lost(self, worker: Any, fits: float, most: int) -> None:
        """``worker`` died (its node may be gone): it goes, and no more than
        ``fits`` workers (what the cluster's live nodes hold), at least one
        and at most ``most``, run from now on."""
        if worker in self.workers:  # not when the driver shut the workers down (an interrupted fit)
            self.workers.remove(worker)
        self.starting.pop(worker, None)
        self.capacity = max(1, min(most, fits))

    def unplaced(self, after_s: float, fits: Callable[[], float]) -> list[tuple[Any, Running]]:
        """(ref, batch) of each running batch whose worker, started in place
        of one that died, has not been heard from for ``after_s`` seconds
        while the cluster's live nodes hold fewer workers than the study has
        (``fits()``, asked only then): a worker Ray cannot place (its node
        was counted before Ray saw it gone). The newest such workers first,
        as many as exceed what fits."""
        now = self._clock()
        waiting = [
            (ref, running)
            for ref, running in self.running.items()
            if running.worker in self.starting and now - self.starting[running.worker] >= after_s
        ]
        if not waiting:
            return []
        excess = len(self.workers) - fits()
        waiting.sort(key=lambda item: self.starting[item[1].worker], reverse=True)
        return waiting[: max(0, int(math.ceil(excess)))]

    def withdraw(self, ref: Any, fits: float, most: int) -> Running:
        """Take the batch behind ``ref`` back from its unplaced worker (see
        `unplaced`), which goes: the batch never ran, so it runs again
        elsewhere, and no more than ``fits`` workers run from now on."""
        running = self.finished(ref)
        self.folded(running.batch.batch_id)
        self.lost(running.worker, fits, most)
        return running

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
        """``kill`` every worker."""
        for worker in self.workers:
            kill(worker)
        self.workers.clear()
