"""Where trials come from: Tune searchers proposing sequences."""

import math
import pickle

import pytest
from ray import tune
from ray.tune.search import ConcurrencyLimiter, Repeater, Searcher

from ray_stagetree import Constant, MultiStep
from ray_stagetree.runtime.driver.arguments import max_pending_trials
from ray_stagetree.searchers.sources import SearcherSource, VariantSource, from_searchable, searchable_space
from ray_stagetree.searchers.variants import sample_variants


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


class Dataset:
    """A value no searcher can take: an object."""

    def __init__(self, rows):
        self.rows = rows


@pytest.mark.parametrize("searcher_name", ["optuna", "hyperopt"])
def test_tunes_searchers_propose_configs_with_functions_and_objects_as_under_tune(searcher_name):
    """Tune gives a searcher ``tune.sample_from`` functions and objects as
    placeholders and resolves them in each suggestion; they used to reach
    the searcher as they are (Optuna: "does not support parameters of type
    `Function`")."""
    pytest.importorskip(searcher_name)
    if searcher_name == "optuna":
        from ray.tune.search.optuna import OptunaSearch as Searcher
    else:
        from ray.tune.search.hyperopt import HyperOptSearch as Searcher
    data = Dataset([1, 2, 3])
    space = {
        "x": tune.uniform(0, 1),
        "double_x": tune.sample_from(lambda spec: 2 * spec.config.x),
        "data": data,
        "pick": tune.choice([Dataset([1]), Dataset([2])]),
        "lr": MultiStep(tune.uniform(0.1, 1.0), [4], 0.5),
    }
    source = SearcherSource(Searcher(), space, metric="x", mode="max", num_samples=3)
    for _ in range(3):
        trial_id, config = source.next_trial()
        assert config["double_x"] == 2 * config["x"]
        assert isinstance(config["data"], Dataset) and config["data"].rows == [1, 2, 3]
        assert isinstance(config["pick"], Dataset) and config["pick"].rows in ([1], [2])
        assert isinstance(config["lr"], MultiStep) and 0.1 <= config["lr"].init <= 1.0
        source.on_complete(trial_id, {"x": config["x"], "training_iteration": 1})
    assert space["pick"].categories[0].rows == [1], "the user's param_space is left as it was"


def test_a_searchers_pending_trial_limit_is_tunes():
    """Tune's rule (TuneController's _get_max_pending_trials): the
    TUNE_MAX_PENDING_TRIALS_PG setting, else a ConcurrencyLimiter's
    max_concurrent anywhere in the searcher's chain, else
    max_concurrent_trials (which Tune applies as such a limiter), else 1."""

    def source(searcher):
        return SearcherSource(searcher, {"x": tune.uniform(0, 1)}, "loss", "min", 10)

    assert source(Searcher()).pending_limit(None, None) == 1
    assert source(Searcher()).pending_limit(None, 3) == 3
    limited = source(Repeater(ConcurrencyLimiter(Searcher(), max_concurrent=4), repeat=2))
    assert limited.pending_limit(None, None) == 4
    assert limited.pending_limit(7, None) == 7


def test_variants_wait_for_workers_without_limit_unless_drawn_without_end():
    """A list of variants has no pending limit unless TUNE_MAX_PENDING_TRIALS_PG
    sets one (as Tune bounds its variants); a stream without end
    (num_samples=-1) has a searcher's: max_concurrent_trials, else 1."""
    assert VariantSource([{"x": 1}]).pending_limit(None, 2) is None
    assert VariantSource([{"x": 1}]).pending_limit(7, 2) == 7
    endless = VariantSource(sample_variants({"x": tune.uniform(0, 1)}, -1, seed=0))
    assert endless.open_ended and endless.remaining == math.inf
    assert endless.pending_limit(None, None) == 1 and endless.pending_limit(None, 3) == 3
    assert endless.pending_limit(5, 3) == 5


def test_a_stream_without_end_skips_repeated_configs_and_ends_when_only_repeats_come():
    space = {"lr": tune.choice([0.1, 0.2]), "decay": MultiStep(0.1, tune.choice([[5], [10]]), 0.5)}
    source = VariantSource(sample_variants(space, -1, seed=0), skip_repeats=True)
    drawn = [proposal[1] for proposal in iter(source.next_trial, None)]
    assert len(drawn) == 4 and len({(config["lr"], repr(config["decay"])) for config in drawn}) == 4
    assert source.remaining == 0 and source.pending_limit(None, None) is None
    # Without stage sharing a repeat trains again, as under Tune: repeats are kept.
    repeating = VariantSource(sample_variants(space, -1, seed=0))
    assert len({repr(repeating.next_trial()[1]) for _ in range(20)}) == 4 and repeating.remaining == math.inf
    copy = pickle.loads(pickle.dumps(source))  # a study snapshot holds it
    assert copy.next_trial() is None
    older = VariantSource([{"lr": 0.1}])
    for attribute in ("_seen", "_exhausted"):  # a snapshot saved before they were kept
        del older.__dict__[attribute]
    assert pickle.loads(pickle.dumps(older)).next_trial()[1] == {"lr": 0.1}


@pytest.mark.parametrize("value, expected", [("auto", None), (" AUTO ", None), ("3", 3)])
def test_tune_max_pending_trials_pg_is_read_as_tune_reads_it(monkeypatch, value, expected):
    monkeypatch.setenv("TUNE_MAX_PENDING_TRIALS_PG", value)
    assert max_pending_trials() == expected


@pytest.mark.parametrize("value", ["0", "-2", "many", "1.5"])
def test_a_bad_tune_max_pending_trials_pg_is_refused_by_name(monkeypatch, value):
    monkeypatch.setenv("TUNE_MAX_PENDING_TRIALS_PG", value)
    with pytest.raises(ValueError, match=rf"TUNE_MAX_PENDING_TRIALS_PG.*{value}"):
        max_pending_trials()
