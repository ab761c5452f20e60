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

Workers have a `worker_shapes.Shape`: all start with one trial's resources,
and a batch whose trials a ``ResourceChangingScheduler`` gave others needs
a worker that covers them. Where none is idle the pool makes room for one:
it retires idle workers that do not cover it (and then each that comes
back, until it fits), and starts it; no worker of the study's own shape
starts meanwhile.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ray_stagetree.execution.batches import BatchSpec
from ray_stagetree.planning.policies import StageBatch
from ray_stagetree.runtime.control.worker_shapes import Shape


@dataclass
class Running:
    """A batch dispatched to a worker, until its outcome is read."""

    worker: Any
    batch: StageBatch
    spec: BatchSpec
    dispatched: float  # the pool's clock() when it was dispatched
    trials: frozenset[str] = frozenset()  # those it was dispatched for (its requests' trials then)


class WorkerPool:
    """A study's stage workers.

    Parameters
    ----------
    start:
        Starts one more worker of a `Shape`: the pool keeps ``capacity``
        of them, and starts one in place of a worker that died or was
        retired at once.
    capacity:
        How many workers the study has, and how many batches run at once
        (``StudySpec.num_workers``); fewer once nodes are lost (`lost`).
    placement:
        What signals that Ray placed a worker: called once per worker, it
        returns a reference that resolves once the worker runs (the
        controller awaits it and then calls `placed`).
    clock:
        Seconds now (``time.monotonic``; a test passes its own).
    shape:
        The shape the study's workers start with (one trial's resources).
    room:
        Whether workers of the given shapes fit the cluster together; asked
        only once a worker of another shape than ``shape`` lives or waits.
    stop:
        Stops a worker the pool retires to make room for another shape.
    """

    def __init__(
        self,
        start: Callable[[], Any],
        capacity: int,
        placement: Callable[[Any], Any],
        clock: Callable[[], float] = time.monotonic,
        shape: Shape | None = None,
        room: Callable[[list[Shape]], bool] = lambda shapes: True,
        stop: Callable[[Any], None] = lambda worker: None,
    ) -> None:
        self._start = start
        self.shape = Shape() if shape is None else shape
        self._room = room
        self._stop = stop
        self.shapes: dict[Any, Shape] = {}  # each live worker's shape
        self._wanted: Shape | None = None  # a shape a ready batch needs, waiting for room
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
            self._add(worker, self.shape)
        self._replacing = True
        self._fill()

    def _add(self, worker: Any, shape: Shape) -> None:
        self.workers.append(worker)
        self.shapes[worker] = shape
        self.starting[self._placement(worker)] = worker

    def _fill(self) -> None:
        """Start workers until the study has ``capacity`` of them (of its
        own shape, while no other waits for room and they fit)."""
        while self._replacing and len(self.workers) < self.capacity and self._wanted is None:
            if not self._fits(self.shape):
                break
            self._add(self._start(self.shape), self.shape)

    def _fits(self, shape: Shape) -> bool:
        """Whether a worker of ``shape`` fits beside the live ones (the
        study's own shape always does among its own: its capacity was sized to the cluster)."""
        held = list(self.shapes.values())
        if shape == self.shape and all(other == self.shape for other in held):
            return True
        return self._room([*held, shape])

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

    def take(self, shape: Shape | None = None) -> Any | None:
        """A placed idle worker that covers ``shape`` (the study's own by
        default), one of that very shape first; None if none is idle
        (`want` makes room for one)."""
        needed = self.shape if shape is None else shape
        # The longest idle first: at the start, the first placed worker takes
        # the highest-priority batch, the oldest trial in admission order,
        # which then reports first, as Tune's first trial does (issue 31).
        exact = [worker for worker in self.idle if self.shapes[worker] == needed]
        covering = exact or [worker for worker in self.idle if self.shapes[worker].covers(needed)]
        if not covering:
            return None
        self.idle.remove(covering[0])
        return covering[0]

    def want(self, shape: Shape) -> None:
        """A ready batch needs a worker of ``shape`` and none idle covers it:
        start one, retiring idle workers that do not cover it until it fits
        (more retire as they come back, `returned`). Nothing if one is on its way."""
        if any(self.shapes[worker].covers(shape) for worker in self.starting.values()):
            return
        self._wanted = shape
        self._make_room()

    def reshaping(self) -> bool:
        """Whether a worker of another shape than the study's waits for room or for Ray to place it."""
        return self._wanted is not None or any(self.shapes[w] != self.shape for w in self.starting.values())

    def _make_room(self) -> None:
        wanted = self._wanted
        if wanted is None:
            return
        while not self._fits(wanted):
            spare = next((worker for worker in self.idle if not self.shapes[worker].covers(wanted)), None)
            if spare is None:
                return  # running workers hold the room: they retire as they come back
            self._forget(spare)
            self._stop(spare)
        self._wanted = None
        self._add(self._start(wanted), wanted)

    def take_parked(self, worker: Any) -> Any:
        """The idle ``worker``, whose parked trainable the next batch continues."""
        self.idle.remove(worker)
        return worker

    def dispatched(self, ref: Any, worker: Any, batch: StageBatch, spec: BatchSpec) -> None:
        """``batch`` runs on ``worker``; ``ref`` is what its outcome comes back through."""
        self._of_batch[batch.batch_id] = worker
        trials = frozenset(t for request in batch.requests for t in request.trials)
        self.running[ref] = Running(worker, batch, spec, self._clock(), trials)

    def heard(self, batch_id: int) -> None:
        """The batch reported (`stalled` counts its silence from now)."""
        self._heard[batch_id] = self._clock()

    def worker_of(self, batch_id: int) -> Any | None:
        """The worker of a batch whose outcome is not folded in yet."""
        return self._of_batch.get(batch_id)

    def runs_on(self, batch_id: int, shape: Shape) -> bool:
        """Whether the running batch's worker covers ``shape`` (True for a batch not running)."""
        worker = self._of_batch.get(batch_id)
        return worker is None or self.shapes[worker].covers(shape)

    def finished(self, ref: Any) -> Running:
        """The batch behind ``ref`` ended (its outcome, or its failure, is read now)."""
        running = self.running.pop(ref)
        self._heard.pop(running.batch.batch_id, None)
        return running

    def folded(self, batch_id: int) -> None:
        """The batch's outcome is folded in: its worker is no longer asked for its checkpoints."""
        self._of_batch.pop(batch_id, None)

    def returned(self, worker: Any) -> None:
        """``worker`` is idle again (or retires, while a worker of another
        shape waits for the room it holds)."""
        self.idle.append(worker)
        self._make_room()

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
        self.shapes.pop(worker, None)
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

    def shut_down(self, kill: Callable[[Any], None], keep: Iterable[Any] = ()) -> list[Any]:
        """``kill`` every worker but those of ``keep`` of the study's own
        shape that run no batch, which it returns (the driver's next study
        may run on them); none starts after this."""
        self._replacing = False
        busy = [running.worker for running in self.running.values()]
        kept = [worker for worker in keep if self.shapes.get(worker) == self.shape and worker not in busy]
        for worker in self.workers:
            if worker not in kept:
                kill(worker)
        self.workers.clear()
        self.idle.clear()
        self.starting.clear()
        self.shapes.clear()
        self._wanted = None
        return kept
