"""Scripts written the way Ray Tune's own examples are written
(`tests/tune_style/`), run with vanilla ``ray.tune.Tuner`` and with
``ray_stagetree.Tuner``: the Tuner import is the only difference, and both
must run every trial without error and find the same best configuration.
Each checks a script against Ray Tune's own run, so they are in the release
tier (-m release); cheaper tests in CI hold their features on ray_stagetree
alone (PBT forks and reset_config, HyperBand and ASHA lengths, checkpoints
of functions and classes, the hosted searchers, stoppers)."""

import dataclasses
import importlib.util
import json
import math
import os
import sys

import pytest
from ray import tune

import ray_stagetree

pytestmark = pytest.mark.release

SCRIPTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "tune_style")


def load_script(name):
    """Import ``tests/tune_style/<name>.py`` by path. It is registered under its
    own name: Ray's workers import its trainable by that name (the
    ``ray_session`` fixture puts ``tests/tune_style`` on their PYTHONPATH)."""
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, os.path.join(SCRIPTS, f"{name}.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def run_both(name, tmp_path):
    """``main`` of the script with vanilla Tune, then with ray_stagetree:
    ((best config, best metric), ResultGrid) for each."""
    script = load_script(name)
    vanilla = script.main(tune_reusing_function_actors, storage_path=str(tmp_path / "tune"))
    assert_no_errors(vanilla[1], "ray.tune.Tuner")
    ours = script.main(ray_stagetree.Tuner, storage_path=str(tmp_path / "stagetree"))
    assert_no_errors(ours[1], "ray_stagetree.Tuner")
    return script, vanilla, ours


def tune_reusing_function_actors(trainable, *args, tune_config=None, **kwargs):
    """Vanilla ``ray.tune.Tuner``, reusing actors for a function trainable
    whose script leaves ``reuse_actors`` at its default: Tune resets a
    function trainable between trials without changing what it reports, and
    a process started per trial made the reference runs most of this file's
    time. Class trainables keep the script's setting (reuse calls their
    ``reset_config``)."""
    config = tune_config or tune.TuneConfig()
    if not isinstance(trainable, type) and not config.reuse_actors:
        config = dataclasses.replace(config, reuse_actors=True)
    return tune.Tuner(trainable, *args, tune_config=config, **kwargs)


def assert_no_errors(grid, who):
    assert len(grid) > 0, f"{who}: no trial ran"
    messages = [str(result.error) for result in grid if result.error is not None]
    assert not messages, f"{who}: {len(messages)} trial(s) ended in error:\n" + "\n".join(messages)
    assert not grid.errors


def assert_same_best(vanilla, ours):
    (tune_config, tune_value), _ = vanilla
    (our_config, our_value), _ = ours
    assert our_config == tune_config
    assert our_value == pytest.approx(tune_value, rel=1e-6)


@pytest.mark.long
def test_pbt_function(tmp_path, ray_session):
    script, vanilla, ours = run_both("pbt_function", tmp_path)
    # The toy problem's optimum is the grid's lr=0.01, which stays the top
    # trial (and is never exploited) whatever PBT explores for the others.
    assert vanilla[0][0] == {"lr": script.OPTIMAL_LR, "checkpoint_interval": script.PERTURBATION_INTERVAL}
    assert vanilla[0][1] == pytest.approx(script.TRAINING_ITERATIONS)
    assert_same_best(vanilla, ours)
    for who, (_, grid) in (("ray.tune.Tuner", vanilla), ("ray_stagetree.Tuner", ours)):
        # PBT exploited: some trial trained with more than one learning rate
        assert any(result.metrics_dataframe["cur_lr"].nunique() > 1 for result in grid), who
        assert grid.get_best_result().metrics["lr_type"] == "float", who
        for result in grid:  # what the trainable saw in config["lr"], at every iteration
            assert set(result.metrics_dataframe["lr_type"]) == {"float"}, (who, result.config)
            assert result.metrics["training_iteration"] == script.TRAINING_ITERATIONS, (who, result.config)


def test_custom_searcher_returning_finished(tmp_path, ray_session):
    script, vanilla, ours = run_both("custom_searcher", tmp_path)
    assert vanilla[0][0] == {"width": 4.0, "height": -20.0}
    assert_same_best(vanilla, ours)
    for who, (_, grid) in (("ray.tune.Tuner", vanilla), ("ray_stagetree.Tuner", ours)):
        # every proposed config ran, once, to the end of its loop
        ran = sorted((result.config["width"], result.config["height"]) for result in grid)
        assert ran == sorted((c["width"], c["height"]) for c in script.CANDIDATES), who
        assert all(result.metrics["training_iteration"] == script.STEPS for result in grid), who


def test_hyperopt_conditional_search_space(tmp_path, ray_session):
    pytest.importorskip("hyperopt")
    script, vanilla, ours = run_both("hyperopt_conditional_search_space", tmp_path)
    assert len(vanilla[1]) == len(ours[1]) == script.NUM_SAMPLES
    for who, (_, grid) in (("ray.tune.Tuner", vanilla), ("ray_stagetree.Tuner", ours)):
        for result in grid:
            # nested, as the search space is (not flattened to "activation/activation")
            assert isinstance(result.config.get("activation"), dict), (who, result.config)
            activation = result.config["activation"]
            assert activation["activation"] in ("relu", "tanh"), (who, result.config)
            assert ("mult" in activation) == (activation["activation"] == "relu"), (who, result.config)
        best = grid.get_best_result()
        assert best.config["activation"]["activation"] == best.metrics["activation"], who
    assert ours[0][0]["activation"]["activation"] == vanilla[0][0]["activation"]["activation"]
    assert_same_best(vanilla, ours)


def test_hyperband_function_with_trials_returning_before_max_t(tmp_path, ray_session):
    script, vanilla, ours = run_both("hyperband_function", tmp_path)
    assert vanilla[0][0] == {"height": 100.0, "steps": script.MAX_T, "width": 4.0}
    assert_same_best(vanilla, ours)
    for who, (_, grid) in (("ray.tune.Tuner", vanilla), ("ray_stagetree.Tuner", ours)):
        lengths = [result.metrics["training_iteration"] for result in grid]
        assert len(lengths) == 8, who
        assert all(n <= r.config["steps"] for n, r in zip(lengths, grid)), who
        # the short trials returned after their last step, before max_t
        assert any(r.config["steps"] < script.MAX_T and n == r.config["steps"] for n, r in zip(lengths, grid)), who
        assert script.MAX_T in lengths, who


@pytest.mark.long
def test_hyperband_class_trainable_dict_checkpoints(tmp_path, ray_session):
    script, vanilla, ours = run_both("hyperband_class", tmp_path)
    assert vanilla[0][0] == {"width": 5, "height": 100}
    assert vanilla[0][1] == pytest.approx(100 * math.tanh(script.MAX_T / 5))
    assert_same_best(vanilla, ours)
    for who, (_, grid) in (("ray.tune.Tuner", vanilla), ("ray_stagetree.Tuner", ours)):
        assert len(grid) == 6, who
        lengths = [result.metrics["training_iteration"] for result in grid]
        assert max(lengths) == script.MAX_T and min(lengths) < script.MAX_T, (who, lengths)
        for result in grid:
            # the trainable's own step counter survived every pause/resume:
            # load_checkpoint got the dict save_checkpoint returned
            frame = result.metrics_dataframe
            assert list(frame["timestep"]) == list(frame["training_iteration"]), (who, result.config)


def test_pbt_class_trainable_directory_checkpoints_and_reset_config(tmp_path, ray_session):
    script, vanilla, ours = run_both("pbt_class", tmp_path)
    top = script.TRAINING_ITERATIONS  # nobody gains more than a point per step
    for who, ((best_config, best_value), grid) in (("ray.tune.Tuner", vanilla), ("ray_stagetree.Tuner", ours)):
        assert len(grid) == 4, who
        # PBT is random: the best lands in the same range, not on the same value
        assert top / 2 <= best_value <= top + 1e-9, (who, best_config, best_value)
        for result in grid:
            assert result.metrics["training_iteration"] == top, (who, result.config)
            # at most a point per step: no accuracy carried over to a trial
            # that started on (or was reset onto) a reused actor
            assert result.metrics["mean_accuracy"] <= top + 1e-9, (who, result.config)
    for who, (_, grid) in (("ray.tune.Tuner", vanilla), ("ray_stagetree.Tuner", ours)):
        for result in grid:
            # the result's config ends with the values PBT last handed the
            # trainable (through reset_config, or a restart)
            assert set(result.config) == {"lr", "some_other_factor"}, (who, result.config)
            iteration = result.metrics["training_iteration"]
            lr = value_at(result.config["lr"], iteration)
            assert isinstance(lr, float), (who, result.config)
            assert value_at(result.config["some_other_factor"], iteration) in (1, 2), (who, result.config)
            assert result.metrics["cur_lr"] == pytest.approx(lr), (who, result.config)
    assert all(not isinstance(value, dict) for result in vanilla[1] for value in result.config.values())


def value_at(value, iteration):
    """A config value as the trainable saw it at ``iteration``. Vanilla Tune's
    ``result.config`` holds the last plain value; ray_stagetree's holds, for a
    trial that exploited another, the schedule PBT discovered as a sequence in
    its JSON form (a ``Concat``; see docs/guides/drop-in.md)."""
    if isinstance(value, dict) and "family" in value:
        return ray_stagetree.from_json(value).value(iteration - 1)
    return value


def test_async_hyperband_without_checkpoints(tmp_path, ray_session):
    script, vanilla, ours = run_both("async_hyperband_no_checkpoint", tmp_path)
    for who, (_, grid) in (("ray.tune.Tuner", vanilla), ("ray_stagetree.Tuner", ours)):
        assert len(grid) == script.NUM_SAMPLES, who
        lengths = [result.metrics["training_iteration"] for result in grid]
        assert all(n <= script.MAX_T for n in lengths), (who, lengths)
        # ASHA stopped some trials early and let some finish their loop
        assert min(lengths) < script.MAX_T and script.MAX_T in lengths, (who, lengths)
        for result in grid:
            assert result.checkpoint is None, (who, result.config)
            assert len(result.metrics_dataframe) == result.metrics["training_iteration"], (who, result.config)
    grid = ours[1]
    # without checkpoints nothing can be resumed: no iteration is ever trained
    # twice (or past what the trials reported)
    assert grid.iterations_executed <= sum(len(result.metrics_dataframe) for result in grid)
    # BasicVariantGenerator(random_state=...) draws the same configurations,
    # and the best dominates at every rung, so ASHA keeps it whatever the order
    sampled = {
        who: sorted((r.config["width"], r.config["height"]) for r in grid)
        for who, (_, grid) in (("tune", vanilla), ("ours", ours))
    }
    assert sampled["ours"] == sampled["tune"], sampled
    assert_same_best(vanilla, ours)


def test_tune_basic_stopper_object_with_endless_loop(tmp_path, ray_session):
    script, vanilla, ours = run_both("tune_basic_stopper", tmp_path)
    assert vanilla[0][0] == {"width": 50.0, "height": -10.0}
    assert_same_best(vanilla, ours)
    lengths = {}
    for who, (_, grid) in (("ray.tune.Tuner", vanilla), ("ray_stagetree.Tuner", ours)):
        assert len(grid) == 6, who
        lengths[who] = {(r.config["width"], r.config["height"]): r.metrics["training_iteration"] for r in grid}
        # the iteration cap ended some trials, the plateau stopper the others
        assert script.MAX_ITER in lengths[who].values(), (who, lengths[who])
        assert min(lengths[who].values()) < script.MAX_ITER, (who, lengths[who])
        assert all(len(r.metrics_dataframe) == r.metrics["training_iteration"] for r in grid), who
    # each trial stopped where its own curve says, under either Tuner
    assert lengths["ray_stagetree.Tuner"] == lengths["ray.tune.Tuner"]


def test_optuna_define_by_run_search_space(tmp_path, ray_session):
    pytest.importorskip("optuna")
    script, vanilla, ours = run_both("optuna_define_by_run", tmp_path)
    configs = {}
    for who, (_, grid) in (("ray.tune.Tuner", vanilla), ("ray_stagetree.Tuner", ours)):
        assert len(grid) == script.NUM_SAMPLES, who
        for result in grid:
            config = result.config
            # conditional: "mult" exists only for relu; the constant came back from the function
            assert config["activation"] in ("relu", "tanh"), (who, config)
            assert ("mult" in config) == (config["activation"] == "relu"), (who, config)
            assert config["steps"] == script.STEPS, (who, config)
            assert result.metrics["training_iteration"] == script.STEPS, (who, config)
        configs[who] = sorted(sorted(r.config.items()) for r in grid)
    # a seeded sampler below n_startup_trials hands both Tuners the same configurations
    assert configs["ray_stagetree.Tuner"] == configs["ray.tune.Tuner"]
    assert_same_best(vanilla, ours)


def test_custom_func_checkpointing(tmp_path, ray_session):
    script, vanilla, ours = run_both("custom_func_checkpointing", tmp_path)
    assert vanilla[0][0] == {"steps": script.STEPS, "width": 100, "height": 10.0}
    assert_same_best(vanilla, ours)
    for who, (_, grid) in (("ray.tune.Tuner", vanilla), ("ray_stagetree.Tuner", ours)):
        assert len(grid) == 6, who
        assert all(result.checkpoint is not None for result in grid), who
        best = grid.get_best_result()
        assert best.checkpoint is not None, who
        with (
            best.checkpoint.as_directory() as checkpoint_dir,
            open(os.path.join(checkpoint_dir, "checkpoint.json")) as f,
        ):
            state = json.load(f)
        # the last checkpoint the trainable wrote, at its last step
        assert state["step"] == script.STEPS - 1, (who, state)
        assert state["mean_loss"] == pytest.approx(best.metrics["mean_loss"]), (who, state)


@pytest.mark.long
def test_rays_own_pbt_example_reaches_its_target(tmp_path, ray_session):
    """Ray's ``pbt_example.py`` (imported from Ray, configured as its
    ``__main__``: 8 trials on 2 CPUs) converges as under Tune, where its
    trials reach ``done`` at iterations 220-350: PBT's population takes
    turns on the workers, and an exploited trial keeps its explored values.
    (Before, the trials with workers ran ahead and the population drifted
    to the initial learning rate: none reached the target in 1,000.)"""
    sys.path.insert(0, os.path.join(os.path.dirname(SCRIPTS), os.pardir, "release"))
    import bench_pbt

    grid = bench_pbt.pbt_example(ray_stagetree.Tuner, cap=600, storage=str(tmp_path)).fit()
    assert_no_errors(grid, "ray_stagetree.Tuner")
    last = sorted(result.metrics["training_iteration"] for result in grid)
    reached = [result for result in grid if result.metrics["done"] and result.metrics["mean_accuracy"] > 200]
    # PBT is random: under Tune too, a run now and then leaves one trial behind to the cap (7 of 8 in 1 of 3
    # repeats of release/bench_pbt.py). Before the fix, 0 or 1 of 8 got there.
    assert len(reached) >= 6, last
