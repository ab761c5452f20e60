"""Any picklable value in ``param_space``, as Tune takes it: given directly,
in a grid or drawn by ``tune.sample_from``; it reaches the trainable,
``result.config`` and callbacks as the user's object; equal content shares,
a value without a stable fingerprint shares nothing; a study holding such
values restores; ``stagetree status``/``show``/``ls`` and the monitor read
its folder without unpickling anything."""

from __future__ import annotations

import argparse
import itertools
import json
import os
import subprocess
import sys
import tempfile
import time

import pyarrow.parquet as pq
from ray import tune
from ray.tune.schedulers import PopulationBasedTraining

from ray_stagetree import Concat, MultiStep, Tuner, get_hparams
from ray_stagetree.execution.storage import CheckpointStorage
from ray_stagetree.runtime.control.experiment_state import read_state

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
STAGETREE = os.path.join(os.path.dirname(sys.executable), "stagetree")


class Box:
    """A user's picklable object (a dataset handle, a model spec): compared by content."""

    def __init__(self, size):
        self.size = size

    def __eq__(self, other):
        return type(other) is Box and other.size == self.size

    def __repr__(self):
        return f"Box({self.size})"


class Clock:
    """A value whose pickle differs each time (its state holds a counter): no stable fingerprint."""

    ticks = itertools.count()

    def __getstate__(self):
        return {"tick": next(Clock.ticks)}


def observe(config):
    """Reports what it was given: each value's type and the values themselves."""
    for _ in range(3):
        tune.report(
            {
                "score": config["box"].size,
                "types": ",".join(f"{key}={type(value).__name__}" for key, value in sorted(config.items())),
                "marker_exists": config["path"].exists(),
                "args_smoke": config["args"].smoke_test,
            }
        )


class Recorder(tune.Callback):
    def __init__(self):
        self.configs = []

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.configs.append(trial.config)


def test_objects_reach_the_trainable_result_config_and_callbacks_as_given(tmp_path, ray_session):
    marker = tmp_path / "marker"
    marker.touch()
    args = argparse.Namespace(smoke_test=True, use_gpu=False)
    recorder = Recorder()
    space = {
        "path": marker,
        "pair": (None, marker),
        "args": args,
        "box": tune.grid_search([Box(1), Box(2)]),
        "drawn": tune.sample_from(lambda spec: Box(spec.config.box.size * 10)),
    }
    grid = Tuner(
        observe,
        param_space=space,
        tune_config=tune.TuneConfig(metric="score", mode="max"),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="objects", callbacks=[recorder], verbose=0),
    ).fit()
    assert grid.num_errors == 0, grid.errors
    for result in grid:
        config = result.config
        assert config["path"] == marker and type(config["path"]) is type(marker)
        assert config["pair"] == (None, marker) and type(config["pair"]) is tuple
        assert config["args"] == args and type(config["args"]) is argparse.Namespace
        assert config["drawn"] == Box(config["box"].size * 10)
        assert result.metrics["types"] == "args=Namespace,box=Box,drawn=Box,pair=tuple,path=PosixPath"
        assert result.metrics["marker_exists"] is True and result.metrics["args_smoke"] is True
    assert grid.get_best_result().config["box"] == Box(2)
    assert sorted(config["box"].size for config in recorder.configs) == [1, 2]
    assert all(type(config["path"]) is type(marker) for config in recorder.configs)


def descend(config):
    for _ in range(6):
        tune.report({"loss": get_hparams()["lr"]})


def shared_run(tmp_path, name, data):
    grid = Tuner(
        descend,
        param_space={"lr": tune.grid_search([MultiStep(0.1, [3], 0.1), MultiStep(0.1, [3], 0.5)]), "data": data},
        run_config=tune.RunConfig(storage_path=str(tmp_path), name=name, stop={"training_iteration": 6}, verbose=0),
    ).fit()
    assert grid.num_errors == 0, grid.errors
    return grid.unique_iterations, grid.trial_by_trial_iterations


def test_equal_objects_share_and_unequal_or_unfingerprintable_ones_do_not(tmp_path, ray_session):
    # both trials get a copy of an equal Box: their 3 iterations of lr 0.1 train once
    assert shared_run(tmp_path, "equal", Box(1)) == (9, 12)
    # a grid over unequal boxes: each lr with each box, and boxes never share
    assert shared_run(tmp_path, "unequal", tune.grid_search([Box(1), Box(2)])) == (18, 24)
    # a value whose pickle differs each time has no stable fingerprint: nothing is shared, all run
    assert shared_run(tmp_path, "unfingerprintable", Clock()) == (12, 12)
    # a lambda is fingerprinted by cloudpickle (by value): trials with it share
    assert shared_run(tmp_path, "lambda", lambda x: x) == (9, 12)


def pbt_trainable(config):
    state = {"x": 0.0}
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as path:
            with open(os.path.join(path, "state.json")) as file:
                state = json.load(file)
    assert config["marker"].name == "marker" and isinstance(config["clock"], Clock)
    while True:
        state["x"] += config["lr"]
        time.sleep(0.2)  # slow enough that the population reaches each perturbation together
        with tempfile.TemporaryDirectory() as path:
            with open(os.path.join(path, "state.json"), "w") as file:
                json.dump(state, file)
            tune.report({"x": state["x"]}, checkpoint=tune.Checkpoint.from_directory(path))


def test_pbt_result_config_holds_the_values_in_force_and_the_schedule_beside_it(tmp_path, ray_session):
    # Synchronous: it exploits whatever the timing (asynchronous PBT found nothing to compare once in the
    # full suite, when the loaded machine started the four trials' workers one after another).
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=2,
        hyperparam_mutations={"lr": tune.uniform(0.01, 1.0)},
        synch=True,
    )
    grid = Tuner(
        tune.with_resources(pbt_trainable, {"cpu": 0.5}),
        # a value without a fingerprint: the exploit's copy still forks from its source's checkpoint
        param_space={"lr": tune.grid_search([0.01, 0.1, 0.5, 0.9]), "marker": tmp_path / "marker", "clock": Clock()},
        tune_config=tune.TuneConfig(metric="x", mode="max", scheduler=pbt),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="pbt", stop={"training_iteration": 6}, verbose=0),
    ).fit()
    assert grid.num_errors == 0, grid.errors
    assert all(type(result.config["lr"]) is float for result in grid)  # as Tune shows it, not a schedule
    exploited = [result for result in grid if "config_schedule" in result.metrics]
    assert exploited, "PBT exploited no trial; the test would not cover the change of config"
    for result in exploited:
        schedule = result.metrics["config_schedule"]["lr"]
        assert isinstance(schedule, Concat) and result.config["lr"] == schedule.value(5)
        assert result.metrics["config_schedule"]["marker"] == tmp_path / "marker"
    assert grid.unique_iterations < grid.trial_by_trial_iterations, "exploits fork from their source's checkpoint"
    best = grid.get_best_result()
    assert type(best.config["lr"]) is float


def sometimes_failing(config):
    """Ray's restore tests' trainable: fails after its first result while the marker exists."""
    failing, _ = config["failing_hanging"]
    checkpoint = tune.get_checkpoint()
    it = 0
    if checkpoint:
        with checkpoint.as_directory() as path:
            with open(os.path.join(path, "it.json")) as file:
                it = json.load(file)
    for _ in range(2):
        it += 1
        with tempfile.TemporaryDirectory() as path:
            with open(os.path.join(path, "it.json"), "w") as file:
                json.dump(it, file)
            tune.report({"it": it}, checkpoint=tune.Checkpoint.from_directory(path))
        if failing is not None and failing.exists():
            raise RuntimeError("I am failing")


def test_a_study_with_objects_restores_and_continues(tmp_path, ray_session):
    marker = tmp_path / "fail_marker"
    marker.touch()
    tuner = Tuner(
        sometimes_failing,
        param_space={"failing_hanging": tune.grid_search([(None, None), (marker, None)])},
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="restore", verbose=0),
    )
    first = tuner.fit()
    assert first.num_errors == 1
    path = first.experiment_path
    assert (marker, None) in read_state(CheckpointStorage(path)).objects.values()  # the snapshot keeps the object
    marker.unlink()
    results = Tuner.restore(path, sometimes_failing, resume_errored=True).fit()
    assert results.num_errors == 0, results.errors
    assert sorted((r.config["failing_hanging"] for r in results), key=repr) == [(None, None), (marker, None)]
    assert all(type(r.config["failing_hanging"]) is tuple for r in results)


def test_ray_mnist_trainable_pattern_with_a_namespace_in_the_config(tmp_path, ray_session):
    """Ray's mnist_pytorch_trainable.py puts its argparse.Namespace in the config of a class trainable."""
    args = argparse.Namespace(smoke_test=True, use_gpu=False, ray_address=None)
    grid = Tuner(
        NamespaceTrainable,
        param_space={"args": args, "lr": tune.uniform(0.001, 0.1), "momentum": tune.uniform(0.1, 0.9)},
        tune_config=tune.TuneConfig(metric="mean_accuracy", mode="max", num_samples=2),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path),
            name="mnist_pattern",
            stop={"mean_accuracy": 0.95, "training_iteration": 3},
            checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True, checkpoint_frequency=3),
            verbose=0,
        ),
    ).fit()
    assert grid.num_errors == 0, grid.errors
    best = grid.get_best_result().config
    assert best["args"] == args and isinstance(best["lr"], float)


class NamespaceTrainable(tune.Trainable):
    def setup(self, config):
        self.smoke = config["args"].smoke_test
        self.lr = config.get("lr", 0.01)
        self.accuracy = 0.0

    def step(self):
        self.accuracy += self.lr
        return {"mean_accuracy": self.accuracy, "smoke": self.smoke}

    def save_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "state.json"), "w") as file:
            json.dump(self.accuracy, file)

    def load_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "state.json")) as file:
            self.accuracy = json.load(file)


INSPECT = """
import sys
from ray_stagetree.monitor.view import ExperimentReader, study_state
state = study_state(ExperimentReader(sys.argv[1]), metric="score", mode="max")
print(len(state["trials"]), len(state["stages"]))
"""


def test_listing_commands_and_the_monitor_read_the_folder_without_unpickling(tmp_path, ray_session):
    grid = Tuner(
        observe,
        param_space={
            "path": tmp_path,
            "pair": (None, tmp_path),
            "args": argparse.Namespace(smoke_test=False),
            "box": tune.grid_search([Box(1), Box(2)]),
            "drawn": 0,
        },
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="listed", verbose=0),
    ).fit()
    assert grid.num_errors == 0, grid.errors
    path = grid.experiment_path
    # the plan's tables: pyarrow alone reads them, the objects described
    rows = pq.read_table(os.path.join(path, "plan", "trials.parquet")).to_pylist()
    stored = [json.loads(row["config"]) for row in rows]
    assert sorted(config["box"]["__pickled__"]["repr"] for config in stored) == ["Box(1)", "Box(2)"]
    assert {config["args"]["__pickled__"]["type"] for config in stored} == {"argparse.Namespace"}
    # Box's module is not importable here: anything unpickling a Box fails
    environment = dict(os.environ, PYTHONPATH=ROOT)
    for command in (["status", path], ["show", path], ["ls", str(tmp_path)]):
        ran = subprocess.run([STAGETREE, *command], capture_output=True, text=True, env=environment, timeout=120)
        assert ran.returncode == 0, (command, ran.stdout, ran.stderr)
        assert "Error" not in ran.stderr, ran.stderr
    shown = subprocess.run([STAGETREE, "show", path], capture_output=True, text=True, env=environment, timeout=120)
    assert "Box(1)" in shown.stdout and "Box(2)" in shown.stdout
    inspected = subprocess.run(
        [sys.executable, "-c", INSPECT, path], capture_output=True, text=True, env=environment, timeout=120
    )
    assert inspected.returncode == 0, inspected.stderr
    assert inspected.stdout.split()[0] == "2"
