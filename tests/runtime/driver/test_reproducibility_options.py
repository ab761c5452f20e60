"""Reproducibility's parts without Ray: stage seeds, seeding the generators,
repeats of grid and searcher configurations, the Tuner's argument checks
and the per-configuration statistics."""

import os
import random

import numpy as np
import pandas as pd
import pytest
from ray import tune
from ray.tune.search import Searcher

from ray_stagetree import MultiStep, Tuner
from ray_stagetree.runtime.driver.restoring import save_settings
from ray_stagetree.runtime.driver.results import ResultGrid
from ray_stagetree.runtime.driver.trial_sources import trial_source
from ray_stagetree.runtime.workers.reproducibility import (
    Reproducibility,
    SeededRepeater,
    repeat_configs,
    seed_stage,
    stage_seed,
)

torch = pytest.importorskip("torch")


def train(config):
    pass


def draws():
    return random.random(), float(np.random.random()), float(torch.rand(1))


def test_seed_stage_sets_every_generator_from_the_trial_seed_and_start():
    seed_stage(Reproducibility(seed=3), {"lr": 0.1}, start=0)
    first = draws()
    draws()  # whatever ran before (another batch on this worker) does not matter
    seed_stage(Reproducibility(seed=3), {"lr": 0.2}, start=0)
    assert draws() == first
    seed_stage(Reproducibility(seed=0), {"seed": 3}, start=0)  # the trial's seed entry wins
    assert draws() == first
    seed_stage(Reproducibility(seed=0), {"seed": np.int64(3)}, start=0)  # as tune.grid_search(np.arange(...)) gives it
    assert draws() == first
    seed_stage(Reproducibility(seed=3), {}, start=5)
    assert draws() != first
    assert stage_seed(3, 0) != stage_seed(4, 0) != stage_seed(3, 1) and 0 <= stage_seed(3, 0) < 2**63


def test_a_bad_seed_entry_is_named():
    with pytest.raises(
        ValueError, match=r"config\['seed'\] \(the trial's seed in a reproducible study\) must be an int >= 0, got -1"
    ):
        seed_stage(Reproducibility(), {"seed": -1}, start=0)


def test_deterministic_algorithms_are_switched_on(monkeypatch):
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)  # and restored after the test
    try:
        seed_stage(Reproducibility(deterministic_algorithms=True), {}, start=0)
        assert torch.are_deterministic_algorithms_enabled() and not torch.backends.cudnn.benchmark
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    finally:
        torch.use_deterministic_algorithms(False)


def test_repeats_of_grid_configs_get_consecutive_seeds():
    configs = repeat_configs([{"lr": 0.1}, {"lr": 0.2}], repeats=3, seed=10)
    assert configs == [{"lr": lr, "seed": seed} for lr in (0.1, 0.2) for seed in (10, 11, 12)]


class Counting(Searcher):
    """Suggests lr = 1, 2, 3, ...; records what it was told."""

    def __init__(self):
        super().__init__(metric="loss", mode="min")
        self.suggested, self.completed = 0, []

    def suggest(self, trial_id):
        self.suggested += 1
        return {"lr": float(self.suggested)}

    def on_trial_complete(self, trial_id, result=None, error=False):
        self.completed.append(result["loss"])


def test_seeded_repeater_repeats_each_suggestion_and_reports_the_mean():
    inner = Counting()
    repeater = SeededRepeater(inner, repeat=2, seed=5)
    configs = [repeater.suggest(f"t{i}") for i in range(4)]
    assert configs == [{"lr": 1.0, "seed": 5}, {"lr": 1.0, "seed": 6}, {"lr": 2.0, "seed": 5}, {"lr": 2.0, "seed": 6}]
    repeater.on_trial_complete("t0", {"loss": 1.0})
    repeater.on_trial_complete("t1", {"loss": 3.0})
    assert inner.completed == [2.0]


def test_a_tuner_with_a_searcher_and_repeats_suggests_each_configuration_repeats_times():
    config = tune.TuneConfig(search_alg=Counting(), num_samples=2, metric="loss", mode="min")
    source = trial_source(
        Tuner(train, param_space={"lr": tune.uniform(0.1, 1.0)}, tune_config=config, seed=3, repeats=2)
    )
    assert source.remaining == 4  # num_samples counts configurations
    trials = [source.next_trial()[1] for _ in range(4)]
    assert [(trial["lr"], trial["seed"]) for trial in trials] == [(1.0, 3), (1.0, 4), (2.0, 3), (2.0, 4)]
    assert source.next_trial() is None


@pytest.mark.parametrize(
    "options, error, message",
    [
        ({"reproducible": 1}, TypeError, "reproducible must be True or False, got 1"),
        ({"seed": -2}, ValueError, "seed must be an int >= 0, got -2"),
        ({"seed": 1.5}, ValueError, "seed must be an int >= 0, got 1.5"),
        ({"repeats": 0}, ValueError, "repeats must be an int >= 1 (trainings of each configuration), got 0"),
        ({"deterministic_algorithms": True}, ValueError, "deterministic_algorithms=True needs reproducible=True"),
        (
            {"deterministic_algorithms": "yes", "reproducible": True},
            TypeError,
            "deterministic_algorithms must be True or False",
        ),
        ({"monitor": "on"}, TypeError, "monitor must be True or False, got 'on'"),
    ],
)
def test_tuner_refuses_bad_reproducibility_options(options, error, message):
    with pytest.raises(error) as raised:
        Tuner(train, param_space={"lr": 0.1}, **options)
    assert message in str(raised.value)


def test_a_drawn_config_with_a_bad_seed_is_refused_before_anything_trains(tmp_path):
    tuner = Tuner(
        train,
        param_space={"seed": tune.grid_search([1, 0.5])},
        run_config=tune.RunConfig(storage_path=str(tmp_path)),
        reproducible=True,
    )
    with pytest.raises(
        ValueError,
        match=r"trial 1 .* cannot run: config\['seed'\] \(the trial's seed in a reproducible study\) must be an int >= 0, got 0.5",
    ):
        tuner.fit()


def test_repeats_refuse_a_space_with_its_own_seed():
    with pytest.raises(
        ValueError, match=r"repeats=2 sets each repeat's config\['seed'\], but param_space already has 'seed'"
    ):
        Tuner(train, param_space={"lr": 0.1, "seed": tune.grid_search([0, 1])}, repeats=2)


def test_repeats_multiply_the_trials_and_reproducible_random_spaces_are_drawn_from_the_seed():
    space = {"lr": MultiStep(tune.uniform(0.01, 0.1), [5], 0.1)}
    tuner = Tuner(
        train, param_space=space, tune_config=tune.TuneConfig(num_samples=2), reproducible=True, seed=1, repeats=3
    )
    source = trial_source(tuner)
    configs = [source.next_trial()[1] for _ in range(source.remaining)]
    assert [config["seed"] for config in configs] == [1, 2, 3] * 2
    again = Tuner(
        train, param_space=space, tune_config=tune.TuneConfig(num_samples=2), reproducible=True, seed=1, repeats=3
    )
    assert [c["lr"] for c in configs] == [trial_source(again).next_trial()[1]["lr"]] * 3 + [configs[3]["lr"]] * 3
    assert configs[0]["lr"] != configs[3]["lr"]


def result(config, loss, error=None):
    frame = pd.DataFrame([{"loss": loss}])
    return tune.Result(
        metrics={"loss": loss, "config": config}, checkpoint=None, error=error, path="/x", metrics_dataframe=frame
    )


def test_repeats_dataframe_has_mean_and_std_per_configuration():
    grid = ResultGrid(
        [
            result({"lr": 0.1, "seed": 0}, 1.0),
            result({"lr": 0.1, "seed": 1}, 3.0),
            result({"lr": 0.2, "seed": 0}, 5.0),
            result({"lr": 0.2, "seed": 1}, None, error=RuntimeError("failed")),
        ],
        "/x",
        default_metric="loss",
    )
    frame = grid.get_repeats_dataframe().set_index("config/lr")
    assert frame.loc[0.1, "loss_mean"] == 2.0 and frame.loc[0.1, "loss_std"] == pytest.approx(np.std([1, 3], ddof=1))
    assert frame.loc[0.2, "loss_mean"] == 5.0 and np.isnan(frame.loc[0.2, "loss_std"])
    assert frame.loc[0.2, "num_errors"] == 1 and frame.loc[0.2, "seeds"] == [0, 1]
    with pytest.raises(ValueError, match="get_repeats_dataframe needs a metric name"):
        ResultGrid([], "/x").get_repeats_dataframe()


def test_restore_keeps_the_reproducibility_options_and_can_serve_the_monitor(tmp_path):
    run_config = tune.RunConfig(name="study", storage_path=str(tmp_path))
    tuner = Tuner(train, param_space={"lr": 0.1}, run_config=run_config, reproducible=True, seed=4, repeats=2)
    save_settings(tuner, str(tmp_path / "study"))
    restored = Tuner.restore(str(tmp_path / "study"), train, monitor=True)
    assert (restored.reproducible, restored.seed, restored.repeats, restored.monitor) == (True, 4, 2, True)
    with pytest.raises(TypeError, match="monitor must be True or False, got 1"):
        Tuner.restore(str(tmp_path / "study"), train, monitor=1)
