"""`ray_stagetree.run`: Ray Tune's ``tune.run`` (its documented signature and
semantics, Ray 2.60) on the stage tree, returning Tune's
``ExperimentAnalysis``; what it cannot honour is refused by name."""

from __future__ import annotations

import inspect
import os
import signal
import time

import pytest
import ray
from ray import tune
from ray.tune.error import TuneError
from ray.tune.schedulers import ASHAScheduler

import ray_stagetree
from ray_stagetree import run, run_experiments


def descend(config):
    """Reports ``loss = lr * (4 - i)`` for i = 0, 1, ...; appends a line to
    ``config["log"]`` per iteration when given; raises at iteration 2 while
    the file ``config["fail"]`` exists; sends the driver SIGUSR1 (its Ctrl-C)
    once, while ``config["interrupt"]`` exists, and waits to be stopped."""
    for i in range(4):
        if config.get("log"):
            with open(config["log"], "a") as file:
                file.write(f"{config['lr']}\n")
        if config.get("fail") and i == 2 and os.path.exists(config["fail"]):
            raise RuntimeError("failing while the marker exists")
        if config.get("interrupt") and i == 1 and os.path.exists(config["interrupt"]):
            os.remove(config["interrupt"])
            os.kill(config["pid"], signal.SIGUSR1)
            time.sleep(30)
        tune.report({"loss": config["lr"] * (4 - i)})


class Climb(tune.Trainable):
    def setup(self, config):
        self.total = 0.0

    def step(self):
        self.total += self.config["lr"]
        return {"score": self.total}

    def save_checkpoint(self, checkpoint_dir):
        return {"total": self.total}

    def load_checkpoint(self, checkpoint):
        self.total = checkpoint["total"]


GRID = {"lr": tune.grid_search([0.1, 0.2])}


@pytest.fixture(scope="module")
def grid_arguments(tmp_path_factory):
    folder = tmp_path_factory.mktemp("grid")
    return dict(
        config={**GRID, "log": str(folder / "iterations")},
        metric="loss",
        mode="min",
        stop={"training_iteration": 3},
        storage_path=str(folder),
        name="grid",
        verbose=0,
    )


@pytest.fixture(scope="module")
def grid_analysis(ray_session, grid_arguments):
    return run(descend, **grid_arguments)


def test_the_module_is_a_drop_in_for_tune_run():
    import ray_stagetree as tune_  # "import ray_stagetree as tune; tune.run(...)"

    assert tune_.run is run and "run" in ray_stagetree.__all__


@pytest.mark.parametrize(("ours", "tunes"), [(run, tune.run), (run_experiments, tune.run_experiments)])
def test_the_signature_is_tunes(ours, tunes):
    """Every argument, in Tune's order and kind, with Tune's default (but
    ``_entrypoint``, Tune's internal marker of who called it)."""
    ours, tunes = inspect.signature(ours).parameters, inspect.signature(tunes).parameters
    assert [(p.name, p.kind) for p in ours.values()] == [(p.name, p.kind) for p in tunes.values()]
    assert {p.name: p.default for p in ours.values() if p.name != "_entrypoint"} == {
        p.name: p.default for p in tunes.values() if p.name != "_entrypoint"
    }


def test_a_function_trainable_gives_tunes_experiment_analysis(grid_analysis):
    analysis = grid_analysis
    assert isinstance(analysis, tune.ExperimentAnalysis)
    assert (analysis.default_metric, analysis.default_mode) == ("loss", "min")
    assert analysis.best_config["lr"] == 0.1
    assert [trial.status for trial in analysis.trials] == ["TERMINATED"] * 2
    assert {trial.last_result["training_iteration"] for trial in analysis.trials} == {3}  # the stop dict
    frame = analysis.dataframe()
    assert sorted(frame["config/lr"]) == [0.1, 0.2]
    assert sorted(frame["loss"].round(6)) == [0.2, 0.4]
    assert analysis.best_result["loss"] == pytest.approx(0.2)
    # Tune's Trial fields beside the results: the searched values (not the constant "log"), max_failures
    assert sorted(trial.evaluated_params["lr"] for trial in analysis.trials) == [0.1, 0.2]
    assert all(set(trial.evaluated_params) == {"lr"} and trial.max_failures == 0 for trial in analysis.trials)


def test_the_same_call_to_ray_tunes_run_gives_the_same_analysis(grid_analysis, grid_arguments, tmp_path):
    tunes = tune.run(descend, **{**grid_arguments, "config": GRID, "storage_path": str(tmp_path), "name": "tunes"})
    ours = grid_analysis
    assert ours.best_config["lr"] == tunes.best_config["lr"] == 0.1
    assert sorted(t.status for t in ours.trials) == sorted(t.status for t in tunes.trials)

    def last(analysis):
        return sorted(
            (t.config["lr"], t.last_result["loss"], t.last_result["training_iteration"]) for t in analysis.trials
        )

    assert last(ours) == pytest.approx(last(tunes))
    assert set(tunes.dataframe().columns) <= set(ours.dataframe().columns)


def test_a_class_trainable_with_sampled_configs_and_the_deprecated_checkpoint_arguments(ray_session, tmp_path):
    with pytest.warns(DeprecationWarning) as warned:
        analysis = run(
            Climb,
            config={"lr": tune.uniform(0.5, 1.0)},
            num_samples=2,
            stop={"training_iteration": 2},
            checkpoint_freq=1,
            keep_checkpoints_num=1,
            storage_path=str(tmp_path),
            verbose=0,
        )
    assert {"checkpoint_freq", "keep_checkpoints_num"} <= {str(w.message).split()[0] for w in warned}
    assert len(analysis.trials) == 2
    for trial in analysis.trials:
        assert 0.5 <= trial.config["lr"] <= 1.0
        assert trial.last_result["score"] == pytest.approx(2 * trial.config["lr"])
        assert trial.checkpoint is not None
    assert analysis.default_metric is None  # no metric given: Tune's analysis has none either


def test_a_scheduler_and_a_searcher_by_name(ray_session, tmp_path):
    analysis = run(
        descend,
        config={"lr": tune.uniform(0.1, 1.0)},
        metric="loss",
        mode="min",
        num_samples=4,
        search_alg="optuna",  # created by name, as tune.run creates it
        scheduler=ASHAScheduler(max_t=4, grace_period=1),
        storage_path=str(tmp_path),
        verbose=0,
    )
    assert len(analysis.trials) == 4
    assert analysis.best_config["lr"] == min(trial.config["lr"] for trial in analysis.trials)


def test_resources_per_trial_leave_the_callers_function_as_it_was(ray_session, tmp_path):
    def gpus(config):
        tune.report({"gpus": len(ray.get_gpu_ids())})

    analysis = run(gpus, resources_per_trial={"cpu": 1, "gpu": 2}, storage_path=str(tmp_path), verbose=0)
    assert analysis.trials[0].last_result["gpus"] == 2
    assert not hasattr(gpus, "_resources"), "tune.with_resources went to a copy"
    assert analysis.trials[0].placement_group_factory.required_resources == {"CPU": 1.0, "GPU": 2.0}


def test_each_trial_gets_the_resources_its_config_asks_for(ray_session, tmp_path):
    """As Tune asks ``with_resources``' function (or a class's
    ``default_resource_request``) per trial: every trial held the first
    trial's request, so a trial asking for 2 GPUs ran with 1."""

    def gpus(config):
        tune.report({"gpus": len(ray.get_gpu_ids())})

    asks = tune.with_resources(gpus, lambda config: {"cpu": 1, "gpu": config["gpus"]})
    analysis = run(asks, config={"gpus": tune.grid_search([1, 2])}, storage_path=str(tmp_path), verbose=0)
    held = sorted((trial.config["gpus"], trial.last_result["gpus"]) for trial in analysis.trials)
    assert held == [(1, 1), (2, 2)]
    shown = sorted(trial.placement_group_factory.required_resources["GPU"] for trial in analysis.trials)
    assert shown == [1.0, 2.0]


def test_a_trial_that_returned_having_reported_nothing_has_tunes_last_result(ray_session, tmp_path):
    def silent(config):
        pass

    (trial,) = run(silent, storage_path=str(tmp_path), verbose=0).trials
    assert sorted(trial.last_result) == [
        "config",
        "date",
        "done",
        "hostname",
        "node_ip",
        "pid",
        "timestamp",
        "trial_id",
    ]
    assert trial.last_result["done"] is True


def test_resources_per_trial_on_a_trainable_with_resources_is_tunes_error():
    def asks(config):
        tune.report({"loss": 0.0})

    with pytest.raises(TuneError, match="clear the `resources_per_trial`"):
        run(tune.with_resources(asks, {"cpu": 1}), resources_per_trial={"cpu": 1}, verbose=0)


def test_a_failed_trial_raises_tunes_error_as_tune_run_does(ray_session, tmp_path):
    marker = tmp_path / "fail"
    marker.touch()
    space = {"lr": 0.1, "fail": str(marker)}
    with pytest.raises(TuneError) as ours:
        run(descend, config=space, storage_path=str(tmp_path), name="ours", verbose=0)
    with pytest.raises(TuneError) as tunes:
        tune.run(descend, config=space, storage_path=str(tmp_path), name="tunes", verbose=0)
    assert ours.value.args[0] == tunes.value.args[0] == "Trials did not complete"
    assert [t.status for t in ours.value.args[1]] == [t.status for t in tunes.value.args[1]] == ["ERROR"]


def test_failed_trials_are_returned_and_resumed_with_errored(ray_session, tmp_path):
    marker = tmp_path / "fail"
    marker.touch()
    space = {"lr": 0.1, "fail": tune.grid_search([None, str(marker)])}
    arguments = dict(config=space, storage_path=str(tmp_path), name="failing", verbose=0)
    analysis = run(descend, raise_on_failed_trial=False, **arguments)
    assert sorted(t.status for t in analysis.trials) == ["ERROR", "TERMINATED"]

    marker.unlink()  # Tune's resume="AUTO+ERRORED": the errored trial runs again, the finished one is kept
    resumed = run(descend, resume="AUTO+ERRORED", **arguments)
    assert [t.status for t in resumed.trials] == ["TERMINATED"] * 2
    assert sorted(t.trial_id for t in resumed.trials) == sorted(t.trial_id for t in analysis.trials)


def test_resume_auto_trains_nothing_again_of_a_finished_experiment(grid_analysis, grid_arguments):
    log = grid_arguments["config"]["log"]
    with open(log) as file:
        trained = file.read()
    again = run(descend, resume="AUTO", **grid_arguments)
    with open(log) as file:
        assert file.read() == trained
    assert sorted(t.trial_id for t in again.trials) == sorted(t.trial_id for t in grid_analysis.trials)
    assert [t.status for t in again.trials] == ["TERMINATED"] * 2
    assert again.best_config["lr"] == 0.1


def test_resume_auto_continues_an_interrupted_experiment(ray_session, tmp_path):
    interrupt = tmp_path / "interrupt"
    interrupt.touch()
    space = {**GRID, "interrupt": str(interrupt), "pid": os.getpid()}
    arguments = dict(config=space, storage_path=str(tmp_path), name="interrupted", verbose=0)
    stopped = run(descend, **arguments)  # as Tune: an interrupted run returns, its unfinished trials logged
    assert any(t.status != "TERMINATED" for t in stopped.trials)
    resumed = run(descend, resume="AUTO", **arguments)
    assert [t.status for t in resumed.trials] == ["TERMINATED"] * 2
    assert {t.last_result["training_iteration"] for t in resumed.trials} == {4}


def test_an_experiment_is_run_from_its_spec(ray_session, tmp_path):
    spec = {"run": descend, "config": GRID, "stop": {"training_iteration": 2}, "storage_path": str(tmp_path)}
    trials = run_experiments({"from_spec": spec}, verbose=0)  # a tune.Experiment per entry, as Tune makes them
    assert sorted(t.config["lr"] for t in trials) == [0.1, 0.2]
    assert [(t.status, t.last_result["training_iteration"]) for t in trials] == [("TERMINATED", 2)] * 2
    assert tune.ExperimentAnalysis(str(tmp_path / "from_spec")).trials, "the experiment's own folder"


@pytest.mark.parametrize(
    ("arguments", "error", "match"),
    [
        ({"export_formats": ["model"]}, ValueError, "export_formats is not supported"),
        ({"restore": "/a/checkpoint"}, ValueError, "restore is not supported"),
        ({"log_to_file": ["a", "b", "c"]}, ValueError, "has to have a length of 2"),
        ({"_remote": True}, ValueError, "_remote is not supported: allowed None or False"),
        ({"mode": "maximum"}, ValueError, "must be one of \\['min', 'max'\\]"),
        ({"config": [1, 2]}, ValueError, "The `config` passed to `tune.run"),
        ({"resume": "auto"}, ValueError, "resume must be None, False, True or 'AUTO'"),
        ({"resume": "AUTO+NEVER"}, ValueError, "Invalid resume setting: 'NEVER'"),
        ({"resume": "LOCAL"}, DeprecationWarning, "'LOCAL' is deprecated"),
        ({"local_dir": "/tmp"}, DeprecationWarning, "`local_dir` argument is deprecated"),
        ({"chdir_to_trial_dir": False}, DeprecationWarning, "`chdir_to_trial_dir` is deprecated"),
        (
            {"resume_config": tune.ResumeConfig(finished=tune.ResumeConfig.ResumeType.RESTART)},
            ValueError,
            "finished=SKIP",
        ),
    ],
)
def test_what_cannot_be_honoured_is_refused_by_name(arguments, error, match):
    with pytest.raises(error, match=match):
        run(descend, **arguments)


def test_several_experiments_at_once_are_refused(tmp_path):
    experiments = [tune.Experiment(name, descend, storage_path=str(tmp_path)) for name in ("a", "b")]
    with pytest.raises(ValueError, match="run_or_experiment must be one trainable or one tune.Experiment"):
        run(experiments)
    with pytest.raises(ValueError, match="concurrent=False"):
        run_experiments(experiments)
