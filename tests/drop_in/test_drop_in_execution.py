"""Tune scripts run unchanged. Finite loops, open-ended trials and
Tune's stop criteria, ``ray.tune.Trainable`` classes, GPUs for class
trainables, and live continuation: never more iterations executed than the
trials report, with or without checkpoints."""

from __future__ import annotations

import json
import os
import random
import tempfile

import pytest
from ray import tune
from ray.tune.error import TuneError
from ray.tune.schedulers import (
    ASHAScheduler,
    FIFOScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    PopulationBasedTraining,
)
from ray.tune.stopper import CombinedStopper, MaximumIterationStopper, TrialPlateauStopper

from ray_stagetree import MultiStep, Tuner, get_hparams
from ray_stagetree.trainables import StageTrainable


def restored_x():
    """The ``x`` of the checkpoint the trial resumes from, or 0."""
    checkpoint = tune.get_checkpoint()
    if not checkpoint:
        return 0.0
    with checkpoint.as_directory() as path, open(os.path.join(path, "x.json")) as file:
        return json.load(file)


def report_with_checkpoint(metrics):
    """``tune.report`` with a checkpoint holding ``metrics["x"]``."""
    with tempfile.TemporaryDirectory() as path:
        with open(os.path.join(path, "x.json"), "w") as file:
            json.dump(metrics["x"], file)
        tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(path))


def counting_loop(config):
    """A finite loop, as Tune's hyperband_function example: no checkpoint,
    or (``config["checkpoint"]``) one at every iteration."""
    x = 0.0
    for _ in range(config.get("steps", 10**9)):
        x += get_hparams()["lr"]
        if config.get("checkpoint"):
            report_with_checkpoint({"x": x})
        else:
            tune.report({"x": x})


def checkpointing_loop(config):
    """An endless loop that checkpoints where asked and resumes from it."""
    from ray_stagetree import should_checkpoint

    x = restored_x()
    while True:
        x += get_hparams()["lr"]
        if should_checkpoint():
            report_with_checkpoint({"x": x})
        else:
            tune.report({"x": x})


#: What Tune adds to every result of a function trainable.
TUNE_AUTO_KEYS = {
    "training_iteration",
    "time_this_iter_s",
    "time_total_s",
    "timestamp",
    "date",
    "pid",
    "hostname",
    "node_ip",
    "time_since_restore",
    "iterations_since_restore",
    "trial_id",
    "done",
    "config",
}


def reported(grid) -> int:
    return sum(len(result.metrics_dataframe) for result in grid if result.metrics_dataframe is not None)


@pytest.mark.parametrize(
    "stop, lengths",
    [
        (None, [4, 8, 12]),  # no stop: the function's own loop ends each trial
        ({"x": 1.0}, [4, 4, 4]),  # a metric threshold
        (lambda trial_id, result: result["x"] >= 1.0, [4, 4, 4]),  # a stop function
        (CombinedStopper(MaximumIterationStopper(6), TrialPlateauStopper("x", num_results=100)), [4, 6, 6]),
        ({"done": True}, [4, 8, 12]),
    ],
    ids=["none", "threshold", "function", "stopper", "done"],
)
def test_open_ended_trials_end_where_tune_ends_them(tmp_path, ray_session, stop, lengths):
    grid = Tuner(
        counting_loop,
        param_space={"lr": 0.25, "steps": tune.grid_search([4, 8, 12]), "checkpoint": True},
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="open", stop=stop, verbose=0),
    ).fit()
    assert grid.num_errors == 0
    assert sorted(len(result.metrics_dataframe) for result in grid) == lengths
    assert grid.iterations_executed == reported(grid) == sum(lengths)
    for result in grid:  # as in Tune: the last checkpoint reported, and Tune's auto-filled keys
        folders = sorted(entry for entry in os.listdir(result.path) if entry.startswith("checkpoint_"))
        assert result.checkpoint is not None and result.checkpoint.path == os.path.join(result.path, folders[-1])
        with open(os.path.join(result.checkpoint.path, "x.json")) as file:
            assert json.load(file) == result.metrics["x"]
        assert TUNE_AUTO_KEYS <= set(result.metrics), TUNE_AUTO_KEYS - set(result.metrics)
        assert result.metrics["iterations_since_restore"] == result.metrics["training_iteration"]


def test_a_stoppers_stop_all_ends_the_study(tmp_path, ray_session):
    class StopAllAtThree(tune.Stopper):
        def __init__(self):
            self.seen = 0

        def __call__(self, trial_id, result):
            self.seen += 1
            return False

        def stop_all(self):
            return self.seen >= 3

    grid = Tuner(
        counting_loop,
        param_space={"lr": tune.grid_search([0.1, 0.2])},
        tune_config=tune.TuneConfig(max_concurrent_trials=1),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="all", stop=StopAllAtThree(), verbose=0),
    ).fit()
    assert grid.num_errors == 0
    assert reported(grid) == 3, "the study ended at the third result"


def test_a_stop_function_that_raises_ends_fit_as_tunes_does(tmp_path, ray_session):
    """An error raised handling a result (a stop function's, here one taking
    Tune's arguments wrong) ends fit() as a TuneError with its traceback, as
    Tune's loop raises it (it was Ray's RayTaskError around the TypeError)."""

    def stop(result):  # Tune calls stop(trial_id, result)
        return result["x"] > 1

    tuner = Tuner(
        counting_loop,
        param_space={"lr": 0.5},
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="stop_fn", stop=stop, verbose=0),
    )
    with pytest.raises(TuneError, match=r"TypeError: .*stop\(\) takes 1 positional argument") as raised:
        tuner.fit()
    assert type(raised.value) is TuneError


class TuneStyleTrainable(tune.Trainable):
    """A plain ray.tune.Trainable: dict checkpoints, reset_config, the
    attributes Tune gives it; it reads sequence values with get_hparams()."""

    def setup(self, config):
        self.x = 0.0
        self.resets = 0

    def step(self):
        self.x += get_hparams()["lr"]
        return {"x": self.x, "iteration_seen": self.iteration, "trial_seen": self.trial_id}

    def save_checkpoint(self, checkpoint_dir):
        return {"x": self.x}

    def load_checkpoint(self, checkpoint):
        self.x = checkpoint["x"]

    def reset_config(self, new_config):
        self.resets += 1
        return True


def test_tune_trainable_subclasses_run_unchanged_and_share_prefixes(tmp_path, ray_session):
    grid = Tuner(
        TuneStyleTrainable,
        param_space={"lr": tune.grid_search([MultiStep(1.0, [3], 0.5), MultiStep(1.0, [5], 0.5)])},
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="cls", stop={"training_iteration": 8}, verbose=0),
    ).fit()
    assert grid.num_errors == 0
    by_milestone = {r.config["lr"].milestones[0]: r for r in grid}
    assert by_milestone[3].metrics["x"] == pytest.approx(3 + 5 * 0.5)
    assert by_milestone[5].metrics["x"] == pytest.approx(5 + 3 * 0.5)
    assert grid.iterations_executed == 13, "the 3 shared iterations ran once"
    frame = by_milestone[5].metrics_dataframe
    assert frame["iteration_seen"].tolist() == list(range(8)), "self.iteration counts through the fork"
    assert set(frame["trial_seen"]) <= {r.metrics["trial_id"] for r in grid}
    # A Tune Trainable's bookkeeping comes through, as under Tune.
    assert {"time_this_iter_s", "time_total_s", "date"} <= set(frame.columns)


class LoadsDataInSetup(TuneStyleTrainable):
    """Tune's reason for ``reuse_actors``: ``setup`` loads data (each load is
    a line in a file here); ``reset_config`` takes a new trial without it."""

    def setup(self, config):
        super().setup(config)
        with open(config["loads"], "a") as file:
            file.write(f"{os.getpid()}\n")

    def reset_config(self, new_config):
        self.x = 0.0  # a new trial's state; a stage's starting checkpoint is restored after it
        return super().reset_config(new_config)


@pytest.mark.parametrize("reuse_actors", [False, True])
def test_reuse_actors_hands_a_workers_object_to_its_next_batch_through_reset_config(
    tmp_path, ray_session, reuse_actors
):
    """As Tune reuses an actor for the next trial (``reset`` then the
    checkpoint restored), a worker keeps a class trainable's object for its
    next batch: ``setup`` runs once per worker, not once per stage batch,
    and the results are those of new objects."""
    loads = tmp_path / "loads"
    lrs = [MultiStep(1.0, [3], 0.5), MultiStep(1.0, [5], 0.5), MultiStep(1.0, [3], 0.25)]
    grid = Tuner(
        LoadsDataInSetup,
        param_space={"lr": tune.grid_search(lrs), "loads": str(loads)},
        tune_config=tune.TuneConfig(reuse_actors=reuse_actors),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="reuse", stop={"training_iteration": 8}, verbose=0),
    ).fit()
    assert grid.num_errors == 0
    found = sorted((r.config["lr"].milestones[0], r.config["lr"].gamma, r.metrics["x"]) for r in grid)
    assert found == [(3, 0.25, 3 + 5 * 0.25), (3, 0.5, 3 + 5 * 0.5), (5, 0.5, 5 + 3 * 0.5)]
    workers = set(loads.read_text().split())
    setups = len(loads.read_text().split())
    if reuse_actors:
        assert setups == len(workers) <= 2, "one setup per worker: the later batches reset its object"
    else:
        assert setups >= 3 > len(workers) - 1, "a new object per stage batch: the shared stage and each fork"


class ReadsItsConfig(LoadsDataInSetup):
    def step(self):
        self.x += self.config["lr"]  # a number, as a Tune trainable reads it
        return {"x": self.x}


@pytest.mark.parametrize("reuse_actors", [False, True])
def test_a_reset_config_that_resets_state_keeps_a_trials_state_where_its_config_changes(
    tmp_path, ray_session, reuse_actors
):
    """Where a value the object reads from ``self.config`` changes (a
    sequence's milestone), it gets the new config through ``reset_config``
    and its state back from the checkpoint saved there, as Tune resets then
    restores an actor: a ``reset_config`` that starts a new trial's state
    (as ``reuse_actors`` asks of it) loses nothing. (Before, x restarted
    from 0 at the milestone: 2.5 where it is 5.5.)"""
    grid = Tuner(
        ReadsItsConfig,
        param_space={
            "lr": tune.grid_search([MultiStep(1.0, [3], 0.5), MultiStep(1.0, [5], 0.5)]),
            "loads": "/dev/null",
        },
        tune_config=tune.TuneConfig(reuse_actors=reuse_actors),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="reads", stop={"training_iteration": 8}, verbose=0),
    ).fit()
    assert grid.num_errors == 0
    assert sorted(r.metrics["x"] for r in grid) == [3 + 5 * 0.5, 5 + 3 * 0.5]


def test_a_tune_trainable_under_pbt_gets_plain_values_through_reset_config(tmp_path, ray_session):
    class PlainLr(TuneStyleTrainable):
        def step(self):
            import time

            time.sleep(0.2)  # the population reaches each perturbation together
            self.x += self.config["lr"]
            return {"x": self.x, "lr_type": type(self.config["lr"]).__name__, "resets": self.resets}

    pbt = PopulationBasedTraining(  # synchronous: it exploits whatever the timing (a loaded machine's)
        time_attr="training_iteration",
        perturbation_interval=2,
        hyperparam_mutations={"lr": tune.uniform(0.01, 1.0)},
        synch=True,
    )
    grid = Tuner(
        tune.with_resources(PlainLr, {"cpu": 0.5}),
        param_space={"lr": tune.grid_search([0.01, 0.1, 0.5, 0.9])},
        tune_config=tune.TuneConfig(metric="x", mode="max", scheduler=pbt),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="pbt", stop={"training_iteration": 8}, verbose=0),
    ).fit()
    assert grid.num_errors == 0
    assert {t for r in grid for t in r.metrics_dataframe["lr_type"]} == {"float"}
    # result.config holds the values in force, as Tune's; an exploited trial's schedule is beside it
    assert all(isinstance(r.config["lr"], float) for r in grid)
    assert any("config_schedule" in r.metrics for r in grid), "PBT exploited no trial"


class GpuTrainable(StageTrainable):
    def step(self):
        return {
            "devices": os.environ.get("CUDA_VISIBLE_DEVICES", ""),
            "resources": self.trial_resources.required_resources,  # Tune's Trainable.trial_resources
        }

    def get_state(self):
        return {}

    def set_state(self, state):
        pass


@pytest.mark.parametrize("wrap", ["with_resources", "default_resource_request"])
def test_a_class_trainable_gets_its_gpu(tmp_path, ray_session, wrap):
    if wrap == "with_resources":
        trainable = tune.with_resources(GpuTrainable, {"cpu": 1, "gpu": 1})
    else:

        class trainable(GpuTrainable):  # noqa: N801 - Tune's own idiom
            @classmethod
            def default_resource_request(cls, config):
                return tune.PlacementGroupFactory([{"CPU": 1, "GPU": 1}])

    grid = Tuner(
        trainable,
        param_space={"lr": tune.grid_search([0.1, 0.2])},
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="gpu", stop={"training_iteration": 2}, verbose=0),
    ).fit()
    assert grid.num_errors == 0
    assert all(row not in ("", None) for r in grid for row in r.metrics_dataframe["devices"])
    assert all(r.metrics["resources"] == {"CPU": 1.0, "GPU": 1.0} for r in grid)


def test_the_missing_checkpoint_warning_is_shown_once_per_study(tmp_path, ray_session, caplog):
    with caplog.at_level("WARNING", logger="ray_stagetree"):
        Tuner(
            counting_loop,
            param_space={"lr": tune.grid_search([MultiStep(0.1, [m], 0.5) for m in (2, 3, 4)])},
            run_config=tune.RunConfig(
                storage_path=str(tmp_path), name="warn", stop={"training_iteration": 6}, verbose=0
            ),
        ).fit()
    warnings = [record.message for record in caplog.records if "needs a checkpoint" in record.message]
    assert len(warnings) == 1, warnings
    assert "train it again" in warnings[0]


def test_pbt_twins_are_members_of_their_own(tmp_path, ray_session):
    """Tune's PBT examples start the population from one constant config
    (Ray's pb2_example): under Tune the trainable's own randomness sets the
    members apart, so each trains its start on its own here too, and the
    population is as large as num_samples."""
    grid = Tuner(
        counting_loop,
        param_space={"lr": 0.1, "checkpoint": True},
        tune_config=tune.TuneConfig(
            metric="x",
            mode="max",
            num_samples=3,
            scheduler=PopulationBasedTraining(perturbation_interval=2, hyperparam_mutations={"lr": [0.1, 0.2]}),
        ),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="twins", stop={"training_iteration": 4}, verbose=0),
    ).fit()
    assert grid.num_errors == 0
    assert grid.iterations_executed >= 3 * 2, "each member trained its start up to the first perturbation"


def test_a_trial_joining_a_long_trajectory_takes_its_results_without_retraining(tmp_path, ray_session):
    """The second of two identical trials starts when the first has ended
    (one at a time): it takes the plan's 400 results of their shared
    trajectory, deciding at each (a metric stop criterion makes every
    iteration a decision point), without training any of them again."""
    grid = Tuner(
        counting_loop,
        param_space={"lr": 0.5},
        tune_config=tune.TuneConfig(metric="x", mode="max", num_samples=2, max_concurrent_trials=1),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path), name="late", stop={"training_iteration": 400, "x": 1e9}, verbose=0
        ),
    ).fit()
    assert grid.num_errors == 0, [result.error for result in grid]
    assert [len(result.metrics_dataframe) for result in grid] == [400, 400]
    assert grid[0].metrics_dataframe["x"].tolist() == grid[1].metrics_dataframe["x"].tolist()
    assert grid.iterations_executed == 400


class FailingScheduler(FIFOScheduler):
    """A user's scheduler with a bug at a trial's third result."""

    def on_trial_result(self, tune_controller, trial, result):
        if result["training_iteration"] == 3:
            raise ValueError("the scheduler's own bug")
        return super().on_trial_result(tune_controller, trial, result)


def test_a_schedulers_own_error_stops_the_study_with_it(tmp_path, ray_session):
    """As Tune's fit() raises it (it was a baffling "no batch can be
    dispatched", the scheduler's error only in a worker's log)."""
    tuner = Tuner(
        counting_loop,
        param_space={"lr": tune.grid_search([0.1, 0.2])},
        tune_config=tune.TuneConfig(metric="x", mode="max", scheduler=FailingScheduler()),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="buggy", stop={"training_iteration": 10}, verbose=0),
    )
    with pytest.raises(TuneError, match="ValueError: the scheduler.s own bug"):  # as Tune raises it
        tuner.fit()


def noisy_loop(config):
    """Progress drawn from Python's global generator (as Ray's pbt_function),
    resumed from the checkpoint of every iteration."""
    x = restored_x()
    while True:
        draw = random.random()
        x += config["lr"] * draw
        report_with_checkpoint({"x": x, "draw": draw})


class NoisyTrainable(tune.Trainable):
    """`noisy_loop` as a class that takes PBT's values live (reset_config)."""

    def setup(self, config):
        self.lr, self.x = config["lr"], 0.0

    def step(self):
        draw = random.random()
        self.x += self.lr * draw
        return {"x": self.x, "draw": draw}

    def save_checkpoint(self, checkpoint_dir):
        return {"x": self.x}

    def load_checkpoint(self, checkpoint):
        self.x = checkpoint["x"]

    def reset_config(self, new_config):
        self.lr = new_config["lr"]
        return True


@pytest.mark.parametrize("trainable", [noisy_loop, NoisyTrainable], ids=["function", "class"])
def test_a_pbt_clone_draws_random_numbers_of_its_own_after_its_fork(tmp_path, ray_session, trainable):
    """Under Tune a clone goes on with its own process's generators; here it
    forks from its source's checkpoint, random state included, and with the
    source's state it would draw the very numbers its source draws after the
    fork (a population driven by noise stops exploring). Two trials with
    different learning rates, so every exploit sets the clone apart from its
    source: no two trials draw the same number at an iteration."""
    grid = Tuner(
        trainable,
        param_space={"lr": tune.grid_search([0.1, 0.4])},
        tune_config=tune.TuneConfig(
            metric="x",
            mode="max",
            scheduler=PopulationBasedTraining(
                time_attr="training_iteration",
                perturbation_interval=2,
                quantile_fraction=0.5,
                hyperparam_mutations={"lr": tune.uniform(0.1, 0.5)},
                synch=True,  # the two trials meet at every perturbation point, however late the second starts
            ),
        ),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path),
            name="clones",
            stop={"training_iteration": 8},
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1 if trainable is NoisyTrainable else 0),
            verbose=0,
        ),
    ).fit()
    assert grid.num_errors == 0
    assert any("config_schedule" in result.metrics for result in grid), "the weaker trial exploited the stronger"
    draws = {}
    for result in grid:
        frame = result.metrics_dataframe.drop_duplicates("training_iteration", keep="last")
        for iteration, draw in zip(frame["training_iteration"], frame["draw"]):
            draws.setdefault((iteration, draw), []).append(result.metrics["trial_id"])
    assert not [(point, trials) for point, trials in draws.items() if len(trials) > 1]


def test_no_missing_checkpoint_warning_where_nothing_forks(tmp_path, ray_session, caplog):
    """Tune's searcher examples (ASHA, no checkpoint, nothing shared) lose
    nothing without checkpoints: no warning."""
    with caplog.at_level("WARNING", logger="ray_stagetree"):
        grid = Tuner(
            counting_loop,
            param_space={"lr": tune.grid_search([0.1, 0.2, 0.3, 0.4])},
            tune_config=tune.TuneConfig(
                metric="x", mode="max", scheduler=ASHAScheduler(max_t=8, grace_period=1, reduction_factor=2)
            ),
            run_config=tune.RunConfig(
                storage_path=str(tmp_path), name="quiet", stop={"training_iteration": 8}, verbose=0
            ),
        ).fit()
    assert grid.num_errors == 0
    assert not [record.message for record in caplog.records if "needs a checkpoint" in record.message]


SCHEDULERS = {
    "fifo": lambda: FIFOScheduler(),
    "asha": lambda: ASHAScheduler(max_t=12, grace_period=1, reduction_factor=2),
    "hyperband": lambda: HyperBandScheduler(max_t=12, reduction_factor=2),
    "median": lambda: MedianStoppingRule(grace_period=2, min_samples_required=2),
    "pbt": lambda: PopulationBasedTraining(
        time_attr="training_iteration", perturbation_interval=3, hyperparam_mutations={"noise": [0.0, 0.5]}
    ),
}


# Synchronous HyperBand resumes a paused trial from its checkpoint, or, when
# its trainable keeps none, where that trainable waits parked. (PBT, as Ray's,
# never clones a trial that has no checkpoint.)
INVARIANT_CASES = [
    (scheduler, trainable) for scheduler in sorted(SCHEDULERS) for trainable in ("counting_loop", "checkpointing_loop")
]


@pytest.mark.parametrize("scheduler_name, trainable_name", INVARIANT_CASES)
def test_never_more_iterations_executed_than_reported(tmp_path, ray_session, scheduler_name, trainable_name):
    """The invariant of live continuation, over schedulers, trainables that
    checkpoint or not, and random sequence spaces."""
    rng = random.Random(f"{scheduler_name}-{trainable_name}")
    milestones = rng.sample(range(1, 12), 4)
    space = {"lr": tune.grid_search([MultiStep(1.0, [m], rng.choice([0.5, 0.9])) for m in milestones]), "noise": 0.0}
    grid = Tuner(
        globals()[trainable_name],
        param_space=space,
        tune_config=tune.TuneConfig(metric="x", mode="max", scheduler=SCHEDULERS[scheduler_name]()),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="inv", stop={"training_iteration": 12}, verbose=0),
    ).fit()
    assert grid.num_errors == 0, [str(r.error) for r in grid if r.error]
    assert grid.iterations_executed <= reported(grid)


def marking_loop(config):
    """`counting_loop` that leaves a file in ``config["marks"]`` each time it starts."""
    with open(os.path.join(config["marks"], f"{config['lr']}-{os.urandom(4).hex()}"), "w"):
        pass
    counting_loop(config)


def test_a_trial_paused_without_a_checkpoint_goes_on_in_its_live_trainable(tmp_path, ray_session):
    """Synchronous HyperBand pauses trials at each rung until their bracket
    gets there. A trainable that keeps no checkpoint waits parked on its
    worker meanwhile: each trial's function starts once, nothing retrains,
    and a trial resumed there reports what an unpaused one would."""
    marks = tmp_path / "marks"
    marks.mkdir()
    rates = [0.1 * (i + 1) for i in range(8)]  # one bracket of 8 trials on 2 workers
    grid = Tuner(
        marking_loop,
        param_space={"lr": tune.grid_search(rates), "marks": str(marks)},
        tune_config=tune.TuneConfig(metric="x", mode="max", scheduler=HyperBandScheduler(max_t=8, reduction_factor=2)),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="parked", stop={"training_iteration": 8}, verbose=0),
    ).fit()
    assert grid.num_errors == 0
    assert grid.iterations_executed == reported(grid)
    starts = sorted(float(name.split("-")[0]) for name in os.listdir(marks))
    assert starts == pytest.approx(rates)
    for result in grid:
        history = result.metrics_dataframe
        assert history["x"].tolist() == pytest.approx([result.config["lr"] * k for k in history["training_iteration"]])
    assert max(len(result.metrics_dataframe) for result in grid) == 8  # someone was resumed to the end


def odd_checkpointing_loop(config):
    """Reports a checkpoint (holding its iteration) at odd iterations only."""
    iteration = 0
    while True:
        iteration += 1
        if iteration % 2 == 0:
            tune.report({"x": config["lr"] * iteration})
            continue
        with tempfile.TemporaryDirectory() as path:
            with open(os.path.join(path, "iteration.json"), "w") as file:
                json.dump(iteration, file)
            tune.report({"x": config["lr"] * iteration}, checkpoint=tune.Checkpoint.from_directory(path))


def test_a_trial_that_ends_parked_keeps_its_latest_reported_checkpoint(tmp_path, ray_session):
    """Trials paused at an even rung wait parked (no checkpoint there); those
    their bracket then stops end parked. As under Tune, each one's
    `Result.checkpoint` is the latest it reported, also where the plan had
    not asked for it (iteration 3 of a trial stopped at rung 4)."""
    grid = Tuner(
        odd_checkpointing_loop,
        param_space={"lr": tune.grid_search([0.1 * (i + 1) for i in range(8)])},
        tune_config=tune.TuneConfig(metric="x", mode="max", scheduler=HyperBandScheduler(max_t=8, reduction_factor=2)),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path), name="ends_parked", stop={"training_iteration": 8}, verbose=0
        ),
    ).fit()
    assert grid.num_errors == 0
    assert grid.iterations_executed == reported(grid), "a resumed trial goes on in its parked trainable"
    saved = {}
    for result in grid:
        with result.checkpoint.as_directory() as path, open(os.path.join(path, "iteration.json")) as file:
            saved[result.metrics["training_iteration"]] = json.load(file)
    assert 4 in saved, "a trial stopped at rung 4"
    assert saved == {last: last - 1 + last % 2 for last in saved}


def test_a_searcher_under_asha_without_checkpoints_executes_only_what_it_reports(tmp_path, ray_session):
    pytest.importorskip("optuna")
    from ray.tune.search.optuna import OptunaSearch

    grid = Tuner(
        counting_loop,
        param_space={"lr": tune.uniform(0.0, 1.0), "steps": 10},
        tune_config=tune.TuneConfig(
            num_samples=6,
            scheduler=ASHAScheduler(metric="x", mode="max", max_t=10, grace_period=1),
            search_alg=OptunaSearch(metric="x", mode="max"),  # metric and mode given to them only
        ),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="optuna", verbose=0),
    ).fit()
    assert grid.num_errors == 0 and len(grid) == 6
    assert grid.iterations_executed == reported(grid)


def test_stop_criteria_become_a_horizon_thresholds_or_a_stopper():
    """Ray-free: how RunConfig.stop is read before anything runs."""

    def run_config(stop):
        return tune.RunConfig(stop=stop)

    plain = Tuner(counting_loop, param_space={"lr": 0.1}, run_config=run_config({"training_iteration": 5, "x": 2}))
    assert (plain.horizon, plain.stop_thresholds, plain.stopper) == (5, {"x": 2}, None)
    capped = Tuner(counting_loop, param_space={"lr": 0.1}, run_config=run_config(MaximumIterationStopper(7)))
    assert (capped.horizon, capped.stopper) == (7, None), "a plain iteration cap plans like training_iteration"
    open_ended = Tuner(counting_loop, param_space={"lr": 0.1})
    assert (open_ended.horizon, open_ended.stopper) == (None, None)
    asha = Tuner(
        counting_loop,
        param_space={"lr": 0.1},
        tune_config=tune.TuneConfig(scheduler=ASHAScheduler(max_t=9), metric="x", mode="max"),
    )
    assert asha.horizon == 9
    function = Tuner(counting_loop, param_space={"lr": 0.1}, run_config=run_config(lambda trial_id, result: False))
    assert function.horizon is None and function.stopper is not None
    for bad, message in (
        (5, "RunConfig.stop must be None, a dict"),
        ({"x": "high"}, r"RunConfig.stop\['x'\] must be a number"),
    ):
        with pytest.raises(ValueError, match=message):
            Tuner(counting_loop, param_space={"lr": 0.1}, run_config=run_config(bad))
    with pytest.raises(ValueError, match=r"stop\['training_iteration'\] must be an int >= 1, got 0"):
        Tuner(counting_loop, param_space={"lr": 0.1}, run_config=run_config({"training_iteration": 0}))


def test_tunes_get_context_names_the_trial_and_gives_a_folder(tmp_path, ray_session):
    def train(config):
        context = tune.get_context()
        with open(os.path.join(context.get_trial_dir(), "note.txt"), "w") as file:
            file.write("written by the trial")
        for _ in range(2):
            tune.report({"trial": context.get_trial_id(), "experiment": context.get_experiment_name()})

    grid = Tuner(
        train,
        param_space={"lr": tune.grid_search([0.1, 0.2])},
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="ctx", verbose=0),
    ).fit()
    assert grid.num_errors == 0
    for result in grid:
        assert result.metrics["trial"] == result.metrics["trial_id"]
        assert result.metrics["experiment"] == "ctx"
        assert os.path.exists(os.path.join(result.path, "note.txt"))
