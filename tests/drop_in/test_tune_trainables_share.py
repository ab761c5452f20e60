"""A Ray Tune trainable shares stages as written (issue 57): it reads its
hyper-parameters from ``config`` as numbers, restores from
``tune.get_checkpoint()`` and shuffles with a generator of its own; only the
schedule moved into ``param_space``. Shared, it reports exactly what it
reports trained trial by trial, and executes fewer iterations."""

import json
import os
import tempfile

import pytest
from ray import tune

import ray_stagetree
from ray_stagetree import MultiStep, get_hparams

EPOCHS = 6


def losses(grid):
    return {str(result.config["lr"]): result.metrics_dataframe["loss"].tolist() for result in grid}


def assert_ran(grid):
    assert not grid.errors, [str(result.error) for result in grid if result.error]


def test_a_tune_trainable_reading_numbers_shares_and_equals_trial_by_trial(ray_session, tmp_path):
    import torch_reads_numbers as script

    shared = script.main(ray_stagetree.Tuner, str(tmp_path / "shared"))
    alone = script.main(ray_stagetree.Tuner, str(tmp_path / "alone"), stage_sharing=False)
    assert_ran(shared)
    assert_ran(alone)
    reported = sum(len(result.metrics_dataframe) for result in shared)
    assert reported == 3 * script.EPOCHS and shared.iterations_executed < reported  # the first 2 epochs once
    assert losses(shared) == losses(alone)  # bit for bit: the forks restore the trainable's own generator too
    lrs = {str(result.config["lr"]): result.metrics_dataframe["lr"].tolist() for result in shared}
    assert lrs["MultiStep(init=0.05, milestones=[4], gamma=0.1)"] == pytest.approx([0.05] * 4 + [0.005] * 2)


def checkpoint_dict(state):
    folder = tempfile.mkdtemp()
    with open(os.path.join(folder, "state.json"), "w") as file:
        json.dump(state, file)
    return tune.Checkpoint.from_directory(folder)


def load_dict(checkpoint):
    with checkpoint.as_directory() as folder, open(os.path.join(folder, "state.json")) as file:
        return json.load(file)


def no_checkpoints(config):
    lr = config["lr"]
    for _ in range(EPOCHS):
        tune.report({"loss": lr})


def test_a_held_value_that_changes_without_a_checkpoint_names_the_key_and_the_fixes(ray_session, tmp_path):
    grid = ray_stagetree.Tuner(
        no_checkpoints,
        param_space={"lr": MultiStep(0.5, [2], 0.1)},
        run_config=tune.RunConfig(storage_path=str(tmp_path), stop={"training_iteration": EPOCHS}, verbose=0),
    ).fit()
    message = str(grid[0].error)
    assert "config['lr'] changes at iteration 2" in message
    assert "report() got none at iteration 2" in message and "get_hparams()['lr']" in message
    assert len(grid[0].metrics_dataframe) == 2  # never a row trained with the stale value


def follows_values(config):
    """Written for ray_stagetree, runs on ray.tune.Tuner too: get_hparams() each iteration."""
    x, start = 1.0, 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        state = load_dict(checkpoint)
        x, start = state["x"], state["iteration"]
    for iteration in range(start, EPOCHS):
        x -= get_hparams()["lr"] * x
        state = {"x": x, "iteration": iteration + 1}
        tune.report({"loss": x, "lr": get_hparams()["lr"]}, checkpoint=checkpoint_dict(state))


class FollowsValues(tune.Trainable):
    def setup(self, config):
        self.x = 1.0

    def step(self):
        lr = get_hparams()["lr"]
        self.x -= lr * self.x
        return {"loss": self.x, "lr": lr}

    def save_checkpoint(self, checkpoint_dir):
        return {"x": self.x}

    def load_checkpoint(self, checkpoint):
        self.x = checkpoint["x"]


@pytest.mark.parametrize("trainable", [follows_values, FollowsValues], ids=["function", "class"])
def test_get_hparams_runs_on_both_tuners_with_the_same_results(ray_session, tmp_path, trainable):
    space = {"lr": tune.grid_search([MultiStep(0.5, [2], 0.1), MultiStep(0.5, [4], 0.2)])}

    def run(tuner_class, name):
        return tuner_class(
            trainable,
            param_space=space,
            run_config=tune.RunConfig(
                storage_path=str(tmp_path / name), stop={"training_iteration": EPOCHS}, verbose=0
            ),
        ).fit()

    ours, theirs = run(ray_stagetree.Tuner, "ours"), run(tune.Tuner, "tune")
    assert_ran(ours)
    assert not theirs.errors, [str(result.error) for result in theirs if result.error]
    assert ours.iterations_executed < 2 * EPOCHS  # followed live: no restart, the prefix shared
    assert losses(ours) == losses(theirs)
    lrs = sorted(result.metrics_dataframe["lr"].tolist() for result in theirs)
    assert lrs[0] == pytest.approx([0.5, 0.5, 0.05, 0.05, 0.05, 0.05])


def reads_lr_once(config):
    """Tune's shape: the learning rate read once, as a number, at the start."""
    lr, state = config["lr"], {"epoch": 0}
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        state = load_dict(checkpoint)
    while state["epoch"] < 4:
        state["epoch"] += 1
        tune.report({"lr": lr}, checkpoint=checkpoint_dict(state))


def test_a_held_value_changes_where_the_shared_prefix_ends(ray_session, tmp_path):
    """The trials diverge where their learning rates change: the trial whose
    batch continues live past the shared stage restarts there too, with its
    own value, as the one forked from the checkpoint does."""
    lrs = [MultiStep(0.5, [2], 0.5), MultiStep(0.5, [2], 0.1)]
    grid = ray_stagetree.Tuner(
        reads_lr_once,
        param_space={"lr": tune.grid_search(lrs)},
        run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0),
    ).fit()
    assert_ran(grid)
    seen = sorted(result.metrics_dataframe["lr"].tolist() for result in grid)
    assert seen == [[0.5, 0.5, 0.05, 0.05], [0.5, 0.5, 0.25, 0.25]]
