"""A checkpoint directory that holds symbolic links is kept whole, as Tune's
upload keeps it (it copies what a link points to); one whose link cannot be
followed errors its trial, naming the link (issue 30 point 4: such a
checkpoint was lost with no error, or the worker waited forever)."""

import os
import tempfile

import pytest
from ray import tune

from ray_stagetree import Tuner

ITERATIONS = 3


def linked_checkpoint(scratch, iteration, broken=False):
    """A checkpoint folder under ``scratch`` whose weights (a file) and shards
    (a folder) are links."""
    elsewhere = tempfile.mkdtemp(prefix="weights_", dir=scratch)
    with open(os.path.join(elsewhere, "weights.bin"), "w") as file:
        file.write(f"weights {iteration}")
    os.makedirs(os.path.join(elsewhere, "shards"))
    with open(os.path.join(elsewhere, "shards", "0.bin"), "w") as file:
        file.write(f"shard {iteration}")
    folder = tempfile.mkdtemp(prefix="checkpoint_", dir=scratch)
    os.symlink(os.path.join(elsewhere, "missing" if broken else "weights.bin"), os.path.join(folder, "weights.bin"))
    os.symlink(os.path.join(elsewhere, "shards"), os.path.join(folder, "shards"))
    return folder


def reports_linked_checkpoints(config):
    for iteration in range(1, ITERATIONS + 1):
        folder = linked_checkpoint(config["scratch"], iteration, broken=config.get("broken", False))
        tune.report({"loss": 1.0 / iteration}, checkpoint=tune.Checkpoint.from_directory(folder))


class SavesLinks(tune.Trainable):
    def setup(self, config):
        self.steps = 0

    def step(self):
        self.steps += 1
        return {"loss": 1.0 / self.steps}

    def save_checkpoint(self, checkpoint_dir):
        source = linked_checkpoint(self.config["scratch"], self.steps)
        for name in os.listdir(source):
            os.symlink(os.path.join(source, name), os.path.join(checkpoint_dir, name))

    def load_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "weights.bin")) as file:
            self.steps = int(file.read().split()[1])


def fit(tmp_path, name, trainable, space=None, **run_config):
    return Tuner(
        trainable,
        param_space={"scratch": str(tmp_path), **(space or {})},
        run_config=tune.RunConfig(
            name=name,
            storage_path=str(tmp_path),
            stop={"training_iteration": ITERATIONS},
            verbose=0,
            **run_config,
        ),
    ).fit()


def kept(result):
    """What the trial's checkpoint holds: relative path -> text, links followed."""
    root = result.checkpoint.path
    found = {}
    for folder, _, files in os.walk(root):
        for name in files:
            path = os.path.join(folder, name)
            assert not os.path.islink(path), f"{path} is still a link"
            with open(path) as file:
                found[os.path.relpath(path, root)] = file.read()
    return found


@pytest.mark.timeout(240)
def test_a_reported_checkpoint_holding_links_is_kept_with_what_they_point_to(tmp_path, ray_session):
    grid = fit(tmp_path, "function", reports_linked_checkpoints)
    assert grid.num_errors == 0
    assert kept(grid[0]) == {"weights.bin": "weights 3", os.path.join("shards", "0.bin"): "shard 3"}


@pytest.mark.timeout(240)
def test_a_class_trainables_saved_links_are_kept(tmp_path, ray_session):
    grid = fit(tmp_path, "class", SavesLinks, checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1))
    assert grid.num_errors == 0
    assert kept(grid[0]) == {"weights.bin": "weights 3", os.path.join("shards", "0.bin"): "shard 3"}


@pytest.mark.timeout(240)
def test_a_link_to_nothing_errors_the_trial_naming_it(tmp_path, ray_session):
    grid = fit(tmp_path, "broken", reports_linked_checkpoints, space={"broken": True})
    assert grid.num_errors == 1
    assert "'weights.bin' is a symbolic link to" in str(grid[0].error)
    assert "which does not exist" in str(grid[0].error)
