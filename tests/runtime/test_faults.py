"""Faults during a study (issue 17): what a shared stage's transient error
costs, and the storage actor's process dying."""

from __future__ import annotations

import os

import pytest
from ray import tune

from ray_stagetree import MultiStep, Tuner, get_hparams, report


def fails_once(config):
    """Raises at iteration 2 the first time (it removes the flag file), so
    a retry succeeds."""
    iteration = 0
    while True:
        iteration += 1
        if iteration == 2 and os.path.exists(config["flag"]):
            os.remove(config["flag"])
            raise RuntimeError("transient failure")
        report({"lr": get_hparams()["lr"]})


def always_fails(config):
    iteration = 0
    while True:
        iteration += 1
        if iteration == 2:
            raise RuntimeError("deterministic failure")
        report({"lr": get_hparams()["lr"]})


def study(trainable, tmp_path, flag=None):
    return Tuner(
        trainable,
        param_space={"lr": tune.grid_search([MultiStep(1.0, [m], 0.5) for m in (4, 5, 6)]), "flag": str(flag)},
        run_config=tune.RunConfig(storage_path=str(tmp_path), stop={"training_iteration": 6}, verbose=0),
    ).fit()


@pytest.mark.timeout(300)
def test_a_transient_error_on_a_shared_stage_costs_no_trial(tmp_path, ray_session):
    flag = tmp_path / "flag"
    flag.touch()
    grid = study(fails_once, tmp_path, flag)
    assert not flag.exists(), "the failure happened"
    assert not grid.errors, "the shared stage was retried once before it counted against its three trials"
    assert all(len(result.metrics_dataframe) == 6 for result in grid)


@pytest.mark.timeout(300)
def test_a_deterministic_error_on_a_shared_stage_fails_its_trials(tmp_path, ray_session):
    grid = study(always_fails, tmp_path)
    assert len(grid.errors) == 3
    assert "deterministic failure" in str(grid.errors[0])
