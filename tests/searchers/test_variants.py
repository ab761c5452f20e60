import pytest
from ray import tune

from ray_stagetree import Constant, Cosine, CyclicLR, Exponential, MultiStep, SearchPlan, Warmup
from ray_stagetree.searchers import generate_trials


def test_grid_over_sequence_parameters_and_sequences():
    space = {
        "lr": tune.grid_search([Constant(0.1), Warmup(0.01, 5, MultiStep(0.1, tune.grid_search([[30], [60]]), 0.1))]),
        "batch_size": tune.grid_search([128, MultiStep(values=(128, 256), milestones=[40])]),
        "seed": 0,
    }
    trials = generate_trials(space)
    assert len(trials) == 6
    lrs = {repr(t["lr"]) for t in trials}
    assert "Constant(init=0.1)" in lrs
    assert any("milestones=[30]" in lr for lr in lrs) and any("milestones=[60]" in lr for lr in lrs)
    assert all(t["seed"] == 0 for t in trials)


def test_random_domains_are_drawn_reproducibly_and_validated():
    space = {"lr": Exponential(tune.loguniform(1e-3, 1e-1), tune.choice([0.9, 0.95]))}
    first = generate_trials(space, num_samples=5, seed=1)
    again = generate_trials(space, num_samples=5, seed=1)
    assert [t["lr"] for t in first] == [t["lr"] for t in again]
    for trial in first:
        assert trial["lr"].is_resolved and 1e-3 <= trial["lr"].value(0) <= 1e-1


def test_domains_inside_a_sampled_sequence_are_resolved():
    space = {"lr": tune.choice([CyclicLR(0.001, tune.choice([0.05, 0.1]), 10), Cosine(0.1, 0.0, tune.choice([10, 20]))])}
    trials = generate_trials(space, num_samples=20, seed=0)
    assert all(t["lr"].is_resolved for t in trials)
    # drawn trials go straight into a plan
    plan = SearchPlan()
    plan.add_trials((str(i), t, 50) for i, t in enumerate(trials))


def test_filter_drops_combinations():
    space = {"lr": tune.grid_search([0.1, 0.01]), "optimizer": tune.grid_search(["sgd", "adam"])}
    kept = generate_trials(space, filter=lambda c: not (c["optimizer"] == "adam" and c["lr"] == 0.1))
    assert len(kept) == 3


def test_a_domain_that_draws_a_bad_value_raises_naming_the_parameter():
    with pytest.raises(ValueError, match="gamma"):
        generate_trials({"lr": Exponential(0.1, tune.choice([-1.0]))})


@pytest.mark.parametrize(
    "kwargs, match",
    [({"num_samples": 0}, "num_samples must be an int >= 1"), ({"filter": 3}, "filter must be callable")],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        generate_trials({"lr": 0.1}, **kwargs)


def test_unresolved_config_cannot_be_planned():
    with pytest.raises(ValueError, match="still holds Tune search-space domains"):
        SearchPlan().add_trial("a", {"lr": Exponential(tune.uniform(0.1, 0.2), 0.9)}, 10)
