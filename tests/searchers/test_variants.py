import pickle

import numpy as np
import pytest
from ray import tune

from ray_stagetree import Constant, Cosine, CyclicLR, Exponential, MultiStep, Warmup
from ray_stagetree.planning import SearchPlan
from ray_stagetree.searchers import generate_trials
from ray_stagetree.searchers.variants import sample_variants


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
    space = {
        "lr": tune.choice([CyclicLR(0.001, tune.choice([0.05, 0.1]), 10), Cosine(0.1, 0.0, tune.choice([10, 20]))])
    }
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
    [
        ({"num_samples": 0}, "num_samples must be an int >= 1"),
        ({"num_samples": -1}, "num_samples must be an int >= 1"),  # a list without end
        ({"filter": 3}, "filter must be callable"),
    ],
)
def test_bad_arguments(kwargs, match):
    with pytest.raises((ValueError, TypeError), match=match):
        generate_trials({"lr": 0.1}, **kwargs)


def test_unresolved_config_cannot_be_planned():
    with pytest.raises(ValueError, match="still holds Tune search-space domains"):
        SearchPlan().add_trial("a", {"lr": Exponential(tune.uniform(0.1, 0.2), 0.9)}, 10)


def test_a_stream_draws_the_grid_one_repeat_at_a_time_as_generate_trials_would():
    space = {"lr": MultiStep(tune.uniform(0.01, 0.1), tune.grid_search([[5], [10]]), 0.1)}
    stream = sample_variants(space, num_samples=1000, seed=3)
    assert len(stream.drawn()) == 2 and stream.remaining == 2000  # drawn so far: one repeat of the grid
    taken = [next(stream) for _ in range(3)]
    assert len(stream.drawn()) == 1 and stream.remaining == 1997
    # between draws it pickles small and goes on as the original does
    copy = pickle.loads(pickle.dumps(stream))
    assert len(pickle.dumps(stream)) < 4000
    rest = [next(stream) for _ in range(7)]
    assert [repr(next(copy)["lr"]) for _ in range(7)] == [repr(config["lr"]) for config in rest]
    expected = generate_trials(space, num_samples=5, seed=3)
    assert [repr(c["lr"]) for c in taken + rest] == [repr(c["lr"]) for c in expected]


def test_a_stream_takes_numpys_global_state_over_without_repeating_it():
    space = {"lr": tune.uniform(0.0, 1.0)}
    np.random.seed(5)
    first = [config["lr"] for config in sample_variants(space, num_samples=4)]
    # the values drawing from the global state gives (Tune's default), wherever the stream is taken
    assert first == [config["lr"] for config in generate_trials(space, 4, seed=np.random.RandomState(5))]
    np.random.seed(5)
    stream = sample_variants(space, num_samples=4)
    later = [config["lr"] for config in sample_variants(space, num_samples=4)]
    assert [config["lr"] for config in stream] == first
    assert not set(later) & set(first), "a second study in the same process draws other trials"


def test_points_to_evaluate_come_first_and_each_draw_applies_to_every_draw():
    space = {"lr": tune.grid_search([0.1, 0.2]), "wd": 0.0}
    stream = sample_variants(
        space, num_samples=2, points_to_evaluate=[{"lr": 0.5}], each_draw=lambda configs: configs + configs
    )
    assert [config["lr"] for config in stream] == [0.5, 0.5] + [0.1, 0.2] * 2, "the point took one of the 2 samples"


def tunes_variants(space, num_samples, points):
    """The configs Tune's BasicVariantGenerator draws, in its order."""
    from ray.tune.experiment import Experiment
    from ray.tune.search.basic_variant import BasicVariantGenerator

    generator = BasicVariantGenerator(points_to_evaluate=[dict(point) for point in points], random_state=1)
    generator.add_configurations([Experiment("study", lambda config: None, config=space, num_samples=num_samples)])
    configs = []
    while (trial := generator.next_trial()) is not None:
        configs.append(trial.config)
    return configs


@pytest.mark.parametrize(
    "points, num_samples",
    [
        ([{"b": 5.0}], 2),  # the grid the point leaves open: all its values
        ([{"a": 1, "b": 5.0}], 2),
        ([{"a": 1, "b": 5.0}, {"b": 7.0}], 3),
        ([{"a": 1, "b": 5.0}, {"a": 2, "b": 7.0}], 1),  # more points than samples: the points alone
    ],
)
def test_points_to_evaluate_are_drawn_as_tune_draws_them(points, num_samples):
    """Each point gives the space's variants with its values and takes one of
    the ``num_samples`` repeats. Points used to come on top of the samples,
    each as one trial: a study of ``num_samples=3`` and two points ran 5."""
    space = {"a": tune.grid_search([1, 2]), "b": tune.quniform(0, 10, 0.5)}
    ours = list(sample_variants(space, num_samples, seed=1, points_to_evaluate=points))
    assert ours == tunes_variants(space, num_samples, points)


class CountsCopies:
    """A grid value that counts the deep copies made of it."""

    copies = 0

    def __init__(self, value):
        self.value = value

    def __deepcopy__(self, memo):
        CountsCopies.copies += 1
        return CountsCopies(self.value)


def test_a_grid_is_drawn_in_linear_time_in_tunes_order():
    """Tune's generator deep-copies the space once per variant; a grid's own
    values are not copied each time (an N-value grid cost O(N²): minutes
    before a 20,000-value study's first trial). Each value is copied for its
    own variant only, and the variants are Tune's, in Tune's order."""
    from ray.tune.search.variant_generator import generate_variants

    CountsCopies.copies = 0
    values = [CountsCopies(k) for k in range(200)]
    configs = generate_trials({"a": tune.grid_search(values), "b": tune.grid_search([1, 2]), "c": tune.uniform(0, 1)})
    assert [(config["a"].value, config["b"]) for config in configs] == [(k, b) for b in (1, 2) for k in range(200)]
    assert CountsCopies.copies <= 3 * len(configs), CountsCopies.copies  # not len(configs) * len(values)
    space = {"a": tune.grid_search(list(range(30))), "b": tune.grid_search(["x", "y"]), "c": tune.uniform(0, 1)}
    tunes = [config for _, config in generate_variants(space, random_state=np.random.default_rng(3))]
    assert generate_trials(space, seed=np.random.default_rng(3)) == tunes


def test_the_experiment_tag_names_drawn_values_as_tunes_does():
    """Grid and domain values, also inside a sequence, are in the tag; a
    ``tune.sample_from`` value (computed from the others) and constants are not,
    as in Tune's trial folder names (``..._0_a=1,c=0.9238_<date>``)."""
    from ray_stagetree.runtime.control.trials import experiment_tag
    from ray_stagetree.searchers.variants import tuned_paths

    space = {
        "a": tune.grid_search([1, 2]),
        "b": tune.sample_from(lambda spec: spec.config.a * 2),
        "c": tune.uniform(0, 1),
        "lr": MultiStep(0.1, [3], tune.choice([0.1, 0.5])),
        "d": 3,
    }
    assert tuned_paths(space) == {("a",), ("c",), ("lr",)}
    config = {"a": 1, "b": 2, "c": 0.25, "lr": MultiStep(0.1, [3], 0.5), "d": 3}
    assert experiment_tag("f_00000", config, tuned_paths(space)).startswith("0_a=1,c=0.2500,lr=")
