"""Studies that survive the driver: `Tuner.restore` and `Tuner.can_restore`
with Tune's semantics, on the study state the controller keeps current."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time

import numpy as np
import pytest
import ray
from ray import tune
from ray.tune.schedulers import FIFOScheduler
from ray.tune.search import Searcher
from restore_study import HORIZON, accumulate, build_tuner, key, summary
from trainables_for_tests import kill_ray_processes

from ray_stagetree import Tuner
from ray_stagetree.execution.storage import CheckpointStorage
from ray_stagetree.runtime.control.experiment_state import STATE_FILE, read_state
from ray_stagetree.runtime.driver.restoring import save_settings


def stored_rows(path: str) -> int:
    """Results the latest snapshot at ``path`` holds, over all trials."""
    try:
        state = read_state(CheckpointStorage(path))
    except Exception:  # not written yet, or being replaced
        return 0
    return sum(len(trial.reported) for trial in state.trials)


def interrupted(tmp_path, name: str, at: int = 6):
    """A study stopped part way, as a lost driver leaves it: the first trial
    to reach iteration ``at`` interrupts the driver. Its ResultGrid."""
    flag = tmp_path / "interrupt"
    flag.touch()
    interrupt = {"at": at, "pid": os.getpid(), "flag": str(flag)}
    return build_tuner(str(tmp_path), name, interrupt=interrupt).fit()


@pytest.fixture(scope="module")
def reference(ray_session, tmp_path_factory):
    """The uninterrupted study's results."""
    return summary(build_tuner(str(tmp_path_factory.mktemp("reference")), "reference").fit())


@pytest.fixture(scope="module")
def stopped(ray_session, tmp_path_factory):
    """A study interrupted part way (as a lost driver leaves it): its
    summary, its experiment directory and the iterations it executed. Each
    test restores a copy of it (a moved directory)."""
    grid = interrupted(tmp_path_factory.mktemp("stopped"), "study")
    return summary(grid), grid.experiment_path, grid.iterations_executed


@pytest.fixture(scope="module")
def errored(ray_session, tmp_path_factory):
    """A study whose every trial failed at iteration 5, and the flag file
    that made them fail (remove it and they no longer do)."""
    folder = tmp_path_factory.mktemp("errored")
    flag = folder / "fail"
    flag.touch()
    grid = build_tuner(str(folder), "study", fail_at=5, fail_flag=str(flag)).fit()
    return grid, flag


def copy_of(path: str, tmp_path, name: str = "copy") -> str:
    shutil.copytree(path, tmp_path / name)
    return str(tmp_path / name)


def test_an_interrupted_study_restores_to_the_uninterrupted_results(tmp_path, stopped, reference):
    before, path, _ = stopped
    assert not all(trial["done"] for trial in before.values()), "fit() returned at the interruption"
    path = copy_of(path, tmp_path)
    assert Tuner.can_restore(path)
    restored = Tuner.restore(path, accumulate).fit()
    results = summary(restored)
    assert results == {key: dict(trial, trial_id=before[key]["trial_id"]) for key, trial in reference.items()}, (
        "same metrics, every iteration reported once, and the trials keep their ids"
    )
    for result in restored:  # the trial logs went on where they stood: each iteration once
        with open(os.path.join(result.path, "result.json")) as file:
            logged = [json.loads(line)["training_iteration"] for line in file]
        assert logged == list(range(1, HORIZON + 1))
    resumed = [row for result in restored for row in result.metrics_dataframe["resumed_from"].tolist() if row > 0]
    assert resumed, "training went on from stored checkpoints, not from scratch"


def test_an_interrupted_study_under_num_to_keep_restores_to_the_uninterrupted_results(tmp_path, reference):
    """Under num_to_keep the checkpoints no trial keeps go while the study
    runs (their copies once a snapshot no longer names them): interrupted
    part way, the study goes on from the ones its snapshot kept, to the
    same results, and ends holding only what its trials keep, the stored
    checkpoints its snapshot does not name removed."""
    flag = tmp_path / "interrupt"
    flag.touch()
    interrupt = {"at": 6, "pid": os.getpid(), "flag": str(flag)}
    keep_one = tune.CheckpointConfig(num_to_keep=1)
    before = build_tuner(str(tmp_path), "kept", interrupt=interrupt, checkpoint_config=keep_one).fit()
    assert not all(result.metrics.get("done") for result in before), "fit() returned at the interruption"
    # What the interrupted run stored and its snapshot does not name (reported after it): no restore reads it.
    orphan = os.path.join(before.experiment_path, "checkpoints", "node000099_step0000001.batch9.ckpt")
    open(orphan, "wb").close()
    restored = Tuner.restore(before.experiment_path, accumulate).fit()
    assert not os.path.exists(orphan)
    assert {k: trial["x"] for k, trial in summary(restored).items()} == {k: t["x"] for k, t in reference.items()}
    resumed = [row for result in restored for row in result.metrics_dataframe["resumed_from"].tolist() if row > 0]
    assert resumed, "training went on from stored checkpoints, not from scratch"
    assert len(os.listdir(os.path.join(before.experiment_path, "checkpoints"))) <= len(restored)


def test_a_study_stored_before_the_vocabulary_rename_restores(tmp_path, ray_session):
    """`tests/fixtures/make_pre_vocabulary.py` interrupted this study with the
    code before the vocabulary rename: its snapshot, saved plan and sealed
    checkpoints continue to the uninterrupted study's results."""
    from fixtures.make_pre_vocabulary import FIXTURE

    from ray_stagetree.execution.payload_auth import key_dir

    path = copy_of(os.path.join(FIXTURE, "study"), tmp_path)
    with open(os.path.join(path, "stagetree_experiment_id")) as file:
        experiment_id = file.read().strip()
    os.makedirs(key_dir(), exist_ok=True)
    shutil.copy(os.path.join(FIXTURE, "key"), os.path.join(key_dir(), experiment_id))
    stored = read_state(CheckpointStorage(path)).trials
    assert any(trial.status != "TERMINATED" for trial in stored), "the fixture is a study stopped part way"
    restored = Tuner.restore(path, accumulate).fit()
    with open(os.path.join(FIXTURE, "reference.json")) as file:
        reference = json.load(file)
    trial_ids = {key(trial.config_json): trial.trial_id for trial in stored}
    assert summary(restored) == {config: dict(trial, trial_id=trial_ids[config]) for config, trial in reference.items()}
    assert any(row > 0 for result in restored for row in result.metrics_dataframe["resumed_from"]), (
        "training went on from the stored checkpoints"
    )


def test_newest_checkpoints_lost_from_the_directory_are_trained_again(tmp_path, stopped, reference):
    path = copy_of(stopped[1], tmp_path)
    checkpoints = list((tmp_path / "copy" / "checkpoints").iterdir())
    for newest in sorted(checkpoints, key=lambda entry: int(entry.name.split("_step")[1].split(".")[0]))[-3:]:
        newest.unlink()
    results = summary(Tuner.restore(path, accumulate).fit())
    assert {key: trial["x"] for key, trial in results.items()} == {key: trial["x"] for key, trial in reference.items()}


def test_unfinished_trials_end_where_they_stood_without_resume_unfinished(tmp_path, stopped):
    before, path, executed = stopped
    restored = Tuner.restore(copy_of(path, tmp_path), accumulate, resume_unfinished=False).fit()
    after = summary(restored)
    assert {key: trial["iterations"] for key, trial in after.items()} == {
        key: trial["iterations"] for key, trial in before.items()
    }, "nothing more trained"
    assert all(result.error is None for result in restored)
    assert restored.iterations_executed == executed, "counted over the whole study"


def test_errored_trials_stay_errored_by_default_and_resume_when_asked(tmp_path, errored, reference):
    grid, flag = errored
    assert len(grid.errors) == len(reference), "every trial failed at iteration 5"
    path = copy_of(grid.experiment_path, tmp_path)
    flag.touch()
    kept = Tuner.restore(path, accumulate).fit()
    assert len(kept.errors) == len(reference), "errored trials stay errored by default"

    flag.unlink()
    resumed = Tuner.restore(path, accumulate, resume_errored=True).fit()
    assert not resumed.errors
    results = summary(resumed)
    assert {key: trial["x"] for key, trial in results.items()} == {key: trial["x"] for key, trial in reference.items()}
    assert all(trial["iterations"] == list(range(1, HORIZON + 1)) for trial in results.values())
    assert all(result.metrics_dataframe["resumed_from"].tolist()[4] > 0 for result in resumed), (
        "iteration 5 trained from a stored checkpoint, not from scratch"
    )


def test_restart_errored_starts_results_over(tmp_path, errored, reference):
    grid, flag = errored
    path = copy_of(grid.experiment_path, tmp_path)
    if flag.exists():
        flag.unlink()
    restarted = Tuner.restore(path, accumulate, restart_errored=True, resume_errored=True).fit()
    results = summary(restarted)
    assert not restarted.errors
    assert all(trial["iterations"] == list(range(1, HORIZON + 1)) for trial in results.values())
    assert {key: trial["x"] for key, trial in results.items()} == {key: trial["x"] for key, trial in reference.items()}


def test_can_restore_only_at_the_experiment_root(tmp_path, ray_session):
    grid = build_tuner(str(tmp_path), "study").fit()
    path = grid.experiment_path
    assert Tuner.can_restore(path)
    assert not Tuner.can_restore(grid[0].path), "a trial folder is not a study"
    assert not Tuner.can_restore(str(tmp_path / "nothing"))
    with pytest.raises(ValueError, match="stagetree_tuner.pkl is missing.*experiment directory"):
        Tuner.restore(grid[0].path, accumulate)
    with pytest.raises(TypeError, match="resume_errored must be True or False, got 'yes'"):
        Tuner.restore(path, accumulate, resume_errored="yes")
    # A finished study restores to its results, training nothing.
    again = Tuner.restore(path, accumulate).fit()
    assert again.iterations_executed == grid.iterations_executed
    assert summary(again) == summary(grid)


class CountingSearcher(Searcher):
    """Suggests lr values in turn; its state is the count of suggestions."""

    def __init__(self):
        super().__init__(metric="x", mode="max")
        self.suggested = 0

    def suggest(self, trial_id):
        self.suggested += 1
        return {"lr": 0.5 + 0.1 * self.suggested}

    def on_trial_complete(self, trial_id, result=None, error=False):
        pass


class CountingScheduler(FIFOScheduler):
    def __init__(self):
        super().__init__()
        self.results = 0

    def on_trial_result(self, tune_controller, trial, result):
        self.results += 1
        return super().on_trial_result(tune_controller, trial, result)

    def on_trial_complete(self, tune_controller, trial, result):
        self.results += 1  # Tune hands a trial's last result here, not to on_trial_result


def test_searcher_and_scheduler_state_is_restored(tmp_path, ray_session):
    name = "study"
    flag = tmp_path / "interrupt"
    flag.touch()
    interrupt = {"at": 3, "pid": os.getpid(), "flag": str(flag)}  # the first trial to reach iteration 3 stops fit()
    tuner = Tuner(
        accumulate,
        param_space={"lr": tune.uniform(0.5, 1.5), "decay": 0.9, "interrupt": interrupt},
        tune_config=tune.TuneConfig(
            search_alg=CountingSearcher(), scheduler=CountingScheduler(), num_samples=6, max_concurrent_trials=2
        ),
        run_config=tune.RunConfig(
            name=name, storage_path=str(tmp_path), stop={"training_iteration": HORIZON}, verbose=0
        ),
    )
    first = tuner.fit()
    assert not all(result.metrics.get("done") for result in first)
    restored = Tuner.restore(first.experiment_path, accumulate).fit()
    ids = [result.metrics["trial_id"] for result in restored]
    assert len(ids) == len(set(ids)) == 6, "no trial id assigned twice"
    lrs = sorted(result.config["lr"] for result in restored)
    assert np.allclose(lrs, [0.5 + 0.1 * k for k in range(1, 7)]), "the searcher went on where it stood"
    state = read_state(CheckpointStorage(restored.experiment_path))
    assert state.source.searcher.suggested == 6
    assert state.host.scheduler.results == 6 * HORIZON, "the scheduler saw every iteration once, across the restore"


# -- the stress test: SIGKILL / SIGINT at random points until the study completes --


def test_killed_at_random_points_and_restored_until_complete(tmp_path, reference):
    address = ray.get_runtime_context().gcs_address
    name, results_file = "study", tmp_path / "results.json"
    path = tmp_path / name
    rng = np.random.default_rng(7)
    code = "import sys, restore_study; restore_study.main(*sys.argv[1:])"
    seen_metrics: set = set()
    trial_ids: set = set()
    kills = 0
    for round_ in range(8):
        driver = subprocess.Popen([sys.executable, "-c", code, str(tmp_path), name, address, str(results_file)])
        exits = (0,)
        if round_ < 3:  # the short form: three kills, at random points of its progress, then it runs to the end
            at = stored_rows(str(path)) + int(rng.integers(3, 15))
            deadline = time.monotonic() + 120
            while stored_rows(str(path)) < at and driver.poll() is None and time.monotonic() < deadline:
                time.sleep(0.02)
            if driver.poll() is None:
                sent = signal.SIGKILL if round_ % 2 == 0 else signal.SIGINT
                driver.send_signal(sent)
                kills += 1
                # A Ctrl-C that lands after fit() returned ends Python with KeyboardInterrupt (exit 1).
                exits = (0, -signal.SIGKILL) if sent == signal.SIGKILL else (0, -signal.SIGINT, 1)
        assert driver.wait(timeout=300) in exits
        if (path / STATE_FILE).exists():
            state = read_state(CheckpointStorage(str(path)))
            metrics = {(row["node_id"], row["step"]) for row in state.plan["metrics"]}
            assert seen_metrics <= metrics, "progress never goes back beyond what was stored"
            seen_metrics = metrics
            trial_ids |= {trial.trial_id for trial in state.trials}
        if results_file.exists():
            break
    assert kills >= 1
    results = json.loads(results_file.read_text())
    assert {key: trial["x"] for key, trial in results.items()} == {key: trial["x"] for key, trial in reference.items()}
    assert all(trial["iterations"] == list(range(1, HORIZON + 1)) for trial in results.values())
    assert trial_ids == {trial["trial_id"] for trial in results.values()}, "no trial id assigned twice"


def test_a_study_lost_before_its_first_snapshot_restores_from_the_start(tmp_path, reference):
    tuner = build_tuner(str(tmp_path), "study")
    save_settings(tuner, f"{tmp_path}/study")  # what fit() writes before anything runs
    assert Tuner.can_restore(f"{tmp_path}/study")
    results = summary(Tuner.restore(f"{tmp_path}/study", accumulate).fit())
    assert {key: trial["x"] for key, trial in results.items()} == {key: trial["x"] for key, trial in reference.items()}


def test_a_study_whose_controller_dies_continues_from_its_snapshot(tmp_path, reference, caplog, monkeypatch):
    name = "study"
    killed = []
    # The trials wait at iteration 3 (all six share iterations 1 and 2) until the controller is killed, once a
    # snapshot holds 8 of the study's 72 results: a snapshot at every step, and the study cannot end first, however
    # loaded the machine (the kill used to race the study's end; a loaded full suite once lost the race).
    monkeypatch.setenv("TUNE_GLOBAL_CHECKPOINT_S", "0")
    hold = {"at": 3, "flag": str(tmp_path / "hold")}
    (tmp_path / "hold").touch()

    def kill_controller():
        while stored_rows(f"{tmp_path}/{name}") < 8:
            time.sleep(0.05)
        killed.append(kill_ray_processes("ray::StudyController"))
        os.remove(hold["flag"])

    watcher = threading.Thread(target=kill_controller, daemon=True)
    watcher.start()
    grid = build_tuner(str(tmp_path), name, hold=hold).fit()
    watcher.join()
    assert killed == [1]
    assert "controller died" in caplog.text
    results = summary(grid)
    assert {key: trial["x"] for key, trial in results.items()} == {key: trial["x"] for key, trial in reference.items()}
    assert all(trial["iterations"] == list(range(1, HORIZON + 1)) for trial in results.values())
