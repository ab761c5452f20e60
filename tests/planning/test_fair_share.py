"""Fair shares of workers between studies on one plan (planning.fair_share)."""

from ray_stagetree import Constant, CriticalPathPolicy
from ray_stagetree.planning import SearchPlan
from ray_stagetree.planning.fair_share import FairShare


def two_studies(big=40, small=2):
    """A plan with ``big`` trials of study "big" and ``small`` of study "small",
    sharing nothing (each trial its own learning rate, so its own root)."""
    plan = SearchPlan()
    for index in range(big):
        plan.add_trial(f"big/{index}", {"lr": Constant(1.0 + index)}, 10)
    for index in range(small):
        plan.add_trial(f"small/{index}", {"lr": Constant(-1.0 - index)}, 10)
    return plan


def fair_share(capacity, weights=None):
    return FairShare(
        CriticalPathPolicy(), lambda trial_id: trial_id.split("/")[0], lambda: capacity, lambda: weights or {}
    )


def served(plan, batches):
    return [sorted({t.split("/")[0] for s in b.stages for r in s.requests for t in r.trials}) for b in batches]


def test_a_large_study_does_not_starve_a_small_one():
    plan = two_studies()
    # The critical-path policy alone would give all four workers to the big
    # study (its trials come first, equal paths); the bound holds it to two.
    batches = fair_share(4).select(plan, 4)
    assert sorted(map(tuple, served(plan, batches))) == [("big",), ("big",), ("small",), ("small",)]


def test_weights_set_the_shares():
    plan = two_studies(small=10)
    share = fair_share(4, {"big": 3.0, "small": 1.0})
    assert share.shares(plan) == {"big": 3, "small": 1}
    assert sorted(map(tuple, served(plan, share.select(plan, 4)))) == [("big",)] * 3 + [("small",)]


def test_a_study_alone_or_whose_neighbour_has_nothing_ready_uses_every_worker():
    plan = two_studies(small=1)
    batches = fair_share(4).select(plan, 4)
    assert len(batches) == 4  # work-conserving: 1 small, then 3 big though its share is 2
    assert fair_share(4).running(plan) == {"big": 3, "small": 1}


def test_a_freed_worker_goes_to_the_study_below_its_share():
    plan = two_studies(small=3)
    share = fair_share(2)
    first = share.select(plan, 2)
    assert sorted(map(tuple, served(plan, first))) == [("big",), ("small",)]
    big_batch = next(b for b in first if served(plan, [b]) == [["big"]])
    plan.release_batch(big_batch.batch_id)  # big's batch ended; small still holds one worker
    assert served(plan, share.select(plan, 1)) == [["big"]]  # both at their share of 1 again


def test_a_shared_batch_counts_for_each_study_it_serves():
    plan = SearchPlan()
    plan.add_trial("a/0", {"lr": Constant(1.0)}, 10)
    plan.add_trial("b/0", {"lr": Constant(1.0)}, 10)  # the same trial in another study: one stage
    share = fair_share(2)
    (batch,) = share.select(plan, 2)
    assert served(plan, [batch]) == [["a", "b"]]
    assert share.running(plan) == {"a": 1, "b": 1}


def test_a_fair_share_stands_in_for_its_policy():
    """The controller calls the policy's time-sharing hooks on whatever
    selects its batches: a fair share forwards them to its policy."""
    from ray_stagetree.planning.fair_share import FairShare
    from ray_stagetree.planning.policies import CriticalPathPolicy

    policy = CriticalPathPolicy()
    share = FairShare(policy, lambda trial_id: None, lambda: 2, dict)
    share.bind(2)
    assert share.cost_model is policy.cost_model and share.name == "critical_path"
    assert share.started(None, 0.0) is None and share.quantum_deadline(0) is None


def scanned_shares(share, plan):
    """The shares from a walk over every open request (what `FairShare.shares`
    counts incrementally instead)."""
    import math

    busy = share.studies(request for request in plan.open_requests() if request.trials)
    weights, capacity = share.weights(), share.capacity()
    total = sum(weights.get(study, 1.0) for study in busy)
    return {study: max(1, math.floor(capacity * weights.get(study, 1.0) / total)) for study in busy}


def test_incremental_shares_equal_the_scan_through_a_plans_changes():
    import random

    from ray_stagetree import MultiStep

    rng = random.Random(7)
    plan = SearchPlan()
    share = fair_share(4, {"a": 2.0, "b": 1.0, "c": 1.0})
    share.shares(plan)  # watching from the empty plan on
    added = 0
    for _ in range(600):
        live = list(plan.trials)
        action = rng.choice(["add", "add", "extend", "remove", "answer", "dispatch", "release", "reopen"])
        if action == "add" or not live:
            study = rng.choice("abc")
            # Few distinct milestones: trials of different studies share requests.
            plan.add_trial(f"{study}/{added}", {"lr": MultiStep(1.0, [rng.randint(1, 4)], 0.5)}, rng.randint(1, 8))
            added += 1
        elif action == "extend":
            plan.extend_trial(rng.choice(live), rng.randint(1, 8))
        elif action == "remove":
            plan.remove_trial(rng.choice(live))
        elif action == "answer":
            request = plan.trials[rng.choice(live)].request
            plan.record_metrics(request.node.node_id, request.iteration, {"loss": 0.0})
        elif action == "dispatch":
            share.select(plan, 1)
        elif action == "release" and plan.running_batches:
            plan.release_batch(rng.choice(plan.running_batches))
        elif action == "reopen":
            plan.reopen(rng.choice(live))
        assert share.shares(plan) == scanned_shares(share, plan), action
    assert plan.running_batches or any(plan.open_requests())  # the walk ended with work open, not trivially
