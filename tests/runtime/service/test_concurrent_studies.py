"""Studies that together want more stage workers than the cluster has
(issue 31: several Tuners fitting at once in one Ray cluster, each with its
own controller and no plan service). A study's workers that Ray cannot
place yet, because the others' hold the cluster, must take no batch: one
sent to such a worker waited while a placed worker of the same study sat
idle, and two studies each waiting that way never ended."""

from __future__ import annotations

import threading
import time

import ray
from ray import tune
from service_study import HORIZON, expected_total, summary
from trainables_for_tests import sum_of_lr

from ray_stagetree import MultiStep, Tuner

MILESTONES = (2, 3, 4, 5)  # four trials sharing a prefix: the study asks for both of the session's CPUs
STALLED_AFTER_S = 120.0  # generous for a loaded machine: each study alone takes seconds


def study(storage, name, sleep=0.05):
    return Tuner(
        sum_of_lr,
        param_space={"lr": tune.grid_search([MultiStep(1.0, [m], 0.5) for m in MILESTONES]), "sleep": sleep},
        run_config=tune.RunConfig(stop={"training_iteration": HORIZON}, storage_path=storage, name=name, verbose=0),
    )


def fit_at_once(tuners):
    """Every tuner's fit() from its own thread, all at once: their results, in order."""
    results = {}
    threads = [
        threading.Thread(target=lambda i=i, t=t: results.setdefault(i, t.fit()), daemon=True)
        for i, t in enumerate(tuners)
    ]
    for thread in threads:
        thread.start()
    deadline = time.monotonic() + STALLED_AFTER_S
    for thread in threads:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    assert len(results) == len(tuners), f"{len(tuners) - len(results)} of {len(tuners)} studies stalled"
    return [results[i] for i in range(len(tuners))]


def assert_complete(results):
    assert results.num_errors == 0, results.errors
    assert summary(results) == {m: expected_total(m) for m in MILESTONES}  # every trial, as trained alone
    assert results.iterations_executed == HORIZON + sum(HORIZON - m for m in MILESTONES[:-1])  # shared as alone


def test_concurrent_studies_wanting_more_workers_than_the_cluster_has_all_end(ray_session, tmp_path):
    for results in fit_at_once([study(str(tmp_path), f"study{i}") for i in range(3)]):
        assert_complete(results)


@ray.remote(num_cpus=1)
class Holder:
    """Another job's actor holding one of the cluster's CPUs."""

    def ready(self):
        return True


def test_a_study_runs_on_the_one_worker_ray_places_while_the_cluster_stays_held(ray_session, tmp_path):
    holder = Holder.remote()
    ray.get(holder.ready.remote())
    try:
        # The study starts two workers (the cluster has two CPUs): one is placed, the other waits for the
        # holder's CPU, which it never gets before the study ends.
        (results,) = fit_at_once([study(str(tmp_path), "held")])
        assert_complete(results)
    finally:
        ray.kill(holder)
