"""StructuredBO's sub-models on known functions: prefix features, the
parametric learning curve, the GP surrogate and its fork-point forecasts."""

import numpy as np
import pytest

from ray_stagetree import Constant, MultiStep
from ray_stagetree.planning.config import TrialConfig
from ray_stagetree.searchers.surrogate import Anchor, LearningCurvePrior, PrefixFeatures, PrefixSurrogate

HORIZON = 20


def planned(lr):
    return TrialConfig.from_config({"lr": lr, "batch_size": 64})


def known_metric(config, iteration):
    """Best at a mean learning rate of 0.1 over the prefix, rising with training."""
    mean_lr = config.sequences[config.names.index("lr")].values(0, iteration).mean()
    return -((np.log10(mean_lr) + 1) ** 2) - 1 / iteration


def measured(configs, iterations=range(1, HORIZON + 1, 2)):
    return [(config, iteration, known_metric(config, iteration)) for config in configs for iteration in iterations]


def test_prefix_features_are_equal_exactly_where_schedules_share_a_prefix():
    early, late = planned(MultiStep(0.1, [5], 0.1)), planned(MultiStep(0.1, [12], 0.1))
    features = PrefixFeatures([early, late], HORIZON)
    iterations = np.arange(1, HORIZON + 1)
    same = np.all(features(early, iterations) == features(late, iterations), axis=1)
    assert same.tolist() == [iteration <= 5 for iteration in iterations]
    assert np.all((features(early, iterations) >= 0) & (features(early, iterations) <= 1))


def test_prefix_features_refuse_other_hyper_parameters():
    features = PrefixFeatures([planned(Constant(0.1))], HORIZON)
    with pytest.raises(ValueError, match="momentum"):
        features(TrialConfig.from_config({"lr": 0.1, "momentum": 0.9}), [3])


def test_learning_curve_prior_recovers_a_known_power_law():
    iterations = np.arange(1, 41)
    values = 0.9 + 0.3 * (iterations**-0.5 - 1) / -0.5
    prior = LearningCurvePrior().fit(iterations, values)
    np.testing.assert_allclose(prior.params, [0.9, 0.3, -0.5], atol=1e-3)
    assert prior(np.array([10_000]))[0] == pytest.approx(0.9 + 0.3 / 0.5, abs=0.01)  # its asymptote


def test_learning_curve_prior_is_a_constant_without_enough_steps():
    prior = LearningCurvePrior().fit(np.array([1, 2, 1]), np.array([0.2, 0.4, 0.3]))
    assert prior(np.array([1, 100])).tolist() == pytest.approx([0.3, 0.3])


def test_surrogate_forecasts_an_unseen_schedule_of_a_known_function():
    train = [planned(Constant(float(lr))) for lr in np.logspace(-3, 0, 7)]
    model = PrefixSurrogate(HORIZON, seed=0).fit(measured(train))
    unseen = planned(Constant(0.05))
    mean, std = model.forecast([unseen, train[3]])
    assert mean[0] == pytest.approx(known_metric(unseen, HORIZON), abs=0.03)
    assert std[1] < std[0]  # surer where it measured


def test_surrogate_learns_from_intermediate_results_alone():
    """Trials measured up to half the horizon (running, or stopped early)
    still rank schedules at the horizon."""
    train = [planned(Constant(lr)) for lr in (0.001, 0.01, 0.1, 1.0)]
    model = PrefixSurrogate(HORIZON, seed=0).fit(measured(train, range(1, HORIZON // 2 + 1)))
    mean, _ = model.forecast(train)
    assert int(np.argmax(mean)) == 2


def test_a_candidate_forking_from_a_measured_prefix_is_forecast_from_the_measurement():
    """A path that went better than the model expects (a lucky start) stays
    better after a fork: the candidate continues from that model state."""
    luck = 0.05
    measured_trial = planned(MultiStep(0.1, [10], 0.5))
    others = [planned(Constant(lr)) for lr in (0.003, 0.03, 0.3)]
    points = measured(others) + [
        (config, iteration, value + luck) for config, iteration, value in measured([measured_trial])
    ]
    model = PrefixSurrogate(HORIZON, seed=0).fit(points)
    candidate = planned(MultiStep(0.1, [15], 0.5))  # follows measured_trial for 10 iterations
    anchor = Anchor(10, known_metric(measured_trial, 10) + luck)
    mean, _ = model.forecast([candidate], [anchor])
    assert mean[0] == pytest.approx(known_metric(candidate, HORIZON) + luck, abs=0.01)
    # the anchor is taken as measured: moving it moves the forecast by as much
    moved, _ = model.forecast([candidate], [Anchor(10, anchor.value + 0.1)])
    assert moved[0] - mean[0] == pytest.approx(0.1)


def test_monte_carlo_draws_match_the_forecast():
    train = [planned(Constant(lr)) for lr in (0.001, 0.01, 0.1, 1.0)]
    model = PrefixSurrogate(HORIZON, seed=0).fit(measured(train))
    candidates = [planned(Constant(0.05)), planned(MultiStep(0.1, [8], 0.1))]
    anchors = [None, Anchor(8, known_metric(train[2], 8))]
    draws = model.sample(candidates, anchors, 4000, np.random.default_rng(0))
    mean, std = model.forecast(candidates, anchors)
    assert draws.shape == (2, 4000)
    np.testing.assert_allclose(draws.mean(axis=1), mean, atol=4 * std.max() / np.sqrt(4000) + 1e-3)
    np.testing.assert_allclose(draws.std(axis=1), std, rtol=0.05)
