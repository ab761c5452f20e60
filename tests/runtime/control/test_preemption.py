"""Time-sharing pre-emption of running batches (runtime.control.preemption),
without Ray: a fake plan and policy."""

from __future__ import annotations

from ray_stagetree.execution.batches import FlushReply
from ray_stagetree.runtime.control.preemption import Preemption


class Plan:
    """The plan's answers for one running batch (id 1) on node 0, iterations 0 to 10."""

    def __init__(self, needed_until=(0, 10), checkpoints_needed=()):
        self.nodes = {0: "node0"}
        self._needed = needed_until
        self._checkpoints = list(checkpoints_needed)

    def needed_until(self, batch_id):
        return self._needed

    def checkpoints_needed(self, batch_id):
        return self._checkpoints

    def batch_segments(self, batch_id):
        return [(0, 0, 10)]


class Policy:
    def __init__(self, boundary_at: int | None):
        self.boundary_at = boundary_at
        self.asked = []

    def at_boundary(self, plan, batch_id, node, iteration, now):
        self.asked.append((batch_id, node, iteration, now))
        return self.boundary_at is not None and iteration >= self.boundary_at

    def __repr__(self):
        return "Policy()"


def test_a_batch_whose_quantum_is_over_checkpoints_one_iteration_later_and_stops_there():
    warnings = []
    preemption = Preemption(Plan(checkpoints_needed=[("node0", 2)]), warnings.append, clock=lambda: 7.0)
    policy = Policy(boundary_at=4)
    assert preemption.reply(policy, 1, 0, 3, can_checkpoint=True) is None
    assert policy.asked == [(1, "node0", 3, 7.0)]
    assert preemption.reply(policy, 1, 0, 4, can_checkpoint=True) == FlushReply([2, 5], 5, 10)
    # Until it stops, each report gets the same stop, without asking the policy again.
    assert preemption.reply(policy, 1, 0, 5, can_checkpoint=True) == FlushReply([2, 5], 5, 10)
    assert len(policy.asked) == 2
    preemption.ended(1)
    assert preemption.reply(Policy(boundary_at=None), 1, 0, 5, can_checkpoint=True) is None
    assert warnings == []


def test_a_batch_no_trial_needs_further_stops_where_the_plan_says():
    preemption = Preemption(Plan(needed_until=(0, 3)), [].append)
    assert preemption.reply(Policy(boundary_at=2), 1, 0, 2, True) == FlushReply([3], 3, 10)
    assert Preemption(Plan(needed_until=None), [].append).reply(Policy(2), 1, 0, 2, True) == FlushReply([3], 0, 10)


def test_a_trainable_without_a_checkpoint_where_it_yields_ends_time_sharing_with_a_warning():
    warnings = []
    preemption = Preemption(Plan(), warnings.append)
    policy = Policy(boundary_at=4)
    assert preemption.reply(policy, 1, 0, 4, True) is not None
    assert preemption.reply(policy, 1, 0, 5, can_checkpoint=False) is None
    assert preemption.off and len(warnings) == 1
    assert "execution_policy=Policy() pre-empts batches at a checkpoint, but the trainable reported none" in warnings[0]
    assert preemption.reply(policy, 2, 0, 9, True) is None  # no batch is pre-empted any more
