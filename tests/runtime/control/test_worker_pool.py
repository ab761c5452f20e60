"""The controller's stage workers (runtime.control.worker_pool), without
Ray: fake workers and references, a test clock."""

from __future__ import annotations

import itertools
import math
from types import SimpleNamespace

import pytest

from ray_stagetree.runtime.control.worker_pool import WorkerPool
from ray_stagetree.runtime.control.worker_shapes import Shape, fits


class Clock:
    def __init__(self) -> None:
        self.now = 50.0

    def __call__(self) -> float:
        return self.now


def pool_of(capacity: int, clock: Clock | None = None) -> tuple[WorkerPool, list[str]]:
    """A pool whose workers' placement signals are ``placed-<worker>``."""
    started: list[str] = []
    names = (f"new{i}" for i in itertools.count())

    def start(shape: object = None) -> str:
        started.append(next(names))
        return started[-1]

    return WorkerPool(start, capacity, lambda worker: f"placed-{worker}", clock or Clock()), started


def adopt_placed(pool: WorkerPool, workers: list[str]) -> None:
    pool.adopt(workers)
    for worker in workers:
        pool.placed(f"placed-{worker}")


def batch(batch_id: int) -> SimpleNamespace:
    return SimpleNamespace(batch_id=batch_id, requests=[])


def test_the_longest_idle_placed_worker_takes_the_next_batch():
    pool, started = pool_of(3)
    adopt_placed(pool, ["w0", "w1"])
    assert started == ["new0"] and pool.workers == ["w0", "w1", "new0"]  # the study's third worker
    assert pool.idle_count() == 2  # new0 is not placed yet
    assert pool.take() == "w0"
    pool.returned("w0")
    assert pool.take() == "w1" and pool.take() == "w0"
    assert pool.idle_count() == 0
    pool.placed("placed-new0")
    assert pool.idle_count() == 1 and pool.take() == "new0"
    assert started == ["new0"]


def test_a_batch_never_goes_to_a_worker_ray_has_not_placed():
    """Issue 31: studies that together want more workers than the cluster
    has. A worker Ray has not placed (other studies' workers hold the
    cluster) takes no batch, even the first-started one: a batch sent to it
    waited as long as the cluster stayed full, while the study's placed
    worker sat idle; two studies each waiting so never ended."""
    pool, started = pool_of(2)
    pool.adopt(["w0", "w1"])
    assert pool.starting == {"placed-w0": "w0", "placed-w1": "w1"}
    assert pool.idle_count() == 0 and pool.idle == []
    pool.placed("placed-w1")
    assert pool.idle_count() == 1 and pool.take() == "w1"
    pool.dispatched("r0", "w1", batch(0), None)
    pool.finished("r0")
    pool.returned("w1")
    # The next batch goes to w1 again: w0, first started, is still waiting for the cluster.
    assert pool.idle_count() == 1 and pool.take() == "w1"
    assert started == []  # and no more workers start than the study has


def test_a_worker_that_goes_before_it_is_placed_is_forgotten():
    pool, started = pool_of(2)
    pool.adopt(["w0", "w1"])
    pool.lost("w0", fits=1, most=2)  # the cluster holds one worker now: none starts in its place
    assert pool.workers == ["w1"] and pool.starting == {"placed-w1": "w1"} and started == []
    pool.shut_down(lambda worker: None)
    assert pool.starting == {} and pool.idle_count() == 0


def test_running_batches_count_against_the_capacity_until_they_finish():
    pool, _ = pool_of(2)
    adopt_placed(pool, ["w0", "w1"])
    spec = object()
    pool.dispatched("ref0", pool.take(), batch(7), spec)
    assert pool.idle_count() == 1 and pool.worker_of(7) == "w0"
    assert pool.running_workers() == {7: "w0"}
    running = pool.finished("ref0")
    assert (running.worker, running.batch.batch_id, running.spec) == ("w0", 7, spec)
    assert pool.running == {} and pool.idle_count() == 1  # until its worker is returned
    pool.returned("w0")
    assert pool.idle_count() == 2
    # Its worker is still asked for the batch's checkpoints until the outcome is folded in.
    assert pool.worker_of(7) == "w0"
    pool.folded(7)
    assert pool.worker_of(7) is None
    with pytest.raises(KeyError):
        pool.finished("ref0")


def test_a_parked_trainables_worker_is_taken_out_of_the_idle_ones():
    pool, started = pool_of(2)
    adopt_placed(pool, ["w0", "w1"])
    assert pool.take_parked("w1") == "w1"
    assert pool.idle == ["w0"] and started == []


def test_a_lost_worker_goes_and_one_starts_in_its_place_up_to_what_the_cluster_holds():
    pool, started = pool_of(4)
    adopt_placed(pool, ["w0", "w1", "w2", "w3"])
    pool.lost("w2", fits=2, most=4)
    assert pool.workers == ["w0", "w1", "w3"] and pool.capacity == 2 and started == []
    pool.lost("w1", fits=0, most=4)  # at least one: a node may come back
    assert pool.capacity == 1 and pool.workers == ["w0", "w3"]
    pool.lost("w0", fits=math.inf, most=4)  # and never more than the study asked for
    assert pool.capacity == 4
    assert started == ["new0", "new1", "new2"] and pool.workers == ["w3", "new0", "new1", "new2"]
    assert pool.idle == ["w3"]  # the new ones take batches once placed
    pool.lost("gone", fits=3, most=4)  # shut down by the driver already: nothing to remove
    assert len(pool.workers) == 4 and pool.capacity == 3


def test_a_retired_worker_is_replaced_and_a_plan_service_grows_its_pool():
    pool, started = pool_of(1)
    pool.grow(2)  # a second study attached before the loop adopted the first workers
    assert started == []
    adopt_placed(pool, ["w0"])
    assert started == ["new0"] and pool.capacity == 2
    pool.retire(pool.take())
    assert started == ["new0", "new1"] and pool.workers == ["new0", "new1"] and pool.idle == []
    pool.grow(1)  # never fewer
    assert pool.capacity == 2


def test_a_batch_is_stalled_after_a_silence_counted_from_its_dispatch_or_last_report():
    clock = Clock()
    pool, _ = pool_of(2, clock)
    adopt_placed(pool, ["w0", "w1"])
    pool.dispatched("ref0", pool.take(), batch(1), None)
    clock.now += 10
    pool.dispatched("ref1", pool.take(), batch(2), None)
    clock.now += 50
    assert [(b.batch_id, s) for b, s in pool.stalled(60)] == [(1, 60)]
    pool.heard(1)
    clock.now += 5
    assert [(b.batch_id, s) for b, s in pool.stalled(60)] == []
    assert [(b.batch_id, s) for b, s in pool.stalled(5)] == [(1, 5), (2, 55)]
    pool.returned(pool.finished("ref0").worker)
    pool.dispatched("ref2", pool.take(), batch(1), None)  # the same batch id again: silent since now
    assert [b.batch_id for b, _ in pool.stalled(1)] == [2]


def test_shutting_down_kills_every_worker_once_and_starts_none_after():
    pool, started = pool_of(3)
    adopt_placed(pool, ["w0", "w1"])
    killed: list[str] = []
    pool.shut_down(killed.append)
    assert killed == ["w0", "w1", "new0"] and pool.workers == [] and pool.idle == []
    pool.shut_down(killed.append)
    assert len(killed) == 3
    pool.lost("w0", fits=3, most=3)  # its batch's failure, read after the driver shut the workers down
    assert pool.workers == [] and started == ["new0"]


def test_shutting_down_spares_the_workers_asked_that_run_nothing_and_have_the_studys_shape():
    pool, _ = pool_of(3)
    adopt_placed(pool, ["w0", "w1", "w2"])
    pool.dispatched("ref0", pool.take(), batch(1), None)  # w0 runs a batch at the study's end
    killed: list[str] = []
    assert pool.shut_down(killed.append, keep=["w0", "w1", "gone"]) == ["w1"]
    assert killed == ["w0", "w2"], "the busy one, and the one not asked for, are stopped"


# -- workers of other shapes (ResourceChangingScheduler) -------------------------------

ONE_CPU, TWO_CPUS = Shape.of({"CPU": 1}), Shape.of({"CPU": 2})


def shaped_pool(capacity: int, cpus: float) -> tuple[WorkerPool, list[tuple[str, Shape]], list[str]]:
    """A pool of one-CPU workers on a cluster of ``cpus``: (pool, started, stopped)."""
    started: list[tuple[str, Shape]] = []
    stopped: list[str] = []
    names = (f"new{i}" for i in itertools.count())

    def start(shape: Shape) -> str:
        started.append((next(names), shape))
        return started[-1][0]

    pool = WorkerPool(
        start,
        capacity,
        lambda worker: f"placed-{worker}",
        Clock(),
        shape=ONE_CPU,
        room=lambda shapes: fits(shapes, {"CPU": cpus}),
        stop=stopped.append,
    )
    return pool, started, stopped


def test_a_batch_takes_a_worker_of_its_shape_first_else_one_that_covers_it():
    pool, started, _ = shaped_pool(2, cpus=4)
    adopt_placed(pool, ["w0", "w1"])
    assert pool.take(TWO_CPUS) is None, "no worker holds two CPUs"
    pool.want(TWO_CPUS)
    assert started == [("new0", TWO_CPUS)], "the cluster has room beside the two: none retires"
    pool.placed("placed-new0")
    assert pool.take(ONE_CPU) == "w0", "a worker of the batch's own shape before a larger one"
    assert pool.take(TWO_CPUS) == "new0"
    pool.returned("new0")
    assert pool.take(ONE_CPU) == "w1" and pool.take(ONE_CPU) == "new0", "a larger worker covers a smaller batch"


def test_idle_workers_retire_to_make_room_for_a_larger_one():
    pool, started, stopped = shaped_pool(2, cpus=2)
    adopt_placed(pool, ["w0", "w1"])
    pool.want(TWO_CPUS)
    assert stopped == ["w0", "w1"] and started == [("new0", TWO_CPUS)]
    assert pool.workers == ["new0"] and pool.idle_count() == 0
    pool.want(TWO_CPUS)
    assert len(started) == 1, "one is on its way: a batch asking again starts no second one"
    pool.placed("placed-new0")
    assert pool.take() == "new0", "the study's own batches run on it too"
    pool.returned("new0")
    assert [name for name, _ in started] == ["new0"], "no one-CPU worker starts: the two CPUs are held"


def test_running_workers_retire_as_they_come_back_until_the_larger_one_fits():
    pool, started, stopped = shaped_pool(2, cpus=2)
    adopt_placed(pool, ["w0", "w1"])
    assert pool.take() == "w0"
    pool.want(TWO_CPUS)
    assert stopped == ["w1"] and started == [], "w0 still runs a batch and holds its CPU"
    assert pool.workers == ["w0"]
    pool.returned("w0")
    assert stopped == ["w1", "w0"] and started == [("new0", TWO_CPUS)]
