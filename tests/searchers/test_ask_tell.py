"""Ask/tell algorithms as Tune searchers: batches asked, run and told in
order, driven through the same SearcherSource a study uses (no Ray started),
and one end to end in a study."""

import pytest
from evolution_search import RegularizedEvolution
from ray import tune

from ray_stagetree import Exponential
from ray_stagetree.searchers import AskTellAlgorithm, AskTellSearcher
from ray_stagetree.searchers.sources import WAIT, SearcherSource


class Recorder(AskTellAlgorithm):
    """Asks for lr = 0.1 * (batch index + 1), records what it is told."""

    def __init__(self, batches=2):
        self.batches, self.asked, self.told = batches, [], []

    def ask(self, n):
        if len(self.asked) == self.batches:
            return []
        self.asked.append(n)
        return [{"lr": {"init": 0.1 * len(self.asked) + i}} for i in range(n)]

    def tell(self, results):
        self.told.append(results)


SPACE = {"lr": Exponential(tune.uniform(0.0, 1.0), 0.9), "seed": 0}


def drain(source):
    trials = []
    while (trial := source.next_trial()) not in (None, WAIT):
        trials.append(trial)
    return trials, trial


def test_batches_are_asked_run_and_told_in_turn():
    algorithm = Recorder()
    source = SearcherSource(AskTellSearcher(algorithm, batch_size=3), SPACE, "loss", "min", num_samples=100)
    assert (algorithm.metric, algorithm.mode) == ("loss", "min")
    first, stop = drain(source)
    assert stop == WAIT and len(first) == 3 and algorithm.asked == [3]
    assert first[0][1] == {"lr": Exponential(0.1, 0.9), "seed": 0}  # the space's own values kept
    source.on_complete(first[0][0], {"loss": 1.0})
    source.on_complete(first[1][0], None, error=True)
    assert algorithm.told == [] and drain(source)[1] == WAIT  # the batch is not over
    source.on_complete(first[2][0], {"accuracy": 0.5})
    assert algorithm.told == [
        [({"lr": {"init": 0.1}}, 1.0), ({"lr": {"init": 1.1}}, None), ({"lr": {"init": 2.1}}, None)]
    ]
    second, _ = drain(source)
    assert [config["lr"].init for _, config in second] == [0.2, 1.2, 2.2]
    for trial_id, _ in second:
        source.on_complete(trial_id, {"loss": 0.5})
    assert drain(source) == ([], None) and source.remaining == 0  # an empty ask ends the search


def test_num_samples_cuts_a_batch():
    source = SearcherSource(AskTellSearcher(Recorder(), batch_size=4), SPACE, "loss", "min", num_samples=2)
    assert len(drain(source)[0]) == 2


def test_bad_arguments_and_answers_are_named():
    with pytest.raises(ValueError, match="batch_size must be an int >= 1, got 0"):
        AskTellSearcher(Recorder(), batch_size=0)
    with pytest.raises(TypeError, match="algorithm must be an AskTellAlgorithm, got dict"):
        AskTellSearcher({})

    class Greedy(Recorder):
        def ask(self, n):
            return [{"lr": {"init": 0.1}}] * (n + 1)

    source = SearcherSource(AskTellSearcher(Greedy(), batch_size=2), SPACE, "loss", "min", num_samples=10)
    with pytest.raises(ValueError, match=r"Greedy.ask\(2\) returned 3 configurations"):
        source.next_trial()
    with pytest.raises(ValueError, match="needs a metric"):
        SearcherSource(AskTellSearcher(Recorder()), SPACE, None, None, num_samples=1)


def test_regularized_evolution_mutates_the_best_of_its_population():
    algorithm = RegularizedEvolution(population_size=4, sample_size=4, seed=0)
    source = SearcherSource(AskTellSearcher(algorithm, batch_size=4), SPACE, "loss", "min", num_samples=8)
    first, _ = drain(source)
    for trial_id, config in first:
        source.on_complete(trial_id, {"loss": config["lr"].init})
    best = min(config["lr"].init for _, config in first)
    second, _ = drain(source)
    # Sample size = population: every child is the best parent with its one searched value redrawn.
    assert len(second) == 4 and len(algorithm.population) == 4
    assert all(config["lr"].init != best for _, config in second)
    with pytest.raises(ValueError, match="use tune.choice instead of grid_search at lr"):
        SearcherSource(AskTellSearcher(RegularizedEvolution()), {"lr": tune.grid_search([1, 2])}, "loss", "min", 1)


class TellCounter(AskTellAlgorithm):
    """Each configuration carries how many scores the algorithm had been told when it was asked."""

    def __init__(self):
        self.scores = 0

    def ask(self, n):
        return [{"lr": {"init": 0.1 * (i + 1)}, "told": self.scores} for i in range(n)]

    def tell(self, results):
        self.scores += sum(score is not None for _, score in results)


def test_an_ask_tell_algorithm_runs_a_study(ray_session):
    from trainables_for_tests import noisy_descent

    from ray_stagetree import Tuner

    results = Tuner(
        noisy_descent,
        param_space={"lr": Exponential(tune.uniform(0.01, 0.5), 0.9)},
        tune_config=tune.TuneConfig(
            metric="loss", mode="min", num_samples=4, search_alg=AskTellSearcher(TellCounter(), batch_size=2)
        ),
        run_config=tune.RunConfig(stop={"training_iteration": 3}, verbose=0),
    ).fit()
    assert results.num_errors == 0
    # The second batch was asked for once the first had been told both scores.
    assert sorted(result.config["told"] for result in results) == [0, 0, 2, 2]
    assert sorted(result.config["lr"].init for result in results) == [0.1, 0.1, 0.2, 0.2]
