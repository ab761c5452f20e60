import pytest

from ray_stagetree import MultiStep
from ray_stagetree.planning import CostModel, SearchPlan


def plan_with_timings(per_iteration):
    plan = SearchPlan()
    for batch_size, seconds in per_iteration.items():
        node = plan.add_trial(f"bs{batch_size}", {"lr": 0.1, "batch_size": batch_size}, 100).node
        plan.record_timing(node.node_id, 0, 20, 20 * seconds)
    return plan


def test_default_is_one_unit_per_iteration():
    plan = SearchPlan()
    node = plan.add_trial("a", {"lr": 0.1}, 10).node
    model = CostModel().fit(plan)
    assert not model.is_fitted and model.stage_seconds(node, 0, 10) == 10.0


def test_linear_regression_recovers_cost_per_batch_size():
    # seconds per iteration = 0.1 + 0.01 * batch_size
    plan = plan_with_timings({32: 0.42, 64: 0.74, 128: 1.38})
    model = CostModel(ridge=0.0).fit(plan)
    node = plan.add_trial("bs256", {"lr": 0.1, "batch_size": 256}, 100).node
    assert model.seconds_per_iteration(node, 0, 10) == pytest.approx(2.66, rel=1e-6)


def test_stage_cost_follows_values_that_change_inside_the_stage():
    plan = plan_with_timings({64: 0.74, 128: 1.38})
    model = CostModel(ridge=0.0).fit(plan)
    node = plan.add_trial("step", {"lr": 0.1, "batch_size": MultiStep(values=(64, 128), milestones=[50])}, 100).node
    assert model.stage_seconds(node, 0, 100) == pytest.approx(50 * 0.74 + 50 * 1.38, rel=1e-6)


def test_categorical_values_are_features_and_predictions_stay_positive():
    plan = SearchPlan()
    for optimizer, seconds in (("adam", 2.0), ("sgd", 1.0)):
        node = plan.add_trial(optimizer, {"optimizer": optimizer}, 10).node
        plan.record_timing(node.node_id, 0, 10, 10 * seconds)
    model = CostModel(ridge=0.0).fit(plan)
    assert model.seconds_per_iteration(plan.trials["adam"].request.node, 0, 10) == pytest.approx(2.0)
    assert model.seconds_per_iteration(plan.trials["sgd"].request.node, 0, 10) == pytest.approx(1.0)


@pytest.mark.parametrize("kwargs", [{"default_seconds_per_iteration": 0}, {"ridge": -1}])
def test_bad_parameters(kwargs):
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        CostModel(**kwargs)


def test_recompute_cost_is_priced_from_the_previous_checkpoint_on_the_path():
    """DESIGN's eviction rule: what losing a checkpoint costs is retraining it
    from the checkpoint before it, whatever report flush carried it."""
    from ray_stagetree.planning.cost import recompute_seconds
    from ray_stagetree.planning.plan import CheckpointInfo

    plan = SearchPlan()
    parent = plan.add_trial("a", {"lr": MultiStep(0.1, [6], 0.1)}, 10).node
    child = plan.add_trial("b", {"lr": MultiStep(0.1, [8], 0.1)}, 10).node
    assert child.parent is parent and child.fork_iteration == 6
    for node in (parent, child):
        for iteration in range(node.fork_iteration + 1, 11):
            plan.record_metrics(node.node_id, iteration, {"time_this_iter_s": float(iteration)})
    # One flush carried iterations 9 and 10 (19 s); the checkpoint at 10
    # would be retrained from the one at 4 on the parent: iterations 5..10.
    plan.record_checkpoint(parent.node_id, 4, CheckpointInfo(path="checkpoints/p4"))
    assert recompute_seconds(child, 10) == sum(range(5, 11))
    plan.record_checkpoint(child.node_id, 8, CheckpointInfo(path="checkpoints/c8"))
    assert recompute_seconds(child, 10) == 9 + 10, "from the child's own earlier checkpoint"
    assert recompute_seconds(child, 8) == sum(range(5, 9)), "its own record does not count as a start"
    plan.record_checkpoint(parent.node_id, 6, CheckpointInfo(path="checkpoints/p6"))
    assert recompute_seconds(child, 8) == 7 + 8, "from the branch point's checkpoint"
    plan.drop_checkpoint(parent.node_id, 4)
    assert recompute_seconds(parent, 6) == sum(range(1, 7)), "from initialization without one"


def test_recompute_cost_counts_unmeasured_iterations_as_one_second():
    from ray_stagetree.planning.cost import recompute_seconds

    plan = SearchPlan()
    node = plan.add_trial("a", {"lr": 0.1}, 5).node
    plan.record_metrics(node.node_id, 5, {"time_this_iter_s": 3.0})
    assert recompute_seconds(node, 5) == 4 * 1.0 + 3.0
