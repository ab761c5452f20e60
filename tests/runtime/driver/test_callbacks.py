"""Tune's callbacks and loggers on the driver (`runtime/driver/callbacks.py`): the
runner fed with the controller's progress, then end to end through `Tuner`."""

import csv
import glob
import json
import os
import pickle
import re
import struct

import fsspec
import numpy as np
import pytest
from ray import tune
from ray.tune.error import TuneError
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback, LoggerCallback, TBXLoggerCallback
from ray.tune.result import SHOULD_CHECKPOINT
from trainables_for_tests import SavesItsStep, noisy_descent

from ray_stagetree import MultiStep, PlanServiceConfig, Tuner
from ray_stagetree.planning.config import tabular
from ray_stagetree.runtime.control.messages import CallbackAnswer, Progress
from ray_stagetree.runtime.driver.callback_hooks import asks_for_checkpoints
from ray_stagetree.runtime.driver.callbacks import CallbackRunner, searched_paths, with_default_loggers
from ray_stagetree.runtime.service.service_client import shutdown

CONFIG = {"lr": {"family": "MultiStep", "init": 0.1, "milestones": [4], "gamma": 0.5, "values": None}, "seed": 0}


class Recorder(tune.Callback):
    """Every hook call, with what the trial looked like at the time."""

    def __init__(self):
        self.calls = []

    def setup(self, stop=None, num_samples=None, total_num_samples=None, **info):
        self.calls.append(("setup", num_samples, total_num_samples))

    def on_trial_start(self, iteration, trials, trial, **info):
        self.calls.append(("start", trial.trial_id, trial.status, len(trials)))

    def on_trial_result(self, iteration, trials, trial, result, **info):
        assert trial.last_result is not result, "as in Tune, the trial's last result is updated after the callbacks"
        self.calls.append(("result", trial.trial_id, result["training_iteration"], result.get("loss")))

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.calls.append(("complete", trial.trial_id, trial.status))

    def on_trial_error(self, iteration, trials, trial, **info):
        self.calls.append(("error", trial.trial_id, trial.status, trial.error_msg))

    def on_trial_recover(self, iteration, trials, trial, **info):
        self.calls.append(("recover", trial.trial_id, trial.run_metadata.num_failures))

    def on_trial_restore(self, iteration, trials, trial, **info):
        self.calls.append(("restore", trial.trial_id))

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        assert trial.checkpoint is checkpoint
        self.calls.append(("checkpoint", trial.trial_id, checkpoint.path))

    def on_experiment_end(self, trials, **info):
        self.calls.append(("end", sorted(t.trial_id for t in trials)))

    def of(self, kind):
        return [call[1:] for call in self.calls if call[0] == kind]


def start(trial_id, dirname=None):
    return {
        "event": "start",
        "trial_id": trial_id,
        "name": f"t_{trial_id}",
        "dirname": dirname or trial_id,
        "config": CONFIG,
    }


def row(trial_id, step, loss):
    return {
        "trial_id": trial_id,
        "training_iteration": step,
        "loss": loss,
        "done": False,
        "config": CONFIG,
        "time_this_iter_s": 0.1,
    }


def progress(rows=(), events=(), rows_through=0):
    return Progress(rows=list(rows), events=list(events), rows_through=rows_through)


def result_steps(folder):
    with open(os.path.join(folder, "result.json")) as file:
        return [json.loads(line)["training_iteration"] for line in file]


def csv_steps(folder):
    with open(os.path.join(folder, "progress.csv")) as file:
        return [int(r["training_iteration"]) for r in csv.DictReader(file)]


def tensorboard_scalars(folder):
    """{tag: [(step, value)]} from every TensorBoard event file in ``folder``
    (TFRecord framing: length, its CRC, the Event proto, its CRC)."""
    from tensorboardX.proto import event_pb2

    scalars = {}
    for path in sorted(glob.glob(os.path.join(folder, "events.out.tfevents.*"))):
        with open(path, "rb") as file:
            data = file.read()
        offset = 0
        while offset < len(data):
            (length,) = struct.unpack("<Q", data[offset : offset + 8])
            event = event_pb2.Event.FromString(data[offset + 12 : offset + 12 + length])
            offset += 12 + length + 4
            for value in event.summary.value:
                scalars.setdefault(value.tag, []).append((event.step, value.simple_value))
    return scalars


def test_hooks_are_called_in_tunes_order_with_trial_views(tmp_path):
    recorder = Recorder()
    runner = CallbackRunner([recorder], str(tmp_path / "exp"), param_space={"lr": tune.grid_search([1, 2])})
    runner.setup(num_samples=1, total_num_samples=2)
    runner.update(progress([row("a", 1, 0.9), row("b", 1, 0.8)], [start("a"), start("b")]))
    recover = {"event": "recover", "trial_id": "b", "name": "t_b", "dirname": "b", "error": "OSError: flaky"}
    runner.update(progress(events=[recover]))
    runner.update(
        progress(
            [row("a", 2, 0.7)],
            [
                {"event": "complete", "trial_id": "a", "name": "t_a", "dirname": "a"},
                {"event": "error", "trial_id": "b", "name": "t_b", "dirname": "b", "error": "ValueError: boom"},
            ],
        )
    )
    checkpoint = str(tmp_path / "exp" / "a" / "checkpoint_000002")
    runner.update(
        progress(events=[{"event": "checkpoint", "trial_id": "a", "name": "t_a", "dirname": "a", "path": checkpoint}])
    )
    runner.end()
    assert recorder.calls[0] == ("setup", 1, 2)
    assert recorder.of("start") == [("a", "RUNNING", 1), ("b", "RUNNING", 2)]
    assert recorder.of("result") == [("a", 1, 0.9), ("b", 1, 0.8), ("a", 2, 0.7)]
    assert recorder.of("complete") == [("a", "TERMINATED")]
    assert recorder.of("recover") == [("b", 1)]
    assert recorder.of("error") == [("b", "ERROR", "ValueError: boom")]
    assert recorder.of("checkpoint") == [("a", checkpoint)]
    assert recorder.calls[-1] == ("end", ["a", "b"])
    trial = runner.trials["a"]
    assert str(trial) == "t_a" and trial.trial_id == "a" and trial.config == CONFIG
    assert trial.path == f"{tmp_path}/exp/a" and trial.local_path == str(tmp_path / "exp" / "a")
    assert trial.last_result["training_iteration"] == 2 and trial.checkpoint.path == checkpoint
    assert trial.evaluated_params == {
        "lr/family": "MultiStep",
        "lr/init": 0.1,
        "lr/milestones": [4],
        "lr/gamma": 0.5,
        "lr/values": None,
    }
    with open(runner.trials["b"].error_file) as file:  # each failure, as Tune's Trial.handle_error adds it
        assert re.fullmatch(
            r"Failure # 1 \(occurred at .+\)\nOSError: flaky\nFailure # 2 \(occurred at .+\)\nValueError: boom\n",
            file.read(),
        )


class RecoverOrder(tune.Callback):
    def __init__(self):
        self.orders = []

    def on_trial_recover(self, iteration, trials, trial, **info):
        self.orders.append([view.trial_id for view in trials])


def test_a_recovered_trial_goes_to_the_end_of_the_trials_before_the_callbacks_hear(tmp_path):
    """As Tune requeues a trial it retries before ``on_trial_recover``."""
    recorder = RecoverOrder()
    runner = CallbackRunner([recorder], str(tmp_path / "exp"))
    runner.setup(num_samples=1, total_num_samples=3)
    runner.update(progress([row("a", 1, 0.9)], [start("a"), start("b"), start("c")]))
    runner.update(progress(events=[{"event": "recover", "trial_id": "a", "name": "t_a", "dirname": "a", "error": "x"}]))
    runner.update(progress(events=[{"event": "recover", "trial_id": "c", "name": "t_c", "dirname": "c", "error": "x"}]))
    runner.end()
    assert recorder.orders == [["b", "c", "a"], ["b", "a", "c"]]


class AsksForCheckpoints(tune.Callback):
    """Tune's custom_checkpointing_with_callback example: asks for a checkpoint after every result."""

    def on_trial_result(self, iteration, trials, trial, result, **info):
        result[SHOULD_CHECKPOINT] = True


class AsksWhileLogging(LoggerCallback):
    """A logger of the user's that asks: it sees the result as loggers do (`tabular`)."""

    def log_trial_result(self, iteration, trial, result):
        result[SHOULD_CHECKPOINT] = True


class QuietJsonLogger(JsonLoggerCallback):
    """A subclass of Ray's logger that adds no hook of its own."""


def test_a_class_trainable_waits_for_the_callbacks_of_the_users_that_may_ask_for_checkpoints():
    """A function trainable waits for no answer: under Tune too it saves only what it reports."""
    assert asks_for_checkpoints([AsksForCheckpoints()], SavesItsStep)
    assert asks_for_checkpoints([AsksWhileLogging()], SavesItsStep)
    assert not asks_for_checkpoints([AsksForCheckpoints()], noisy_descent)
    assert not asks_for_checkpoints([tune.Callback(), JsonLoggerCallback(), QuietJsonLogger()], SavesItsStep)
    assert not asks_for_checkpoints(None, SavesItsStep)


@pytest.mark.parametrize("class_trainable", [True, False])
@pytest.mark.parametrize("asks", [AsksForCheckpoints, AsksWhileLogging])
def test_the_callbacks_answer_which_results_they_asked_to_checkpoint(tmp_path, asks, class_trainable):
    """A row that came with a checkpoint (a function's report) has Tune's
    ``should_checkpoint`` already: no callback asked for that one. A
    function trainable waits for no answer: under Tune too it saves only what it reports."""
    callbacks = [asks()]
    answers = asks_for_checkpoints(callbacks, SavesItsStep if class_trainable else noisy_descent)
    runner = CallbackRunner(callbacks, str(tmp_path / "exp"), answers_checkpoint_requests=answers)
    runner.setup(num_samples=1, total_num_samples=1)
    runner.update(
        progress([row("a", 1, 0.9), {**row("a", 2, 0.8), SHOULD_CHECKPOINT: True}], [start("a")], rows_through=2)
    )
    first = runner.answer()
    runner.update(progress([row("a", 3, 0.7)], rows_through=3))
    second = runner.answer()
    runner.end()
    if class_trainable:
        assert first == CallbackAnswer(2, [("a", 1)]) and second == CallbackAnswer(3, [("a", 3)])
    else:
        assert first is None and second is None


def test_default_loggers_write_tunes_files_once_per_iteration(tmp_path):
    runner = CallbackRunner(None, str(tmp_path))
    runner.setup()
    # Shared-stage metrics fan out to each trial; an iteration trained again
    # (a retry) comes a second time and is logged once.
    runner.update(
        progress(
            [row("a", 1, 0.9), row("b", 1, 0.9), row("a", 2, 0.8), row("b", 2, 0.8)],
            [start("a"), start("b", dirname="b_dir")],
        )
    )
    runner.update(
        progress(
            [row("a", 2, 0.8), row("a", 3, 0.5), row("b", 3, 0.6)],
            [
                {"event": "complete", "trial_id": "a", "name": "t_a", "dirname": "a"},
                {"event": "complete", "trial_id": "b", "name": "t_b", "dirname": "b_dir"},
            ],
        )
    )
    runner.end()
    for folder, last in ((tmp_path / "a", 0.5), (tmp_path / "b_dir", 0.6)):
        assert result_steps(folder) == csv_steps(folder) == [1, 2, 3]
        with open(folder / "params.json") as file:
            assert json.load(file) == CONFIG
        with open(folder / "params.pkl", "rb") as file:
            assert pickle.load(file) == CONFIG
        scalars = tensorboard_scalars(folder)
        assert [step for step, _ in scalars["ray/tune/loss"]] == [1, 2, 3]
        assert [value for _, value in scalars["ray/tune/loss"]] == pytest.approx([0.9, 0.8, last])  # float32


class ReadsTheLogsAtTheEnd(tune.Callback):
    """As MLflow's ``save_artifact`` does: reads the trial's folder when it ends."""

    def __init__(self):
        self.logged_steps = {}

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.logged_steps[trial.trial_id] = result_steps(trial.local_path)


def test_a_callback_at_a_trials_end_finds_all_its_results_written(tmp_path):
    reader = ReadsTheLogsAtTheEnd()
    runner = CallbackRunner([reader], str(tmp_path))
    runner.setup()
    steps = range(1, 2001)  # results the log thread is still writing when the trial's end comes
    complete = {"event": "complete", "trial_id": "a", "name": "t_a", "dirname": "a"}
    runner.update(progress([row("a", step, 1.0 / step) for step in steps], [start("a"), complete]))
    runner.end()
    assert reader.logged_steps == {"a": list(steps)}


def test_users_logger_replaces_its_default_and_the_variable_disables_them(monkeypatch):
    mine = JsonLoggerCallback()
    callbacks = with_default_loggers([mine])
    assert [
        cls
        for c in callbacks
        for cls in (JsonLoggerCallback, CSVLoggerCallback, TBXLoggerCallback)
        if isinstance(c, cls)
    ] == [JsonLoggerCallback, CSVLoggerCallback, TBXLoggerCallback]
    assert callbacks[0] is mine
    monkeypatch.setenv("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    recorder = Recorder()
    assert with_default_loggers([recorder]) == [recorder]


def test_a_runner_created_again_appends_and_never_repeats_an_iteration(tmp_path):
    first = CallbackRunner(None, str(tmp_path))
    first.update(progress([row("a", step, 1 / step) for step in (1, 2, 3)], [start("a")]))
    # The driver dies here, what it handed its loggers written (its files close). TensorBoard names event files
    # by the second they were opened: the new driver's, seconds later, gets
    # another name, as it would without this rename.
    first.close_logs()
    for writer in first.callbacks[-1]._trial_writer.values():
        writer.close()
    for name in glob.glob(str(tmp_path / "a" / "events.out.tfevents.*")):
        os.rename(name, name + ".driver1")
    # a restored study replays the plan's history
    second = CallbackRunner(None, str(tmp_path))
    second.update(progress([row("a", step, 1 / step) for step in (1, 2, 3, 4, 5)], [start("a")]))
    second.update(progress(events=[{"event": "complete", "trial_id": "a", "name": "t_a", "dirname": "a"}]))
    second.end()
    assert result_steps(tmp_path / "a") == csv_steps(tmp_path / "a") == [1, 2, 3, 4, 5]
    with open(tmp_path / "a" / "progress.csv") as file:
        assert file.read().count("training_iteration") == 1, "one header"
    assert sorted(step for step, _ in tensorboard_scalars(tmp_path / "a")["ray/tune/loss"]) == [1, 2, 3, 4, 5]


def test_a_remote_experiment_path_gets_the_staged_logs(tmp_path):
    path = f"memory://callbacks-{os.getpid()}/exp"
    runner = CallbackRunner(None, path)
    runner.update(progress([row("a", 1, 0.9), row("a", 2, 0.8)], [start("a")]))
    assert runner.trials["a"].local_path != f"{path}/a" and os.path.isdir(runner.trials["a"].local_path)
    runner.update(progress(events=[{"event": "complete", "trial_id": "a", "name": "t_a", "dirname": "a"}]))
    runner.wait_for_logs()  # written on the loggers' thread, then uploaded
    filesystem = fsspec.filesystem("memory")
    folder = f"/callbacks-{os.getpid()}/exp/a"
    assert {"result.json", "progress.csv", "params.json", "params.pkl"} <= {
        name.rsplit("/", 1)[-1] for name in filesystem.ls(folder, detail=False)
    }, "uploaded when the trial ends"
    assert any("tfevents" in name for name in filesystem.ls(folder, detail=False))
    # continued by a new driver (another staging folder): appended, not repeated
    again = CallbackRunner(None, path)
    again.update(progress([row("a", 2, 0.8), row("a", 3, 0.7)], [start("a")]))
    again.end()
    lines = filesystem.cat_file(f"{folder}/result.json").decode().splitlines()
    assert [json.loads(line)["training_iteration"] for line in lines] == [1, 2, 3]


def test_a_remote_study_uploads_while_it_runs_every_sync_period(tmp_path):
    path = f"memory://callbacks-sync-{os.getpid()}/exp"
    runner = CallbackRunner(None, path, sync_period=0)
    runner.update(progress([row("a", 1, 0.9)], [start("a")]))
    runner.update(progress([row("a", 2, 0.8)]))
    runner.wait_for_logs()
    lines = fsspec.filesystem("memory").cat_file(f"/callbacks-sync-{os.getpid()}/exp/a/result.json").splitlines()
    assert [json.loads(line)["training_iteration"] for line in lines] == [1, 2], "the trial still runs"


def test_searched_paths_name_what_the_space_draws():
    space = {
        "lr": tune.grid_search([MultiStep(0.1, [4], 0.5), MultiStep(0.1, [8], 0.5)]),
        "wd": MultiStep(tune.loguniform(1e-4, 1e-2), [5], 0.1),
        "fixed": MultiStep(0.1, [5], 0.1),
        "model": {"width": tune.choice([8, 16]), "depth": 3},
        "seed": 0,
    }
    assert searched_paths(space) == ("lr", "wd", "model/width")


def test_bad_callbacks_and_reporters_are_refused_before_anything_runs():
    with pytest.raises(TypeError, match=r"RunConfig.callbacks\[1\] must be a ray.tune.Callback.*'not one'"):
        Tuner(noisy_descent, run_config=tune.RunConfig(callbacks=[Recorder(), "not one"]))
    with pytest.raises(TypeError, match="RunConfig.progress_reporter must be a ray.tune.ProgressReporter.*print"):
        Tuner(noisy_descent, run_config=tune.RunConfig(progress_reporter=print))


# -- end to end ------------------------------------------------------------------------

HORIZON = 6
# Three trials sharing lr=0.1 for 2 iterations; two of them for 4.
LRS = [MultiStep(0.1, [2], 0.5), MultiStep(0.1, [4], 0.5), MultiStep(0.1, [4], 0.2)]


def fit(storage, name, callbacks=None, space=None, **run_kwargs):
    tuner = Tuner(
        noisy_descent,
        param_space=space or {"lr": tune.grid_search(LRS)},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(
            name=name,
            storage_path=storage,
            stop={"training_iteration": HORIZON},
            callbacks=callbacks,
            verbose=0,
            **run_kwargs,
        ),
    )
    return tuner.fit()


def test_a_study_calls_callbacks_and_logs_every_trial(tmp_path, ray_session):
    recorder = Recorder()
    grid = fit(str(tmp_path), "study", [recorder])
    assert grid.unique_iterations < grid.trial_by_trial_iterations, "the trials share stages"
    assert recorder.calls[0] == ("setup", 1, 3) and recorder.calls[-1][0] == "end"
    ids = sorted(result.metrics["trial_id"] for result in grid)
    assert sorted(trial_id for trial_id, *_ in recorder.of("start")) == ids
    assert sorted(trial_id for trial_id, _ in recorder.of("complete")) == ids
    for result in grid:
        trial_id = result.metrics["trial_id"]
        logged = [(step, loss) for t, step, loss in recorder.of("result") if t == trial_id]
        assert logged == list(zip(result.metrics_dataframe["training_iteration"], result.metrics_dataframe["loss"]))
        folder = result.path
        assert result_steps(folder) == csv_steps(folder) == list(range(1, HORIZON + 1))
        with open(os.path.join(folder, "params.json")) as file:
            # result.config holds the sequence object; Tune's logger writes its declarative form
            assert json.load(file) == tabular(result.config) and isinstance(result.config["lr"], MultiStep)
        assert [step for step, _ in tensorboard_scalars(folder)["ray/tune/loss"]] == list(range(1, HORIZON + 1))
        assert (trial_id, result.checkpoint.path) in recorder.of("checkpoint")


def test_an_errored_trial_calls_on_trial_error_and_keeps_its_logs(tmp_path, ray_session):
    recorder = Recorder()
    space = {"lr": LRS[0], "explode_at": tune.grid_search([None, 3])}
    grid = fit(str(tmp_path), "errors", [recorder], space=space)
    failed = next(result for result in grid if result.error is not None)
    trial_id = failed.metrics["trial_id"]
    ((errored, status, message),) = recorder.of("error")
    assert errored == trial_id and status == "ERROR" and "exploded on purpose" in message
    assert result_steps(failed.path) == csv_steps(failed.path) == [1, 2]
    with open(os.path.join(failed.path, "error.txt")) as file:
        assert re.match(
            r"Failure # 1 \(occurred at \d{4}-\d\d-\d\d_\d\d-\d\d-\d\d\)\n.*exploded on purpose", file.read(), re.S
        )
    assert [t for t, _ in recorder.of("complete")] == [r.metrics["trial_id"] for r in grid if r.error is None]


def test_a_retried_trial_reports_again_what_its_retry_trains_again_as_tunes_does(tmp_path, ray_session):
    """Tune's retry starts from the trial's last checkpoint (here none: from
    the start) and reports those iterations again: its results and logs hold
    both attempts, and ``on_trial_recover`` marks the failure."""
    recorder = Recorder()
    # Slower than a worker's flush: the first attempt's results reach the study before it dies at 4.
    space = {"lr": LRS[0], "die_once_at": 4, "marker": str(tmp_path / "died"), "sleep": 0.6}
    (result,) = fit(
        str(tmp_path), "retried", [recorder], space=space, failure_config=tune.FailureConfig(max_failures=1)
    )
    assert result.error is None and recorder.of("recover") == [(result.metrics["trial_id"], 1)]
    attempts = result.metrics_dataframe["training_iteration"].tolist()
    resumed_at = attempts[3]  # the retry's first iteration: after its checkpoint, if it had one
    assert attempts == [1, 2, 3, *range(resumed_at, HORIZON + 1)] and resumed_at <= 4
    assert result_steps(result.path) == csv_steps(result.path) == attempts
    assert recorder.of("restore") == ([(result.metrics["trial_id"],)] if resumed_at > 1 else [])
    with open(os.path.join(result.path, "error.txt")) as file:  # as Tune keeps it: the failure, though retried
        assert file.read().startswith("Failure # 1 (occurred at ")


class ArtifactUploads(LoggerCallback):
    """W&B's LoggerCallback shape: ``log_trial_save`` uploads ``trial.checkpoint``'s folder."""

    def __init__(self):
        self.saved = []

    def log_trial_result(self, iteration, trial, result):
        pass

    def log_trial_save(self, trial):
        path = trial.checkpoint.path
        with open(os.path.join(path, "state.json")) as file:
            self.saved.append((trial.trial_id, path, file.read()))


class CheckpointArtifacts(tune.Callback):
    """MLflow's artifact shape: ``on_checkpoint`` logs the checkpoint's folder as it comes."""

    def __init__(self):
        self.checkpoints = []

    def on_checkpoint(self, iteration, trials, trial, checkpoint, **info):
        assert trial.checkpoint is checkpoint and os.listdir(checkpoint.path) == ["state.json"]
        self.checkpoints.append((trial.trial_id, checkpoint.path))


def test_each_checkpoint_reaches_save_hooks_as_it_is_registered_in_every_trial_it_serves(tmp_path, ray_session):
    """Tune calls ``on_trial_save`` and ``on_checkpoint`` as each checkpoint
    is registered, with it in the trial's folder. A shared stage's
    checkpoint is every trial's it serves: each gets its copy, numbered as
    its own, as each would have saved it under Tune."""
    uploads, artifacts = ArtifactUploads(), CheckpointArtifacts()
    grid = fit(str(tmp_path), "saves", [uploads, artifacts])
    assert grid.unique_iterations < grid.trial_by_trial_iterations, "the trials share stages"
    for result in grid:
        trial_id = result.metrics["trial_id"]
        saved = [(path, content) for t, path, content in uploads.saved if t == trial_id]
        assert [path for path, _ in saved] == [
            f"{result.path}/checkpoint_{index:06d}" for index in range(len(saved))
        ], "numbered in its own folder, in order"
        assert [path for t, path in artifacts.checkpoints if t == trial_id] == [path for path, _ in saved]
        assert result.checkpoint.path == saved[-1][0]
    first = {content for t, path, content in uploads.saved if path.endswith("checkpoint_000000")}
    assert len(first) == 1, "the shared stage's checkpoint, the same in all three trials"


class AsksAt(tune.Callback):
    def __init__(self, iterations):
        self.iterations = iterations

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result["training_iteration"] in self.iterations:
            result[SHOULD_CHECKPOINT] = True


@pytest.mark.parametrize("on_service", [False, True], ids=["controller", "plan_service"])
def test_a_class_trainable_checkpoints_where_a_callback_asks_before_it_trains_on(tmp_path, ray_session, on_service):
    """Ray's ``custom_checkpointing_with_callback.py``: a callback sets
    ``result[SHOULD_CHECKPOINT] = True`` and Tune saves the trial at that
    result, without periodic checkpoints. Here too, also inside stages the
    trials share (iteration 3 of the two that decay at 4), and on a plan service."""
    service = PlanServiceConfig(f"svc_{os.urandom(3).hex()}") if on_service else None
    tuner = Tuner(
        SavesItsStep,
        param_space={"lr": tune.grid_search(LRS)},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(
            name="asked",
            storage_path=str(tmp_path),
            stop={"training_iteration": HORIZON},
            callbacks=[AsksAt({3, 5})],
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=0, checkpoint_at_end=True),
            verbose=0,
        ),
        plan_service=service,
    )
    try:
        grid = tuner.fit()
    finally:
        if service is not None:
            shutdown(service.name)
    assert not grid.errors and grid.unique_iterations < grid.trial_by_trial_iterations
    for result in grid:
        saved_at = []
        for checkpoint, metrics in result.best_checkpoints:
            with open(os.path.join(checkpoint.path, "steps.json")) as file:
                saved_at.append((json.load(file), metrics["training_iteration"]))
        steps = sorted(step for step, _ in saved_at)
        assert all(step == iteration for step, iteration in saved_at), "saved at the result it was asked at"
        assert {3, 5} <= set(steps) and steps[-1] == HORIZON, steps


class RaisesAt3(tune.Callback):
    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result["training_iteration"] == 3:
            raise ValueError("the callback failed at 3")


@pytest.mark.timeout(180)
def test_a_callback_raising_while_class_trainables_wait_for_it_ends_fit_with_its_error(tmp_path, ray_session):
    """Tune's ``fit()`` raises a callback's error (an ``on_trial_result``'s
    as a ``TuneError`` with its traceback); the trainables waiting for the
    callbacks' answer must not hold the study's end."""
    tuner = Tuner(
        SavesItsStep,
        param_space={"lr": tune.grid_search(LRS)},
        run_config=tune.RunConfig(
            storage_path=str(tmp_path), stop={"training_iteration": 1000}, callbacks=[RaisesAt3()], verbose=0
        ),
    )
    with pytest.raises(TuneError, match="ValueError: the callback failed at 3"):
        tuner.fit()


def test_a_remote_study_uploads_its_logs(tmp_path, ray_session):
    # A URL is staged locally and uploaded (memory:// would too, but its
    # checkpoints stay in the controller's process).
    recorder = Recorder()
    grid = fit(f"file://{tmp_path}", "remote", [recorder])
    for result in grid:
        folder = result.path.removeprefix("file://")
        assert result_steps(folder) == csv_steps(folder) == list(range(1, HORIZON + 1))
        assert glob.glob(os.path.join(folder, "events.out.tfevents.*"))
        assert (result.metrics["trial_id"], result.checkpoint.path) in recorder.of("checkpoint")


def test_mlflow_logger_callback_works_unchanged(tmp_path, ray_session, monkeypatch):
    import mlflow  # mlflow-skinny, in the test extra: the callback must be exercised, not skipped

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # a local file tracking URI, no server
    from ray.air.integrations.mlflow import MLflowLoggerCallback

    uri = f"file://{tmp_path}/mlruns"
    callback = MLflowLoggerCallback(tracking_uri=uri, experiment_name="stagetree", save_artifact=True)
    grid = fit(str(tmp_path), "mlflow", [callback])
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("stagetree")
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == len(grid) == 3
    by_trial = {run.data.tags["trial_name"]: run for run in runs}
    for result in grid:
        run = by_trial[f"noisy_descent_{result.metrics['trial_id']}"]  # Tune's trial name: <trainable>_<trial id>
        assert run.info.status == "FINISHED"
        history = client.get_metric_history(run.info.run_id, "loss")
        assert [m.step for m in history] == list(range(1, HORIZON + 1))
        assert [m.value for m in history] == pytest.approx(result.metrics_dataframe["loss"].tolist())
        assert run.data.params["lr/milestones"] == str(result.config["lr"].to_json()["milestones"])
        assert {"result.json", "progress.csv", "params.json"} <= {
            a.path for a in client.list_artifacts(run.info.run_id)
        }


def logs_to_mlflow(config):
    os.environ["MLFLOW_ALLOW_FILE_STORE"] = "true"  # a local file tracking URI, no server
    from ray.air.integrations.mlflow import setup_mlflow

    mlflow = setup_mlflow(config, tracking_uri=config["uri"], create_experiment_if_not_exists=True)
    for step in range(2):
        mlflow.log_metric("loss", config["x"] / (step + 1), step=step)
        tune.report({"loss": config["x"] / (step + 1), "name": tune.get_context().get_trial_name()})


def test_setup_mlflow_in_a_trainable_names_the_experiment_after_the_trial(tmp_path, ray_session, monkeypatch):
    """As under Tune: Ray's integrations see a Tune trial, its id and name."""
    import mlflow

    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")

    uri = f"file://{tmp_path}/mlruns"
    grid = Tuner(
        logs_to_mlflow,
        param_space={"uri": uri, "x": tune.grid_search([1.0, 2.0])},
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="setup_mlflow", verbose=0),
    ).fit()
    assert grid.num_errors == 0
    client = mlflow.tracking.MlflowClient(tracking_uri=uri)
    for result in grid:
        experiment = client.get_experiment_by_name(result.metrics["name"])
        (run,) = client.search_runs([experiment.experiment_id])
        history = client.get_metric_history(run.info.run_id, "loss")
        assert [m.value for m in history] == [result.config["x"], result.config["x"] / 2]


class OpenTrials(tune.Callback):
    """The most trials started and not yet ended at once: what a logger
    keeps files open for (Tune's TensorBoard logger: a writer and its pipes)."""

    def __init__(self):
        self.open, self.most = set(), 0

    def on_trial_start(self, iteration, trials, trial, **info):
        self.open.add(trial.trial_id)
        self.most = max(self.most, len(self.open))

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.open.discard(trial.trial_id)


def test_trials_start_when_they_run_not_when_admitted(tmp_path, ray_session):
    """A study admits all its trials at once; announcing them all then made
    10,000 trials exhaust the driver's open files. As in Tune, a trial
    starts when a batch serving it is dispatched (or at its first result)."""
    opened = OpenTrials()
    space = {"lr": tune.grid_search([0.1 * (k + 1) for k in range(12)]), "sleep": 0.3}
    grid = fit(str(tmp_path), "starts", [opened], space=space)
    assert len(grid) == 12 and grid.num_errors == 0 and not opened.open
    assert opened.most <= 6, opened.most  # all 12 at admission before


def test_a_poll_of_many_short_trials_keeps_one_trials_files_open_at_a_time(tmp_path):
    """Tune's loggers open files at a trial's start and close them at its end:
    a poll that holds thousands of trials that started and ended since the
    last one (a study of short trials) opens them one trial at a time."""
    opened = OpenTrials()
    runner = CallbackRunner([opened], str(tmp_path))
    ids = [f"t{index}" for index in range(50)]
    ended = [{"event": "complete", "trial_id": t, "name": t, "dirname": t} for t in ids]
    runner.update(progress([row(t, 1, 0.5) for t in ids], [start(t) for t in ids] + ended))
    assert opened.most == 1 and not opened.open


def test_the_batched_tensorboard_logger_writes_the_scalars_tunes_writes(tmp_path):
    """Tune's TBXLoggerCallback and ours, fed the same results: the same
    scalars at the same steps (nested metrics flattened, NaN and non-numbers
    left out, ints and bools and NumPy scalars kept), and the same values
    kept for the trial's hparams at its end. A result with a list (a
    histogram) takes Tune's own path."""
    from ray_stagetree.runtime.driver.log_files import TBXLogger
    from ray_stagetree.runtime.driver.log_thread import LoggedTrial

    results = [
        {"training_iteration": 1, "loss": 0.5, "acc": np.float32(0.25), "n": np.int64(3), "flag": True,
         "nested": {"a": 1.5, "deeper": {"b": 2}}, "nan": float("nan"), "inf": float("inf"), "name": "x",
         "config": CONFIG, "pid": 7, "timestamp": 5, "time_total_s": 0.1, "empty": []},
        {"training_iteration": 2, "timesteps_total": 40, "loss": 0.25, "hist": [1.0, 2.0, 3.0], "config": CONFIG},
        {"training_iteration": 3, "timesteps_total": 0, "loss": float("nan"), "np_nan": np.float64("nan")},
    ]  # fmt: skip
    scalars, kept = {}, {}
    for name, logger in (("tune", TBXLoggerCallback()), ("ours", TBXLogger())):
        folder = tmp_path / name
        folder.mkdir()
        trial = LoggedTrial("t", "t", str(folder), lambda: None)
        trial.config = {"lr": 0.1}
        logger.log_trial_start(trial)
        for result in results:
            logger.log_trial_result(result["training_iteration"], trial, dict(result))
        kept[name] = dict(logger._trial_result[trial])
        logger._trial_writer[trial].close()
        scalars[name] = tensorboard_scalars(folder)
    assert scalars["ours"] == scalars["tune"]
    assert "ray/tune/nested/deeper/b" in scalars["ours"] and "ray/tune/nan" not in scalars["ours"]
    assert [step for step, _ in scalars["ours"]["ray/tune/loss"]] == [1, 40]  # timesteps_total when given
    assert kept["ours"] == kept["tune"]


@pytest.mark.parametrize("histogram", [False, True])
def test_tensorboard_leaves_out_pbts_schedules_as_it_leaves_out_the_config(tmp_path, caplog, histogram):
    """A trial PBT changed has its schedules in its rows (config_schedule): the
    config, which Tune's TensorBoard logger leaves out. Logged, its nested
    lists (a schedule's parts) made Ray warn of an invalid value once per
    run; the other loggers still have it."""
    from ray.util.debug import reset_log_once

    from ray_stagetree.runtime.driver.log_files import TBXLogger
    from ray_stagetree.runtime.driver.log_thread import LoggedTrial

    schedule = {"lr": {"family": "Concat", "parts": [{"family": "Constant", "init": 0.4}], "milestones": [2]}}
    result = {"training_iteration": 1, "loss": 0.5, "config_schedule": schedule, "config": CONFIG}
    if histogram:
        result["hist"] = [1.0, 2.0]
    logger = TBXLogger()
    trial = LoggedTrial("t", "t", str(tmp_path), lambda: None)
    trial.config = {"lr": 0.1}
    reset_log_once("invalid_tbx_value")
    logger.log_trial_result(1, trial, result)
    logger._trial_writer[trial].close()
    assert "invalid value" not in caplog.text
    assert set(tensorboard_scalars(tmp_path)) == {"ray/tune/loss"} | ({"ray/tune/hist"} if histogram else set())
    assert result["config_schedule"] is schedule
