"""How `stagetree status` reads a trial's state from its folder and the saved plan (no Ray)."""

import json

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


def test_a_tuner_stores_its_metric_and_mode_for_readers_that_never_unpickle(tmp_path):
    """What `stagetree status` and the monitor rank by, for a study a Python script ran (no Ray needed)."""
    from ray import tune
    from trainables_for_tests import noisy_descent

    from ray_stagetree import Tuner
    from ray_stagetree.jobs.experiments import read_experiment

    run_config = tune.RunConfig(name="scripted", storage_path=str(tmp_path), stop={"training_iteration": 2})
    Tuner(noisy_descent, tune_config=tune.TuneConfig(metric="accuracy", mode="max"), run_config=run_config)
    assert json.loads((tmp_path / "scripted" / "stagetree_study.json").read_text()) == {
        "metric": "accuracy",
        "mode": "max",
    }
    experiment = read_experiment(str(tmp_path / "scripted"))
    assert experiment.metric_and_mode() == ("accuracy", "max")
    assert experiment.metric_and_mode("loss", "min") == ("loss", "min")


def test_a_plan_caught_while_its_first_snapshot_is_written_reads_as_no_plan_yet(tmp_path):
    """`stagetree status` on a study that is writing its plan table by table
    shows the trials without one, not a traceback."""
    from ray import tune
    from trainables_for_tests import noisy_descent

    from ray_stagetree import Tuner
    from ray_stagetree.jobs.experiments import PLAN_FOLDER, read_experiment
    from ray_stagetree.planning.plan import SearchPlan

    Tuner(noisy_descent, run_config=tune.RunConfig(name="writing", storage_path=str(tmp_path)))
    plan_folder = tmp_path / "writing" / PLAN_FOLDER
    SearchPlan().save(str(plan_folder))
    assert read_experiment(str(tmp_path / "writing")).plan is not None
    (plan_folder / "nodes.parquet").unlink()
    assert read_experiment(str(tmp_path / "writing")).plan is None
