"""StructuredBO as a Tune searcher on known functions of a schedule: it
finds the optimum, prefers candidates that reuse measured prefixes, spreads
a batch, learns from stopped trials, survives save/restore, and refuses
bad arguments by name."""

import numpy as np
import pytest
from ray import tune

from ray_stagetree import Constant, MultiStep
from ray_stagetree.planning.config import TrialConfig
from ray_stagetree.searchers import StructuredBO, from_tune_config

HORIZON = 20


def learning_rates(suggestion):
    config = TrialConfig.from_config(from_tune_config(suggestion))
    return config.sequences[config.names.index("lr")].values(0, HORIZON)


def mean_lr_score(lrs, iteration):
    """Best (0 - 1/iteration) at a mean learning rate of 10**-1.5 over the prefix."""
    return -((np.log10(lrs[:iteration].mean()) + 1.5) ** 2) - 1 / iteration


def late_ratio_score(lrs, iteration):
    """Only the decay factor after the milestone matters (best 0.5); the
    first learning rate, which decides the shared prefix, does not."""
    return -((lrs[iteration - 1] / lrs[0] - 0.5) ** 2)


def run_trial(searcher, trial_id, suggestion, score, stop=HORIZON):
    lrs = learning_rates(suggestion)
    for iteration in range(1, stop + 1):
        searcher.on_trial_result(trial_id, {"training_iteration": iteration, "score": score(lrs, iteration)})
    searcher.on_trial_complete(trial_id, {"training_iteration": stop, "score": score(lrs, stop)})
    return score(lrs, stop)


def study(searcher, score, trials, stop=HORIZON):
    finals = []
    for index in range(trials):
        suggestion = searcher.suggest(f"t{index}")
        finals.append(run_trial(searcher, f"t{index}", suggestion, score, stop))
    return finals


# Fewer candidates, draws and GP points than the defaults: the behaviour is
# the same, the tests are quick.
QUICK = {"num_candidates": 64, "num_samples": 32, "max_points": 100}
DECAY_SPACE = {"lr": MultiStep(tune.loguniform(1e-3, 1.0), [tune.randint(2, 19)], tune.uniform(0.05, 1.0))}


def test_finds_the_optimum_of_a_known_schedule_function():
    searcher = StructuredBO(DECAY_SPACE, metric="score", mode="max", horizon=HORIZON, num_initial=5, seed=0, **QUICK)
    finals = study(searcher, mean_lr_score, 12)
    assert max(finals) > -1 / HORIZON - 0.01  # the optimum is -1/HORIZON
    assert max(finals[5:]) > max(finals[:5])  # the model, not the random start, found it


def test_minimises_when_asked():
    searcher = StructuredBO(DECAY_SPACE, metric="score", mode="min", horizon=HORIZON, num_initial=5, seed=0, **QUICK)
    finals = study(searcher, lambda lrs, iteration: -mean_lr_score(lrs, iteration), 12)
    assert min(finals) < 1 / HORIZON + 0.01


def test_learns_from_trials_stopped_at_half_the_horizon():
    searcher = StructuredBO(DECAY_SPACE, metric="score", mode="max", horizon=HORIZON, num_initial=5, seed=1, **QUICK)
    finals = study(searcher, mean_lr_score, 12, stop=HORIZON // 2)
    assert max(finals) > -1 / (HORIZON // 2) - 0.01


def shared_proposals(cost_exponent):
    """Share of the model's proposals that reuse the prefix of an earlier
    trial, and the best score found."""
    space = {"lr": MultiStep(tune.loguniform(1e-3, 1.0), [10], tune.uniform(0.05, 1.0))}
    searcher = StructuredBO(
        space, metric="score", mode="max", horizon=HORIZON, num_initial=4, seed=4, cost_exponent=cost_exponent, **QUICK
    )
    prefixes, shared, finals = [], 0, []
    for index in range(12):
        suggestion = searcher.suggest(f"t{index}")
        prefix = learning_rates(suggestion)[:10]
        shared += index >= 4 and any(np.array_equal(prefix, seen) for seen in prefixes)
        prefixes.append(prefix)
        finals.append(run_trial(searcher, f"t{index}", suggestion, late_ratio_score))
    return shared / 8, max(finals)


def test_prefers_candidates_that_reuse_trained_prefixes_when_equally_promising():
    shared, best = shared_proposals(cost_exponent=1.0)
    blind, _ = shared_proposals(cost_exponent=0.0)
    assert shared >= 0.375 and shared > blind
    assert best > -0.01  # reuse did not cost quality: the decay found is within 0.1 of 0.5


def test_a_batch_of_running_trials_spreads_out():
    searcher = StructuredBO(DECAY_SPACE, metric="score", mode="max", horizon=HORIZON, num_initial=5, seed=2, **QUICK)
    study(searcher, mean_lr_score, 6)
    batch = [searcher.suggest(f"b{index}") for index in range(4)]  # none has reported yet
    means = [np.log10(learning_rates(s).mean()) for s in batch]
    schedules = {tuple(learning_rates(s)) for s in batch}
    assert len(schedules) == 4
    assert np.ptp(means) > 0.05  # not four copies of one point, moved by noise


def test_save_and_restore_keep_what_it_measured(tmp_path):
    searcher = StructuredBO(DECAY_SPACE, metric="score", mode="max", horizon=HORIZON, num_initial=3, seed=4, **QUICK)
    study(searcher, mean_lr_score, 4)
    running = searcher.suggest("running")
    lrs = learning_rates(running)
    searcher.on_trial_result("running", {"training_iteration": 1, "score": mean_lr_score(lrs, 1)})
    path = tmp_path / "searcher.json"
    searcher.save(str(path))
    restored = StructuredBO(DECAY_SPACE, horizon=HORIZON, seed=99)
    restored.restore(str(path))
    assert restored.metric == "score" and restored._plan.unique_iterations() == searcher._plan.unique_iterations()
    assert sorted((p[1], p[2]) for p in restored._measured()) == sorted((p[1], p[2]) for p in searcher._measured())
    assert restored._rng.random() == searcher._rng.random()
    run_trial(restored, "running", running, mean_lr_score)  # the running trial reports on to the restored searcher
    assert "running" not in restored._running


def test_works_on_plain_tune_domains():
    """No sequences: a vanilla Tune space, each value constant over training."""
    space = {"lr": tune.loguniform(1e-3, 1.0)}
    searcher = StructuredBO(space, metric="score", mode="max", horizon=HORIZON, seed=0, **QUICK)
    finals = []
    for index in range(12):
        suggestion = searcher.suggest(f"t{index}")
        assert isinstance(suggestion["lr"], float)
        finals.append(run_trial(searcher, f"t{index}", {"lr": Constant(suggestion["lr"]).to_spec()}, mean_lr_score))
    assert max(finals) > -1 / HORIZON - 0.02


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"horizon": 0}, "horizon must be an int >= 1, got 0"),
        ({"horizon": 2.5}, "horizon must be an int >= 1, got 2.5"),
        ({"horizon": 10, "num_initial": 0}, "num_initial must be an int >= 1, got 0"),
        ({"horizon": 10, "cost_exponent": -1}, r"cost_exponent must be a finite number >= 0 and <= 4, got -1"),
        ({"horizon": 10, "mode": "up"}, "mode must be 'min' or 'max', got 'up'"),
        ({"horizon": 10, "seed": "a"}, "seed must be an int or None, got 'a'"),
    ],
)
def test_bad_arguments_are_refused_by_name(arguments, message):
    with pytest.raises(ValueError, match=message):
        StructuredBO(DECAY_SPACE, **arguments)


@pytest.mark.parametrize(
    "space, message",
    [
        ({"lr": tune.grid_search([0.1, 0.2])}, "grid_search at lr is not supported"),
        ({"lr": tune.sample_from(lambda _: 0.1)}, "lr is a Function"),
        ({"lr": 0.1}, "no Tune domain to search"),
        ({"lr": tune.choice([MultiStep(tune.uniform(0.1, 1), [5], 0.1), 0.1])}, "category of the tune.choice at lr"),
    ],
)
def test_spaces_it_cannot_model_are_refused(space, message):
    with pytest.raises(ValueError, match=message):
        StructuredBO(space, horizon=10)


def test_suggest_without_a_space_says_what_is_missing():
    with pytest.raises(RuntimeError, match="no search space"):
        StructuredBO(horizon=10, metric="score", mode="max").suggest("t0")


def test_trials_that_end_without_a_result_are_forgotten():
    searcher = StructuredBO(DECAY_SPACE, metric="score", mode="max", horizon=HORIZON, num_initial=2, seed=5, **QUICK)
    study(searcher, mean_lr_score, 3)
    searcher.suggest("failed")
    searcher.on_trial_complete("failed", None, error=True)  # errored before its first report
    assert "failed" not in searcher._plan.trials
    assert learning_rates(searcher.suggest("next")).shape == (HORIZON,)


# -- used as every Tune searcher is: no arguments, space and horizon from the study

TUNER_SPACE = {"lr": MultiStep(tune.uniform(0.01, 0.5), [tune.randint(2, 8)], 0.3)}


def hosted(spec, trials=12, space=TUNER_SPACE, **arguments):
    """``StructuredBO(**arguments)`` given the space and ``spec`` as the
    Tuner gives them (through `SearcherSource`), run for ``trials`` trials
    of ``stop`` iterations each; the searcher and the configs it proposed."""
    from ray_stagetree.searchers.sources import SearcherSource

    searcher = StructuredBO(seed=0, **QUICK, **arguments)
    source = SearcherSource(searcher, space, "score", "max", trials, spec)
    configs = []
    while (trial := source.next_trial()) is not None:
        trial_id, config = trial
        configs.append(config)
        lrs = np.array([config["lr"].value(i) for i in range(8)])
        for iteration in range(1, 9):
            source.on_result(trial_id, {"training_iteration": iteration, "score": mean_lr_score(lrs, iteration)})
        source.on_complete(trial_id, {"training_iteration": 8, "score": mean_lr_score(lrs, 8)})
    return searcher, configs


def test_takes_the_tuners_param_space_with_domains_inside_a_sequences_list():
    """The Tuner hands searchers lists that hold domains as marked dicts: StructuredBO
    used to read them as milestones and refuse every draw."""
    searcher, configs = hosted({"stop": {"training_iteration": 8}, "num_samples": 12, "time_budget_s": None})
    assert len(configs) == 12 and searcher.horizon == 8
    assert all(isinstance(c["lr"], MultiStep) and 2 <= c["lr"].milestones[0] < 8 for c in configs)
    assert len(searcher._plan.trials) == 12 and any(node.metrics for node in searcher._plan.nodes)


@pytest.mark.parametrize(
    "spec, horizon",
    [
        ({"stop": {"training_iteration": 8}}, 8),
        ({"stop": {}, "max_t": 6.0}, 6),  # a scheduler's max_t (Tune's schedulers keep it as a float)
        ({"stop": {"training_iteration": 8, "loss": 0.1}, "max_t": 5}, 5),  # the smaller of the two
        ({"stop": {"training_iteration": 4}, "max_t": None}, 4),
    ],
)
def test_the_horizon_comes_from_the_study(spec, horizon):
    searcher = StructuredBO()
    searcher.set_search_properties("score", "max", TUNER_SPACE, **spec)
    assert searcher.horizon == horizon


def test_a_horizon_given_to_it_wins_over_the_studys():
    searcher = StructuredBO(horizon=3)
    searcher.set_search_properties("score", "max", TUNER_SPACE, stop={"training_iteration": 8})
    assert searcher.horizon == 3


def test_a_bad_horizon_from_the_study_is_named():
    with pytest.raises(ValueError, match=r"stop\['training_iteration'\] must be an int >= 1, got 0"):
        StructuredBO().set_search_properties("score", "max", TUNER_SPACE, stop={"training_iteration": 0})


def test_open_ended_trials_give_the_horizon_of_the_longest_completed_one():
    """No stop and no max_t: random draws until a trial ends, then the model
    at the longest trial's length, every result kept."""
    searcher, configs = hosted({"stop": {}}, trials=8, num_initial=3)
    assert searcher.horizon == 8 and searcher._learns_horizon and len(configs) == 8
    assert sum(len(searcher._plan.history(t)) for t in searcher._plan.trials) == 8 * 8


def test_a_longer_open_ended_trial_grows_the_horizon_and_keeps_what_was_measured(tmp_path):
    searcher = StructuredBO(TUNER_SPACE, metric="score", mode="max", seed=1, num_initial=2, **QUICK)
    assert searcher.horizon is None
    study(searcher, mean_lr_score, 1, stop=4)
    searcher.suggest("errored")
    for iteration in range(1, 10):
        searcher.on_trial_result("errored", {"training_iteration": iteration, "score": -1.0})
    searcher.on_trial_complete("errored", error=True)  # an error is no natural end: the horizon stays
    assert searcher.horizon == 4
    study_longer = [searcher.suggest("long")]
    run_trial(searcher, "long", study_longer[0], mean_lr_score, stop=6)
    assert searcher.horizon == 6
    assert sorted(searcher._plan.history("t0")) == [1, 2, 3, 4], "a trial that ended at 4 stays cut at 4"
    assert sorted(searcher._plan.history("errored")) == [1, 2, 3, 4, 5, 6]
    searcher.save(str(tmp_path / "state.json"))
    restored = StructuredBO(TUNER_SPACE, metric="score", mode="max", num_initial=2, **QUICK)
    restored.restore(str(tmp_path / "state.json"))
    assert restored.horizon == 6 and restored._learns_horizon
    assert learning_rates(restored.suggest("next")).shape == (HORIZON,)
