"""The study's time budget (TuneConfig.time_budget_s), without Ray: when the
study is over it, which running batches to kill, when the controller wakes."""

import math

from ray_stagetree.runtime.control.time_budget import GRACE_S, TimeBudget


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_no_budget_is_never_over_and_never_wakes_the_controller():
    clock = Clock()
    for seconds in (None, math.inf):
        budget = TimeBudget(seconds, clock)
        clock.now += 1e9
        assert not budget.over() and budget.wake_in([1, 2]) is None and budget.to_kill([1, 2]) == []


def test_the_budget_counts_from_its_start_and_wakes_the_controller_when_it_ends():
    clock = Clock()
    budget = TimeBudget(10.0, clock)
    clock.now += 4
    assert budget.elapsed == 4 and not budget.over()
    assert budget.wake_in([7]) == 6
    clock.now += 6.5
    assert budget.over()


def test_batches_still_running_a_grace_period_past_the_budget_are_killed_once():
    clock = Clock()
    budget = TimeBudget(10.0, clock)
    clock.now += 10.5
    assert budget.to_kill([1, 2]) == [], "within the grace period batches may still stop at a report"
    assert budget.wake_in([1, 2]) == GRACE_S - 0.5
    clock.now += GRACE_S
    assert budget.to_kill([1, 2]) == [1, 2]
    assert budget.to_kill([1, 2, 3]) == [3], "a killed batch is not killed again"
    assert budget.wake_in([1, 2, 3]) is None, "nothing left to kill: no wake-up for the budget"


def test_a_restored_study_counts_the_time_its_snapshot_had_run():
    clock = Clock()
    budget = TimeBudget(10.0, clock)
    budget.restored(elapsed=8.0)
    assert budget.elapsed == 8.0 and budget.wake_in([]) == 2.0


def test_a_study_stopped_at_once_is_past_its_budget_and_kills_batches_that_do_not_stop():
    """A stopper's ``stop_all`` or fail_fast, which Tune obeys at once, ends
    the budget there, with or without one: batches get the grace period."""
    clock = Clock()
    for seconds in (None, 60.0):
        budget = TimeBudget(seconds, clock)
        clock.now += 5
        budget.end_now()
        assert budget.over() and budget.to_kill([1]) == []
        assert budget.wake_in([1]) == GRACE_S
        clock.now += GRACE_S
        assert budget.to_kill([1]) == [1]
