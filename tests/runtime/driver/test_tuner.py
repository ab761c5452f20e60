"""The Ray runtime end to end on a local Ray (2 CPUs, 4 fake GPUs)."""

import os
import re
import tempfile
import threading

import pytest
import ray
from ray import tune
from trainables_for_tests import NoisyDescent, count_of, noisy_descent

from ray_stagetree import Exponential, MultiStep, Tuner
from ray_stagetree.planning.cost import CostModel
from ray_stagetree.planning.plan import SearchPlan

HORIZON = 12
# Three trials sharing lr=0.1 for 4 iterations; two of them for 8.
LRS = [MultiStep(0.1, [4], 0.5), MultiStep(0.1, [8], 0.5), MultiStep(0.1, [8], 0.2)]


def run(trainable, tmp_path, name, lrs=LRS, sharing=True, extra=None, max_failures=0, **tuner_kwargs):
    space = {"lr": tune.grid_search(lrs), **(extra or {})}
    tuner = Tuner(
        trainable,
        param_space=space,
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(
            name=name,
            storage_path=str(tmp_path),
            stop={"training_iteration": HORIZON},
            failure_config=tune.FailureConfig(max_failures=max_failures),
            verbose=0,
        ),
        stage_sharing=sharing,
        **tuner_kwargs,
    )
    return tuner.fit()


def losses(grid):
    return {repr(r.config["lr"]): r.metrics_dataframe["loss"].tolist() for r in grid}


def test_shared_prefix_executes_once_and_results_match_trial_by_trial(tmp_path, counter):
    shared = run(noisy_descent, tmp_path, "shared", extra={"counter": counter})
    executed = count_of(counter)
    # unique iterations: [0,4) shared by all, then A alone (8), B and C share
    # [4,8) (4), then B and C alone (4 + 4): 24, against 3 x 12 = 36
    assert executed == 24 == shared.iterations_executed == shared.unique_iterations
    assert shared.trial_by_trial_iterations == 36
    assert shared.worker_seconds > 0, "the workers' busy time is reported"
    # What the iterations took feeds the execution policy's cost model.
    plan = SearchPlan.load(f"{shared.experiment_path}/plan")
    timed = sum(timing.stop - timing.start for timing in plan.timings)
    assert 0 < timed < executed and CostModel().fit(plan).is_fitted
    alone = run(noisy_descent, tmp_path, "alone", sharing=False, extra={"counter": counter})
    assert count_of(counter) - executed == 36
    # DESIGN invariant 4: the same metrics as training each trial alone
    assert losses(shared) == losses(alone)
    assert all(len(r.metrics_dataframe) == HORIZON for r in shared)


@pytest.mark.parametrize("url", [False, True], ids=["path", "file-url"])
def test_result_grid_has_tunes_interface(tmp_path, ray_session, url):
    grid = run(noisy_descent, f"file://{tmp_path}" if url else tmp_path, "grid")
    assert isinstance(grid, tune.ResultGrid) and all(isinstance(result, tune.Result) for result in grid)
    assert len(grid) == 3 and grid.num_errors == 0 and grid.num_terminated == 3
    best = grid.get_best_result()
    assert best.metrics["loss"] == min(r.metrics["loss"] for r in grid)
    assert isinstance(best.config["lr"], MultiStep)  # the user's sequence object, as given
    assert best.metrics["training_iteration"] == HORIZON
    with best.checkpoint.as_directory() as path:
        assert os.path.exists(os.path.join(path, "state.json"))
    frame = grid.get_dataframe()
    assert len(frame) == 3 and "loss" in frame
    local = grid.experiment_path.removeprefix("file://")
    assert os.path.exists(os.path.join(local, best.path.rsplit("/", 1)[-1], "result.json"))
    assert os.path.exists(os.path.join(local, "plan", "nodes.parquet"))
    assert best.metrics_dataframe["training_iteration"].tolist() == list(range(1, HORIZON + 1))


def test_an_unnamed_experiment_is_named_as_tune_names_it(tmp_path):
    """``<trainable>_<date>`` under storage_path; a second study of the
    trainable in the same second gets a folder of its own."""
    run_config = tune.RunConfig(storage_path=str(tmp_path))
    first = Tuner(noisy_descent, run_config=run_config).experiment_path
    second = Tuner(noisy_descent, run_config=run_config).experiment_path
    assert re.fullmatch(r"noisy_descent_\d{4}-\d\d-\d\d_\d\d-\d\d-\d\d(_[0-9a-f]{4})?", os.path.basename(first))
    assert os.path.dirname(first) == str(tmp_path) and first != second


def test_a_study_starts_its_actors_without_exporting_their_classes_again(tmp_path, ray_session, monkeypatch):
    """Ray exports an actor class (pickling it and fingerprinting every
    method's bytecode) each time ``ray.remote`` wraps it anew: with a
    wrapper per worker, asking Ray for 16 workers took the driver 0.97 s on
    2 CPUs. Once per Ray job is enough."""
    run(noisy_descent, tmp_path, "first")
    manager = ray._private.worker.global_worker.function_actor_manager
    exported = []
    export = manager.export_actor_class
    monkeypatch.setattr(manager, "export_actor_class", lambda *args, **kw: exported.append(args) or export(*args, **kw))
    grid = run(noisy_descent, tmp_path, "second")
    assert grid.num_terminated == 3
    assert exported == []


def test_class_trainable_gets_hparam_updates_and_matches_trial_by_trial(tmp_path, ray_session):
    shared = run(NoisyDescent, tmp_path, "class_shared")
    alone = run(NoisyDescent, tmp_path, "class_alone", sharing=False)
    assert losses(shared) == losses(alone)


def test_a_raising_trainable_errors_its_trial_only(tmp_path, ray_session):
    grid = run(
        noisy_descent,
        tmp_path,
        "raising",
        lrs=[Exponential(0.1, 0.9)],
        extra={"explode_at": tune.grid_search([None, 6])},
    )
    assert grid.num_errors == 1 and grid.num_terminated == 1
    (error,) = grid.errors
    assert "exploded on purpose" in str(error)
    good = next(r for r in grid if r.error is None)
    assert len(good.metrics_dataframe) == HORIZON


def test_a_worker_killed_mid_batch_is_retried_with_identical_results(tmp_path, ray_session):
    marker = str(tmp_path / "died")
    reference = run(noisy_descent, tmp_path, "undisturbed")
    # Iterations of 0.2 s: the worker dies well after the controller took the checkpoint it
    # made two iterations before (dying within that call's round trip loses the checkpoint).
    survived = run(
        noisy_descent, tmp_path, "killed", extra={"die_once_at": 6, "marker": marker, "sleep": 0.2}, max_failures=1
    )
    assert os.path.exists(marker), "the worker did die"
    assert survived.num_errors == 0
    assert losses(survived) == losses(reference)


def test_evicted_checkpoints_reload_from_storage(tmp_path, ray_session):
    reference = run(noisy_descent, tmp_path, "in_memory")
    evicting = run(noisy_descent, tmp_path, "evicting", checkpoint_budget_bytes=0)
    assert losses(evicting) == losses(reference)


def test_metric_stop_ends_a_trial_and_preempts_its_batch(tmp_path, counter):
    space = {"lr": Exponential(0.1, 0.9), "signal_at": tune.grid_search([3, 10**9]), "sleep": 0.3, "counter": counter}
    grid = Tuner(
        noisy_descent,
        param_space=space,
        run_config=tune.RunConfig(
            name="stopping", storage_path=str(tmp_path), stop={"training_iteration": HORIZON, "signal": 1}, verbose=0
        ),
    ).fit()
    stopped = next(r for r in grid if r.config["signal_at"] == 3)
    assert stopped.metrics["training_iteration"] == 3 and stopped.error is None
    assert len(next(r for r in grid if r.config["signal_at"] != 3).metrics_dataframe) == HORIZON
    # its batch was pre-empted well before the horizon (reports are flushed every 0.5 s)
    assert count_of(counter) <= HORIZON + 3 + 3


def test_fake_gpus_are_assigned_per_worker(tmp_path, ray_session):
    grid = run(tune.with_resources(noisy_descent, {"cpu": 1, "gpu": 1}), tmp_path, "gpus")
    devices = {row for r in grid for row in r.metrics_dataframe["gpus"]}
    assert devices and all(device != "" for device in devices)


def test_with_parameters_passes_large_objects(tmp_path, ray_session):
    def train(config, offset):
        from ray_stagetree import get_hparams, report

        while True:
            report({"loss": get_hparams()["lr"] + offset})

    grid = run(tune.with_parameters(train, offset=100.0), tmp_path, "params", lrs=[Exponential(0.1, 0.5)])
    assert grid[0].metrics["loss"] == pytest.approx(100.0 + 0.1 * 0.5 ** (HORIZON - 1))


def test_a_list_of_stoppers_stops_as_tunes_experiment_combines_them():
    from ray.tune.stopper import CombinedStopper, MaximumIterationStopper, TrialPlateauStopper

    stoppers = [MaximumIterationStopper(3), TrialPlateauStopper("loss")]
    tuner = Tuner(noisy_descent, param_space={"lr": 0.1}, run_config=tune.RunConfig(stop=stoppers))
    assert isinstance(tuner.stopper, CombinedStopper)
    assert [tuner.stopper("t", {"loss": 1.0}) for _ in range(3)] == [False, False, True]


def test_bad_input_fails_before_training(tmp_path, ray_session):
    with pytest.raises(TypeError, match="gama"):
        Exponential(0.1, gama=0.9)
    with pytest.raises(
        ValueError, match=r"RunConfig.stop must be None, a dict, a ray.tune.Stopper \(or a list of them\) or a function"
    ):
        Tuner(noisy_descent, param_space={"lr": 0.1}, run_config=tune.RunConfig(stop=5))
    with pytest.raises(ValueError, match="asks for 8 GPU but the Ray cluster has 4"):
        Tuner(
            # Tune's with_resources sets an attribute on the function: wrap it, or later tests inherit 8 GPUs
            tune.with_resources(lambda config: noisy_descent(config), {"gpu": 8}),
            param_space={"lr": 0.1},
            run_config=tune.RunConfig(stop={"training_iteration": 2}, storage_path=str(tmp_path)),
        ).fit()
    with pytest.raises(TypeError, match="cannot pickle '_thread.lock' object"):
        Tuner(
            noisy_descent,
            param_space={"lr": 0.1, "model": threading.Lock()},
            run_config=tune.RunConfig(stop={"training_iteration": 2}, storage_path=str(tmp_path)),
        ).fit()
    with pytest.raises(TypeError, match="Trainable is the base class: subclass it and implement step"):
        Tuner(tune.Trainable, run_config=tune.RunConfig(stop={"training_iteration": 2}))
    with pytest.raises(TypeError, match="must subclass ray.tune.Trainable or ray_stagetree.trainables.StageTrainable"):
        Tuner(dict, run_config=tune.RunConfig(stop={"training_iteration": 2}))


def test_an_unported_tune_trainable_runs_unchanged(tmp_path, ray_session):
    """Written for Ray Tune (tune.report, tune.get_checkpoint, a for loop over
    epochs resuming from the checkpoint): only the Tuner import differs."""

    def train(config):
        start, value = 0, 0.0
        checkpoint = tune.get_checkpoint()
        if checkpoint:
            with checkpoint.as_directory() as path:
                with open(os.path.join(path, "state.txt")) as file:
                    start, value = map(float, file.read().split())
        for epoch in range(int(start), 1000):
            value += config["lr"]
            with tempfile.TemporaryDirectory() as path:
                with open(os.path.join(path, "state.txt"), "w") as file:
                    file.write(f"{epoch + 1} {value}")
                tune.report({"value": value, "loss": -value}, checkpoint=tune.Checkpoint.from_directory(path))

    grid = run(train, tmp_path, "unported", lrs=[0.5, 0.25])
    assert sorted(r.metrics["value"] for r in grid) == [0.25 * HORIZON, 0.5 * HORIZON]


def test_a_checked_tuner_offers_every_setting_its_run_reads(tmp_path):
    """`runtime.driver.run` reads a Tuner through `StudySettings` only: each is a public attribute of it."""
    from ray_stagetree.runtime.driver.settings import StudySettings

    tuner = Tuner(noisy_descent, run_config=tune.RunConfig(name="settings", storage_path=str(tmp_path)))
    missing = [name for name in StudySettings.__annotations__ if not hasattr(tuner, name)]
    assert missing == []
    assert tuner.experiment_path == f"{tmp_path}/settings"
