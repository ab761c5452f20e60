"""The conformance kit (`ray_stagetree.testing`) on every implementation the
project ships: each sequence family, execution policy, hosted trial
scheduler family and searcher passes it, and a broken one fails it by name."""

from __future__ import annotations

import pytest
from ray.tune.schedulers import (
    ASHAScheduler,
    FIFOScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    PopulationBasedTraining,
)

from ray_stagetree import sequences
from ray_stagetree.planning.policies import POLICIES, CriticalPathPolicy, get_policy
from ray_stagetree.sequences import FAMILIES
from ray_stagetree.testing import check_execution_policy, check_searcher, check_sequence, check_trial_scheduler
from ray_stagetree.trial_schedulers.promoting_asha import PromotingASHAScheduler

S = sequences
ONE_OF_EACH = [
    S.Constant(0.1),
    S.Constant("adam"),
    S.Exponential(0.1, 0.9),
    S.Step(0.1, 30, 0.1),
    S.MultiStep(0.1, [10, 50], 0.1),
    S.MultiStep(values=[128, 256], milestones=[70]),
    S.CyclicLR(0.01, 0.1, 10),
    S.Cosine(0.1, 0.0, 10, 2),
    S.Warmup(0.0, 5, S.MultiStep(0.1, [100], 0.1)),
    S.Linear(0.01, 0.1, 10),
    S.OneCycle(0.5, 100, three_phase=True, anneal_strategy="linear"),
    S.Polynomial(0.1, 100, 2.0, 0.001),
    S.InverseSqrt(0.1, 40),
    S.Values([1, 2, 3]),
    S.Concat([0.1, S.Exponential(0.1, 0.9), S.Values(["a", "b"])], [10, 20]),
]


def test_the_sequence_cases_cover_every_family():
    assert {sequence.family for sequence in ONE_OF_EACH} == set(FAMILIES)


@pytest.mark.parametrize("sequence", ONE_OF_EACH, ids=repr)
def test_every_sequence_family_conforms(sequence):
    check_sequence(sequence)


@pytest.mark.parametrize("name", sorted(POLICIES))
def test_every_execution_policy_conforms(name):
    check_execution_policy(get_policy(name))


class ForgetsRequests(CriticalPathPolicy):
    """Dispatches one batch, then nothing: requests stay unserved."""

    dispatched = False

    def select(self, plan, idle_workers, admit=None):
        if self.dispatched:
            return []
        chosen = super().select(plan, 1, admit)
        self.dispatched = bool(chosen)
        return chosen


def test_a_policy_that_leaves_requests_unserved_fails_by_name():
    with pytest.raises(AssertionError, match="ForgetsRequests on the 'forks' plan.*unserved"):
        check_execution_policy(ForgetsRequests(), workers=(1,))


SCHEDULERS = {
    "fifo": lambda: FIFOScheduler(),
    "asha": lambda: ASHAScheduler(metric="accuracy", mode="max", max_t=24, grace_period=4, reduction_factor=2),
    "hyperband": lambda: HyperBandScheduler(metric="accuracy", mode="max", max_t=24, reduction_factor=2),
    "median": lambda: MedianStoppingRule(metric="accuracy", mode="max", grace_period=4, min_samples_required=2),
    "pbt": lambda: PopulationBasedTraining(
        metric="accuracy", mode="max", perturbation_interval=6, hyperparam_mutations={"momentum": [0.8, 0.9]}
    ),
    "promoting_asha": lambda: PromotingASHAScheduler(
        metric="accuracy", mode="max", max_t=24, grace_period=4, reduction_factor=2
    ),
}


@pytest.mark.parametrize("name", sorted(SCHEDULERS))
def test_every_hosted_scheduler_family_conforms(name):
    check_trial_scheduler(SCHEDULERS[name])


def searchers():
    from ray_stagetree.searchers import StructuredBO

    found = {"structured_bo": lambda: StructuredBO(metric="accuracy", mode="max", seed=0)}
    try:
        from ray.tune.search.optuna import OptunaSearch

        found["optuna"] = lambda: OptunaSearch(metric="accuracy", mode="max", seed=0)
    except ImportError:
        pass
    return found


@pytest.mark.parametrize("name", sorted(searchers()))
def test_searchers_over_sequences_conform(name):
    check_searcher(searchers()[name])
