"""Which of a study's checkpoints no trial keeps any more under
``CheckpointConfig(num_to_keep=...)``, so that its storage holds what
Tune's would (each trial's kept checkpoints) rather than every checkpoint
a trial reported. Ray-free: `trial_checkpoints.TrialCheckpoints` asks, and
the checkpoint store removes them.

A checkpoint goes once none of the study's trials keeps it (Tune's rule,
`execution.retention.kept_checkpoints`, over each trial's checkpoints so
far: a trial's kept set only ever loses members as it trains on) and
every trial whose path passes it has a later checkpoint to go on from.
A trial that has yet to train past it (one that starts from it, a PBT
exploit that forks from it, a trial of another study on the plan) keeps
it. So go the checkpoints the runtime took for its own ends (where
trials forked, a class trainable's where Tune would not have saved it)
once every trial went past them, and those of the paths PBT's exploits
left.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ray_stagetree.execution.retention import kept_checkpoints
from ray_stagetree.planning.plan import PlanNode, SearchPlan
from ray_stagetree.runtime.control.trials import TrialState


def unkept_checkpoints(
    trials: Mapping[str, TrialState], plan: SearchPlan, checkpoint_config: Any
) -> list[tuple[PlanNode, int]]:
    """(node, iteration) of the plan's checkpoints that none of ``trials``
    (a study's, by id) keeps under ``checkpoint_config`` and none will start
    from again: those on their paths, and those of paths a PBT exploit left."""
    kept: set[tuple[int, int]] = set()
    latest: dict[str, int] = {}  # each trial's latest checkpoint: where it would go on from
    for state in trials.values():
        points = state.trained_checkpoints()
        iterations = [at for _, at in points]
        keeps = set(kept_checkpoints(iterations, state.checkpoint_metrics, checkpoint_config)[0])
        kept.update((node.node_id, at) for node, at in points if at in keeps)
        latest[state.trial_id] = iterations[-1] if iterations else 0
    below = _earliest_below(plan, latest)
    unkept = []
    for node in plan.nodes:
        for at in node.checkpoints:
            if (node.node_id, at) in kept:
                continue
            # Where the trials through (node, at) go on from (`SearchPlan.trials_through`): those
            # on the node asking past it, and those under the children that fork at or after it.
            through = [latest.get(t, 0) for t in node.trials if plan.trials[t].request.iteration >= at]
            through += [below[child.node_id] for child in node.children.values() if child.fork_iteration >= at]
            if min(through, default=math.inf) > at:
                unkept.append((node, at))
    return unkept


def _earliest_below(plan: SearchPlan, latest: Mapping[str, int]) -> dict[int, float]:
    """For each node, the earliest point any trial of its subtree would go
    on from (0 for a trial not among ``latest``; infinity for none)."""
    order, stack = [], list(plan.roots)
    while stack:
        node = stack.pop()
        order.append(node)
        stack.extend(node.children.values())
    below: dict[int, float] = {}
    for node in reversed(order):  # children before their parents
        below[node.node_id] = min(
            [latest.get(t, 0) for t in node.trials] + [below[child.node_id] for child in node.children.values()],
            default=math.inf,
        )
    return below
