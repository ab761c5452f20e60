"""How `stagetree status` reads a trial's state from its folder and the saved plan (no Ray)."""

import pytest

from ray_stagetree.jobs.experiments import TrialRecord


@pytest.mark.parametrize(
    "last,error,requested,status",
    [
        ({}, None, None, "PENDING"),
        ({"training_iteration": 2, "done": False}, None, None, "UNFINISHED"),  # running, or no plan written yet
        ({"training_iteration": 2, "done": False}, None, 5, "UNFINISHED"),  # interrupted: the plan wants 5
        ({"training_iteration": 2, "done": False}, None, 2, "TERMINATED"),  # a scheduler stopped it at 2
        ({"training_iteration": 5, "done": True}, None, None, "TERMINATED"),  # its horizon
        ({"training_iteration": 2, "done": False}, "ValueError: exploded", None, "ERROR"),
        ({"training_iteration": 5, "done": True}, "RayActorError: died", None, "TERMINATED"),  # restored and finished
    ],
)
def test_trial_status(last, error, requested, status):
    assert TrialRecord("t", {}, last, error, updated=0.0, requested=requested).status == status
