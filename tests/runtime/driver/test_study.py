"""Study operations on a finished study: evaluate and extend."""

from ray import tune
from test_tuner import HORIZON, LRS, run
from trainables_for_tests import count_of, noisy_descent

from ray_stagetree import MultiStep, Study, Tuner


def test_evaluate_answers_from_the_plan_or_trains_only_what_is_missing(tmp_path, counter):
    grid = run(noisy_descent, tmp_path, "study", extra={"counter": counter})
    trained = count_of(counter)
    study = Study(grid.experiment_path, noisy_descent)
    config = {"lr": LRS[0], "counter": counter}
    known = study.evaluate(config, 7)
    assert count_of(counter) == trained, "answered from the plan"
    assert known["loss"] == next(r for r in grid if r.config["lr"] == LRS[0]).metrics_dataframe["loss"][6]
    # a new schedule sharing 8 iterations with LRS[1]: only 2 more are trained
    fresh = study.evaluate({"lr": MultiStep(0.1, [8], 0.9), "counter": counter}, 10)
    assert count_of(counter) == trained + 2 and fresh["training_iteration"] == 10


def test_extend_continues_a_trial_from_its_last_checkpoint(tmp_path, counter):
    grid = run(noisy_descent, tmp_path, "extend", extra={"counter": counter})
    trained = count_of(counter)
    trial = next(r for r in grid if r.config["lr"] == LRS[0])
    extended = Study(grid.experiment_path, noisy_descent).extend(trial.metrics["trial_id"], HORIZON + 4)
    assert count_of(counter) == trained + 4
    assert len(extended.metrics_dataframe) == HORIZON + 4
    # the same as training that trial to HORIZON + 4 from scratch
    fresh = Tuner(
        noisy_descent,
        param_space={"lr": LRS[0]},
        run_config=tune.RunConfig(
            storage_path=str(tmp_path), name="fresh", stop={"training_iteration": HORIZON + 4}, verbose=0
        ),
    ).fit()
    assert extended.metrics_dataframe["loss"].tolist() == fresh[0].metrics_dataframe["loss"].tolist()
