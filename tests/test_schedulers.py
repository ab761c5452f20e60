"""Hosted Tune schedulers decide exactly as Ray's own on the same results."""

import random

import numpy as np
import pytest
from ray.tune.schedulers import (
    ASHAScheduler,
    FIFOScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    PopulationBasedTraining,
    TrialScheduler,
)

from ray_stagetree.schedulers import SchedulerHost, TrialProxy

HORIZON = 16


def recorded_stream(trials=12, seed=0):
    """Interleaved (trial, iteration, loss) results, as a study produces them."""
    rnd = random.Random(seed)
    quality = {f"t{i}": rnd.random() for i in range(trials)}
    progress = {trial: 0 for trial in quality}
    stream = []
    while any(step < HORIZON for step in progress.values()):
        trial = rnd.choice([t for t, step in progress.items() if step < HORIZON])
        progress[trial] += 1
        stream.append((trial, progress[trial], quality[trial] / progress[trial] + rnd.random() * 0.05))
    return stream


def decisions_by_ray(scheduler, stream):
    """Ray's scheduler fed directly, as TuneController feeds it."""
    trials, stopped, out = {}, set(), []
    for trial_id, step, loss in stream:
        if trial_id in stopped:
            continue
        if trial_id not in trials:
            trials[trial_id] = TrialProxy(trial_id, {})
            scheduler.on_trial_add(None, trials[trial_id])
        decision = scheduler.on_trial_result(None, trials[trial_id], {"training_iteration": step, "loss": loss})
        out.append((trial_id, step, decision))
        if decision == TrialScheduler.STOP:
            stopped.add(trial_id)
    return out


def decisions_hosted(scheduler, stream):
    host = SchedulerHost(scheduler, "loss", "min", HORIZON)
    added, stopped, out = set(), set(), []
    for trial_id, step, loss in stream:
        if trial_id in stopped:
            continue
        if trial_id not in added:
            added.add(trial_id)
            host.on_add(trial_id, {})
        decision = host.on_result(trial_id, {"training_iteration": step, "loss": loss})
        out.append((trial_id, step, decision))
        if decision == TrialScheduler.STOP:
            stopped.add(trial_id)
    return out


@pytest.mark.parametrize(
    "make",
    [
        lambda: ASHAScheduler(metric="loss", mode="min", max_t=HORIZON, grace_period=1, reduction_factor=2),
        lambda: ASHAScheduler(metric="loss", mode="min", max_t=HORIZON, grace_period=2, reduction_factor=3, brackets=3),
        lambda: MedianStoppingRule(metric="loss", mode="min", grace_period=3, min_samples_required=3),
        lambda: FIFOScheduler(),
    ],
    ids=["asha", "asha-3-brackets", "median", "fifo"],
)
def test_same_decisions_as_rays_own_scheduler(make):
    stream = recorded_stream()
    np.random.seed(1)
    expected = decisions_by_ray(make(), stream)
    np.random.seed(1)
    assert decisions_hosted(make(), stream) == expected
    if "STOP" in {d for _, _, d in expected}:
        assert sum(d == "STOP" for _, _, d in expected) >= 1


def test_requests_are_sized_to_the_next_asha_rung():
    host = SchedulerHost(ASHAScheduler(max_t=HORIZON, grace_period=1, reduction_factor=2), "loss", "min", HORIZON)
    host.on_add("t", {})
    assert [host.next_decision("t", step) for step in (0, 1, 3, 4, 8, 15)] == [1, 2, 4, 8, 16, 16]
    fifo = SchedulerHost(None, None, None, HORIZON)
    fifo.on_add("t", {})
    assert fifo.next_decision("t", 0) == HORIZON


@pytest.mark.parametrize(
    "make",
    [lambda: HyperBandScheduler(), lambda: PopulationBasedTraining(hyperparam_mutations={"lr": [0.1, 0.01]})],
    ids=["hyperband", "pbt"],
)
def test_schedulers_that_pause_are_rejected_clearly(make):
    with pytest.raises(NotImplementedError, match="pauses trials"):
        SchedulerHost(make(), "loss", "min", HORIZON)


def test_a_custom_scheduler_that_pauses_fails_clearly():
    class Pausing(FIFOScheduler):
        def on_trial_result(self, tune_controller, trial, result):
            return TrialScheduler.PAUSE

    host = SchedulerHost(Pausing(), "loss", "min", HORIZON)
    host.on_add("t", {})
    with pytest.raises(NotImplementedError, match="pausing is not supported"):
        host.on_result("t", {"training_iteration": 1, "loss": 1.0})
