"""A driver's next study runs in the controller process its last study
ended in (`runtime.driver.controllers`): the same results as in a new one,
and a controller whose study did not end cleanly, or that died while idle,
is never used again."""

import time

import pytest
from ray import tune
from trainables_for_tests import kill_ray_processes, noisy_descent, ray_processes

from ray_stagetree import MultiStep, Tuner

CONTROLLER = "ray::StudyController"


def fit(tmp_path, name, lrs, callbacks=None):
    return Tuner(
        noisy_descent,
        param_space={"lr": tune.grid_search(lrs)},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(
            name=name,
            storage_path=str(tmp_path),
            stop={"training_iteration": 6},
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


THREE = [MultiStep(0.1, [2], 0.5), MultiStep(0.1, [4], 0.5), MultiStep(0.1, [4], 0.2)]
TWO = [MultiStep(0.05, [3], 0.1), 0.02]


def test_the_next_study_runs_in_the_controller_process_the_last_one_ended_in_and_sees_nothing_of_it(
    tmp_path, ray_session
):
    alone = losses(fit(tmp_path, "two_first", TWO))
    first = fit(tmp_path, "three", THREE)
    (kept,) = controllers(1)
    grid = fit(tmp_path, "two_next", TWO)
    assert controllers(1) == [kept], "the second study ran in the first one's controller process"
    assert len(grid) == 2 and grid.num_errors == 0
    assert losses(grid) == alone, "the same results as in a controller of its own"
    assert grid.iterations_executed == 2 * 6, "none of the first study's checkpoints or trials leaked into it"
    assert len(first) == 3 and first.iterations_executed == 2 + 4 + 2 + 2 * 2  # [0,2) shared by all, [2,4) by two


class Raises(tune.Callback):
    def on_trial_result(self, iteration, trials, trial, result, **info):
        raise ValueError("a callback failed")


def test_a_controller_is_kept_only_after_a_clean_end_and_one_that_died_idle_is_replaced(tmp_path, ray_session):
    with pytest.raises(ValueError, match="a callback failed"):
        fit(tmp_path, "raises", TWO, callbacks=[Raises()])
    assert controllers(0) == [], "a study that raised leaves no controller behind"
    expected = losses(fit(tmp_path, "after_an_error", TWO))
    assert len(controllers(1)) == 1
    assert kill_ray_processes(CONTROLLER) == 1  # the kept one, idle
    assert losses(fit(tmp_path, "after_a_dead_one", TWO)) == expected
    assert len(controllers(1)) == 1
