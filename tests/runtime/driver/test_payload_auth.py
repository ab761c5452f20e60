"""Checkpoints are read only from inside the experiment directory, and only
payloads sealed with the experiment's key are unpickled (issue point 2): a
rewritten plan table or payload, with its correct checksum, runs nothing."""

import os
import pickle
import stat

import pyarrow.parquet as pq
import pytest
from ray import tune
from test_tuner import LRS
from trainables_for_tests import count_of, noisy_descent

from ray_stagetree import Study, Tuner
from ray_stagetree.execution.payload import checksum
from ray_stagetree.execution.payload_auth import ID_FILE, experiment_key, key_dir
from ray_stagetree.execution.sealed_storage import SealedStorage
from ray_stagetree.execution.storage import CheckpointCorruptError, CheckpointStorage, StoredCheckpoint
from ray_stagetree.planning import SearchPlan
from ray_stagetree.planning.plan import CheckpointInfo
from ray_stagetree.runtime.control.checkpoint_store import StorageIO, StudyStorage


class RunsCode:
    """A pickle that creates a file when loaded: proof that something unpickled it."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def evil_bytes(marker) -> bytes:
    return pickle.dumps(RunsCode(marker))


def rewrite_checkpoint_rows(plan_dir, **changes) -> None:
    """Rewrite every row of a saved plan's checkpoints table, as an attacker
    with write access to the experiment directory would."""
    path = os.path.join(plan_dir, "checkpoints.parquet")
    table = pq.read_table(path)
    rows = [{**row, **changes} for row in table.to_pylist()]
    pq.write_table(table.from_pylist(rows, schema=table.schema), path)


@pytest.mark.parametrize("path", ["/tmp/evil.pkl", "checkpoints/../../evil.pkl", "evil.pkl", "file:///tmp/evil.pkl"])
def test_a_plan_table_pointing_outside_the_experiment_directory_is_refused(tmp_path, path):
    plan = SearchPlan()
    plan.add_trial("t", {"lr": 0.1}, 4)
    plan.record_checkpoint(0, 4, CheckpointInfo("checkpoints/node000000_step0000004.ckpt", 3, "sha256:00"))
    plan.save(str(tmp_path / "exp" / "plan"))
    rewrite_checkpoint_rows(tmp_path / "exp" / "plan", path=path)
    with pytest.raises(ValueError, match="has path " + repr(path).replace(".", r"\.") + ".*refusing to load it"):
        SearchPlan.load(str(tmp_path / "exp" / "plan"))
    with pytest.raises(ValueError, match="refusing to load it"):  # Study.evaluate reads the plan first
        Study(str(tmp_path / "exp"), noisy_descent).evaluate({"lr": 0.1}, 6)


def test_storage_io_unpickles_only_what_it_sealed(tmp_path):
    storage = CheckpointStorage(str(tmp_path / "exp"))

    def sealed_by(secret, trusted=False):
        return StudyStorage.of(SealedStorage(storage, secret, trusted))

    io, study = StorageIO(), sealed_by(os.urandom(32))
    name = "checkpoints/node000000_step0000004.ckpt"
    stored = io.write(study, name, {"weights": [1, 2]})
    assert io.reload(study, stored, name) == (None, {"weights": [1, 2]})
    marker = tmp_path / "ran"
    # a pickle put in its place, with the size and checksum the table would then claim
    evil = evil_bytes(marker)
    (tmp_path / "exp" / name).write_bytes(evil)
    forged = StoredCheckpoint(stored.path, len(evil), checksum(evil))
    problem, payload = io.reload(study, forged, name)
    assert payload is None and "not authenticated by this experiment's key" in problem
    # a sealed payload of another checkpoint, or of another experiment's key, is refused too
    other = io.write(study, "checkpoints/other.ckpt", {"weights": [0]})
    assert io.reload(study, other, name)[1] is None
    assert io.reload(sealed_by(os.urandom(32)), other, "checkpoints/other.ckpt")[1] is None
    # declared trusted (RAY_STAGETREE_TRUST_STORAGE=1), it is read as before: checksum only
    assert io.reload(sealed_by(os.urandom(32), trusted=True), other, "checkpoints/other.ckpt")[1] == {"weights": [0]}
    assert not marker.exists()


def test_a_link_out_of_the_experiment_directory_is_not_read(tmp_path):
    outside = tmp_path / "elsewhere.ckpt"
    outside.write_bytes(b"payload")
    storage = CheckpointStorage(str(tmp_path / "exp"))
    (tmp_path / "exp" / "checkpoints").mkdir(parents=True)
    (tmp_path / "exp" / "checkpoints" / "a.ckpt").symlink_to(outside)
    stored = StoredCheckpoint(storage.path("checkpoints/a.ckpt"), 7, checksum(b"payload"))
    with pytest.raises(CheckpointCorruptError, match="outside the experiment directory"):
        storage.read(stored)


def test_the_key_lives_outside_the_experiment_directory_and_follows_it_when_moved(tmp_path):
    storage = CheckpointStorage(str(tmp_path / "exp"))
    key, existed = experiment_key(storage)
    assert not existed and len(key) == 32
    experiment_id = (tmp_path / "exp" / ID_FILE).read_text()
    key_file = os.path.join(key_dir(), experiment_id)
    assert open(key_file, "rb").read() == key and stat.S_IMODE(os.stat(key_file).st_mode) == 0o600
    assert key not in b"".join(p.read_bytes() for p in (tmp_path / "exp").rglob("*") if p.is_file())
    os.rename(tmp_path / "exp", tmp_path / "moved")
    assert experiment_key(CheckpointStorage(str(tmp_path / "moved"))) == (key, True)
    # an id rewritten to name another file is never used as a path: a new id and key replace it
    (tmp_path / "moved" / ID_FILE).write_text("../../etc/passwd")
    assert experiment_key(CheckpointStorage(str(tmp_path / "moved")))[0] != key


@pytest.mark.timeout(120)
def test_study_evaluate_refuses_a_tampered_checkpoint_and_retrains_it(tmp_path, counter):
    config = {"lr": LRS[0], "counter": counter}
    grid = Tuner(
        noisy_descent,
        param_space=config,
        run_config=tune.RunConfig(
            name="tampered", storage_path=str(tmp_path), stop={"training_iteration": 3}, verbose=0
        ),
    ).fit()
    info = SearchPlan.load(f"{grid.experiment_path}/plan").nodes[0].checkpoints[3]
    marker = tmp_path / "ran"
    evil = evil_bytes(marker)
    with open(os.path.join(grid.experiment_path, info.path), "wb") as file:
        file.write(evil)
    rewrite_checkpoint_rows(os.path.join(grid.experiment_path, "plan"), size_bytes=len(evil), checksum=checksum(evil))
    before = count_of(counter)
    metrics = Study(grid.experiment_path, noisy_descent).evaluate(config, 4)
    assert not marker.exists(), "the tampered payload was unpickled"
    assert count_of(counter) - before == 4, "refused, so trained again from the start"
    assert metrics["training_iteration"] == 4
