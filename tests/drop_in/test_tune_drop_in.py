"""Tune behaviours a script relies on, each found broken by running Ray Tune's
own examples with the import changed."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
import time

import pytest
from ray import tune
from ray.tune.error import TuneError
from ray.tune.schedulers import PopulationBasedTraining
from ray.tune.search import Searcher
from trainables_for_tests import fit_under_a_budget

from ray_stagetree import Concat, MultiStep, Tuner, get_hparams
from ray_stagetree.trainables import StageTrainable

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")


def finite_loop(config):
    """Tune's example shape: a loop of config["steps"] reports, then return."""
    for step in range(config["steps"]):
        tune.report({"score": config["slope"] * (step + 1), "done_seen": 0})


def two_objectives(config):
    for step in range(config["steps"]):
        tune.report({"score": config["slope"] * (step + 1), "cost": config["slope"] ** 2})


def reporter_of_done(config):
    for step in range(100):
        tune.report({"score": step, "done": step + 1 >= config["end"]})


def plain_lr_trainable(config, report=tune.report, get_checkpoint=tune.get_checkpoint):
    """Tune's pbt_function shape: config["lr"] used as a number, checkpoints by hand."""
    import json

    state = {"x": 0.0, "step": 0}
    checkpoint = get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as path:
            with open(os.path.join(path, "state.json")) as file:
                state = json.load(file)
    while True:
        lr = max(config["lr"], 1e-4)  # fails if config["lr"] is not a number
        state["x"] += lr
        state["step"] += 1
        time.sleep(config.get("sleep", 0.0))
        with tempfile.TemporaryDirectory() as path:
            with open(os.path.join(path, "state.json"), "w") as file:
                json.dump(state, file)
            report(
                {"x": state["x"], "lr_type": type(config["lr"]).__name__, "lr_seen": config["lr"]},
                checkpoint=tune.Checkpoint.from_directory(path),
            )


class ListSearcher(Searcher):
    """Proposes a fixed list, then FINISHED, as BayesOptSearch does when done.
    Logs the results it sees to a file (it runs inside the controller actor)."""

    def __init__(self, configs, log, **kwargs):
        super().__init__(**kwargs)
        self.configs, self.log = list(configs), str(log)

    def suggest(self, trial_id):
        return self.configs.pop(0) if self.configs else Searcher.FINISHED

    def on_trial_result(self, trial_id, result):
        with open(self.log, "a") as file:
            file.write(f"{trial_id} {result['training_iteration']}\n")

    def seen(self):
        with open(self.log) as file:
            return [(trial_id, int(step)) for trial_id, step in (line.split() for line in file)]

    def on_trial_complete(self, trial_id, result=None, error=False):
        pass


def test_a_searcher_that_finishes_ends_the_study(ray_session, tmp_path):
    searcher = ListSearcher(
        [{"slope": 1.0, "steps": 3}, {"slope": 2.0, "steps": 3}], tmp_path / "log", metric="score", mode="max"
    )
    grid = Tuner(
        finite_loop,
        param_space={"slope": tune.uniform(0, 1), "steps": 3},
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=10),
        run_config=tune.RunConfig(stop={"training_iteration": 3}, verbose=0),
    ).fit()
    assert sorted(r.config["slope"] for r in grid) == [1.0, 2.0]
    assert grid.num_errors == 0
    # Each iteration reaches the searcher once, but the last: as under Tune, the result that meets a stop
    # criterion (done) reaches it at the trial's end (on_trial_complete), not in on_trial_result.
    assert len(searcher.seen()) == len(set(searcher.seen())) == 4


def test_num_samples_minus_one_runs_until_the_searcher_is_finished(ray_session, tmp_path):
    searcher = ListSearcher(
        [{"slope": float(s), "steps": 2} for s in range(3)], tmp_path / "log", metric="score", mode="max"
    )
    grid = Tuner(
        finite_loop,
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=-1),
        run_config=tune.RunConfig(stop={"training_iteration": 2}, verbose=0),
    ).fit()
    assert len(grid) == 3 and grid.num_errors == 0


def slow_finite_loop(config):
    for step in range(config["steps"]):
        time.sleep(0.1)
        tune.report({"score": config["slope"] * (step + 1)})


def test_num_samples_minus_one_draws_random_variants_until_the_time_budget_ends(ray_session, tmp_path):
    """Tune's random search without end: variants are drawn as workers take
    them until time_budget_s, so the ResultGrid holds what ran and at most a
    trial per worker the budget stopped, plus one that waited (it used to be
    refused: -1 only with a searcher)."""

    def fit(budget):
        return Tuner(
            slow_finite_loop,
            param_space={"slope": tune.uniform(0, 1), "steps": 2},
            tune_config=tune.TuneConfig(metric="score", mode="max", num_samples=-1, time_budget_s=budget),
            run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0),
        ).fit()

    def finished(grid):
        return [result for result in grid if result.metrics.get("training_iteration") == 2]

    grid = fit_under_a_budget(fit, lambda grid: len(finished(grid)) >= 2, budgets=(10, 40))
    ran = finished(grid)
    assert len(ran) >= 2 and grid.num_errors == 0
    assert len(grid) <= len(ran) + 2 + 1, (len(grid), len(ran))
    assert len({result.config["slope"] for result in grid}) == len(grid)


def slow_sequence_loop(config):
    for step in range(config["steps"]):
        time.sleep(0.2)
        tune.report({"score": get_hparams()["slope"] * (step + 1)})


def test_num_samples_minus_one_over_trials_sharing_a_prefix_admits_what_its_workers_can_run(ray_session, tmp_path):
    """Every trial shares its first 4 iterations: trials forking from the
    running prefix wait for no worker yet, but each needs one after the fork,
    so no more are live than the workers run plus one (without that bound,
    2,601 trials were admitted in a 4 s budget, none trained to its end)."""

    def fit(budget):
        return Tuner(
            slow_sequence_loop,
            param_space={"slope": MultiStep(1.0, [4], tune.uniform(0, 1)), "steps": 8},
            tune_config=tune.TuneConfig(metric="score", mode="max", num_samples=-1, time_budget_s=budget),
            run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0),
        ).fit()

    def finished(grid):
        return [result for result in grid if result.metrics.get("training_iteration") == 8]

    grid = fit_under_a_budget(fit, lambda grid: len(finished(grid)) >= 2)
    # The budget stopped the live ones: at most one per worker (2) and one more.
    assert grid.num_errors == 0 and len(finished(grid)) >= 2 and len(grid) <= len(finished(grid)) + 2 + 1, len(grid)


def test_num_samples_minus_one_over_a_finite_space_ends_once_it_is_searched_through(ray_session, tmp_path):
    """Draws of a config drawn before are skipped (under stage sharing it
    would train nothing new, and trials would come without end, each
    answered at once); the study ends once draws only repeat: each of the
    space's 3 configs runs once, and no time budget is needed."""
    grid = Tuner(
        finite_loop,
        param_space={"slope": tune.choice([1.0, 2.0, 3.0]), "steps": 2},
        tune_config=tune.TuneConfig(metric="score", mode="max", num_samples=-1),
        run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0),
    ).fit()
    assert sorted(result.config["slope"] for result in grid) == [1.0, 2.0, 3.0]
    assert grid.get_best_result().metrics["score"] == 6.0


def test_a_multi_objective_searcher_gets_every_metric(ray_session, tmp_path):
    """As in Tune's optuna_multiobjective_example.py: metric and mode are lists,
    given to the searcher only."""
    pytest.importorskip("optuna")
    from ray.tune.search.optuna import OptunaSearch

    grid = Tuner(
        two_objectives,
        param_space={"slope": tune.uniform(0, 1), "steps": 2},
        tune_config=tune.TuneConfig(
            search_alg=OptunaSearch(metric=["score", "cost"], mode=["max", "min"]), num_samples=3
        ),
        run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0),
    ).fit()
    assert len(grid) == 3 and grid.num_errors == 0
    assert grid.get_best_result("cost", "min").metrics["cost"] == min(r.metrics["cost"] for r in grid)


def test_a_finite_loop_ends_its_trial_without_error(ray_session):
    grid = Tuner(
        finite_loop,
        param_space={"steps": tune.grid_search([2, 5]), "slope": 1.0},
        run_config=tune.RunConfig(stop={"training_iteration": 5}, verbose=0),
    ).fit()
    assert grid.num_errors == 0
    lengths = {r.config["steps"]: len(r.metrics_dataframe) for r in grid}
    assert lengths == {2: 2, 5: 5}
    assert all(r.metrics["done"] for r in grid)


def test_result_config_is_nested_as_in_tune(ray_session):
    grid = Tuner(
        finite_loop,
        param_space={"opt": {"slope": tune.grid_search([1.0, 3.0])}, "steps": 2, "slope": 0.5},
        run_config=tune.RunConfig(stop={"training_iteration": 2}, verbose=0),
    ).fit()
    assert sorted(r.config["opt"]["slope"] for r in grid) == [1.0, 3.0]
    assert all(r.config["steps"] == 2 for r in grid)
    assert "config/opt/slope" in grid[0].metrics_dataframe.columns  # flattened only in the dataframe


def test_reporting_done_ends_the_trial_and_stop_on_done_works(ray_session):
    grid = Tuner(
        reporter_of_done,
        param_space={"end": tune.grid_search([3, 6])},
        run_config=tune.RunConfig(stop={"training_iteration": 20}, verbose=0),
    ).fit()
    assert {r.config["end"]: len(r.metrics_dataframe) for r in grid} == {3: 3, 6: 6}
    assert grid.num_errors == 0
    assert all(r.metrics["done"] is True for r in grid)
    assert list(grid[0].metrics_dataframe["done"])[:-1] == [False] * (len(grid[0].metrics_dataframe) - 1)


def test_pbt_hands_a_plain_trainable_plain_values(ray_session):
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=2,
        hyperparam_mutations={"lr": tune.uniform(0.001, 1.0)},
        synch=True,  # it exploits whatever the timing (a loaded machine's)
    )
    grid = Tuner(
        # four workers on the two test CPUs, so the population trains in step
        tune.with_resources(plain_lr_trainable, {"cpu": 0.5}),
        # slow enough iterations that the population reaches each perturbation together
        param_space={"lr": tune.grid_search([0.01, 0.1, 0.5, 0.9]), "sleep": 0.2},
        tune_config=tune.TuneConfig(metric="x", mode="max", scheduler=pbt),
        run_config=tune.RunConfig(stop={"training_iteration": 8}, verbose=0),
    ).fit()
    assert grid.num_errors == 0
    types = {t for r in grid for t in r.metrics_dataframe["lr_type"]}
    assert types == {"float"}
    # result.config shows the value in force at the end, as Tune's; the schedule is beside it
    assert all(type(r.config["lr"]) is float for r in grid)
    exploited = [r for r in grid if isinstance(r.metrics.get("config_schedule", {}).get("lr"), Concat)]
    assert exploited, "PBT exploited no trial; the test would not cover the change of config"


def test_a_plain_value_changing_inside_a_batch_restarts_the_function_from_its_checkpoint():
    """A batch that crosses the point where PBT changed a plain value (its
    source checkpoint was lost, say) restarts the function there, Ray-free."""
    from ray_stagetree import Constant, get_checkpoint, report
    from ray_stagetree.execution.batches import BatchSpec
    from ray_stagetree.planning import TrialConfig
    from ray_stagetree.runtime.workers.context import StageContext
    from ray_stagetree.runtime.workers.worker import run_function

    config = {"lr": Constant(0.25).then(Constant(0.5), at=3)}
    spec = BatchSpec(
        batch_id=1,
        config=config,
        trial_config=TrialConfig.from_config(config),
        segments=[(0, 0, 3), (1, 3, 5)],
        save_iterations=set(),
        plain=frozenset({"lr"}),
    )
    outbox: dict = {}
    context = StageContext(spec, controller=None, put=outbox.__setitem__)
    context.flush = lambda ask_callbacks=False: None  # no controller here: keep every record for the assertions
    # Outside a worker, Tune's own report/get_checkpoint are not ours: pass ours.
    run_function(lambda config: plain_lr_trainable(config, report, get_checkpoint), context)
    rows = [row for _, _, row in context.finish().records]
    assert [row["lr_seen"] for row in rows] == [0.25, 0.25, 0.25, 0.5, 0.5]
    # The restarted function resumed from the checkpoint at 3: x keeps growing.
    assert [round(row["x"], 6) for row in rows] == [0.25, 0.5, 0.75, 1.25, 1.75]
    assert context.returned_at is None


def test_a_parked_trainable_continued_into_a_fork_gets_the_value_that_changes_where_it_parked():
    """PBT's exploit forks off the source's checkpoint, and the source's
    trainable, parked there, may continue into the fork: the explored value
    (changing at the park point) restarts it with the new value, from the
    checkpoint it reported there, as Tune restores an exploited trial."""
    from ray_stagetree import Constant, get_checkpoint, report
    from ray_stagetree.execution.batches import BatchSpec
    from ray_stagetree.planning import TrialConfig
    from ray_stagetree.runtime.workers.context import StageContext
    from ray_stagetree.runtime.workers.worker import run_function

    def batch(batch_id, config, segments):
        return BatchSpec(
            batch_id=batch_id,
            config=config,
            trial_config=TrialConfig.from_config(config),
            segments=segments,
            save_iterations=set(),
            plain=frozenset({"lr"}),
        )

    source = batch(1, {"lr": Constant(0.25)}, [(0, 0, 3)])
    fork = batch(2, {"lr": Constant(0.25).then(Constant(0.5), at=3)}, [(1, 3, 5)])
    follow_ups = iter([fork, None])
    outcomes = []

    def park(outcome):
        outcomes.append(outcome)
        return next(follow_ups)

    context = StageContext(source, controller=None, put={}.__setitem__, park=park)
    # No controller: the batch parks at its end, as the controller's reply would say.
    context.flush = lambda ask_callbacks=False: None
    context._parking = True
    run_function(lambda config: plain_lr_trainable(config, report, get_checkpoint), context)
    rows = [row for outcome in outcomes for _, _, row in outcome.records] + [r for _, _, r in context.finish().records]
    assert [row["lr_seen"] for row in rows] == [0.25, 0.25, 0.25, 0.5, 0.5]
    assert [round(row["x"], 6) for row in rows] == [0.25, 0.5, 0.75, 1.25, 1.75]


class DictCheckpointTrainable(StageTrainable):
    """Tune's idiom: save_checkpoint returns a dict, load_checkpoint gets it back."""

    def setup(self, config):
        self.total = 0.0

    def step(self):
        self.total += self.hparams["lr"]
        return {"total": self.total}

    def save_checkpoint(self, checkpoint_dir):
        return {"total": self.total}

    def load_checkpoint(self, checkpoint):
        assert isinstance(checkpoint, dict), f"load_checkpoint got {checkpoint!r}"
        self.total = checkpoint["total"]


def test_a_dict_returned_by_save_checkpoint_reaches_load_checkpoint(ray_session):
    from ray_stagetree import MultiStep

    grid = Tuner(
        DictCheckpointTrainable,
        param_space={"lr": tune.grid_search([MultiStep(1.0, [3], 0.5), MultiStep(1.0, [3], 0.1)])},
        run_config=tune.RunConfig(stop={"training_iteration": 5}, verbose=0),
    ).fit()
    assert grid.num_errors == 0, grid.errors
    # The shared prefix (3 x 1.0) is loaded from the dict checkpoint by the fork.
    assert sorted(round(r.metrics["total"], 6) for r in grid) == [3.2, 4.0]
    assert grid.iterations_executed == 3 + 2 + 2


def flaky_once(config):
    """Fails once at iteration 3 (a marker file remembers), then trains through."""
    for step in range(100):
        if step == 2 and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            raise RuntimeError("transient failure")
        tune.report({"score": step})


def test_a_retried_trials_iterations_reach_its_searcher_once(ray_session, tmp_path):
    searcher = ListSearcher([{"marker": str(tmp_path / "marker")}], tmp_path / "log", metric="score", mode="max")
    grid = Tuner(
        flaky_once,
        tune_config=tune.TuneConfig(search_alg=searcher, num_samples=1),
        run_config=tune.RunConfig(
            stop={"training_iteration": 4}, failure_config=tune.FailureConfig(max_failures=1), verbose=0
        ),
    ).fit()
    assert grid.num_errors == 0
    # 4 is done (the stop criterion): the searcher hears of it at the trial's end, as under Tune.
    assert searcher.seen() == [(grid[0].metrics["trial_id"], step) for step in (1, 2, 3)]
    # Its results hold both attempts, as Tune's progress.csv does: the retry starts over (no checkpoint).
    assert list(grid[0].metrics_dataframe["training_iteration"]) == [1, 2, 1, 2, 3, 4]


def exploding(config):
    for step in range(100):
        if config["explode"] and step == 1:
            raise ValueError("boom")
        tune.report({"score": step})


@pytest.mark.parametrize("fail_fast", [True, "raise"])
def test_fail_fast_stops_the_study_at_the_first_error(ray_session, fail_fast):
    tuner = Tuner(
        exploding,
        param_space={"explode": tune.grid_search([True, False, False, False])},
        tune_config=tune.TuneConfig(max_concurrent_trials=1),
        run_config=tune.RunConfig(
            stop={"training_iteration": 3}, failure_config=tune.FailureConfig(fail_fast=fail_fast), verbose=0
        ),
    )
    if fail_fast == "raise":
        with pytest.raises(Exception, match="boom"):
            tuner.fit()
        return
    grid = tuner.fit()
    assert grid.num_errors == 1
    assert len(grid) == 1  # the trials after the error never started


class RaisesIn(tune.Callback):
    def __init__(self, hook):
        setattr(self, hook, self.boom)

    def boom(self, **info):
        raise RuntimeError("boom in a callback")


@pytest.mark.parametrize(
    "hook, fail_fast, raised",
    [
        ("on_trial_result", False, TuneError),  # Tune's loop wraps an error raised handling a trial's event
        ("on_trial_complete", False, None),  # Tune logs it, and the run goes on
        ("on_trial_complete", "raise", RuntimeError),
        ("on_trial_result", "raise", RuntimeError),  # ... unless fail_fast="raise"
        ("on_step_end", False, RuntimeError),  # its own steps' hooks raise as they are
    ],
)
def test_an_error_in_a_callback_is_raised_as_tune_raises_it(ray_session, hook, fail_fast, raised):
    tuner = Tuner(
        finite_loop,
        param_space={"slope": 1.0, "steps": 2},
        run_config=tune.RunConfig(
            callbacks=[RaisesIn(hook)], failure_config=tune.FailureConfig(fail_fast=fail_fast), verbose=0
        ),
    )
    if raised is None:
        assert tuner.fit()[0].metrics["training_iteration"] == 2
        return
    with pytest.raises(Exception, match="boom in a callback") as error:
        tuner.fit()
    assert type(error.value) is raised


def test_trial_names_and_folders_come_from_the_creators(ray_session, tmp_path):
    grid = Tuner(
        finite_loop,
        param_space={"slope": tune.grid_search([1.0, 2.0]), "steps": 1},
        tune_config=tune.TuneConfig(
            trial_dirname_creator=lambda trial: f"slope_{trial.config['slope']}",
            trial_name_creator=lambda trial: f"named_{trial.trial_id}",
        ),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="exp", stop={"training_iteration": 1}, verbose=0),
    ).fit()
    assert sorted(os.path.basename(r.path) for r in grid) == ["slope_1.0", "slope_2.0"]
    assert sorted(os.listdir(tmp_path / "exp")) == ["checkpoints", "plan", "slope_1.0", "slope_2.0"] or {
        "slope_1.0",
        "slope_2.0",
    } <= set(os.listdir(tmp_path / "exp"))
    assert (tmp_path / "exp" / "slope_1.0" / "result.json").exists()


def test_trials_a_dirname_creator_names_alike_get_folders_of_their_own(ray_session, tmp_path):
    """As Tune does where a trial's folder exists: the name, ``_`` and four
    hex digits (the three trials shared one folder and its result files)."""
    grid = Tuner(
        finite_loop,
        param_space={"slope": tune.grid_search([1.0, 2.0, 3.0]), "steps": 2},
        tune_config=tune.TuneConfig(trial_dirname_creator=lambda trial: "SAME"),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="exp", verbose=0),
    ).fit()
    folders = sorted(os.path.basename(r.path) for r in grid)
    assert folders[0] == "SAME" and len(set(folders)) == 3
    assert all(re.fullmatch(r"SAME_[0-9a-f]{4}", folder) for folder in folders[1:]), folders
    for result in grid:
        assert result.metrics_dataframe["score"].tolist() == [result.config["slope"], 2 * result.config["slope"]]


def test_a_trial_name_creator_alone_names_the_trial_folders_as_in_tune(ray_session, tmp_path):
    """Tune's default folder name starts with the trial's name: the creator's when given."""
    grid = Tuner(
        finite_loop,
        param_space={"slope": tune.grid_search([1.0, 2.0]), "steps": 1},
        tune_config=tune.TuneConfig(trial_name_creator=lambda trial: f"named_{trial.config['slope']}"),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="exp", stop={"training_iteration": 1}, verbose=0),
    ).fit()
    folders = sorted(os.path.basename(result.path) for result in grid)
    assert [folder.split("_slope=")[0] for folder in folders] == ["named_1.0_0", "named_2.0_1"], folders


def test_a_dirname_creator_returning_a_path_errors_its_trial_clearly(ray_session, tmp_path):
    grid = Tuner(
        finite_loop,
        param_space={"slope": 1.0, "steps": 1},
        tune_config=tune.TuneConfig(trial_dirname_creator=lambda trial: "a/b"),
        run_config=tune.RunConfig(storage_path=str(tmp_path), stop={"training_iteration": 1}, verbose=0),
    ).fit()
    assert "trial_dirname_creator must return a non-empty str usable as a folder name" in str(grid.errors[0])


def test_a_relative_storage_path_is_refused_before_anything_runs():
    with pytest.raises(
        ValueError, match=r"storage_path must be an absolute path, a path under '~' or a URI.*'results'"
    ):
        Tuner(finite_loop, run_config=tune.RunConfig(storage_path="results", stop={"training_iteration": 1}))


@pytest.mark.parametrize("num_samples", [0, -2, 1.5])
def test_bad_num_samples_is_refused(num_samples):
    with pytest.raises(ValueError, match=r"num_samples must be an int >= 1, or -1 \(trials without end"):
        Tuner(finite_loop, tune_config=tune.TuneConfig(num_samples=num_samples))


def test_a_trainable_workers_cannot_import_fails_once_with_the_remedy(ray_session, tmp_path, capfd):
    module = tmp_path / "only_on_the_driver_xyz.py"
    module.write_text("from ray import tune\n\ndef train(config):\n    while True:\n        tune.report({'a': 1})\n")
    sys.path.insert(0, str(tmp_path))  # the driver's path only: workers were started without it
    try:
        from only_on_the_driver_xyz import train

        tuner = Tuner(
            train,
            param_space={"x": tune.grid_search([1, 2, 3])},
            run_config=tune.RunConfig(stop={"training_iteration": 2}, verbose=0),
        )
        with pytest.raises(RuntimeError, match=r"module 'only_on_the_driver_xyz'.*runtime_env"):
            tuner.fit()
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("only_on_the_driver_xyz", None)
    assert capfd.readouterr().err.count("Traceback") <= 1


@pytest.mark.release
def test_the_example_joins_a_running_cluster_as_under_ray_job_submit(ray_session):
    """`ray job submit` runs the script with RAY_ADDRESS set to a running cluster (in CI, the faked
    `init_ray` tests of tests/runtime/driver/test_cluster.py and the CLI's `--address` runs hold the joining)."""
    address = ray_session.get_runtime_context().gcs_address
    env = {**os.environ, "RAY_ADDRESS": address}
    result = subprocess.run(
        [sys.executable, os.path.join(EXAMPLES, "mnist1d_study.py"), "--epochs", "3"],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "14 trials, 0 errors" in result.stdout


TRAINER_SCRIPT = """
import sys, tempfile
import ray
from ray import train, tune
from ray.train import ScalingConfig
from ray.train.data_parallel_trainer import DataParallelTrainer
import ray_stagetree

ray.init(address="local", num_cpus=2, include_dashboard=False)  # its own, whatever else runs here

def loop(config):
    train.report({"x": config["a"] * 10})

trainer = DataParallelTrainer(loop, scaling_config=ScalingConfig(num_workers=1))
grid = ray_stagetree.Tuner(
    trainer,
    param_space={"train_loop_config": {"a": tune.grid_search([1, 2])}},
    run_config=tune.RunConfig(storage_path=tempfile.mkdtemp(), verbose=0),
).fit()
print("tuned", sorted(result.metrics["x"] for result in grid))
ray.tune.tuner.Tuner = ray.tune.Tuner = ray_stagetree.Tuner  # a script that swapped Tune's Tuner for ours
trainer = DataParallelTrainer(loop, train_loop_config={"a": 3}, scaling_config=ScalingConfig(num_workers=1),
                              run_config=train.RunConfig(storage_path=tempfile.mkdtemp()))
print("fitted", trainer.fit().metrics["x"])
"""


@pytest.mark.release
@pytest.mark.long
def test_ray_train_trainers_run_as_tune_runs_them(tmp_path):
    """``Tuner(trainer)`` and a trainer's own ``fit()`` (which builds the
    Tuner that ``ray.tune.tuner`` names, ours in a swapped script) run on
    Ray Tune's Tuner, as under Tune, with a message that nothing is shared
    (Ray 2.60's legacy engine; Train v2 trainers get Tune's own answer)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["RAY_TRAIN_V2_ENABLED"] = "0"
    result = subprocess.run(
        [sys.executable, "-c", TRAINER_SCRIPT], env=env, capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "tuned [10, 20]" in result.stdout and "fitted 30" in result.stdout
    assert result.stderr.count("a Ray Train trainer is run by Ray Tune's Tuner") == 1
