"""Tune's schedulers and searchers driving studies of sequences, end to end."""

import json
import os
import tempfile
import time

import pytest
from ray import tune
from ray.tune.schedulers import ASHAScheduler

from ray_stagetree import Concat, Exponential, MultiStep, Step, Tuner, get_hparams

HORIZON = 8


def tune_docs_trainable(config):
    """Written the way Ray Tune's docs write a function trainable."""
    descend(config, lambda: config["lr"])


def sequence_trainable(config):
    """The same, reading the learning rate of this iteration from a sequence."""
    descend(config, lambda: get_hparams()["lr"])


def descend(config, learning_rate):
    step, loss = 0, 10.0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as path:
            with open(os.path.join(path, "state.txt")) as file:
                step, loss = int(file.readline()), float(file.readline())
    while True:
        loss = loss * (1 - learning_rate()) + config["noise"]
        time.sleep(config.get("sleep", 0))
        step += 1
        if step % config.get("checkpoint_every", 1):
            tune.report({"loss": loss})
            continue
        with tempfile.TemporaryDirectory() as path:
            with open(os.path.join(path, "state.txt"), "w") as file:
                file.write(f"{step}\n{loss}\n")
            tune.report({"loss": loss}, checkpoint=tune.Checkpoint.from_directory(path))


def test_asha_study_written_for_tune_runs_with_the_import_changed(tmp_path, ray_session):
    tuner = Tuner(  # the only change: `from ray_stagetree import Tuner`
        tune_docs_trainable,
        # best first: ASHA compares a trial with those that reached its rung before it
        param_space={"lr": tune.grid_search([0.5, 0.4, 0.3, 0.2, 0.1, 0.05]), "noise": 0.01},
        tune_config=tune.TuneConfig(
            metric="loss", mode="min", scheduler=ASHAScheduler(max_t=HORIZON, grace_period=1, reduction_factor=2)
        ),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="asha", verbose=0),
    )
    grid = tuner.fit()
    assert grid.num_errors == 0 and len(grid) == 6
    lengths = sorted(len(r.metrics_dataframe) for r in grid)
    assert lengths[0] < HORIZON and lengths[-1] == HORIZON, "ASHA stopped some trials early"
    # requests stop at rungs: nothing is trained past the point a trial stopped
    assert grid.iterations_executed == sum(lengths)
    assert grid.get_best_result().config["lr"] == 0.5


def test_asha_on_shared_sequences_trains_shared_prefixes_once(tmp_path, ray_session):
    lrs = [MultiStep(0.3, [m], g) for m in (2, 4, 6) for g in (0.5, 0.1)]
    grid = Tuner(
        sequence_trainable,
        param_space={"lr": tune.grid_search(lrs), "noise": 0.01},
        tune_config=tune.TuneConfig(
            metric="loss", mode="min", scheduler=ASHAScheduler(max_t=HORIZON, grace_period=2, reduction_factor=2)
        ),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="asha_shared", verbose=0),
    ).fit()
    assert grid.num_errors == 0
    trial_by_trial = sum(len(r.metrics_dataframe) for r in grid)
    assert grid.iterations_executed < trial_by_trial


@pytest.mark.parametrize("searcher_name", ["optuna", "hyperopt"])
def test_model_based_searchers_tune_sequence_parameters(tmp_path, ray_session, searcher_name):
    if searcher_name == "optuna":
        pytest.importorskip("optuna")
        from ray.tune.search.optuna import OptunaSearch as Search
    else:
        pytest.importorskip("hyperopt")
        from ray.tune.search.hyperopt import HyperOptSearch as Search
    space = {
        "lr": Exponential(tune.uniform(0.05, 0.5), tune.choice([0.8, 0.95])),
        "noise": 0.01,
    }
    grid = Tuner(
        sequence_trainable,
        param_space=space,
        tune_config=tune.TuneConfig(
            metric="loss", mode="min", search_alg=Search(), num_samples=6, max_concurrent_trials=2
        ),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path), name=searcher_name, stop={"training_iteration": 4}, verbose=0
        ),
    ).fit()
    assert len(grid) == 6 and grid.num_errors == 0
    for result in grid:
        lr = result.config["lr"]
        assert isinstance(lr, Exponential) and 0.05 <= lr.init <= 0.5 and lr.gamma in (0.8, 0.95)
        assert len(result.metrics_dataframe) == 4


def test_synchronous_hyperband_study_pauses_and_promotes(tmp_path, ray_session):
    from ray.tune.schedulers import HyperBandScheduler

    grid = Tuner(
        tune_docs_trainable,
        param_space={"lr": tune.grid_search([0.05 * k for k in range(9, 0, -1)]), "noise": 0.01},
        tune_config=tune.TuneConfig(
            metric="loss", mode="min", scheduler=HyperBandScheduler(max_t=9, reduction_factor=3)
        ),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="hyperband", verbose=0),
    ).fit()
    assert grid.num_errors == 0 and len(grid) == 9
    lengths = sorted(len(r.metrics_dataframe) for r in grid)
    assert lengths[0] < 9 and lengths[-1] == 9
    assert grid.iterations_executed == sum(lengths), "no iteration past a trial's last decision"


def test_searcher_wrappers_limit_concurrency_and_repeat(tmp_path, ray_session):
    pytest.importorskip("optuna")
    from ray.tune.search import ConcurrencyLimiter, Repeater
    from ray.tune.search.optuna import OptunaSearch

    searcher = ConcurrencyLimiter(Repeater(OptunaSearch(), repeat=2), max_concurrent=2)
    grid = Tuner(
        sequence_trainable,
        param_space={"lr": MultiStep(tune.uniform(0.1, 0.5), [2], 0.5), "noise": 0.01},
        tune_config=tune.TuneConfig(metric="loss", mode="min", search_alg=searcher, num_samples=4),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path), name="wrappers", stop={"training_iteration": 3}, verbose=0
        ),
    ).fit()
    assert len(grid) == 4 and grid.num_errors == 0
    inits = sorted(r.config["lr"].init for r in grid)
    assert inits[0] == inits[1] and inits[2] == inits[3], "Repeater ran each suggestion twice"


# On a plan service synchronous: its workers start one by one, and on a loaded machine the first may train
# a trial to the end before a second reports, leaving asynchronous PBT nothing to compare it with.
# Checkpoints every second iteration, at the perturbation points only, as Tune's docs advise: each trial is
# cloned from the checkpoint of its perturbation point (once, any iteration without one stopped all clones).
@pytest.mark.parametrize(
    "synch, on_service, checkpoint_every", [(False, False, 1), (False, False, 2), (True, False, 1), (True, True, 1)]
)
def test_pbt_forks_exploited_trials_from_the_source_checkpoint(
    tmp_path, ray_session, synch, on_service, checkpoint_every
):
    """Also on a plan service: an exploit replaces a trial of the shared plan
    (removed and added again under its id, forked from another's checkpoint)."""
    import random

    from ray.tune.schedulers import PopulationBasedTraining

    from ray_stagetree.plan_service import shutdown

    random.seed(0)
    stop = {"training_iteration": HORIZON, **({"loss": 1e9} if checkpoint_every > 1 else {})}
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=2,
        hyperparam_mutations={"lr": [0.05, 0.1, 0.2, 0.4]},
        synch=synch,
    )
    tuner = Tuner(
        # four workers on the two test CPUs, so the population trains in step
        tune.with_resources(sequence_trainable, {"cpu": 0.5}),
        # 1 s an iteration: a trial lasts 8 s, so on a loaded machine a late-started worker's trial still
        # overlaps the first (at 0.2 s, and once at 0.5 s, a full suite ran them one after another: nothing
        # to exploit)
        param_space={
            "lr": tune.grid_search([0.05, 0.1, 0.2, 0.4]),
            "noise": 0.0,
            "sleep": 1.0,
            "checkpoint_every": checkpoint_every,
        },
        tune_config=tune.TuneConfig(metric="loss", mode="min", scheduler=pbt),
        # a metric's stop criterion (never met) has every iteration end a request, so saves are missing at
        # the odd ones
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="pbt", stop=stop, verbose=0),
        plan_service=f"pbt_{os.urandom(3).hex()}" if on_service else None,
    )
    try:
        grid = tuner.fit()
    finally:
        if on_service:
            shutdown(tuner.plan_service.name)
    assert grid.num_errors == 0
    exploited = [r for r in grid if "config_schedule" in r.metrics]
    assert exploited, "the weakest trials exploited stronger ones"
    for result in exploited:
        schedule = result.metrics["config_schedule"]["lr"]  # the discovered schedule, replayable
        assert isinstance(schedule, Concat) and result.config["lr"] == schedule.value(HORIZON - 1)
        fork = schedule.milestones[-1]
        if synch:  # the whole population perturbs together at every interval
            assert all(milestone % 2 == 0 for milestone in schedule.milestones)
        frame = result.metrics_dataframe
        assert frame["training_iteration"].tolist()[-1] == HORIZON
        # the first iteration after the fork continues the source's model:
        # loss(fork + 1) = loss(fork) * (1 - lr after the fork)
        first_after = frame[frame["training_iteration"] == fork + 1].iloc[-1]
        before = 10.0
        for step in range(fork):
            before *= 1 - schedule.value(step)
        assert first_after["loss"] == pytest.approx(before * (1 - schedule.value(fork)))
    for result in grid:  # as Tune's: every row logged, those after an exploit back to an earlier checkpoint too
        with open(os.path.join(result.path, "result.json")) as file:
            logged = [json.loads(line)["training_iteration"] for line in file]
        assert logged == result.metrics_dataframe["training_iteration"].tolist()
        read = tune.Result.from_path(result.path)
        assert read.checkpoint.path == result.checkpoint.path, sorted(os.listdir(result.path))
        assert all(os.path.basename(c.path) == metrics["checkpoint_dir_name"] for c, metrics in read.best_checkpoints)


def test_grid_with_a_filter_and_a_custom_scheduler(tmp_path, ray_session):
    from ray.tune.schedulers import FIFOScheduler, TrialScheduler

    from ray_stagetree.searchers import SequenceGridSearch

    class StopAboveThreshold(FIFOScheduler):
        """A user's own scheduler: stop any trial whose loss is above 9.5 at iteration 2."""

        def on_trial_result(self, tune_controller, trial, result):
            if result["training_iteration"] == 2 and result["loss"] > 9.5:
                return TrialScheduler.STOP
            return TrialScheduler.CONTINUE

    grid = Tuner(
        tune_docs_trainable,
        param_space={"lr": tune.grid_search([0.01, 0.1, 0.3]), "noise": tune.grid_search([0.0, 0.5])},
        tune_config=tune.TuneConfig(
            metric="loss",
            mode="min",
            scheduler=StopAboveThreshold(),
            search_alg=SequenceGridSearch(filter=lambda config: not (config["noise"] > 0 and config["lr"] > 0.2)),
        ),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="custom", stop={"training_iteration": 4}, verbose=0),
    ).fit()
    assert len(grid) == 5, "the filter dropped lr=0.3 with noise"
    lengths = {(r.config["lr"], r.config["noise"]): len(r.metrics_dataframe) for r in grid}
    assert lengths[(0.01, 0.0)] == 2 and lengths[(0.1, 0.0)] == 4


def test_time_budget_stops_the_study(tmp_path, ray_session):
    grid = Tuner(
        tune_docs_trainable,
        param_space={"lr": tune.grid_search([0.1, 0.2]), "noise": 0.0, "sleep": 0.5},
        tune_config=tune.TuneConfig(metric="loss", mode="min", time_budget_s=3),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path), name="budget", stop={"training_iteration": 100}, verbose=0
        ),
    ).fit()
    # a slow machine may stop a trial before its first report: no rows at all
    reported = [0 if r.metrics_dataframe is None else len(r.metrics_dataframe) for r in grid]
    assert grid.num_errors == 0 and len(grid) == 2 and max(reported) < 100


def test_structured_bo_tunes_a_schedule_and_reuses_its_prefixes(tmp_path, ray_session):
    from ray_stagetree.searchers import StructuredBO

    horizon = 6
    # The first learning rate decides the first 4 iterations, the decay the rest.
    space = {"lr": Step(tune.loguniform(0.01, 0.5), 4, tune.uniform(0.5, 1.0)), "noise": 0.01}
    searcher = StructuredBO(horizon=horizon, num_initial=3, num_candidates=64, num_samples=32, seed=0)
    grid = Tuner(
        sequence_trainable,
        param_space=space,
        tune_config=tune.TuneConfig(
            metric="loss", mode="min", search_alg=searcher, num_samples=8, max_concurrent_trials=2
        ),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path), name="sbo", stop={"training_iteration": horizon}, verbose=0
        ),
    ).fit()
    assert len(grid) == 8 and grid.num_errors == 0
    for result in grid:
        assert isinstance(result.config["lr"], Step) and len(result.metrics_dataframe) == horizon
    trial_by_trial = sum(len(result.metrics_dataframe) for result in grid)
    # Its proposals share prefixes (whether a shared prefix is also trained once depends on when a
    # proposal arrives: after the batch passed the fork without a checkpoint there, it is retrained).
    assert grid.unique_iterations < grid.trial_by_trial_iterations == trial_by_trial
    assert grid.iterations_executed <= trial_by_trial
    # the model's proposals beat the random start
    by_start = sorted(grid, key=lambda result: result.metrics["trial_id"])
    assert min(r.metrics["loss"] for r in by_start[3:]) < min(r.metrics["loss"] for r in by_start[:3])
