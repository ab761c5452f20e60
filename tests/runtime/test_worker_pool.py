"""The controller's stage workers (runtime.control.worker_pool), without
Ray: fake workers and references, a test clock."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest

from ray_stagetree.runtime.control.worker_pool import WorkerPool


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def pool_of(capacity: int, clock: Clock | None = None) -> tuple[WorkerPool, list[str]]:
    started: list[str] = []
    names = (f"new{i}" for i in itertools.count())

    def start() -> str:
        started.append(next(names))
        return started[-1]

    return WorkerPool(start, capacity, clock or Clock()), started


def batch(batch_id: int) -> SimpleNamespace:
    return SimpleNamespace(batch_id=batch_id)


def test_the_longest_idle_worker_takes_the_next_batch_and_a_new_one_starts_when_none_is_idle():
    pool, started = pool_of(3)
    pool.adopt(["w0", "w1"])
    assert pool.idle_count() == 3
    assert pool.take() == "w0"
    pool.returned("w0")
    assert pool.take() == "w1" and pool.take() == "w0"
    assert started == []
    assert pool.take() == "new0"
    assert started == ["new0"] and pool.workers == ["w0", "w1", "new0"]


def test_running_batches_count_against_the_capacity_until_they_finish():
    pool, _ = pool_of(2)
    pool.adopt(["w0", "w1"])
    spec = object()
    pool.dispatched("ref0", pool.take(), batch(7), spec)
    assert pool.idle_count() == 1 and pool.worker_of(7) == "w0"
    assert pool.running_workers() == {7: "w0"}
    running = pool.finished("ref0")
    assert (running.worker, running.batch.batch_id, running.spec) == ("w0", 7, spec)
    assert pool.idle_count() == 2 and pool.running == {}
    # Its worker is still asked for the batch's checkpoints until the outcome is folded in.
    assert pool.worker_of(7) == "w0"
    pool.folded(7)
    assert pool.worker_of(7) is None
    with pytest.raises(KeyError):
        pool.finished("ref0")


def test_a_parked_trainables_worker_is_taken_out_of_the_idle_ones():
    pool, started = pool_of(2)
    pool.adopt(["w0", "w1"])
    assert pool.take_parked("w1") == "w1"
    assert pool.idle == ["w0"] and started == []


def test_a_lost_worker_goes_and_the_capacity_shrinks_to_what_the_cluster_holds():
    pool, _ = pool_of(4)
    pool.adopt(["w0", "w1", "w2", "w3"])
    pool.lost("w2", fits=2, most=4)
    assert pool.workers == ["w0", "w1", "w3"] and pool.capacity == 2
    pool.lost("w1", fits=0, most=4)  # at least one: a node may come back
    assert pool.capacity == 1
    pool.lost("w0", fits=math.inf, most=4)  # and never more than the study asked for
    assert pool.capacity == 4
    pool.lost("gone", fits=3, most=4)  # shut down by the driver already: nothing to remove
    assert pool.workers == ["w3"] and pool.capacity == 3


def test_a_batch_is_stalled_after_a_silence_counted_from_its_dispatch_or_last_report():
    clock = Clock()
    pool, _ = pool_of(2, clock)
    pool.adopt(["w0", "w1"])
    pool.dispatched("ref0", pool.take(), batch(1), None)
    clock.now += 10
    pool.dispatched("ref1", pool.take(), batch(2), None)
    clock.now += 50
    assert [(b.batch_id, s) for b, s in pool.stalled(60)] == [(1, 60)]
    pool.heard(1)
    clock.now += 5
    assert [(b.batch_id, s) for b, s in pool.stalled(60)] == []
    assert [(b.batch_id, s) for b, s in pool.stalled(5)] == [(1, 5), (2, 55)]
    pool.finished("ref0")
    pool.dispatched("ref2", pool.take(), batch(1), None)  # the same batch id again: silent since now
    assert [b.batch_id for b, _ in pool.stalled(1)] == [2]


def test_shutting_down_kills_every_worker_once():
    pool, _ = pool_of(2)
    pool.adopt(["w0", "w1"])
    pool.take(), pool.take(), pool.take()
    killed: list[str] = []
    pool.shut_down(killed.append)
    assert killed == ["w0", "w1", "new0"] and pool.workers == []
    pool.shut_down(killed.append)
    assert len(killed) == 3


def test_a_replacement_worker_ray_cannot_place_gives_its_batch_back():
    """A node is lost: the worker started in place of its worker was counted
    on it. Unheard for long enough while the live nodes hold fewer workers
    than the study has, its batch is taken back and the worker goes."""
    clock = Clock()
    pool, started = pool_of(2, clock)
    pool.adopt(["w0", "w1"])
    pool.dispatched("r0", pool.take(), batch(0), None)
    pool.dispatched("r1", pool.take(), batch(1), None)
    pool.finished("r1")
    pool.lost("w1", fits=2, most=2)  # its node is still counted
    pool.dispatched("r2", pool.take(), batch(1), None)  # the retry, on a replacement
    assert started == ["new0"] and pool.starting == {"new0": 50.0}
    asked = []

    def fits() -> float:
        asked.append(1)
        return 1

    clock.now += 9
    assert pool.unplaced(10, fits) == [] and asked == []  # not yet: a loaded machine starts workers slowly
    clock.now += 1
    assert [ref for ref, _ in pool.unplaced(10, lambda: 2)] == []  # the cluster holds it: only slow
    ((ref, running),) = pool.unplaced(10, fits)
    assert ref == "r2" and running.worker == "new0" and running.batch.batch_id == 1
    withdrawn = pool.withdraw(ref, fits=1, most=2)
    assert withdrawn.worker == "new0" and pool.workers == ["w0"] and pool.capacity == 1
    assert "r2" not in pool.running and pool.worker_of(1) is None and pool.starting == {}
    assert [ref for ref, _ in pool.unplaced(0, fits)] == []  # w0 is not a replacement


def test_a_replacement_heard_from_is_placed():
    clock = Clock()
    pool, _ = pool_of(1, clock)
    pool.dispatched("r0", pool.take(), batch(0), None)
    pool.heard(0)
    clock.now += 60
    assert pool.starting == {} and pool.unplaced(10, lambda: 0) == []
