"""What the user sees of a study is true: the status file the driver writes
from the study's start to its end is what ``stagetree status``, ``ls``,
``show`` and the monitor read, and it agrees with the result grid after a
Ctrl-C before the first result, after a failing shared stage, and from
another process while the study runs."""

from __future__ import annotations

import json
import os
import signal
import threading
import time

import pytest
from ray import tune

from ray_stagetree import MultiStep, Tuner
from ray_stagetree.execution.study_file import STATUS_FILE, UNFINISHED, status_record
from ray_stagetree.jobs.experiments import list_experiments, read_experiment
from ray_stagetree.monitor.view import ExperimentReader, study_state
from ray_stagetree.planning.lifecycle import ERROR, PENDING, RUNNING, TERMINATED
from ray_stagetree.runtime.control.messages import Progress
from ray_stagetree.runtime.driver.status_file import StatusFile


def test_the_status_file_follows_the_polls_and_says_how_the_study_stopped(tmp_path):
    status = StatusFile(str(tmp_path))
    written = json.loads((tmp_path / STATUS_FILE).read_text())
    assert written["state"] == "running" and written["trials"] == {}, "written at the start, before any result"
    status.update(Progress(statuses={"a": ("trial_a", PENDING), "b": ("trial_b", RUNNING)}))
    status.update(Progress(statuses={"b": ("trial_b", TERMINATED)}, rows=[{"trial_id": "b", "training_iteration": 3}]))
    status.close("interrupted")
    written = json.loads((tmp_path / STATUS_FILE).read_text())
    assert written["state"] == "interrupted" and written["updated"] >= written["started"]
    assert written["trials"] == {
        "a": {"dirname": "trial_a", "status": UNFINISHED, "iterations": 0},
        "b": {"dirname": "trial_b", "status": TERMINATED, "iterations": 3},
    }
    status.close("ended")
    assert json.loads((tmp_path / STATUS_FILE).read_text())["state"] == "interrupted", "closed once"


def test_a_continued_study_keeps_the_trials_its_earlier_runs_recorded(tmp_path):
    first = StatusFile(str(tmp_path))
    first.update(Progress(statuses={"a": ("trial_a", TERMINATED)}))
    first.close("ended")
    again = StatusFile(str(tmp_path), continues=True)
    again.close("ended")
    assert set(json.loads((tmp_path / STATUS_FILE).read_text())["trials"]) == {"a"}


def write_status(folder, started, updated, state, trials):
    folder.mkdir()
    (folder / "stagetree_study.json").write_text(json.dumps({"metric": None, "mode": None}))
    (folder / "stagetree_tuner.pkl").write_bytes(b"")
    (folder / STATUS_FILE).write_text(status_record(started, updated, state, trials))


def test_the_latest_study_is_the_one_started_last(tmp_path):
    now = time.time()
    write_status(tmp_path / "older", now - 100, now, "ended", {})  # updated after the newer one started
    write_status(tmp_path / "newer", now - 50, now - 40, "interrupted", {})
    assert [os.path.basename(e.path) for e in list_experiments(str(tmp_path))] == ["older", "newer"]


def interrupts_before_reporting(config):
    """The first trial to start sends the driver SIGUSR1 (its Ctrl-C) and
    reports nothing before the driver has stopped the study."""
    try:
        os.remove(config["flag"])
    except FileNotFoundError:
        pass
    else:
        os.kill(config["pid"], signal.SIGUSR1)
    time.sleep(30)
    tune.report({"loss": 1.0})


@pytest.mark.timeout(180)
def test_ctrl_c_before_the_first_result_shows_every_trial_unfinished_and_when(tmp_path, ray_session):
    flag = tmp_path / "flag"
    flag.touch()
    space = {"pid": os.getpid(), "flag": str(flag), "lr": tune.grid_search([0.1, 0.2, 0.3])}
    grid = Tuner(
        interrupts_before_reporting,
        param_space=space,
        run_config=tune.RunConfig(name="interrupted", storage_path=str(tmp_path), verbose=0),
    ).fit()
    assert len(grid) == 3
    experiment = read_experiment(grid.experiment_path)
    assert experiment.state == "interrupted"
    assert experiment.counts() == {UNFINISHED: 3}, "the trials fit() returned, none of them ended"
    assert time.time() - experiment.last_update < 120, "not the epoch"


def fails_at_two(config):
    for iteration in range(1, 4):
        if iteration == 2:
            raise RuntimeError("the shared stage failed")
        tune.report({"loss": config["lr"].value(iteration - 1)})


@pytest.mark.timeout(180)
def test_trials_failing_in_one_shared_stage_are_each_counted_once_with_their_folder(tmp_path, ray_session):
    space = {"lr": tune.grid_search([MultiStep(0.1, [m], 0.5) for m in (3, 4)])}  # shared until iteration 3
    grid = Tuner(
        fails_at_two,
        param_space=space,
        run_config=tune.RunConfig(name="failing", storage_path=str(tmp_path), verbose=0),
    ).fit()
    assert grid.num_errors == 2
    experiment = read_experiment(grid.experiment_path)
    assert experiment.counts() == {ERROR: 2} and experiment.state == "ended"
    for result in grid:
        assert os.path.isfile(os.path.join(result.path, "params.json")), "each errored trial has its own folder"
    reader = ExperimentReader(grid.experiment_path)
    assert sorted(row["status"] for row in study_state(reader, None, "min")["trials"]) == [ERROR, ERROR]


def slow_trainable(config):
    for _ in range(6):
        time.sleep(0.5)
        tune.report({"loss": config["lr"]})


@pytest.mark.timeout(180)
def test_a_second_process_sees_running_only_for_what_workers_train(tmp_path, ray_session):
    """Four trials on the session's two CPUs: while the study runs, the
    status file (what another process reads) never has more RUNNING trials
    than workers, and at the end agrees with the grid."""
    seen, errors = [], []
    stop = threading.Event()
    path = tmp_path / "watched"

    def watch():
        while not stop.is_set():
            try:
                if (path / STATUS_FILE).exists():
                    seen.append(read_experiment(str(path)).counts())
            except Exception as error:  # what `ray_stagetree status` would have shown as a traceback
                errors.append(error)
            time.sleep(0.2)

    watcher = threading.Thread(target=watch)
    watcher.start()
    try:
        grid = Tuner(
            slow_trainable,
            param_space={"lr": tune.grid_search([0.1, 0.2, 0.3, 0.4])},
            run_config=tune.RunConfig(name="watched", storage_path=str(tmp_path), verbose=0),
        ).fit()
    finally:
        stop.set()
        watcher.join()
    assert not errors, errors
    assert any(counts.get(RUNNING) for counts in seen), "seen running"
    assert max(counts.get(RUNNING, 0) for counts in seen) <= 2, seen
    assert read_experiment(grid.experiment_path).counts() == {TERMINATED: 4} == {TERMINATED: len(grid)}
