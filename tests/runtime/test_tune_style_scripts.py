"""Scripts written the way Ray Tune's own examples are written
(`tests/tune_style/`), run with vanilla ``ray.tune.Tuner`` and with
``ray_stagetree.Tuner``: the Tuner import is the only difference, and both
must run every trial without error and find the same best configuration."""

import importlib.util
import os
import sys

import pytest
from ray import tune

import ray_stagetree

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
    vanilla = script.main(tune.Tuner, storage_path=str(tmp_path / "tune"))
    assert_no_errors(vanilla[1], "ray.tune.Tuner")
    ours = script.main(ray_stagetree.Tuner, storage_path=str(tmp_path / "stagetree"))
    assert_no_errors(ours[1], "ray_stagetree.Tuner")
    return script, vanilla, ours


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
