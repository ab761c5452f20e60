"""Where trials come from: Tune searchers proposing sequences."""

import pytest
from ray import tune

from ray_stagetree import Constant, MultiStep
from ray_stagetree.searchers.sources import SearcherSource, from_searchable, searchable_space


def test_lists_holding_domains_reach_searchers_as_dicts_and_come_back_as_lists():
    space = {"lr": {"milestones": [tune.randint(1, 5), 8], "gamma": 0.5}, "plain": [1, 2]}
    searchable = searchable_space(space)
    assert set(searchable["lr"]["milestones"]) == {"__stagetree_list__", "0", "1"}
    assert searchable["plain"] == [1, 2], "lists without domains stay lists"
    suggested = {"lr": {"milestones": {"__stagetree_list__": True, "0": 3, "1": 8}, "gamma": 0.5}, "plain": [1, 2]}
    assert from_searchable(suggested) == {"lr": {"milestones": [3, 8], "gamma": 0.5}, "plain": [1, 2]}


@pytest.mark.parametrize("searcher_name", ["optuna", "hyperopt"])
def test_tunes_searchers_propose_sequences_with_domains_in_lists(searcher_name):
    """Optuna and HyperOpt name parameters by string paths: a MultiStep's
    milestone drawn from a domain used to fail inside them with a TypeError."""
    if searcher_name == "optuna":
        pytest.importorskip("optuna")
        from ray.tune.search.optuna import OptunaSearch as Searcher
    else:
        pytest.importorskip("hyperopt")
        from ray.tune.search.hyperopt import HyperOptSearch as Searcher
    space = {"lr": MultiStep(tune.uniform(0.1, 1.0), [tune.randint(1, 5), 9], 0.5), "wd": Constant(0.0)}
    source = SearcherSource(Searcher(), space, metric="x", mode="max", num_samples=3)
    for _ in range(3):
        trial_id, config = source.next_trial()
        lr = config["lr"]
        assert isinstance(lr, MultiStep) and 1 <= lr.milestones[0] < 5 and lr.milestones[1] == 9
        assert 0.1 <= lr.init <= 1.0 and config["wd"] == Constant(0.0)
        source.on_complete(trial_id, {"x": lr.init, "training_iteration": 1})
    assert source.next_trial() is None
