"""Searchers given to a Tuner as every Tune searcher is: constructed with no
arguments, the space in ``param_space`` (Tune domains inside a sequence's
list), the horizon from ``RunConfig.stop`` or the scheduler, end to end."""

import pytest
from ray import tune
from ray.tune.schedulers import ASHAScheduler

from ray_stagetree import MultiStep, Tuner, get_hparams
from ray_stagetree.searchers import StructuredBO

ITERATIONS = 6
SPACE = {"lr": MultiStep(tune.uniform(0.01, 0.5), [tune.randint(2, 8)], 0.3)}


def decay(config):
    """Loss falls by this iteration's learning rate; ends after ITERATIONS by itself."""
    loss = 1.0
    for _ in range(ITERATIONS):
        loss *= 1 - get_hparams()["lr"]
        tune.report({"loss": loss})


def study(tmp_path, search_alg, num_samples, stop=None, scheduler=None):
    tuner = Tuner(
        decay,
        param_space=SPACE,
        tune_config=tune.TuneConfig(
            search_alg=search_alg, num_samples=num_samples, metric="loss", mode="min", scheduler=scheduler
        ),
        run_config=tune.RunConfig(stop=stop, storage_path=str(tmp_path), name="study", verbose=0),
    )
    grid = tuner.fit()
    assert grid.num_errors == 0, grid.errors
    assert len(grid) == num_samples
    milestones = {milestone(result.config["lr"]) for result in grid}
    assert milestones <= set(range(2, 8)) and len(milestones) > 1, "milestones drawn from tune.randint(2, 8)"
    return grid


def milestone(lr):
    """The first milestone of a trial's MultiStep (its spec, as result.config shows it today, or the object)."""
    return lr["milestones"][0] if isinstance(lr, dict) else lr.milestones[0]


@pytest.mark.parametrize(
    "stop, scheduler",
    [
        ({"training_iteration": ITERATIONS}, None),
        (None, ASHAScheduler(max_t=ITERATIONS, grace_period=2)),
        (None, None),  # open-ended: the trainable ends its trials
    ],
    ids=["stop", "max_t", "open_ended"],
)
def test_structured_bo_with_no_arguments_searches_the_tuners_param_space(tmp_path, ray_session, stop, scheduler):
    """It used to need horizon= and the space in its constructor; given the
    space through param_space, every study failed with "100 random draws ...
    refuse their parameters"."""
    study(tmp_path, StructuredBO(), 12, stop, scheduler)


@pytest.mark.parametrize("name", ["optuna", "hyperopt"])
def test_tunes_searchers_search_domains_inside_a_sequences_list(tmp_path, ray_session, name):
    if name == "optuna":
        pytest.importorskip("optuna")
        from ray.tune.search.optuna import OptunaSearch as Searcher
    else:
        pytest.importorskip("hyperopt")
        from ray.tune.search.hyperopt import HyperOptSearch as Searcher
    study(tmp_path, Searcher(), 4, {"training_iteration": ITERATIONS})
