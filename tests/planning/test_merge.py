import pytest
from paper_examples import FIGURE_4_HORIZON, FIGURE_4_TRIALS

from ray_stagetree import Constant, MultiStep, kwise_merge_rate, merge_rate
from ray_stagetree.searchers import generate_trials
from ray_stagetree.simulation.paper_spaces import RESNET56_HORIZON, resnet56_space


def test_merge_rate_of_figure_4():
    assert merge_rate(FIGURE_4_TRIALS.values(), FIGURE_4_HORIZON) == pytest.approx(1200 / 700)


def test_disjoint_trials_have_merge_rate_one():
    assert merge_rate([{"lr": Constant(v)} for v in (0.1, 0.2, 0.3)], 50) == 1.0


def test_per_trial_horizons():
    configs = [{"lr": MultiStep(0.1, [100], 0.1)}] * 2
    assert merge_rate(configs, [50, 150]) == pytest.approx(200 / 150)
    with pytest.raises(ValueError, match="2 horizons for 3 trials"):
        merge_rate(configs + configs[:1], [50, 150])


def test_kwise_merge_rate_shares_across_studies():
    study_a = [{"lr": MultiStep(0.1, [100], 0.1)}]
    study_b = [{"lr": MultiStep(0.1, [150], 0.1)}]
    assert merge_rate(study_a, 200) == merge_rate(study_b, 200) == 1.0
    assert kwise_merge_rate([study_a, study_b], 200) == pytest.approx(400 / 300)
    assert kwise_merge_rate([study_a, study_b], [200, [100]]) == pytest.approx(300 / 200)


def test_resnet56_grid_of_table_2_shares_prefixes():
    trials = generate_trials(resnet56_space())
    assert len(trials) == 120
    rate = merge_rate(trials, RESNET56_HORIZON)
    assert 1.2 < rate < 2.0


def test_empty_study_is_an_error():
    with pytest.raises(ValueError, match="at least one trial"):
        merge_rate([], 10)
