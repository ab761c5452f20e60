"""Faults end to end: a read-only storage, the time budget,
a trainable that never reports, numpy values in the space, odd metrics."""

import _thread
import errno
import json
import logging
import math
import os
import sys
import threading
import time
from pathlib import Path

import fsspec
import numpy as np
import pytest
from fsspec.implementations.local import LocalFileSystem
from ray import tune
from ray.tune.schedulers import ASHAScheduler
from trainables_for_tests import count_of, sum_of_lr

from ray_stagetree import MultiStep, Tuner, get_hparams, report
from ray_stagetree.execution.storage import CheckpointStorage
from ray_stagetree.runtime.control.experiment_state import STATE_FILE, read_state


class ReadOnlyFileSystem(LocalFileSystem):
    """A local filesystem that refuses writes, as a read-only mount does
    (chmod does not stop root, which runs CI)."""

    def _refuse(self, *args, **kwargs):
        raise PermissionError(13, "Read-only file system")

    makedirs = mkdir = pipe_file = put_file = mv = rm_file = _refuse

    def open(self, path, mode="rb", **kwargs):
        if "r" not in mode:
            self._refuse()
        return super().open(path, mode, **kwargs)


def train_forever(config):
    while True:
        time.sleep(config["seconds"])
        report({"loss": 1.0, "reported_at": time.time()})


def never_reports(config):
    while True:
        time.sleep(1)


def reports_values(config):
    """Reports the config's values and their types, and odd metric values."""
    while True:
        values = {key: (repr(value), type(value).__name__) for key, value in config.items() if key != "kind"}
        metrics = {"values": values, "lr": get_hparams().get("lr")}
        kind = config.get("kind")
        if kind == "odd":
            metrics.update(loss=float("nan"), other=float("inf"), vector=np.arange(3), word="abc", **{"a/b": 1.0})
        elif kind == "string":
            metrics["loss"] = "low"
        elif kind == "missing":
            metrics["accuracy"] = 0.5
        else:
            metrics["loss"] = 1.0
        report(metrics)


class Recorder(tune.ProgressReporter):
    """A progress table that keeps every status line it is shown."""

    def __init__(self):
        self.lines = []

    def should_report(self, trials, done=False):
        return True

    def report(self, trials, done, *sys_info):
        self.lines.extend(sys_info)


def run_config(tmp_path, name, **kwargs):
    kwargs.setdefault("verbose", 0)
    return tune.RunConfig(name=name, storage_path=str(tmp_path), **kwargs)


@pytest.mark.timeout(60)
def test_read_only_storage_fails_before_anything_trains(tmp_path):
    # Tuner() writes the experiment folder (as Tune's does): it fails there, before fit().
    with pytest.raises(PermissionError, match=f"experiment directory '{tmp_path}/ro' is not writable"):
        Tuner(
            train_forever,
            run_config=tune.RunConfig(name="ro", storage_path=str(tmp_path), storage_filesystem=ReadOnlyFileSystem()),
        )  # no Ray is needed to get here: ray_session is not used


@pytest.mark.timeout(60)
def test_storage_in_the_drivers_memory_is_refused_before_anything_trains():
    with pytest.raises(ValueError, match="'memory://studies/exp' is in this process's memory"):
        Tuner(train_forever, run_config=tune.RunConfig(name="exp", storage_path="memory://studies"))


@pytest.mark.timeout(60)
def test_storage_probe_leaves_nothing_behind(tmp_path):
    from ray_stagetree.runtime.driver.arguments import check_writable

    check_writable(CheckpointStorage(str(tmp_path / "exp")), str(tmp_path / "exp"))
    assert fsspec.filesystem("file").ls(str(tmp_path / "exp")) == []


@pytest.mark.timeout(90)
def test_time_budget_stops_running_batches_at_their_next_report(tmp_path, ray_session, monkeypatch):
    # Snapshots wake the controller too: without them only the budget's own wake-up stops trials on time.
    monkeypatch.setenv("TUNE_GLOBAL_CHECKPOINT_S", "1000")
    budget = 4
    grid = Tuner(
        train_forever,
        param_space={"seconds": 1.0},  # one trial: no other trial's report wakes the controller
        tune_config=tune.TuneConfig(time_budget_s=budget),
        run_config=run_config(tmp_path, "budget"),
    ).fit()  # returning at all is the budget at work: the trainable never stops by itself
    assert grid.num_errors == 0 and len(grid) == 1
    # When the budget began: the final snapshot is written at the end, with the study's elapsed time.
    state_file = tmp_path / "budget" / STATE_FILE
    state = read_state(CheckpointStorage(str(tmp_path / "budget")))
    budget_end = state_file.stat().st_mtime - state.elapsed + budget
    # (On a loaded machine the worker may not get through one iteration within the budget: no rows.)
    rows = grid[0].metrics_dataframe
    before = [] if rows is None or rows.empty else [t for t in rows["reported_at"] if t <= budget_end]
    # One iteration was running when the budget ended; the batch stops at its report. (Iterations
    # trained after a trial stopped count as executed but are not in its results.)
    assert grid.iterations_executed - len(before) <= 1, (grid.iterations_executed, len(before))


@pytest.mark.timeout(90)
def test_time_budget_ends_a_trainable_that_never_reports(tmp_path, ray_session, monkeypatch):
    monkeypatch.setenv("RAY_STAGETREE_STALL_WARNING_S", "1")
    recorder = Recorder()
    grid = Tuner(
        never_reports,
        # Long enough for the worker to start on a loaded machine (CI once took over 10 s, running four test processes)
        tune_config=tune.TuneConfig(time_budget_s=18),
        run_config=run_config(tmp_path, "silent", verbose=1, progress_reporter=recorder),
    ).fit()  # returning at all is the budget at work: the trainable never reports
    assert len(grid) == 1 and grid.num_errors == 0
    assert any("has not reported for" in line for line in recorder.lines), recorder.lines[-3:]


def starts_then_hangs(config):
    """Tells the stopper below it has started, then never reports."""
    Path(config["started"]).touch()
    while True:
        time.sleep(1)


class StopOnceStarted(tune.Stopper):
    """A stopper whose ``stop_all`` turns True between results (as a
    ``TimeoutStopper``'s does): here, once the trainable has started."""

    def __init__(self, started):
        self.started = started

    def __call__(self, trial_id, result):
        return False

    def stop_all(self):
        return os.path.exists(self.started)


@pytest.mark.timeout(90)
def test_a_stoppers_stop_all_ends_the_study_without_waiting_for_a_result(tmp_path, ray_session):
    """Tune asks ``stop_all`` at each step of its loop, not only after a
    result, and stops the trials at once: a ``TimeoutStopper`` in ``stop``
    ends a study whose trainable reports rarely, or never, on time. (The
    study was only asked after a result: this fit never returned.)"""
    started = str(tmp_path / "started")
    grid = Tuner(
        starts_then_hangs,
        param_space={"started": started, "x": tune.grid_search([1, 2])},
        tune_config=tune.TuneConfig(max_concurrent_trials=1),
        run_config=run_config(tmp_path, "stop_all", stop=StopOnceStarted(started)),
    ).fit()  # returning at all is the stopper at work
    # As in Tune: the grid's second trial is never made, the first ends without results.
    assert len(grid) == 1 and grid.num_errors == 0
    assert grid[0].metrics_dataframe is None or grid[0].metrics_dataframe.empty


@pytest.mark.timeout(90)
def test_numpy_values_reach_the_trainable_as_given(tmp_path, ray_session):
    space = {
        "lr": tune.grid_search(np.linspace(0.1, 0.2, 2)),
        "f32": np.float32(0.5),
        "n": np.int64(3),
        "flag": np.bool_(True),
        "array": np.arange(3),
        "nan": float("nan"),
        "inf": -math.inf,
        "decay": MultiStep(np.float64(0.1), np.array([30]), np.float32(0.5)),
    }
    grid = Tuner(
        reports_values,
        param_space=space,
        run_config=run_config(tmp_path, "numpy", stop={"training_iteration": 2}),
    ).fit()
    assert grid.num_errors == 0 and len(grid) == 2
    seen = sorted(grid, key=lambda r: r.metrics["lr"])
    assert [r.metrics["lr"] for r in seen] == [0.1, 0.2]
    values = seen[0].metrics["values"]
    assert values["f32"] == ("np.float32(0.5)", "float32")
    assert values["n"] == ("np.int64(3)", "int64")
    assert values["flag"] == ("np.True_", "bool")
    assert values["array"] == ("array([0, 1, 2])", "ndarray")
    assert values["nan"] == ("nan", "float") and values["inf"] == ("-inf", "float")
    # result.config shows the values as given, as Tune's does; the stored form is Python numbers and lists
    config = seen[0].config
    assert type(config["f32"]) is np.float32 and list(config["array"]) == [0, 1, 2] and math.isnan(config["nan"])
    stored = json.loads((Path(seen[0].path) / "params.json").read_text())
    assert type(stored["f32"]) is float and stored["array"] == [0, 1, 2]


@pytest.mark.timeout(90)
def test_odd_metric_values_are_accepted_and_a_missing_metric_warns_once(tmp_path, ray_session, caplog, monkeypatch):
    monkeypatch.setenv("TUNE_DISABLE_STRICT_METRIC_CHECKING", "1")  # else a result without the metric stops the study
    grid = Tuner(
        reports_values,
        param_space={"kind": tune.grid_search(["odd", "missing", "missing"])},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=run_config(tmp_path, "odd", stop={"training_iteration": 3}),
    ).fit()
    assert grid.num_errors == 0 and len(grid) == 3
    odd = next(r for r in grid if r.config["kind"] == "odd")
    assert math.isnan(odd.metrics["loss"]) and odd.metrics["word"] == "abc" and odd.metrics["a/b"] == 1.0
    warnings = [r.getMessage() for r in caplog.records if "without TuneConfig's metric 'loss'" in r.getMessage()]
    assert len(warnings) == 1, warnings


@pytest.mark.timeout(90)
def test_a_string_where_the_scheduler_needs_a_number_errors_the_trial(tmp_path, ray_session):
    grid = Tuner(
        reports_values,
        param_space={"kind": tune.grid_search(["string", "number"])},
        tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=ASHAScheduler(max_t=4, grace_period=2)),
        run_config=run_config(tmp_path, "string", failure_config=tune.FailureConfig(max_failures=-1)),
    ).fit()
    by_kind = {r.config["kind"]: r for r in grid}
    assert by_kind["number"].error is None and by_kind["number"].metrics["training_iteration"] == 4
    message = str(by_kind["string"].error)
    assert "reported loss='low' (str) at iteration 1" in message
    assert "the trial scheduler (AsyncHyperBandScheduler) compares 'loss': it must be a number" in message


def exits_at_the_second_iteration(config):
    report({"loss": 1.0})
    if config["exits"]:
        sys.exit(3)
    report({"loss": 0.5})


@pytest.mark.timeout(120)
def test_a_trainable_calling_sys_exit_errors_its_trial_and_the_study_ends(tmp_path, ray_session):
    grid = Tuner(
        exits_at_the_second_iteration,
        param_space={"exits": tune.grid_search([True, False])},
        run_config=run_config(tmp_path, "exits"),
    ).fit()
    by_exit = {result.config["exits"]: result for result in grid}
    assert by_exit[False].error is None and by_exit[False].metrics["training_iteration"] == 2
    assert "SystemExit: 3" in str(by_exit[True].error)


def reports_badly(config):
    """``unpicklable`` reports a lock at iteration 2; ``flaky`` raises on its
    first three attempts (counted in files), then trains; ``fine`` trains."""
    kind, iteration = config["kind"], 0
    if kind == "flaky":
        attempts = sorted(os.listdir(config["folder"]))
        if len(attempts) < 3:
            open(os.path.join(config["folder"], f"attempt{len(attempts)}"), "w").close()
            raise RuntimeError(f"transient failure {len(attempts)}")
    while True:
        iteration += 1
        metrics = {"loss": 1.0 / iteration}
        if kind == "unpicklable" and iteration == 2:
            metrics["lock"] = threading.Lock()
        report(metrics)


@pytest.mark.timeout(120)
def test_an_unpicklable_metric_errors_its_trial_and_unlimited_retries_retry(tmp_path, ray_session):
    folder = tmp_path / "attempts"
    folder.mkdir()
    grid = Tuner(
        reports_badly,
        param_space={"kind": tune.grid_search(["unpicklable", "flaky", "fine"]), "folder": str(folder)},
        run_config=tune.RunConfig(
            storage_path=str(tmp_path),
            stop={"training_iteration": 3},
            failure_config=tune.FailureConfig(max_failures=-1),
            verbose=0,
        ),
    ).fit()
    by_kind = {result.config["kind"]: result for result in grid}
    message = str(by_kind["unpicklable"].error)
    assert "reported lock=<unlocked _thread.lock" in message and "at iteration 2" in message, message
    assert "cannot be pickled" in message, message
    assert len(by_kind["unpicklable"].metrics_dataframe) == 1, "its first iteration is kept; not retried forever"
    assert len(os.listdir(folder)) == 3, "max_failures=-1: retried past three failures"
    for kind in ("flaky", "fine"):
        assert by_kind[kind].error is None and by_kind[kind].metrics["training_iteration"] == 3, kind


class FullAfter(LocalFileSystem):
    """A local disk that fills up once ``after`` checkpoints are stored:
    the next ``writes`` write attempts (None: all) fail with ENOSPC."""

    cachable = False  # a disk of its own per study: fsspec would hand the next one this one's state

    def __init__(self, after=2, writes=None, **kwargs):
        super().__init__(**kwargs)
        self.after, self.writes = after, writes

    def _full(self):
        counts = self.__dict__.setdefault("_counts", {"stored": 0, "failed": 0})
        if counts["stored"] >= self.after and (self.writes is None or counts["failed"] < self.writes):
            counts["failed"] += 1
            raise OSError(errno.ENOSPC, "No space left on device")
        return counts

    def pipe_file(self, path, value, **kwargs):
        counts = self._full()
        super().pipe_file(path, value, **kwargs)
        counts["stored"] += "/checkpoints/" in path

    def put_file(self, lpath, rpath, **kwargs):
        self._full()
        super().put_file(lpath, rpath, **kwargs)


def full_disk_study(tmp_path, filesystem):
    return Tuner(
        sum_of_lr,
        param_space={"lr": tune.grid_search([MultiStep(1.0, [m], 0.5) for m in (1, 2)])},
        run_config=tune.RunConfig(
            storage_path=str(tmp_path), storage_filesystem=filesystem, stop={"training_iteration": 3}, verbose=0
        ),
        checkpoint_budget_bytes=0,  # every checkpoint must reach storage before it leaves memory
    ).fit()


@pytest.mark.timeout(120)
def test_a_disk_full_for_a_while_loses_nothing(tmp_path, ray_session):
    grid = full_disk_study(tmp_path, FullAfter(after=2, writes=4))
    assert not grid.errors
    assert sorted(result.metrics["total"] for result in grid) == [1 + 0.5 + 0.5, 1 + 1 + 0.5]
    assert grid.iterations_executed == grid.unique_iterations, "checkpoints storage refused stayed in memory"
    for result in grid:
        with open(os.path.join(result.checkpoint.path, "state.json")) as file:
            assert json.load(file) == [result.metrics["total"], 3], "written once the disk had room again"


@pytest.mark.timeout(120)
def test_a_disk_full_until_the_end_returns_the_results_and_says_what_was_not_written(
    tmp_path, ray_session, caplog, monkeypatch
):
    """The study pauses for RAY_STAGETREE_STORAGE_WAIT_S, then goes on
    without storage: it returns every result and names what it could not write.
    A trial that ends before the disk fills has its checkpoint written as it
    ends, so which results keep one depends on timing; what holds either way
    is that a written checkpoint is right and a missing one is named. (Where
    the stages already running were all it had left, it ends within the
    pause, with no "goes on without it" to say: on a loaded machine, at times.)"""
    monkeypatch.setenv("RAY_STAGETREE_STORAGE_WAIT_S", "1")
    grid = full_disk_study(tmp_path, FullAfter(after=2))
    assert any("the study pauses" in r.getMessage() for r in caplog.records)
    assert not grid.errors
    assert sorted(result.metrics["total"] for result in grid) == [1 + 0.5 + 0.5, 1 + 1 + 0.5]
    message = next(r.getMessage() for r in caplog.records if "refused part of the study's end" in r.getMessage())
    assert f"storage under '{tmp_path}/" in message and "No space left on device" in message, message
    unwritten = [result for result in grid if result.checkpoint is None]
    assert unwritten, "the disk is full at the study's end"
    for result in unwritten:
        assert f"'{os.path.basename(result.path)}/checkpoint_" in message, (result.path, message)
    for result in grid:
        if result.checkpoint is not None:
            with open(os.path.join(result.checkpoint.path, "state.json")) as file:
                assert json.load(file) == [result.metrics["total"], 3], "written before the disk filled"


class ReadOnlyWhileFlagged(LocalFileSystem):
    """Local storage that turns read-only while the file ``flag`` exists
    (storage made immutable mid-study, then given back)."""

    def __init__(self, flag: str, **kwargs):
        super().__init__(flag=flag, **kwargs)
        self.flag = flag

    def _guard(method):
        def guarded(self, *args, **kwargs):
            if os.path.exists(self.flag):
                raise PermissionError(13, "Read-only file system")
            return method(self, *args, **kwargs)

        guarded.__name__ = method.__name__
        return guarded

    makedirs = _guard(LocalFileSystem.makedirs)
    mkdir = _guard(LocalFileSystem.mkdir)
    pipe_file = _guard(LocalFileSystem.pipe_file)
    put_file = _guard(LocalFileSystem.put_file)
    mv = _guard(LocalFileSystem.mv)
    rm_file = _guard(LocalFileSystem.rm_file)

    def open(self, path, mode="rb", **kwargs):
        if "r" not in mode and os.path.exists(self.flag):
            raise PermissionError(13, "Read-only file system")
        return super().open(path, mode, **kwargs)


def read_only_study(tmp_path, flag, counter, flag_at=3, sleep=0.05):
    return Tuner(
        sum_of_lr,  # storage turns read-only when the first trial reaches iteration flag_at
        param_space={
            "lr": tune.grid_search([MultiStep(1.0, [m], 0.5) for m in (2, 4)]),
            "flag": str(flag),
            "flag_at": flag_at,
            "sleep": sleep,
            "counter": counter,
        },
        run_config=tune.RunConfig(
            name="read_only",
            storage_path=str(tmp_path),
            storage_filesystem=ReadOnlyWhileFlagged(str(flag)),
            stop={"training_iteration": 6},
            verbose=0,
        ),
    )


#: The read-only study's totals, and the iterations it executes fault-free (2 shared, then 4 per trial).
READ_ONLY_TOTALS = sorted([1 + 1 + 0.5 * 4, 1 * 4 + 0.5 * 2])
READ_ONLY_ITERATIONS = 2 + 4 + 4


class OnDriverWarning(logging.Handler):
    """Calls ``action`` once, the first time the driver shows a warning holding ``text``."""

    def __init__(self, text, action):
        super().__init__()
        self.text, self.action, self.seen = text, action, []

    def emit(self, record):
        message = record.getMessage()
        self.seen.append(message)
        if self.text in message and len([m for m in self.seen if self.text in m]) == 1:
            self.action()


@pytest.fixture
def driver_warnings():
    shown = logging.getLogger("ray_stagetree")  # where the driver shows the study's warnings
    handlers = []

    def on(text, action):
        handlers.append(OnDriverWarning(text, action))
        shown.addHandler(handlers[-1])
        return handlers[-1]

    yield on
    for handler in handlers:
        shown.removeHandler(handler)


@pytest.mark.timeout(240)
@pytest.mark.parametrize("flag_at", [3, 6], ids=["mid-study", "at-the-last-iteration"])
def test_storage_turned_read_only_mid_study_pauses_it_until_storage_is_back(
    tmp_path, counter, driver_warnings, flag_at, monkeypatch
):
    """While storage refuses the study's snapshot no new stage starts; once
    storage takes writes again the study goes on and ends as a fault-free
    run does, nothing trained twice and every checkpoint stored. Storage that
    turns read-only as the last iterations report pauses the study before its
    end, not after it (the end asks storage for the snapshot first)."""
    sleep = 0.05
    if flag_at == 6:  # the first snapshot stored, and none due again before the end: the end must ask storage
        monkeypatch.setenv("TUNE_GLOBAL_CHECKPOINT_S", "60")
        sleep = 0.5
    flag = tmp_path / "storage_is_read_only"
    paused = driver_warnings("the study pauses", lambda: threading.Timer(2.0, flag.unlink).start())
    grid = read_only_study(tmp_path, flag, counter, flag_at, sleep).fit()
    assert not grid.errors
    assert sorted(result.metrics["total"] for result in grid) == READ_ONLY_TOTALS
    assert any(message.startswith("storage takes writes again after") for message in paused.seen), paused.seen
    assert count_of(counter) == READ_ONLY_ITERATIONS
    assert all(result.checkpoint is not None for result in grid), "stored once storage took writes again"


@pytest.mark.timeout(240)
def test_a_study_stopped_while_storage_refuses_it_restores_once_back(tmp_path, counter, driver_warnings):
    """Ctrl-C during the pause: `fit()` returns; once storage is back,
    `Tuner.restore` continues from the last snapshot storage took and ends
    with the same results."""
    flag = tmp_path / "storage_is_read_only"
    driver_warnings("the study pauses", _thread.interrupt_main)
    grid = read_only_study(tmp_path, flag, counter).fit()
    assert os.path.exists(flag), "stopped while storage was still read-only"
    flag.unlink()
    restored = Tuner.restore(grid.experiment_path, sum_of_lr).fit()
    assert not restored.errors
    assert sorted(result.metrics["total"] for result in restored) == READ_ONLY_TOTALS
    assert all(result.checkpoint is not None for result in restored), "written now that storage takes them"


# -- a worker that dies right after reporting a checkpoint (issue 30 point 7) -------


def test_a_checkpoint_whose_worker_died_before_it_was_taken_is_retrained_not_failed(tmp_path, ray_session):
    """The controller takes a reported checkpoint with a call to its worker
    (``take_checkpoint``); a worker that dies right after reporting never
    answers it, and the reference the store holds raises ActorDiedError. A
    batch dispatched from it before the store saw the loss (the retry of the
    dead worker's trials) reports the source lost, before its trainable runs,
    instead of failing as if its own worker had died: its trials start again
    from the previous checkpoint without spending a failure on it."""
    import ray

    from ray_stagetree.execution.batches import BatchSpec
    from ray_stagetree.execution.payload import CheckpointPayload
    from ray_stagetree.planning import SearchPlan, TrialConfig
    from ray_stagetree.runtime.workers.worker import StageWorker

    @ray.remote(num_cpus=0, max_restarts=0)
    class DyingWorker:
        def die(self):
            os._exit(1)

        def take_checkpoint(self):
            return CheckpointPayload(step=3, rng={}, directory=None, state={"total": 1.5})

    dying = DyingWorker.remote()
    with pytest.raises(ray.exceptions.RayActorError):
        ray.get(dying.die.remote())
    never_taken = dying.take_checkpoint.remote()

    def never_runs(config):
        raise AssertionError("the trainable ran from a checkpoint that was never taken")

    node = SearchPlan().add_trial("a", {"lr": 0.5}, 6).node
    spec = BatchSpec(
        batch_id=2,
        config={"lr": 0.5},
        trial_config=TrialConfig.from_config({"lr": 0.5}),
        segments=[(node.node_id, 3, 6)],
        save_iterations=set(),
        source=never_taken,
    )
    outcome = StageWorker(ray.cloudpickle.dumps(never_runs), None).run_batch(spec)
    assert outcome.error is None and outcome.records == []
    assert "the checkpoint batch 2 starts from is lost" in outcome.source_lost


def test_a_worker_dying_right_after_its_checkpoint_costs_one_failure_and_no_result(tmp_path, ray_session):
    """End to end: the death is the trial's one failure (as in Tune), the
    checkpoint it may not have handed over costs none, and every result is
    the fault-free run's."""
    marker = str(tmp_path / "died")
    grid = Tuner(
        sum_of_lr,  # its process exits once, right after reporting iteration die_after
        param_space={"lr": 0.5, "die_after": 3, "marker": marker},
        run_config=tune.RunConfig(
            name="dies",
            storage_path=str(tmp_path),
            stop={"training_iteration": 6},
            failure_config=tune.FailureConfig(max_failures=1),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=2),
            verbose=0,
        ),
    ).fit()
    assert os.path.exists(marker), "the worker did die"
    assert grid.num_errors == 0
    # The retry reports again what it trains again (Tune's progress.csv holds both attempts): each
    # iteration's last row is the fault-free run's.
    rows = grid[0].metrics_dataframe.drop_duplicates("training_iteration", keep="last")
    assert rows["total"].tolist() == [0.5, 1.0, 1.5, 2.0, 2.5, 3.0]


def deletes_its_experiment_folder(config):
    """Reports 6 iterations; the first trial deletes the experiment folder after its third."""
    for iteration in range(6):
        if iteration == 3 and config["delete"] and os.path.isdir(config["folder"]):
            import shutil

            # The study writes into the folder meanwhile: delete until it is gone, as a user's rm -rf would.
            while os.path.isdir(config["folder"]):
                shutil.rmtree(config["folder"], ignore_errors=True)
        tune.report({"x": iteration})


def test_an_experiment_folder_deleted_mid_study_is_written_again_and_the_loss_is_told(tmp_path, ray_session, caplog):
    folder = tmp_path / "deleted"
    grid = Tuner(
        deletes_its_experiment_folder,
        param_space={"delete": tune.grid_search([True, False]), "folder": str(folder)},
        run_config=run_config(tmp_path, "deleted", stop={"training_iteration": 6}),
    ).fit()
    assert grid.num_errors == 0 and Tuner.can_restore(str(folder))
    warnings = [r.getMessage() for r in caplog.records if "lost its files while the study ran" in r.getMessage()]
    assert len(warnings) == 1 and "the checkpoints and trial folders stored there before are gone" in warnings[0]
    restored = Tuner.restore(str(folder), deletes_its_experiment_folder).get_results()
    assert sorted(result.metrics["x"] for result in restored) == [5, 5]
