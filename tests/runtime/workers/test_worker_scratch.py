"""A worker's temporary folders (a checkpoint unpacked for its trainable,
the last checkpoint it reported) live in one scratch folder per worker
process (`runtime.workers.scratch`): removed when the study ends, and, for a
worker that was killed, by the next worker that starts on the host. Before,
every killed worker (a crash, a killed driver) left a copy of its
trainable's last checkpoint in the node's temporary folder for good."""

import glob
import json
import os
import subprocess
import sys
import tempfile
import uuid

import pytest
from ray import tune

from ray_stagetree import Tuner
from ray_stagetree.runtime.workers import scratch


def _gone_pid():
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def test_reap_removes_the_folders_of_this_hosts_processes_that_are_gone_and_no_others(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    # An earlier test in this process may have made its folder elsewhere: this one makes its own.
    monkeypatch.setattr(scratch, "_folder", None)
    host = scratch._host()
    gone = tmp_path / f"{scratch.PREFIX}{_gone_pid()}_{host}_x1"
    (gone / "stagetree_latest_a").mkdir(parents=True)
    running = tmp_path / f"{scratch.PREFIX}{os.getpid()}_{host}_x2"
    running.mkdir()
    other_host = tmp_path / f"{scratch.PREFIX}{_gone_pid()}_another-host_x3"
    other_host.mkdir()
    assert scratch.reap() == [str(gone)]
    assert running.exists() and other_host.exists()

    made = scratch.mkdtemp("stagetree_latest_")
    assert os.path.dirname(os.path.dirname(made)) == str(tmp_path)
    scratch.remove()
    assert not os.path.exists(os.path.dirname(made))


def reports_then_dies_once(config):
    """Reports a checkpoint holding a file named ``config["name"]`` at every
    iteration; its process exits after the second report of its first run."""
    for iteration in range(1, 5):
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, config["name"]), "w") as file:
                json.dump({"iteration": iteration}, file)
            tune.report(
                {"loss": 1.0 / iteration, "pid": os.getpid()}, checkpoint=tune.Checkpoint.from_directory(folder)
            )
        if iteration == 2 and not os.path.exists(config["marker"]):
            with open(config["marker"], "w") as file:
                file.write(str(os.getpid()))
            os._exit(1)


@pytest.mark.timeout(240)
def test_no_copy_of_a_checkpoint_outlives_the_study_even_from_a_worker_that_died(tmp_path, ray_session):
    name = f"weights_{uuid.uuid4().hex}.json"
    grid = Tuner(
        reports_then_dies_once,
        param_space={"name": name, "marker": str(tmp_path / "died")},
        run_config=tune.RunConfig(
            storage_path=str(tmp_path), failure_config=tune.FailureConfig(max_failures=1), verbose=0
        ),
    ).fit()
    # As under Tune, the retry goes on from the checkpoint reported before the process
    # died (iteration 2), and this trainable reports four more iterations from there.
    assert grid.num_errors == 0 and grid[0].metrics["training_iteration"] == 6
    assert int((tmp_path / "died").read_text()) != grid[0].metrics["pid"]  # it did die, and another worker went on
    # The trial's own checkpoint is in the experiment folder; no copy is left in the temporary folder.
    assert os.path.exists(os.path.join(grid[0].checkpoint.path, name))
    assert glob.glob(os.path.join(tempfile.gettempdir(), "stagetree_*", "**", name), recursive=True) == []
