"""Time-sharing policies on simulated GPUs: pre-emption loses and repeats
nothing, and convergence priority finds good jobs that FIFO reaches last."""

import dataclasses

import pytest

from ray_stagetree import FifoPolicy, HermesPolicy, RoundRobinPolicy, SlaqPolicy
from ray_stagetree.simulation.time_sharing_study import (
    ITERATIONS,
    MODELS,
    make_bins,
    mean_time_to_target,
    run_bin,
    simulate_bin,
)

GOOGLENET = MODELS[0]


def test_preempted_jobs_resume_where_they_stopped_and_report_what_they_would_have():
    job_bin = make_bins(GOOGLENET, 2, 1)[0]
    fifo_plan, fifo = simulate_bin(job_bin, FifoPolicy())
    plan, shared = simulate_bin(job_bin, RoundRobinPolicy(quantum_s=5))
    assert fifo.yielded == 0 and shared.yielded > 30
    assert shared.checkpoint_loads == shared.yielded  # every pre-empted job is resumed once per pre-emption
    assert shared.iterations == fifo.iterations == 16 * ITERATIONS  # nothing retrained, nothing lost
    for i in range(16):
        trial = f"job{i:02d}"
        resumed, alone = plan.history(trial), fifo_plan.history(trial)
        assert sorted(resumed) == list(range(1, ITERATIONS + 1))
        assert [resumed[k]["loss"] for k in sorted(resumed)] == [alone[k]["loss"] for k in sorted(alone)]


def test_convergence_priority_reaches_good_jobs_submitted_last_sooner():
    job_bin = make_bins(GOOGLENET, 1, 1)[0]
    order = sorted(range(16), key=lambda i: i in job_bin.good)  # the 4 good jobs come last
    good_last = frozenset(range(12, 16))
    last = dataclasses.replace(job_bin, jobs=tuple(job_bin.jobs[i] for i in order), good=good_last, top=good_last)
    times = {
        name: run_bin(last, make()).average_time_to_target
        for name, make in {
            "hermes": lambda: HermesPolicy("loss", "min"),
            "fifo": FifoPolicy,
            "rr": RoundRobinPolicy,
            "slaq": lambda: SlaqPolicy("loss", "min"),
        }.items()
    }
    assert times["hermes"] < min(times["fifo"], times["rr"], times["slaq"])
    assert times["hermes"] == pytest.approx(run_bin(last, HermesPolicy("loss", "min")).average_time_to_target)


def test_the_metric_is_the_good_jobs_mean_time_to_90_percent_of_the_optimum():
    """The paper's figure of merit: each good job's first result at 90% of
    the best final accuracy among all 192 combinations, averaged over the
    good jobs only (bad jobs never count, even when they reach it)."""
    job_bin = make_bins(GOOGLENET, 1, 1)[0]
    plan, _ = simulate_bin(job_bin, FifoPolicy())
    firsts = {}
    for i in range(16):
        history = plan.history(f"job{i:02d}")
        reached = [history[at]["time_total_s"] for at in sorted(history) if history[at]["accuracy"] >= job_bin.target]
        firsts[i] = reached[0] if reached else None
    assert all(firsts[i] is not None for i in job_bin.good)
    expected = sum(firsts[i] for i in job_bin.good) / len(job_bin.good)
    assert mean_time_to_target(plan, job_bin, job_bin.good) == pytest.approx(expected)
    assert len(job_bin.good) == 4 and len(make_bins(GOOGLENET, 2, 1)[0].good) == 12


@pytest.mark.parametrize("bin_type", [1, 2])
def test_the_top_four_are_the_bins_best_final_accuracies_and_in_bin_type_1_its_good_jobs(bin_type):
    """Figure 6's jobs: the four of a bin trained alone to the highest final
    accuracy (all of them good); the run times exactly those."""
    job_bin = make_bins(GOOGLENET, bin_type, 1)[0]
    plan, _ = simulate_bin(job_bin, FifoPolicy())
    finals = {i: plan.history(f"job{i:02d}")[ITERATIONS]["accuracy"] for i in range(16)}
    assert len(job_bin.top) == 4 and job_bin.top <= job_bin.good
    assert min(finals[i] for i in job_bin.top) >= max(finals[i] for i in set(range(16)) - job_bin.top) - 0.02
    if bin_type == 1:
        assert job_bin.top == job_bin.good
    run = run_bin(job_bin, FifoPolicy())
    assert run.top_time_to_target == pytest.approx(mean_time_to_target(plan, job_bin, job_bin.top))
    assert run.average_time_to_target == pytest.approx(mean_time_to_target(plan, job_bin, job_bin.good))
