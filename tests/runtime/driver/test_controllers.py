"""A driver's next study runs in the controller process its last study
ended in (`runtime.driver.controllers`): the same results as in a new one,
and a controller whose study did not end cleanly, or that died while idle,
is never used again."""

import time

import pytest
from ray import tune
from ray.tune.error import TuneError
from trainables_for_tests import kill_ray_processes, noisy_descent, ray_processes

from ray_stagetree import MultiStep, Tuner

CONTROLLER = "ray::StudyController"
STORAGE_IO = "ray::StorageIO"


def fit(tmp_path, name, lrs, callbacks=None):
    return Tuner(
        noisy_descent,
        param_space={"lr": tune.grid_search(lrs)},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(
            name=name,
            storage_path=str(tmp_path),
            stop={"training_iteration": 4},
            callbacks=callbacks,
            verbose=0,
        ),
    ).fit()


def losses(grid):
    return {repr(result.config["lr"]): result.metrics_dataframe["loss"].tolist() for result in grid}


def controllers(expected):
    """This session's controller processes, once they are ``expected`` in number (ray.kill ends them a moment later)."""
    deadline = time.monotonic() + 60
    while len(found := ray_processes(CONTROLLER)) != expected and time.monotonic() < deadline:
        time.sleep(0.2)
    return found


class Raises(tune.Callback):
    def on_trial_result(self, iteration, trials, trial, result, **info):
        raise ValueError("a callback failed")


THREE = [MultiStep(0.1, [1], 0.5), MultiStep(0.1, [2], 0.5), MultiStep(0.1, [2], 0.2)]
TWO = [MultiStep(0.05, [2], 0.1), 0.02]


def test_a_drivers_next_study_runs_in_the_controller_its_last_clean_one_ended_in_and_sees_nothing_of_it(
    tmp_path, ray_session
):
    with pytest.raises(TuneError, match="ValueError: a callback failed"):  # as Tune raises it
        fit(tmp_path, "raises", [0.1], callbacks=[Raises()])
    assert controllers(0) == [], "a study that raised leaves no controller behind"
    alone = losses(fit(tmp_path, "two_first", TWO))  # in a controller of its own
    (kept,) = controllers(1)
    first = fit(tmp_path, "three", THREE)
    assert len(first) == 3 and first.iterations_executed == 1 + 3 + 1 + 2 * 2  # [0,1) shared by all, [1,2) by two
    storage_actor = set(ray_processes(STORAGE_IO))
    grid = fit(tmp_path, "two_next", TWO)
    assert controllers(1) == [kept], "both studies ran in the first one's controller process"
    assert set(ray_processes(STORAGE_IO)) == storage_actor, "and wrote through its storage actor's process"
    assert len(grid) == 2 and grid.num_errors == 0
    assert losses(grid) == alone, "the same results as in a controller of its own"
    assert grid.iterations_executed == 2 * 4, "none of the last study's checkpoints or trials leaked into it"
    assert kill_ray_processes(CONTROLLER) == 1  # the kept one, idle
    (result,) = fit(tmp_path, "after_a_dead_one", [0.02])
    assert result.metrics["training_iteration"] == 4 and len(controllers(1)) == 1
