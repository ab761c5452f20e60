import pickle

import pytest

from ray_stagetree import Constant, MultiStep
from ray_stagetree.planning import RequestState, SearchPlan, build_stage_tree
from ray_stagetree.planning.plan import CheckpointInfo
from ray_stagetree.planning.policies import CriticalPathPolicy

LR_80 = MultiStep(0.1, [80], 0.1)
LR_50 = MultiStep(0.1, [50], 0.1)


def test_plain_value_is_a_constant_sequence():
    plan = SearchPlan()
    a = plan.add_trial("a", {"lr": 0.1, "bs": 128}, 100)
    b = plan.add_trial("b", {"lr": Constant(0.1), "bs": Constant(128)}, 100)
    assert a is b and len(plan.nodes) == 1


def test_nested_configs_share_by_flattened_path():
    plan = SearchPlan()
    a = plan.add_trial("a", {"optim": {"lr": LR_80, "name": "sgd"}}, 100)
    b = plan.add_trial("b", {"optim": {"lr": LR_50, "name": "sgd"}}, 100)
    assert b.node.parent is a.node and b.node.fork_iteration == 50


def test_roots_split_on_static_config_and_study_key():
    plan = SearchPlan()
    plan.add_trial("a", {"lr": LR_80, "layers": [64, 64]}, 100)
    plan.add_trial("b", {"lr": LR_80, "layers": [128]}, 100)
    plan.add_trial("c", {"lr": LR_80, "layers": [64, 64]}, 100, share_key="other")
    plan.add_trial("d", {"lr": LR_80, "layers": [64, 64]}, 100)
    assert len(plan.roots) == 3
    assert plan.trials["a"].request is plan.trials["d"].request


def test_trials_differing_at_iteration_zero_are_separate_roots():
    plan = SearchPlan()
    plan.add_trial("a", {"lr": 0.1}, 10)
    plan.add_trial("b", {"lr": 0.2}, 10)
    assert len(plan.roots) == 2 and plan.unique_iterations() == 20


def test_adding_a_trial_adds_at_most_one_node_and_follows_longest_match():
    plan = SearchPlan()
    plan.add_trial("a", {"lr": MultiStep(values=(0.1, 0.05, 0.01), milestones=[30, 60])}, 90)
    plan.add_trial("b", {"lr": MultiStep(values=(0.1, 0.05, 0.02), milestones=[30, 60])}, 90)
    assert len(plan.nodes) == 2
    c = plan.add_trial("c", {"lr": MultiStep(values=(0.1, 0.05, 0.02, 0.001), milestones=[30, 60, 80])}, 90)
    assert len(plan.nodes) == 3
    # c matches a up to 30, b (node 1, forked at 60) up to 80, and forks from b.
    assert c.node.parent is plan.nodes[1] and c.node.fork_iteration == 80


def test_known_metrics_answer_a_request_at_once():
    plan = SearchPlan()
    request = plan.add_trial("a", {"lr": LR_80}, 100)
    plan.record_metrics(request.node.node_id, 60, {"loss": 1.5})
    answered = plan.add_trial("b", {"lr": MultiStep(0.1, [90], 0.1)}, 60)
    assert answered.answered and answered.node is request.node
    assert plan.history("b") == {60: {"loss": 1.5}}
    assert list(plan.open_requests()) == [request]


def test_record_metrics_answers_and_fans_out_to_every_trial_of_the_request():
    plan = SearchPlan()
    first = plan.add_trial("a", {"lr": LR_80}, 100)
    plan.add_trial("b", {"lr": LR_80}, 100)
    (answered,) = plan.record_metrics(first.node.node_id, 100, {"acc": 0.9})
    assert answered.trials == {"a", "b"} and answered.answered
    assert not list(plan.open_requests())


def test_trials_through_a_point_include_forks_after_it():
    plan = SearchPlan()
    root = plan.add_trial("a", {"lr": LR_80}, 100).node
    plan.add_trial("b", {"lr": LR_50}, 100)
    plan.add_trial("short", {"lr": LR_80}, 30)
    assert plan.trials_through(root, 40) == {"a", "b"}
    assert plan.trials_through(root, 60) == {"a"}
    assert plan.trials_through(root, 20) == {"a", "b", "short"}


def test_remove_unscheduled_trial_drops_its_request():
    plan = SearchPlan()
    plan.add_trial("a", {"lr": LR_80}, 100)
    plan.remove_trial("a")
    assert not list(plan.open_requests()) and not plan.trials
    with pytest.raises(KeyError, match="'a' is not in the plan"):
        plan.remove_trial("a")


def test_removing_one_trial_never_cancels_what_another_needs():
    plan = SearchPlan()
    plan.add_trial("a", {"lr": LR_80}, 100)
    plan.add_trial("b", {"lr": LR_80}, 100)
    (batch,) = CriticalPathPolicy().select(plan, 1)
    plan.remove_trial("a")
    assert plan.needed_until(batch.batch_id) == (batch.stages[-1].node, 100)
    plan.remove_trial("b")
    (request,) = plan.open_requests()
    assert request.state is RequestState.SCHED and request.cancellable
    assert plan.needed_until(batch.batch_id) is None
    assert plan.release_batch(batch.batch_id) == []
    assert not list(plan.open_requests())


def test_a_fork_keeps_a_batch_needed_up_to_the_fork():
    plan = SearchPlan()
    plan.add_trial("a", {"lr": LR_80}, 100)
    plan.add_trial("b", {"lr": LR_50}, 100)
    batches = CriticalPathPolicy().select(plan, 2)
    assert len(batches) == 1, "the fork's branch waits for the shared prefix"
    (batch,) = batches
    trunk = batch.stages[0].node
    running_trial = next(iter(batch.requests[-1].trials))
    plan.remove_trial(running_trial)
    # the other trial still needs the prefix up to the fork at 50
    assert plan.needed_until(batch.batch_id) == (trunk, 50)


def test_request_reached_by_a_running_batch_is_served_by_it():
    plan = SearchPlan()
    plan.add_trial("a", {"lr": LR_80}, 100)
    (batch,) = CriticalPathPolicy().select(plan, 1)
    late = plan.add_trial("late", {"lr": LR_80}, 60)
    assert late.state is RequestState.SCHED and late.batch_id == batch.batch_id
    assert build_stage_tree(plan).stages == []


def test_fork_from_a_running_batch_waits_for_its_checkpoint():
    plan = SearchPlan()
    plan.add_trial("a", {"lr": LR_80}, 100)
    (batch,) = CriticalPathPolicy().select(plan, 1)
    plan.add_trial("b", {"lr": LR_50}, 100)
    (stage,) = build_stage_tree(plan).stages
    assert (stage.start, stage.waits_for, stage.ready) == (50, batch.batch_id, False)
    assert [(n.node_id, s) for n, s in plan.checkpoints_needed(batch.batch_id)] == [(0, 50), (0, 100)]
    assert CriticalPathPolicy().select(plan, 1) == []
    plan.record_checkpoint(0, 50, CheckpointInfo(path="x"))
    (stage,) = build_stage_tree(plan).stages
    assert stage.ready and stage.source.iteration == 50


def test_released_batch_puts_unanswered_requests_back():
    plan = SearchPlan()
    request = plan.add_trial("a", {"lr": LR_80}, 100)
    (batch,) = CriticalPathPolicy().select(plan, 1)
    assert request.state is RequestState.SCHED
    plan.record_checkpoint(request.node.node_id, 40, CheckpointInfo(path="x"))
    assert plan.release_batch(batch.batch_id) == [request]
    assert request.state is RequestState.NOT_SCHED
    (stage,) = build_stage_tree(plan).stages
    assert stage.start == 40, "a failed batch resumes from its latest checkpoint"


def test_extend_trial_continues_from_its_checkpoint():
    plan = SearchPlan()
    request = plan.add_trial("a", {"lr": LR_80}, 40)
    plan.record_metrics(request.node.node_id, 40, {"acc": 0.5})
    plan.record_checkpoint(request.node.node_id, 40, CheckpointInfo(path="x"))
    longer = plan.extend_trial("a", 100)
    assert not longer.answered
    (stage,) = build_stage_tree(plan).stages
    assert (stage.start, stage.stop) == (40, 100)


@pytest.mark.parametrize("iteration", [0, -1, 1.5, True, "10"])
def test_bad_iteration_is_rejected(iteration):
    with pytest.raises(ValueError, match="iteration must be an int >= 1"):
        SearchPlan().add_trial("a", {"lr": 0.1}, iteration)


def test_bad_configs_are_rejected_with_the_key_named():
    plan = SearchPlan()
    with pytest.raises(TypeError, match=r"config keys must be strings, got 1 \(int\) under 'model/'"):
        plan.add_trial("a", {"model": {1: "x"}}, 10)
    with pytest.raises(TypeError, match="config must be a dict"):
        plan.add_trial("b", [("lr", 0.1)], 10)
    plan.add_trial("c", {"lr": 0.1}, 10)
    with pytest.raises(ValueError, match="already in the plan"):
        plan.add_trial("c", {"lr": 0.1}, 10)


def test_checkpoint_must_lie_after_the_fork():
    plan = SearchPlan()
    plan.add_trial("a", {"lr": LR_80}, 100)
    child = plan.add_trial("b", {"lr": LR_50}, 100).node
    with pytest.raises(ValueError, match="after its fork iteration 50"):
        plan.record_checkpoint(child.node_id, 50, CheckpointInfo())


def test_a_batch_continues_live_along_its_node_when_a_request_moves_on():
    plan = SearchPlan()
    plan.add_trial("a", {"lr": LR_80}, 10)
    (batch,) = CriticalPathPolicy().select(plan, 1)
    plan.record_metrics(0, 10, {"loss": 1.0})
    assert plan.extend_batch(batch.batch_id) is None, "nothing wants more of the node yet"
    moved = plan.extend_trial("a", 30)  # the scheduler said CONTINUE at the rung
    assert plan.extend_batch(batch.batch_id) == 30
    assert moved.state is RequestState.SCHED and moved.batch_id == batch.batch_id
    assert [(n.node_id, start, stop) for n, start, stop in plan.batch_segments(batch.batch_id)] == [(0, 0, 30)]
    assert build_stage_tree(plan).stages == [], "no new batch retrains or restores the prefix"


def test_a_batch_does_not_continue_over_another_batchs_segment():
    plan = SearchPlan()
    plan.add_trial("a", {"lr": LR_80}, 10)
    (first,) = CriticalPathPolicy().select(plan, 1)
    plan.record_checkpoint(0, 20, CheckpointInfo(path="x"))  # kept from an earlier study
    plan.add_trial("b", {"lr": LR_80}, 40)
    (second,) = CriticalPathPolicy().select(plan, 1)
    assert second.source.iteration == 20
    plan.record_metrics(0, 10, {})
    assert plan.extend_batch(first.batch_id) is None


def test_a_fork_beyond_a_trials_request_gets_a_checkpoint_before_the_request_reaches_it():
    plan = SearchPlan()
    plan.add_trial("a", {"lr": LR_80}, 10)
    plan.add_trial("b", {"lr": LR_50}, 10)  # both still on the shared node: b forks at 50, later
    (batch,) = CriticalPathPolicy().select(plan, 1)
    for trial_id in ("a", "b"):
        plan.extend_trial(trial_id, 40)
    plan.record_metrics(0, 10, {})
    assert plan.extend_batch(batch.batch_id) == 40
    for trial_id in ("a", "b"):
        plan.extend_trial(trial_id, 60)  # b's request now lives on its own node, forked at 50
    plan.record_metrics(0, 40, {})
    assert plan.extend_batch(batch.batch_id) == 60
    assert (0, 50) in [(n.node_id, s) for n, s in plan.checkpoints_needed(batch.batch_id)]


def test_forks_ahead_of_a_request_are_known_before_the_request_moves():
    plan = SearchPlan()
    plan.add_trial("a", {"lr": LR_80}, 10)
    plan.add_trial("b", {"lr": LR_50}, 10)
    (batch,) = CriticalPathPolicy().select(plan, 1)
    plan.extend_trial("a", 60)  # the batch now runs past b's fork at 50 while b waits at 10
    plan.record_metrics(0, 10, {})
    assert plan.extend_batch(batch.batch_id) == 60
    assert (0, 50) in [(n.node_id, s) for n, s in plan.checkpoints_needed(batch.batch_id)]


def test_a_fork_a_running_batch_passed_without_a_checkpoint_stops_waiting_for_it():
    plan = SearchPlan()
    plan.add_trial("a", {"lr": LR_80}, 100)
    (batch,) = CriticalPathPolicy().select(plan, 1)
    plan.add_trial("b", {"lr": LR_50}, 100)
    assert build_stage_tree(plan).stages[0].waits_for == batch.batch_id
    plan.record_progress(batch.batch_id, 0, 60)  # trained past 50; the trainable kept no checkpoint there
    tree = build_stage_tree(plan)
    assert all(stage.waits_for is None for stage in tree.stages)
    (root,) = tree.roots
    assert root.ready and root.source.is_initialization, "b retrains its prefix now, not when the batch ends"


def test_a_fork_at_a_batchs_end_waits_for_the_checkpoint_saved_after_the_last_report():
    plan = SearchPlan()
    plan.add_trial("a", {"lr": LR_80}, 50)
    (batch,) = CriticalPathPolicy().select(plan, 1)
    plan.record_progress(batch.batch_id, 0, 50)  # the end is reported; its checkpoint follows the reply
    plan.add_trial("b", {"lr": LR_50}, 100)
    stages = build_stage_tree(plan).stages
    assert [stage.waits_for for stage in stages] == [batch.batch_id]


def test_covered_iterations_are_what_live_trials_already_train():
    plan = SearchPlan()
    plan.add_trial("a", {"lr": MultiStep(0.1, [10], 0.1)}, 30)
    plan.add_trial("b", {"lr": MultiStep(0.1, [20], 0.5)}, 30)
    nodes = len(plan.nodes)
    candidates = [
        {"lr": MultiStep(0.1, [25], 0.1)},  # follows b's path to 20, then a fresh value
        {"lr": MultiStep(0.1, [10], 0.1)},  # a itself
        {"lr": Constant(0.2)},  # nothing in common
        {"lr": MultiStep(0.1, [10], 0.1), "momentum": 0.9},  # other hyper-parameters: another root
    ]
    assert plan.covered_iterations(candidates, 30) == [20, 30, 0, 0]
    assert plan.covered_iterations(candidates, 15) == [15, 15, 0, 0]
    assert len(plan.nodes) == nodes  # asking adds nothing
    plan.extend_trial("b", 12)  # b stopped early: only 12 iterations of its path are trained
    assert plan.covered_iterations(candidates[:1], 30) == [12]
    plan.remove_trial("b")
    assert plan.covered_iterations(candidates[:1], 30) == [10]
    path, shared = plan.follow(candidates[0], 30)
    assert shared == 20 and [node.fork_iteration for node in path] == [0, 10]


def test_a_batch_is_timed_per_run_of_iterations_without_its_setup():
    plan = SearchPlan()
    plan.add_trial("a", {"lr": LR_80}, 100)
    plan.add_trial("b", {"lr": LR_50}, 100)
    (batch,) = CriticalPathPolicy().select(plan, 1)
    (first, start, _), *_ = plan.batch_segments(batch.batch_id)
    times = [(first.node_id, iteration, 0.5) for iteration in range(start + 1, start + 5)]
    times += [(first.node_id, start + 5, "n/a")]  # a user's own value: no number, no timing
    plan.record_batch_timings(batch.batch_id, times)
    # The first iteration also paid for the worker's setup: it is no stage's cost.
    assert [(t.node_id, t.start, t.stop, t.seconds) for t in plan.timings] == [
        (first.node_id, start + 1, start + 4, 1.5)
    ]


def test_the_plan_is_the_only_writer_of_its_checkpoint_records():
    plan = SearchPlan()
    node = plan.add_trial("a", {"lr": 0.1}, 10).node
    plan.record_checkpoint(node.node_id, 5, CheckpointInfo(path="checkpoints/x"))
    with pytest.raises(TypeError):
        node.checkpoints[6] = CheckpointInfo(path="checkpoints/y")  # a read-only view
    with pytest.raises(AttributeError):
        node.checkpoints.pop(5)
    assert dict(node.checkpoints) == {5: CheckpointInfo(path="checkpoints/x")}
    position = plan.changes
    plan.drop_checkpoint(node.node_id, 5)
    assert 5 not in node.checkpoints and plan.touched_since(position) == {node}, "stage trees see the change"


def test_checkpoint_records_hold_only_what_persists():
    """No runtime handle (an object reference) in the plan: every field of a
    checkpoint record is a plain value that the plan's tables store."""
    import dataclasses

    from ray_stagetree.planning.persistence import SCHEMAS

    fields = {field.name for field in dataclasses.fields(CheckpointInfo)}
    assert fields == set(SCHEMAS["checkpoints"].names) - {"node_id", "step"}
    plan = SearchPlan()
    node = plan.add_trial("a", {"lr": 0.1}, 10).node
    plan.record_checkpoint(node.node_id, 5, CheckpointInfo("checkpoints/x", 3, "sha256:00"))
    (row,) = plan.records()["checkpoints"]
    assert row == {
        "node_id": node.node_id,
        "step": 5,
        "path": "checkpoints/x",
        "size_bytes": 3,
        "checksum": "sha256:00",
    }
    assert pickle.loads(pickle.dumps(node)).checkpoints == node.checkpoints


def test_metric_records_are_written_as_recorded_last():
    """Snapshots encode each record once (a cache); a record replaced (an
    iteration trained again) is written with its new metrics, and a plan
    pickled and loaded writes the same records."""
    import json

    plan = SearchPlan()
    node = plan.add_trial("a", {"lr": 0.1}, 10).node
    plan.record_metrics(node.node_id, 1, {"loss": 1.0})

    def written():
        return [(row["step"], json.loads(row["metrics"])) for row in plan.records()["metrics"]]

    assert written() == [(1, {"loss": 1.0})]
    plan.record_metrics(node.node_id, 1, {"loss": 0.5})
    plan.record_metrics(node.node_id, 2, {"loss": 0.25})
    assert written() == [(1, {"loss": 0.5}), (2, {"loss": 0.25})]
    assert pickle.loads(pickle.dumps(plan)).records() == plan.records()
