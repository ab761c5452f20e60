"""Held results (runtime.control.held_results): what a trial whose request
moves takes of the plan's results at once, and the loop an exploit back
over them would make. Ray-free: a plan's history as a dict."""

from __future__ import annotations

import pytest

from ray_stagetree.runtime.control.held_results import HeldResults


class ExploitingTrial:
    """A trial sharing a trajectory whose results the plan holds to
    iteration 10; at 10 its scheduler sends it back to a checkpoint at 5
    (PBT's donor lagging), as long as ``lagging``."""

    def __init__(self) -> None:
        self.history = {i: {"score": i} for i in range(1, 11)}
        self.rows: dict[int, dict] = {}
        self.taken: list[int] = []
        self.lagging = True
        self.held = HeldResults(lambda trial_id: self.history, lambda trial_id: self.rows, self.add_result)

    def add_result(self, trial_id: str, iteration: int, metrics: dict) -> None:
        self.held.reported()  # as StudyTrials.add_result does for every result
        self.rows[iteration] = metrics
        self.taken.append(iteration)
        if iteration == 10 and self.lagging:  # exploited: its iterations past the donor's checkpoint are gone
            self.rows = {i: row for i, row in self.rows.items() if i <= 5}
            self.held.moved(trial_id, 5)


@pytest.mark.timeout(10)
def test_a_trial_sent_back_over_results_it_took_waits_for_the_next_turn():
    trial = ExploitingTrial()
    trial.held.moved("t", 0)  # used to take 6..10 again and again, for ever
    assert trial.taken == list(range(1, 11))


def test_the_deferred_results_are_taken_once_a_worker_reported_or_nothing_runs():
    trial = ExploitingTrial()
    trial.held.moved("t", 0)
    trial.held.next_turn(idle=False)
    assert trial.taken == list(range(1, 11)), "nothing moved: the same results would make the same decision"
    trial.lagging = False  # the donor trained on meanwhile: the decision differs
    trial.held.reported()
    trial.held.next_turn(idle=False)
    assert trial.taken == list(range(1, 11)) + [6, 7, 8, 9, 10]
    assert sorted(trial.rows) == list(range(1, 11))


def test_with_nothing_running_the_deferred_results_are_taken_at_once():
    trial = ExploitingTrial()
    trial.held.moved("t", 0)
    trial.lagging = False
    trial.held.next_turn(idle=True)
    assert trial.taken[-5:] == [6, 7, 8, 9, 10]


def test_results_a_pass_takes_do_not_count_as_reports():
    trial = ExploitingTrial()
    trial.held.moved("t", 0)
    trial.held.next_turn(idle=False)
    trial.held.next_turn(idle=False)
    assert trial.taken == list(range(1, 11))
