"""One driver per experiment folder (issue 30 point 6): two drivers
restoring one study, or a fresh fit() into a folder a live driver uses,
both trained all that was left into one folder. The second is refused,
naming the first; a crashed driver's lease lets go. No Ray: the refusal
comes before Ray starts, and the clock is the test's own."""

import json
import os
import signal
import socket
import subprocess
import sys
import time
from types import SimpleNamespace

import pytest
from ray import tune

from ray_stagetree import Tuner
from ray_stagetree.cli import main
from ray_stagetree.cli.common import FAILED, save_job
from ray_stagetree.execution.storage import CheckpointStorage
from ray_stagetree.runtime.driver.lease import (
    LEASE_FILE,
    STALE_S,
    DriverLease,
    ExperimentInUseError,
    check_free,
    read_holder,
)


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


def train(config):
    tune.report({"loss": 1.0})


def plant(storage, host, pid, heartbeat):
    """A lease as another driver writes it."""
    holder = {"host": host, "pid": pid, "started": heartbeat - 60, "heartbeat": heartbeat, "token": "theirs"}
    storage.write(LEASE_FILE, json.dumps(holder).encode())


def test_a_second_driver_is_refused_naming_the_first_until_it_lets_go(tmp_path):
    storage = CheckpointStorage(str(tmp_path))
    clock = Clock()
    with DriverLease(storage, str(tmp_path), clock=clock):
        holder = read_holder(storage)
        assert (holder.host, holder.pid, holder.heartbeat) == (socket.gethostname(), os.getpid(), clock.now)
        with pytest.raises(ExperimentInUseError, match=f"in use by another driver \\(pid {os.getpid()} on host"):
            DriverLease(storage, str(tmp_path), clock=clock).acquire()
    assert read_holder(storage) is None, "the lease goes with its driver"
    with DriverLease(storage, str(tmp_path), clock=clock):
        pass


def test_a_lease_without_heartbeats_goes_stale(tmp_path):
    """A driver on another machine that crashed: its lease lets go STALE_S after its last heartbeat."""
    storage = CheckpointStorage(str(tmp_path))
    clock = Clock()
    plant(storage, "another-host", 4242, heartbeat=clock.now)
    clock.now += STALE_S - 1
    with pytest.raises(ExperimentInUseError, match=r"pid 4242 on host 'another-host'.*last heartbeat 89 s ago"):
        check_free(storage, str(tmp_path), clock)
    clock.now += 1
    with DriverLease(storage, str(tmp_path), clock=clock):
        assert read_holder(storage).pid == os.getpid()


def test_a_renewed_lease_stays_live(tmp_path):
    storage = CheckpointStorage(str(tmp_path))
    clock = Clock()
    lease = DriverLease(storage, str(tmp_path), clock=clock)
    lease.acquire()
    try:
        clock.now += STALE_S - 1
        lease.renew()  # what the heartbeat thread does every HEARTBEAT_S
        clock.now += STALE_S - 1
        with pytest.raises(ExperimentInUseError):
            check_free(storage, str(tmp_path), clock)
    finally:
        lease.release()


def test_a_driver_killed_on_this_machine_lets_go_at_once(tmp_path):
    """`stagetree restore` after a driver was SIGKILLed, or crashed: no wait for the staleness."""
    storage = CheckpointStorage(str(tmp_path))
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys\n"
            "from ray_stagetree.execution.storage import CheckpointStorage\n"
            "from ray_stagetree.runtime.driver.lease import DriverLease\n"
            f"DriverLease(CheckpointStorage({str(tmp_path)!r}), 'study').acquire()\n"
            "print('held', flush=True)\n"
            "sys.stdin.read()\n",
        ],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(ExperimentInUseError, match=f"pid {holder.pid} on host"):
            check_free(storage, str(tmp_path))
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    check_free(storage, str(tmp_path))


def test_the_lease_works_on_fsspec_storage():
    storage = CheckpointStorage("memory://lease-test/study")
    clock = Clock()
    with DriverLease(storage, "memory://lease-test/study", clock=clock):
        with pytest.raises(ExperimentInUseError):
            check_free(storage, "memory://lease-test/study", clock)
    check_free(storage, "memory://lease-test/study", clock)


def live_lease_of_another_driver(path):
    plant(CheckpointStorage(str(path)), "another-host", 4242, heartbeat=time.time())


def run_config(tmp_path):
    return tune.RunConfig(name="study", storage_path=str(tmp_path), verbose=0)


def test_a_restore_or_a_fresh_tuner_into_a_folder_in_use_is_refused_before_anything_runs(tmp_path):
    Tuner(train, run_config=run_config(tmp_path))  # the experiment folder, as a first driver writes it
    study = tmp_path / "study"
    settings = (study / "stagetree_tuner.pkl").read_bytes()
    live_lease_of_another_driver(study)
    with pytest.raises(ExperimentInUseError, match="pid 4242 on host 'another-host'"):
        Tuner.restore(str(study), train).fit()
    with pytest.raises(ExperimentInUseError, match="pid 4242 on host 'another-host'"):
        Tuner(train, param_space={"other": 1}, run_config=run_config(tmp_path))
    assert (study / "stagetree_tuner.pkl").read_bytes() == settings, "the live study's settings are kept"


def test_stagetree_restore_of_a_folder_in_use_is_refused_naming_the_driver(tmp_path, capsys):
    Tuner(train, run_config=run_config(tmp_path))
    study = tmp_path / "study"
    spec = SimpleNamespace(
        data={"trainable": "test_lease:train"}, base_dir=str(tmp_path), source=str(tmp_path / "a.yaml")
    )
    save_job(str(study), spec)
    live_lease_of_another_driver(study)
    assert main(["restore", str(study)]) == FAILED
    assert "is in use by another driver (pid 4242 on host 'another-host'" in capsys.readouterr().err


def test_a_lease_this_process_could_not_remove_does_not_refuse_it(tmp_path):
    """Storage that refused to remove the lease (read-only when the study
    ended) leaves it behind with this process's pid: this process holds it
    no more, so its own restore goes on; a lease it holds still refuses."""
    storage, clock = CheckpointStorage(str(tmp_path)), Clock()
    plant(storage, socket.gethostname(), os.getpid(), clock.now)
    check_free(storage, str(tmp_path), clock)  # left behind: not held
    with DriverLease(storage, str(tmp_path), clock=clock):
        with pytest.raises(ExperimentInUseError):
            check_free(storage, str(tmp_path), clock)
