"""The study's snapshots (runtime.control.snapshots), without Ray: when one
is taken, what its cost delays, storage that refuses them (the pause), an
impossible snapshot, the write in flight, and the freeze of an interrupted
study."""

from __future__ import annotations

import asyncio
import math
import pickle
import re

import pytest

from ray_stagetree.runtime.control.experiment_state import STATE_COST_FACTOR
from ray_stagetree.runtime.control.snapshots import STORAGE_RETRY_MAX_S, STORAGE_RETRY_S, NoSnapshots, Snapshots


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


class Study:
    """What the controller gives its snapshots: the state to take (taking it
    costs ``cost`` seconds of the clock), a storage whose writes the test
    completes, and the driver's warnings."""

    def __init__(self, clock: Clock, cost: float = 0.0) -> None:
        self.clock = clock
        self.cost = cost
        self.state = {"results": 0}
        self.writes: list[tuple[bytes, asyncio.Future]] = []
        self.warnings: list[str] = []

    def take(self) -> bytes:
        self.clock.now += self.cost
        return pickle.dumps(self.state)

    def write(self, data: bytes) -> asyncio.Future:
        future = asyncio.get_running_loop().create_future()
        self.writes.append((data, future))
        return future

    def snapshots(self, period_s: float | None = None) -> Snapshots:
        return Snapshots(self.take, self.write, period_s, self.warnings.append, self.clock)


def run(coroutine_function):
    return asyncio.run(coroutine_function())


def test_a_snapshot_is_taken_when_something_changed_and_none_is_in_flight():
    async def scenario():
        clock = Clock()
        study = Study(clock)
        snapshots = study.snapshots()
        assert snapshots.due_in() == 0.0  # a new study is saved at once
        snapshots.save_soon()
        assert len(study.writes) == 1 and snapshots.in_flight is study.writes[0][1]
        assert pickle.loads(study.writes[0][0]) == {"results": 0}
        assert snapshots.due_in() is None  # nothing changed since, and one is in flight
        snapshots.changed = True
        snapshots.save_soon()
        assert len(study.writes) == 1  # not while one is written
        study.writes[0][1].set_result(None)
        await snapshots.written()
        assert snapshots.in_flight is None
        study.state["results"] = 1
        snapshots.save_soon()
        assert len(study.writes) == 2 and pickle.loads(study.writes[1][0]) == {"results": 1}
        study.writes[1][1].set_result(None)
        await snapshots.written()
        snapshots.save_soon()
        assert len(study.writes) == 2  # nothing changed

    run(scenario)


def test_a_snapshot_costing_s_seconds_delays_the_next_by_the_cost_factor():
    async def scenario():
        clock = Clock()
        study = Study(clock, cost=0.5)
        snapshots = study.snapshots()
        snapshots.save_soon()
        assert snapshots.seconds == pytest.approx(0.5)
        study.writes[0][1].set_result(None)
        await snapshots.written()
        snapshots.changed = True
        # Counted from when it started: the next is due 20 * 0.5 s after that.
        assert snapshots.due_in() == pytest.approx(STATE_COST_FACTOR * 0.5 - 0.5)
        clock.now += STATE_COST_FACTOR * 0.5 - 0.6
        snapshots.save_soon()
        assert len(study.writes) == 1
        clock.now += 0.1
        assert snapshots.due_in() == 0.0
        snapshots.save_soon()
        assert len(study.writes) == 2 and snapshots.seconds == pytest.approx(1.0)

    run(scenario)


def test_a_period_spaces_snapshots_unless_one_costs_more():
    async def scenario():
        clock = Clock()
        study = Study(clock, cost=0.1)
        snapshots = study.snapshots(period_s=5.0)
        snapshots.save_soon()
        study.writes[0][1].set_result(None)
        await snapshots.written()
        snapshots.changed = True
        assert snapshots.due_in() == pytest.approx(4.9)
        study.cost = 8.0
        clock.now += 4.9
        snapshots.save_soon()
        study.writes[1][1].set_result(None)
        await snapshots.written()
        snapshots.changed = True
        assert snapshots.due_in() == pytest.approx(0.0)  # 8 s, past the 5 s period: due when it ended

    run(scenario)


def test_storage_that_refuses_a_snapshot_pauses_the_study_and_is_tried_again_less_and_less_often():
    async def scenario():
        clock = Clock()
        study = Study(clock)
        snapshots = study.snapshots()
        for failed in range(3):
            snapshots.save_soon()
            assert len(study.writes) == failed + 1
            study.writes[-1][1].set_exception(OSError(30, "Read-only file system"))
            await snapshots.written()
            assert snapshots.refused_since == 100.0 and snapshots.changed and snapshots.in_flight is None
            wait = STORAGE_RETRY_S * 2**failed
            assert snapshots.due_in() == wait
            snapshots.save_soon()
            assert len(study.writes) == failed + 1, "not before its retry is due"
            clock.now += wait
        assert len(study.warnings) == 1, "one warning for the whole outage"
        assert (
            "storage refuses the study's snapshot (OSError: [Errno 30] Read-only file system): the study pauses"
            in (study.warnings[0])
        )
        snapshots.save_soon()
        study.writes[-1][1].set_result(None)
        await snapshots.written()
        assert snapshots.refused_since is None
        assert study.warnings[-1] == "storage takes writes again after 7 s: the study goes on"
        snapshots.changed = True
        snapshots.save_soon()
        study.writes[-1][1].set_exception(OSError("disk full"))
        await snapshots.written()
        assert snapshots.due_in() == STORAGE_RETRY_S, "a new outage starts its pauses short again"

    run(scenario)


def test_what_storage_refused_is_told_as_it_stands():
    """The pause's warning names its wait and the snapshot a restore would
    continue from (none, before storage took one); an interrupt then says
    the study's state is not saved."""

    async def scenario():
        clock = Clock()
        study = Study(clock)
        snapshots = Snapshots(study.take, study.write, None, study.warnings.append, wait_s=90.0, clock=clock)
        snapshots.save_soon()
        study.writes[-1][1].set_exception(OSError(30, "Read-only file system"))
        await snapshots.written()
        assert "for up to 90 s" in study.warnings[-1]
        assert study.warnings[-1].endswith(
            "Stopped now, it cannot be continued: storage has taken no snapshot of it yet"
        )
        assert snapshots.not_saved() == "it cannot be continued: storage has taken no snapshot of it yet"
        clock.now += STORAGE_RETRY_S
        snapshots.save_soon()
        study.writes[-1][1].set_result(None)
        await snapshots.written()
        assert snapshots.not_saved() is None
        snapshots.changed = True
        clock.now += 100
        snapshots.save_soon()
        study.writes[-1][1].set_exception(OSError("disk full"))
        await snapshots.written()
        assert re.search(r"Tuner.restore continues it from its last snapshot \(\d\d:\d\d:\d\d\)", study.warnings[-1])
        assert snapshots.not_saved().startswith("Tuner.restore continues it from its last snapshot")

    run(scenario)


def test_past_its_wait_the_study_goes_on_without_storage_and_still_tries_it():
    async def scenario():
        clock = Clock()
        study = Study(clock)
        snapshots = Snapshots(study.take, study.write, None, study.warnings.append, wait_s=10.0, clock=clock)
        snapshots.save_soon()
        study.writes[-1][1].set_exception(OSError(28, "No space left on device"))
        await snapshots.written()
        assert snapshots.paused()
        clock.now += 10.0
        assert not snapshots.paused()
        assert "goes on without it" in study.warnings[-1] and len(study.warnings) == 2
        assert not snapshots.paused() and len(study.warnings) == 2, "said once"
        snapshots.save_soon()
        study.writes[-1][1].set_result(None)
        await snapshots.written()
        assert snapshots.refused_since is None and "takes writes again" in study.warnings[-1]

    run(scenario)


def test_retries_while_storage_refuses_the_snapshot_wait_at_most_a_bound():
    async def scenario():
        clock = Clock()
        study = Study(clock)
        snapshots = study.snapshots()
        for _ in range(12):
            snapshots.save_soon()
            study.writes[-1][1].set_exception(OSError("unreachable"))
            await snapshots.written()
            wait = snapshots.due_in()
            clock.now += wait
        assert wait == STORAGE_RETRY_MAX_S

    run(scenario)


def test_a_study_that_cannot_be_pickled_runs_on_unrestorable_with_one_warning():
    async def scenario():
        study = Study(Clock())

        def take():
            raise TypeError("cannot pickle 'generator' object")

        snapshots = Snapshots(take, study.write, None, study.warnings.append, study.clock)
        snapshots.save_soon()
        assert study.writes == [] and snapshots.in_flight is None
        assert len(study.warnings) == 1 and "cannot be saved for Tuner.restore (TypeError" in study.warnings[0]
        snapshots.changed = True
        assert snapshots.due_in() == math.inf
        study.clock.now += 1e9
        snapshots.save_soon()
        assert len(study.warnings) == 1

    run(scenario)


def test_save_now_waits_for_the_write_in_flight_then_writes_the_study_as_it_stands():
    async def scenario():
        study = Study(Clock(), cost=1.0)
        snapshots = study.snapshots()
        snapshots.save_soon()
        first = study.writes[0][1]
        study.state["results"] = 2

        async def storage():  # completes each write as it comes
            while len(study.writes) < 2:
                first.done() or first.set_result(None)
                await asyncio.sleep(0)
            study.writes[1][1].set_result(None)

        completing = asyncio.ensure_future(storage())
        await snapshots.save_now()  # also before the next is due
        await completing
        assert [pickle.loads(data) for data, _ in study.writes] == [{"results": 0}, {"results": 2}]
        assert snapshots.in_flight is None and not snapshots.changed

    run(scenario)


def test_asked_before_the_end_storage_that_refuses_the_snapshot_pauses_the_study_once():
    """Storage refused a checkpoint and the study would end: the snapshot is
    written at once, so that a refusal pauses the study (it ends only once
    storage took it); after that the pause decides, and an unchanged study
    has nothing to ask."""

    async def scenario():
        study = Study(Clock())
        snapshots = study.snapshots(period_s=60.0)
        snapshots.save_soon()
        study.writes[0][1].set_result(None)
        await snapshots.written()
        snapshots.changed = True  # a checkpoint refused: not due for 60 s

        async def refuse():
            while len(study.writes) < 2:
                await asyncio.sleep(0)
            study.writes[1][1].set_exception(PermissionError(13, "Read-only file system"))

        refusing = asyncio.ensure_future(refuse())
        assert await snapshots.ask_storage() is True, "asked now, not in 60 s"
        await refusing
        assert snapshots.paused() and "the study pauses" in study.warnings[-1]
        assert await snapshots.ask_storage() is False, "paused: the retries wait as mid-study"
        assert len(study.writes) == 2

    run(scenario)


def test_an_unchanged_study_has_nothing_to_ask_storage():
    async def scenario():
        study = Study(Clock())
        snapshots = study.snapshots()
        snapshots.save_soon()
        study.writes[0][1].set_result(None)
        await snapshots.written()
        assert await snapshots.ask_storage() is False and len(study.writes) == 1
        assert await NoSnapshots().ask_storage() is False, "a plan service's study ends as its service decides"

    run(scenario)


def test_freezing_keeps_what_the_driver_last_heard():
    snapshots = Study(Clock()).snapshots()
    assert not snapshots.frozen
    snapshots.freeze()
    assert snapshots.frozen


def test_a_study_without_snapshots_never_takes_one():
    async def scenario():
        snapshots = NoSnapshots()
        snapshots.save_soon()
        await snapshots.save_now()
        assert snapshots.in_flight is None and snapshots.due_in() is None and snapshots.seconds == 0.0

    run(scenario)
