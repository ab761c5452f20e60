"""Each trial runs in its own working directory, as Tune's trainable
actors do: files written by a relative path are the trial's own, trials
that shared a stage each see what it wrote, and ``SyncConfig(sync_artifacts=True)``
puts them in the trial's folder."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

import pytest
from ray import tune

from ray_stagetree import MultiStep, Tuner

STOP = 6
LRS = [MultiStep(1.0, [3], 0.5), MultiStep(1.0, [3], 0.25), MultiStep(1.0, [5], 0.5)]


def writes_a_relative_log(config):
    """A Tune trainable that logs each iteration to ``log.txt`` in its working
    directory and reads the whole file back: a trial's file must hold its own
    iterations, each once, whatever stages it shared."""
    start = 0
    if checkpoint := tune.get_checkpoint():
        with checkpoint.as_directory() as folder, open(os.path.join(folder, "state.json")) as file:
            start = json.load(file)
    for iteration in range(start + 1, STOP + 1):
        with open("log.txt", "a") as log:
            log.write(f"{iteration}:{config['lr']}\n")
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "state.json"), "w") as file:
                json.dump(iteration, file)
            tune.report(
                {"log": open("log.txt").read(), "cwd": os.getcwd()},
                checkpoint=tune.Checkpoint.from_directory(folder),
            )


def expected_log(lr: MultiStep) -> str:
    return "".join(f"{i}:{lr.value(i - 1)}\n" for i in range(1, STOP + 1))


def test_each_trial_writes_relative_files_in_its_own_working_directory(tmp_path, ray_session, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the driver's directory: no trial writes here
    grid = Tuner(
        # One trial at a time, so each fork starts where the stage it shared ended (its branch point), not
        # from an earlier checkpoint while that stage still runs, where the stage's files are not kept.
        tune.with_resources(writes_a_relative_log, {"cpu": 2}),
        param_space={"lr": tune.grid_search(LRS)},
        run_config=tune.RunConfig(
            storage_path=str(tmp_path / "results"),
            name="workdirs",
            sync_config=tune.SyncConfig(sync_artifacts=True),
            verbose=0,
        ),
    ).fit()
    assert grid.num_errors == 0
    assert grid.iterations_executed < len(LRS) * STOP, "the trials shared their first stage"
    for result in grid:
        # Tune's layout: <Ray session>/artifacts/<timestamp>/<experiment>/working_dirs/<trial folder>
        folder = result.metrics["cwd"]
        assert folder.endswith(f"/workdirs/working_dirs/{os.path.basename(result.path)}")
        assert "/artifacts/" in folder
        assert result.metrics["log"] == expected_log(result.config["lr"])
        # sync_artifacts: the working directory's files in the trial's folder, as Tune syncs them
        assert (tmp_path / "results" / "workdirs" / os.path.basename(result.path) / "log.txt").read_text() == (
            expected_log(result.config["lr"])
        )
    assert len({result.metrics["cwd"] for result in grid}) == len(LRS)
    assert not (tmp_path / "log.txt").exists()
    # The files kept where trials forked went with the study: Tune's layout is left, its folders' files.
    study_folder = os.path.dirname(os.path.dirname(grid[0].metrics["cwd"]))
    assert sorted(os.listdir(study_folder)) == ["working_dirs"]


def test_without_sync_artifacts_the_trial_folders_get_no_working_files(tmp_path, ray_session):
    grid = Tuner(
        writes_a_relative_log,
        param_space={"lr": tune.grid_search(LRS[:2])},
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="nosync", verbose=0),
    ).fit()
    assert grid.num_errors == 0
    for result in grid:
        assert result.metrics["log"] == expected_log(result.config["lr"])
        assert not os.path.exists(os.path.join(result.path, "log.txt"))


class LogsToItsLogdir(tune.Trainable):
    """A class trainable that writes to ``self.logdir``, as Tune's users do."""

    def setup(self, config):
        self.at_setup = self.logdir

    def step(self):
        with open(os.path.join(self.logdir, "steps.txt"), "a") as file:
            file.write(f"{self.iteration + 1}\n")
        return {"logdir": self.logdir, "cwd": os.getcwd(), "at_setup": self.at_setup}

    def save_checkpoint(self, checkpoint_dir):
        return None

    def load_checkpoint(self, checkpoint):
        pass

    def reset_config(self, new_config):
        return True


def test_a_class_trainables_logdir_is_its_trials_working_directory(tmp_path, ray_session):
    grid = Tuner(
        LogsToItsLogdir,
        param_space={"lr": tune.grid_search([1, 2, 3])},
        tune_config=tune.TuneConfig(reuse_actors=True),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path), name="logdirs", stop={"training_iteration": 3}, verbose=0
        ),
    ).fit()
    assert grid.num_errors == 0
    for result in grid:
        logdir = result.metrics["logdir"]
        assert logdir == result.metrics["cwd"]
        # setup ran in the trial the reused object was made for, as under Tune
        assert "/logdirs/working_dirs/" in result.metrics["at_setup"]
        assert logdir.endswith(f"/logdirs/working_dirs/{os.path.basename(result.path)}")
        with open(os.path.join(logdir, "steps.txt")) as file:
            assert file.read() == "1\n2\n3\n"


def test_ray_chdir_to_trial_dir_0_keeps_trainables_in_the_drivers_directory(tmp_path):
    """Tune's switch, set before Ray starts as Tune's users set it: the workers inherit it."""
    script = """
import os, ray
from ray import tune
from ray_stagetree import Tuner

os.environ["RAY_CHDIR_TO_TRIAL_DIR"] = "0"
ray.init(address="local", num_cpus=1, include_dashboard=False)
def report_cwd(config):
    tune.report({"cwd": os.getcwd()})
grid = Tuner(report_cwd, run_config=tune.RunConfig(storage_path=os.getcwd(), name="stay", verbose=0)).fit()
print("CWD", grid[0].metrics["cwd"])
"""
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"CWD {tmp_path}" in done.stdout.splitlines()


def reads_its_synced_log(config):
    """Logs each iteration in its working directory and reports how many
    lines its trial folder in storage already shows."""
    synced = os.path.join(config["experiment"], os.path.basename(os.getcwd()), "log.txt")
    for iteration in range(1, 4):
        lines = len(open(synced).readlines()) if os.path.exists(synced) else 0
        with open("log.txt", "a") as log:
            log.write(f"{iteration}\n")
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "state.json"), "w") as file:
                json.dump(iteration, file)
            tune.report({"synced_lines": lines}, checkpoint=tune.Checkpoint.from_directory(folder))


@pytest.mark.parametrize("on_checkpoint", [True, False])
def test_sync_artifacts_syncs_at_each_checkpoint_as_tune_does(tmp_path, ray_session, on_checkpoint):
    grid = Tuner(
        reads_its_synced_log,
        param_space={"experiment": str(tmp_path / "synced")},
        run_config=tune.RunConfig(
            storage_path=str(tmp_path),
            name="synced",
            sync_config=tune.SyncConfig(sync_artifacts=True, sync_artifacts_on_checkpoint=on_checkpoint),
            verbose=0,
        ),
    ).fit()
    assert grid.num_errors == 0
    seen = grid[0].metrics_dataframe["synced_lines"].tolist()
    # Without it, the first report syncs, then one every sync_period (300 s), as under Tune: [0, 1, 1]
    assert seen == ([0, 1, 2] if on_checkpoint else [0, 1, 1])
    assert open(os.path.join(grid[0].path, "log.txt")).read() == "1\n2\n3\n"  # and at the end either way
