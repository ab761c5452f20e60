"""Ray Tune 2.60's result semantics, as a Tune script meets them (issue 29.2):
return values, the trainable's own exception in Result.error, get_best_result
on one trial, Tuner.get_results(), the experiment folder at Tuner(), Tune's
refusals, registered trainables by name."""

from __future__ import annotations

import json
import os
import tempfile
import threading
import time

import pytest
from ray import cloudpickle, tune
from ray.exceptions import RayActorError, RayTaskError
from ray.tune.error import TuneError

from ray_stagetree import Tuner

# A test run on both Tuners holds ray_stagetree to what it asserts, and shows with Ray Tune's run that Tune does
# the same: that run checks the test, not ray_stagetree, so it is in the release tier (-m release).
BOTH_TUNERS = pytest.mark.parametrize(
    "tuner_class", [pytest.param(tune.Tuner, marks=pytest.mark.release), Tuner], ids=["ray_tune", "ray_stagetree"]
)


def run_config(tmp_path, name, **kwargs):
    kwargs.setdefault("verbose", 0)
    return tune.RunConfig(name=name, storage_path=str(tmp_path), **kwargs)


# -- return values (Tune's function wrapper) ------------------------------------


def reports_then_returns_dict(config):
    for step in range(2):
        tune.report({"loss": 10 - step})
    return {"loss": 0.5, "final": True}


def returns_number(config):
    return config["x"] * 2


def yields_results(config):
    for step in range(3):
        yield {"score": step * config["x"]}


def returns_a_string(config):
    return "finished"


def returns_none(config):
    tune.report({"loss": 1.0})


def test_a_returned_dict_is_the_last_result(tmp_path, ray_session):
    (result,) = Tuner(reports_then_returns_dict, run_config=run_config(tmp_path, "dict")).fit()
    assert result.error is None
    assert result.metrics["loss"] == 0.5 and result.metrics["final"] is True
    assert result.metrics["training_iteration"] == 3  # one more result, as in Tune
    assert result.metrics["done"] is True
    assert list(result.metrics_dataframe["loss"]) == [10, 9, 0.5]


def test_a_returned_number_is_recorded_as_metric(tmp_path, ray_session):
    grid = Tuner(
        returns_number,
        param_space={"x": tune.grid_search([1.5, 4])},
        tune_config=tune.TuneConfig(metric="_metric", mode="max"),
        run_config=run_config(tmp_path, "number"),
    ).fit()
    assert sorted(result.metrics["_metric"] for result in grid) == [3.0, 8]
    assert all(result.metrics["done"] is True for result in grid)
    assert grid.get_best_result().config["x"] == 4


def test_yielded_values_are_results(tmp_path, ray_session):
    (result,) = Tuner(yields_results, param_space={"x": 2}, run_config=run_config(tmp_path, "yield")).fit()
    assert list(result.metrics_dataframe["score"]) == [0, 2, 4]
    assert result.metrics["done"] is True


def test_a_return_tune_refuses_errs_the_trial_and_none_adds_nothing(tmp_path, ray_session):
    (bad,) = Tuner(returns_a_string, run_config=run_config(tmp_path, "string")).fit()
    assert isinstance(bad.error, ValueError)
    assert "Either return/yield a single number or a dictionary" in str(bad.error)
    (plain,) = Tuner(returns_none, run_config=run_config(tmp_path, "none")).fit()
    assert plain.error is None and plain.metrics["training_iteration"] == 1


# -- Result.error is the trainable's exception ------------------------------------


class UnpicklableError(Exception):
    def __init__(self, message):
        super().__init__(message)
        self.lock = threading.Lock()


def raises_runtime_error(config):
    tune.report({"loss": 1.0})
    raise RuntimeError(f"boom {config['x']}")


def raises_unpicklable(config):
    raise UnpicklableError("holds a lock")


def test_errors_are_the_trainables_own_exception(tmp_path, ray_session):
    grid = Tuner(
        raises_runtime_error, param_space={"x": tune.grid_search([1, 2])}, run_config=run_config(tmp_path, "errors")
    ).fit()
    assert grid.num_errors == 2 and len(grid.errors) == 2
    for result in grid:
        assert isinstance(result.error, RuntimeError)
        assert isinstance(result.error, RayTaskError)  # as Tune gives it: Ray's task error, an instance of the cause
        assert isinstance(result.error.cause, RuntimeError)
        assert str(result.error.cause) == f"boom {result.config['x']}"
    # It can be passed on as Ray passes errors (its class is made at run time: cloudpickle, as in Tune).
    again = cloudpickle.loads(cloudpickle.dumps(grid.errors[0]))
    assert isinstance(again, RuntimeError)


def test_fail_fast_raise_raises_the_trainables_exception(tmp_path, ray_session):
    tuner = Tuner(
        raises_runtime_error,
        param_space={"x": 7},
        run_config=run_config(tmp_path, "raise", failure_config=tune.FailureConfig(fail_fast="raise")),
    )
    with pytest.raises(RuntimeError, match="boom 7"):
        tuner.fit()


def test_an_unpicklable_exception_degrades_to_its_traceback(tmp_path, ray_session):
    (result,) = Tuner(raises_unpicklable, run_config=run_config(tmp_path, "unpicklable")).fit()
    assert isinstance(result.error, RayTaskError)
    assert "UnpicklableError: holds a lock" in str(result.error)


def kills_its_worker(config):
    tune.report({"loss": 1.0})
    os._exit(1)


def test_a_dead_worker_is_tunes_actor_error(tmp_path, ray_session):
    (result,) = Tuner(kills_its_worker, run_config=run_config(tmp_path, "dead")).fit()
    assert isinstance(result.error, RayActorError)  # what Tune's Result.error holds when the trainable's actor died


# -- get_best_result, get_results --------------------------------------------------


def test_get_best_result_of_one_trial_needs_no_metric(tmp_path, ray_session):
    tuner = Tuner(returns_none, run_config=run_config(tmp_path, "one"))
    with pytest.raises(RuntimeError, match="Can't return results as experiment has not been run, yet"):
        tuner.get_results()
    grid = tuner.fit()
    assert grid.get_best_result() is grid[0]
    assert tuner.get_results() is grid


def test_get_best_result_of_several_trials_asks_for_metric_and_mode(tmp_path, ray_session):
    grid = Tuner(
        returns_number, param_space={"x": tune.grid_search([1, 2])}, run_config=run_config(tmp_path, "two")
    ).fit()
    with pytest.raises(ValueError, match="No metric is provided"):
        grid.get_best_result()
    with pytest.raises(ValueError, match="No mode is provided"):
        grid.get_best_result(metric="_metric")
    with pytest.raises(RuntimeError, match="No best trial found for the given metric: nothing"):
        grid.get_best_result(metric="nothing", mode="max")


# -- the experiment folder at Tuner() --------------------------------------------


def test_the_experiment_folder_exists_after_tuner(tmp_path):
    path = os.path.join(tmp_path, "early")
    assert not Tuner.can_restore(path)
    Tuner(returns_none, run_config=run_config(tmp_path, "early"))
    assert Tuner.can_restore(path)  # no Ray needed: nothing ran


def test_a_storage_path_under_home_is_expanded_as_tune_expands_it(tmp_path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))
    Tuner(returns_none, run_config=tune.RunConfig(storage_path="~/studies", name="home"))
    assert Tuner.can_restore(str(tmp_path / "studies" / "home"))


def test_restoring_a_never_fitted_tuner_runs_the_study(tmp_path, ray_session):
    Tuner(returns_number, param_space={"x": tune.grid_search([1, 2])}, run_config=run_config(tmp_path, "never"))
    tuner = Tuner.restore(os.path.join(tmp_path, "never"), returns_number)
    with pytest.raises(RuntimeError, match="Can't return results as experiment has not been run, yet"):
        tuner.get_results()  # nothing ran: no results to load, as in Tune
    grid = tuner.fit()
    assert sorted(result.metrics["_metric"] for result in grid) == [2, 4]


# -- Tune's refusals -------------------------------------------------------------


def test_a_non_dict_param_space_is_tunes_value_error(tmp_path):
    with pytest.raises(
        ValueError, match="The `param_space` passed to the `Tuner` must be a dict. Got '<class 'list'>'"
    ):
        Tuner(returns_none, param_space=[1, 2], run_config=run_config(tmp_path, "list"))
    with pytest.raises(ValueError, match="`RunConfig` cannot be tuned as part of the `param_space`"):
        Tuner(returns_none, param_space={"run_config": {}}, run_config=run_config(tmp_path, "rc"))


def test_an_unpicklable_trainable_is_refused_at_tuner(tmp_path):
    lock = threading.Lock()

    def holds_a_lock(config):
        with lock:
            tune.report({"loss": 1.0})

    with pytest.raises(TypeError, match="The provided trainable is not serializable"):
        Tuner(holds_a_lock, run_config=run_config(tmp_path, "lock"))
    assert not os.path.exists(os.path.join(tmp_path, "lock"))  # refused before anything is written


def old_signature(config, checkpoint_dir=None):
    tune.report({"loss": 1.0})


def old_signature_required(config, checkpoint_dir):
    tune.report({"loss": 1.0})


def test_the_old_checkpoint_dir_signature_is_refused_at_fit(tmp_path):
    tuner = Tuner(old_signature_required, run_config=run_config(tmp_path, "old"))
    with pytest.raises(
        ValueError, match="Unknown argument found in the Trainable function.*\nFound: \\['config', 'checkpoint_dir'\\]"
    ):
        tuner.fit()  # before Ray starts, as tune.run refuses it
    Tuner(old_signature, run_config=run_config(tmp_path, "optional"))  # callable with one config: Tune takes it


def test_deprecated_options_are_refused_as_tune_run_refuses_them(tmp_path, monkeypatch):
    tuner = Tuner(
        returns_none, tune_config=tune.TuneConfig(chdir_to_trial_dir=False), run_config=run_config(tmp_path, "chdir")
    )
    with pytest.raises(DeprecationWarning, match="`chdir_to_trial_dir` is deprecated. Use the RAY_CHDIR_TO_TRIAL_DIR"):
        tuner.fit()
    with pytest.raises(TypeError, match="chdir_to_trial_dir"):  # Ray's own RunConfig has no such argument
        tune.RunConfig(chdir_to_trial_dir=False)
    monkeypatch.setenv("TUNE_RESULT_DIR", str(tmp_path))
    tuner = Tuner(returns_none, run_config=run_config(tmp_path, "env"))
    with pytest.raises(DeprecationWarning, match="The environment variable `TUNE_RESULT_DIR` is deprecated"):
        tuner.fit()
    monkeypatch.delenv("TUNE_RESULT_DIR")
    failure = tune.FailureConfig(fail_fast=True)
    failure.max_failures = 2  # Ray refuses it at construction; a later change reaches tune.run's check
    tuner = Tuner(returns_none, run_config=run_config(tmp_path, "ff", failure_config=failure))
    with pytest.raises(ValueError, match="max_failures must be 0 if fail_fast=True"):
        tuner.fit()


def test_no_trainable_is_tunes_error(tmp_path):
    with pytest.raises(TuneError, match="You need to provide a trainable to tune"):
        Tuner(None, run_config=run_config(tmp_path, "none"))


# -- registered trainables ---------------------------------------------------------


def test_a_registered_trainable_runs_by_name_and_restores(tmp_path, ray_session):
    tune.register_trainable("stagetree_doubler", returns_number)
    tuner = Tuner(
        "stagetree_doubler", param_space={"x": tune.grid_search([1, 3])}, run_config=run_config(tmp_path, "named")
    )
    grid = tuner.fit()
    assert sorted(result.metrics["_metric"] for result in grid) == [2, 6]
    restored = Tuner.restore(os.path.join(tmp_path, "named"), "stagetree_doubler")
    # Before fit(), get_results() gives the results the experiment folder holds, as Tune's restored Tuner.
    stored = restored.get_results()
    assert sorted(result.metrics["_metric"] for result in stored) == [2, 6]
    assert {result.path for result in stored} == {result.path for result in grid}
    assert len(restored.fit()) == 2
    with pytest.raises(ValueError, match="identifier 'stagetree_nothing' but expected 'stagetree_doubler'"):
        Tuner.restore(os.path.join(tmp_path, "named"), "stagetree_nothing")  # Tune's check comes first
    with pytest.raises(TuneError, match="Unknown trainable: stagetree_nothing"):
        Tuner("stagetree_nothing", run_config=run_config(tmp_path, "unknown"))


# -- Tune's default trial names --------------------------------------------------


def reports_its_name(config):
    tune.report({"name": tune.get_context().get_trial_name(), "id": tune.get_context().get_trial_id()})


class NameRecorder(tune.Callback):
    def __init__(self):
        self.names = set()

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.names.add((str(trial), trial.trial_id))


def test_default_trial_names_are_tunes(tmp_path, ray_session):
    recorder = NameRecorder()
    grid = Tuner(
        reports_its_name,
        param_space={"lr": tune.grid_search([0.5, 0.25]), "fixed": 3},
        run_config=run_config(tmp_path, "names", callbacks=[recorder]),
    ).fit()
    expected = {f"reports_its_name_{result.metrics['id']}" for result in grid}
    assert {result.metrics["name"] for result in grid} == expected  # get_trial_name(), what MLflow/W&B default to
    assert {name for name, _ in recorder.names} == expected  # str(trial) in callbacks
    for result in grid:
        # Tune's folder: <name>_<counter>_<tuned values>_<date>; the counter is the trial id's number.
        counter = int(result.metrics["id"].rsplit("_", 1)[1])
        folder = os.path.basename(result.path)
        prefix = f"{result.metrics['name']}_{counter}_lr={result.config['lr']:.4f}_"
        assert folder.startswith(prefix), folder
        assert len(folder) == len(prefix) + len("2025-01-01_00-00-00")
        assert os.path.isfile(os.path.join(result.path, "result.json"))


def reports_wandb_defaults(config):
    """setup_wandb as a Tune trainable calls it; wandb itself (not installed
    here) is a stand-in whose init returns what it was given."""
    import types

    from ray.air.integrations import wandb as wandb_integration

    wandb_integration.wandb = types.SimpleNamespace(init=lambda **kwargs: kwargs)
    os.environ["WANDB_MODE"] = "offline"  # no API key asked for
    run = wandb_integration.setup_wandb(config, project="stagetree")
    tune.report(
        {"id": run["id"], "name": run["name"], "group": run["group"], "seen_id": tune.get_context().get_trial_id()}
    )


def test_setup_wandb_defaults_to_the_trial_and_experiment(tmp_path, ray_session):
    (result,) = Tuner(reports_wandb_defaults, param_space={"x": 1}, run_config=run_config(tmp_path, "wandb")).fit()
    assert result.error is None, result.error
    trial_id = result.metrics["trial_id"]
    assert result.metrics["id"] == result.metrics["seen_id"] == trial_id
    assert result.metrics["name"] == f"reports_wandb_defaults_{trial_id}"
    assert result.metrics["group"] == "wandb"


# -- a trial its scheduler stops -----------------------------------------------


def climbs(config):
    for step in range(1, 9):
        tune.report({"score": config["lr"] * step})


class ListSearcher(tune.search.Searcher):
    """Suggests the learning rates in order; notes in ``heard`` (a file: ray_stagetree's
    searcher runs in the study's controller) the done flag of each result on_trial_result gets."""

    def __init__(self, rates, heard):
        super().__init__()
        self.rates, self.heard = list(rates), heard

    def suggest(self, trial_id):
        return {"lr": self.rates.pop(0)} if self.rates else tune.search.Searcher.FINISHED

    def on_trial_result(self, trial_id, result):
        with open(self.heard, "a") as file:
            file.write(f"{result['done']}\n")

    def on_trial_complete(self, trial_id, result=None, error=False):
        pass


class RowsSeen(tune.Callback):
    def __init__(self):
        self.rows = []

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.rows.append((trial.config["lr"], result["training_iteration"], result["done"]))


def reports_loss(config):
    for step in range(3):
        tune.report({"loss": config["x"] - step})


@BOTH_TUNERS
def test_a_result_without_the_metric_fails_fit_unless_strict_checking_is_off(
    tmp_path, ray_session, tuner_class, monkeypatch
):
    def tuner(name):
        return tuner_class(
            reports_loss,
            param_space={"x": tune.grid_search([1, 2])},
            tune_config=tune.TuneConfig(metric="acc", mode="max"),
            run_config=run_config(tmp_path, name),
        )

    with pytest.raises(TuneError, match="did not include the specified metric.*`acc` that `tune.TuneConfig"):
        tuner("strict").fit()
    monkeypatch.setenv("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")
    grid = tuner("lenient").fit()
    assert grid.num_errors == 0 and sorted(result.metrics["loss"] for result in grid) == [-1, 0]


@BOTH_TUNERS
def test_a_trial_its_scheduler_stops_ends_on_a_done_result(tmp_path, ray_session, tuner_class):
    """As in Tune: the result a scheduler answers STOP to is ``done`` (in the
    callbacks and the trial's last result), and the searcher hears of it at
    the trial's end, not in ``on_trial_result``. One trial at a time: ASHA's
    decisions are then the same in both systems."""
    from ray.tune.schedulers import ASHAScheduler

    rows, heard = RowsSeen(), tmp_path / "heard"
    heard.touch()
    grid = tuner_class(
        climbs,
        tune_config=tune.TuneConfig(
            metric="score",
            mode="max",
            scheduler=ASHAScheduler(max_t=8, grace_period=1, reduction_factor=2),
            search_alg=ListSearcher([0.3, 0.1, 0.2, 0.05], str(heard)),
            num_samples=4,
            max_concurrent_trials=1,
            reuse_actors=True,  # Tune's four trials in one process: a process per trial made this test's time
        ),
        run_config=run_config(tmp_path, "stopped", callbacks=[rows]),
    ).fit()
    last = sorted((r.config["lr"], r.metrics["training_iteration"], r.metrics["done"]) for r in grid)
    assert last == [(0.05, 1, True), (0.1, 1, True), (0.2, 2, True), (0.3, 8, True)]
    assert sorted(row for row in rows.rows if row[2]) == last, "the callbacks saw each trial's last result done"
    assert heard.read_text().split() == ["False"] * (len(rows.rows) - 4), "every result but the four done ones"


class NotesResults:
    """An ASHA scheduler that notes in ``seen`` (a file: ray_stagetree's scheduler
    runs in the study's controller) each result it is asked about and its answer."""

    def __new__(cls, seen, **kwargs):
        from ray.tune.schedulers import ASHAScheduler

        class Noting(ASHAScheduler):
            def on_trial_result(self, tune_controller, trial, result):
                decision = super().on_trial_result(tune_controller, trial, result)
                with open(seen, "a") as file:
                    file.write(f"{trial.config['lr']} {result['training_iteration']} {result['done']} {decision}\n")
                return decision

        return Noting(**kwargs)


@BOTH_TUNERS
def test_a_scheduler_hears_the_result_at_its_max_t(tmp_path, ray_session, tuner_class):
    """With no stop criterion, the scheduler's max_t ends a trial, and Tune asks
    the scheduler about that last result too (ASHA answers STOP there)."""
    seen = tmp_path / "seen"
    seen.touch()
    grid = tuner_class(
        climbs,
        param_space={"lr": tune.grid_search([0.3])},
        tune_config=tune.TuneConfig(
            metric="score", mode="max", scheduler=NotesResults(str(seen), max_t=4, grace_period=1, reduction_factor=2)
        ),
        run_config=run_config(tmp_path, "max_t"),
    ).fit()
    (result,) = grid
    assert result.metrics["training_iteration"] == 4 and result.metrics["done"] is True
    assert seen.read_text().splitlines() == [f"0.3 {step} False CONTINUE" for step in (1, 2, 3)] + ["0.3 4 False STOP"]


# -- what a Tune script reads of its trial and its results -------------------------


def reports_its_resources(config):
    if config["report"]:
        tune.report({"resources": tune.get_context().get_trial_resources().required_resources})


def test_trial_resources_filesystem_and_a_trial_without_results_read_as_in_tune(tmp_path, ray_session):
    """``get_trial_resources()`` is the trial's resource request (scripts
    size their data loaders by it), ``grid.filesystem`` the experiment
    folder's pyarrow filesystem, and a trial that never reported has an empty
    ``metrics_dataframe``, not None, and Tune's bookkeeping as its metrics:
    each was what failed a Tune script.
    ``Result.metrics`` carries Tune's ``experiment_tag``."""
    import pyarrow.fs

    grid = Tuner(
        tune.with_resources(reports_its_resources, {"cpu": 0.5, "gpu": 1}),
        param_space={"report": tune.grid_search([True, False])},
        run_config=run_config(tmp_path, "resources"),
    ).fit()
    reported, silent = sorted(grid, key=lambda result: not result.config["report"])
    assert reported.metrics["resources"] == {"CPU": 0.5, "GPU": 1.0}
    assert reported.metrics["experiment_tag"] == "0_report=True"  # in the last result, as Tune adds it
    assert silent.metrics_dataframe is not None and silent.metrics_dataframe.empty
    # Tune's last result of a function that returned having reported nothing: its bookkeeping alone.
    assert list(silent.metrics) == ["trial_id", "date", "timestamp", "pid", "hostname", "node_ip", "config", "done"]
    assert silent.metrics["done"] is True and silent.metrics["config"] == {"report": False}
    assert silent.metrics["trial_id"].endswith("_00001") and silent.metrics["pid"] != os.getpid()
    assert isinstance(grid.filesystem, pyarrow.fs.LocalFileSystem)
    assert grid.filesystem.get_file_info(grid.experiment_path).type == pyarrow.fs.FileType.Directory


def sleeps_before_its_first_report(config):
    time.sleep(60)
    tune.report({"x": 1})


@BOTH_TUNERS
def test_a_trial_stopped_before_its_first_report_has_its_id_in_its_metrics(tmp_path, ray_session, tuner_class):
    """A study's time budget ends before any result: each trial's
    ``Result.metrics`` still name it (code that tables results by
    ``trial_id`` read a KeyError). The budget leaves Tune time to start
    both trials on a loaded machine (a trial never started has no metrics
    under Tune)."""
    grid = tuner_class(
        sleeps_before_its_first_report,
        param_space={"a": tune.grid_search([1, 2])},
        tune_config=tune.TuneConfig(time_budget_s=6),
        run_config=run_config(tmp_path, "budget"),
    ).fit()
    for result in grid:
        assert result.metrics["trial_id"].endswith(("_00000", "_00001"))
        assert result.metrics["config"] == {"a": result.config["a"]}


# -- checkpoint folders named in the rows (Result.from_path) ---------------------


def checkpoints_every_other(config):
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder, open(os.path.join(folder, "step")) as file:
            start = int(file.read())
    for step in range(start + 1, 6):
        lr = config["lr"]  # a number under Tune; a sequence's value at this step under ray_stagetree
        if step % 2:
            with tempfile.TemporaryDirectory() as folder:
                with open(os.path.join(folder, "step"), "w") as file:
                    file.write(str(step))
                tune.report({"score": lr * step}, checkpoint=tune.Checkpoint.from_directory(folder))
        else:
            tune.report({"score": lr * step})


@BOTH_TUNERS
def test_rows_name_the_checkpoint_folders_and_result_from_path_reads_a_trial_back(tmp_path, ray_session, tuner_class):
    """As in Tune: a function trainable's rows carry ``checkpoint_dir_name``
    (the n-th reported checkpoint's folder, None without one) and, where it
    reported one, ``should_checkpoint``, Tune's keys in Tune's order after
    the reported metrics (the columns of ``progress.csv``); the trial's
    folders are named so, every reported checkpoint is kept (Tune's default
    ``num_to_keep=None``), and ``tune.Result.from_path`` reads a trial
    folder back with each checkpoint's own row."""
    grid = tuner_class(
        checkpoints_every_other,
        param_space={"lr": tune.grid_search([1.0, 2.0])},
        run_config=run_config(tmp_path, "named"),
    ).fit()
    assert not grid.errors
    for result in grid:
        names = [name if isinstance(name, str) else None for name in result.metrics_dataframe["checkpoint_dir_name"]]
        assert names == ["checkpoint_000000", None, "checkpoint_000001", None, "checkpoint_000002"]
        assert [flag is True for flag in result.metrics_dataframe["should_checkpoint"]] == [True, False] * 2 + [True]
        with open(os.path.join(result.path, "result.json")) as file:
            assert list(json.loads(file.readline())) == ["score", *FUNCTION_RESULT_KEYS]
        with open(os.path.join(result.path, "progress.csv")) as file:
            assert file.readline().strip().split(",") == ["score", *FUNCTION_RESULT_COLUMNS]
        assert os.path.basename(result.checkpoint.path) == "checkpoint_000002"
        assert [metrics["training_iteration"] for _, metrics in result.best_checkpoints] == [1, 3, 5]
        read = tune.Result.from_path(result.path)
        assert read.metrics["score"] == result.metrics["score"]
        assert read.checkpoint.path == result.checkpoint.path
        for checkpoint, metrics in read.best_checkpoints:
            assert os.path.basename(checkpoint.path) == metrics["checkpoint_dir_name"]
            with checkpoint.as_directory() as folder, open(os.path.join(folder, "step")) as file:
                assert int(file.read()) == metrics["training_iteration"]


# What Tune adds to a function trainable's reported metrics, in its order; its CSV leaves out the config.
FUNCTION_RESULT_KEYS = [
    "timestamp", "checkpoint_dir_name", "should_checkpoint", "done", "training_iteration", "trial_id", "date",
    "time_this_iter_s", "time_total_s", "pid", "hostname", "node_ip", "config", "time_since_restore",
    "iterations_since_restore",
]  # fmt: skip
FUNCTION_RESULT_COLUMNS = [key for key in FUNCTION_RESULT_KEYS if key != "config"]


class ResultsSeen(tune.Callback):
    def __init__(self):
        self.tagged_results, self.tagged_last, self.last_then = [], [], []

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.tagged_results.append("experiment_tag" in result)
        self.last_then.append((trial.last_result.get("training_iteration"), result["training_iteration"]))

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.tagged_last.append(trial.last_result.get("experiment_tag"))


@BOTH_TUNERS
def test_the_experiment_tag_is_in_the_last_result_not_in_the_logged_rows(tmp_path, ray_session, tuner_class):
    """Tune adds a trial's experiment tag to a result after its loggers and
    callbacks had it: ``Result.metrics`` and ``trial.last_result`` have it;
    ``result.json``, ``progress.csv``, ``metrics_dataframe``, the
    checkpoints' metrics and the results callbacks see do not. During a
    result's callbacks ``trial.last_result`` is still the one before."""
    import json

    seen = ResultsSeen()
    grid = tuner_class(
        checkpoints_every_other,
        param_space={"lr": tune.grid_search([1.0, 2.0])},
        run_config=run_config(tmp_path, "tags", callbacks=[seen]),
    ).fit()
    assert not grid.errors
    for result in grid:
        tag = f"{int(result.config['lr']) - 1}_lr={result.config['lr']:.4f}"
        assert result.metrics["experiment_tag"] == tag
        assert [metrics.get("experiment_tag") for _, metrics in result.best_checkpoints] == [None] * 3
        assert "experiment_tag" not in result.metrics_dataframe.columns
        with open(os.path.join(result.path, "result.json")) as file:
            assert not any("experiment_tag" in json.loads(line) for line in file)
        with open(os.path.join(result.path, "progress.csv")) as file:
            assert "experiment_tag" not in file.readline()
    assert seen.tagged_results == [False] * 10
    # a callback's trial.last_result is the result before this one: Tune updates it after the callbacks
    assert sorted(seen.last_then, key=lambda pair: pair[1]) == [
        (before, iteration) for iteration in range(1, 6) for before in [iteration - 1 or None] * 2
    ]
    assert sorted(seen.tagged_last) == ["0_lr=1.0000", "1_lr=2.0000"]


def test_shared_stages_name_each_trials_checkpoint_folders_as_it_reported_them(tmp_path, ray_session):
    """Two trials share their first three steps (one stage, its rows the
    plan's): each names its checkpoints among those it reported and keeps
    every one, the shared stage's too, and its folders are read back."""
    from ray_stagetree import Step

    grid = Tuner(
        checkpoints_every_other,
        param_space={"lr": tune.grid_search([Step(1.0, 3, gamma) for gamma in (0.5, 0.1)])},
        run_config=run_config(tmp_path, "shared"),
    ).fit()
    assert not grid.errors and grid.iterations_executed < 10
    for result in grid:
        names = [name if isinstance(name, str) else None for name in result.metrics_dataframe["checkpoint_dir_name"]]
        assert names == ["checkpoint_000000", None, "checkpoint_000001", None, "checkpoint_000002"]
        folders = sorted(name for name in os.listdir(result.path) if name.startswith("checkpoint_"))
        assert folders == ["checkpoint_000000", "checkpoint_000001", "checkpoint_000002"]
        read = tune.Result.from_path(result.path)
        assert [metrics["training_iteration"] for _, metrics in read.best_checkpoints] == [1, 3, 5]


def fails_once_when_asked(config):
    """Trial ``fail`` raises once at its second iteration (a marker file remembers), then scores as the others."""
    for step in range(1, 4):
        if step == 2 and config["fail"] and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            raise RuntimeError("transient failure")
        tune.report({"score": step})


@BOTH_TUNERS
def test_a_retried_trial_goes_after_the_others_as_tune_requeues_it(tmp_path, ray_session, tuner_class):
    """Tune requeues a failed trial it retries at the end of its trials: the
    ResultGrid's order, in which ``get_best_result`` breaks a tie."""
    grid = tuner_class(
        fails_once_when_asked,
        param_space={"fail": tune.grid_search([True, False]), "marker": str(tmp_path / "failed")},
        run_config=run_config(tmp_path, "requeued", failure_config=tune.FailureConfig(max_failures=1)),
    ).fit()
    assert not grid.errors and [result.metrics["score"] for result in grid] == [3, 3]
    assert [result.config["fail"] for result in grid] == [False, True]
    assert [result.metrics["trial_id"][-1] for result in grid] == ["1", "0"]
    assert grid.get_best_result("score", "max").config["fail"] is False
