"""Streamed trials: trials are drawn, checked and admitted as a study goes,
so what happens before its first batch does not grow with ``num_samples``.
Counted in draws, not timed."""

from __future__ import annotations

import asyncio
import itertools

import pytest
from ray import tune

from ray_stagetree import Tuner
from ray_stagetree.planning.lifecycle import ERROR
from ray_stagetree.runtime.control.controller import StudyController
from ray_stagetree.runtime.control.spec import LoopSpec, StudySpec, WorkerSpec
from ray_stagetree.runtime.control.study_trials import ADMIT_PER_TURN
from ray_stagetree.runtime.driver.trial_sources import trial_source


def train(config):
    pass


def counted_space(draws: list[int]) -> dict:
    """A space of two grid values whose every draw is counted in ``draws``."""
    ticks = itertools.count()

    def drawn(spec):
        draws.append(next(ticks))
        return len(draws)

    return {"x": tune.sample_from(drawn), "lr": tune.grid_search([0.1, 0.2])}


@pytest.mark.parametrize("num_samples", [10, 100_000])
def test_the_driver_draws_and_checks_one_repeat_of_the_grid(num_samples):
    draws = []
    source = trial_source(
        Tuner(train, param_space=counted_space(draws), tune_config=tune.TuneConfig(num_samples=num_samples))
    )
    assert len(draws) == 2 and len(source.drawn()) == 2
    assert source.remaining == 2 * num_samples


class FirstDispatch(Exception):
    pass


@pytest.mark.parametrize("num_samples", [2_000, 100_000])
def test_the_first_batch_is_dispatched_after_a_bounded_number_of_draws(num_samples, tmp_path, ray_session):
    draws = []
    source = trial_source(
        Tuner(train, param_space=counted_space(draws), tune_config=tune.TuneConfig(num_samples=num_samples))
    )
    # No workers: the pool would start them from inside the controller's actor, and the test is the draws.
    controller = StudyController(
        StudySpec(LoopSpec(WorkerSpec(b""), str(tmp_path), num_workers=0), trial_source=source, horizon=1)
    )
    seen = []

    async def dispatch():
        seen.append((len(draws), len(controller.trials)))
        raise FirstDispatch

    controller._dispatch = dispatch
    with pytest.raises(FirstDispatch):
        asyncio.run(controller.run([]))
    assert seen == [(ADMIT_PER_TURN, ADMIT_PER_TURN)]
    assert source.remaining == 2 * num_samples - ADMIT_PER_TURN


def test_a_bad_draw_after_the_first_repeat_errs_its_trial_only(tmp_path, ray_session):
    values = iter([1, 2, {1: "not a string key"}, 4])
    space = {"x": tune.sample_from(lambda spec: next(values))}
    source = trial_source(Tuner(train, param_space=space, tune_config=tune.TuneConfig(num_samples=4)))
    controller = StudyController(StudySpec(LoopSpec(WorkerSpec(b""), str(tmp_path)), trial_source=source, horizon=1))
    controller.study.admit()
    statuses = [state.status for state in controller.trials.values()]
    assert statuses.count(ERROR) == 1 and len(statuses) == 4
    assert "config keys must be strings" in next(s.error for s in controller.trials.values() if s.status == ERROR)
