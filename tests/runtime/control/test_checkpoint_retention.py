"""Which checkpoints a study under ``num_to_keep`` no longer needs
(runtime.control.checkpoint_retention), on a real search plan, without Ray."""

from __future__ import annotations

from types import SimpleNamespace

from ray import tune

from ray_stagetree.planning.lifecycle import PENDING, RUNNING, TERMINATED
from ray_stagetree.planning.plan import CheckpointInfo, SearchPlan
from ray_stagetree.runtime.control.checkpoint_retention import unkept_checkpoints
from ray_stagetree.runtime.control.trial_checkpoints import TrialCheckpoints
from ray_stagetree.runtime.control.trials import TrialState
from ray_stagetree.sequences import MultiStep

KEEP_ONE = tune.CheckpointConfig(num_to_keep=1)


def study(plan: SearchPlan, **trials: tuple[MultiStep, int, int]) -> dict[str, TrialState]:
    """Trials ``name=(lr, iterations asked, iterations trained)``, each with
    a checkpoint at every iteration it trained (as a function reporting one
    at every result leaves them)."""
    states = {}
    for trial_id, (lr, asked, trained) in trials.items():
        request = plan.add_trial(trial_id, {"lr": lr}, asked)
        state = TrialState(trial_id=trial_id, config={}, status=RUNNING if trained else PENDING, node=request.node)
        state.rows = {i: {"training_iteration": i, "loss": float(i)} for i in range(1, trained + 1)}
        states[trial_id] = state
        for node in plan.path(trial_id):
            for iteration in range(node.fork_iteration + 1, trained + 1):
                plan.record_checkpoint(node.node_id, iteration, CheckpointInfo(f"ckpt_{node.node_id}_{iteration}"))
    return states


def points(unkept) -> list[tuple[int, int]]:
    return sorted((node.node_id, iteration) for node, iteration in unkept)


def test_a_checkpoint_goes_once_no_trial_keeps_it_and_every_trial_through_it_went_past_it():
    plan = SearchPlan()
    # a (node 0) trained to 6; b shares a's first 4 iterations, forks there (node 1) and stands at 4.
    trials = study(plan, a=(MultiStep(0.1, [4], 0.1), 8, 6), b=(MultiStep(0.1, [4], 0.5), 8, 4))
    assert [node.fork_iteration for node in plan.path("b")] == [0, 4]
    # The shared 1..3 (b goes on from 4, its latest), and a's 5 (a goes on from 6).
    assert points(unkept_checkpoints(trials, plan, KEEP_ONE)) == [(0, 1), (0, 2), (0, 3), (0, 5)]
    # Without num_to_keep every trial keeps every checkpoint it reported.
    assert unkept_checkpoints(trials, plan, tune.CheckpointConfig()) == []
    # The best by a score stays too (both trials' best is their first).
    best = tune.CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="loss", checkpoint_score_order="min")
    assert points(unkept_checkpoints(trials, plan, best)) == [(0, 2), (0, 3), (0, 5)]
    # Ended trials are asked the same: what they keep stays, for their results and a restore.
    for state in trials.values():
        state.status = TERMINATED
    assert points(unkept_checkpoints(trials, plan, KEEP_ONE)) == [(0, 1), (0, 2), (0, 3), (0, 5)]


def test_a_checkpoint_stays_while_a_trial_through_it_has_yet_to_train_past_it():
    plan = SearchPlan()
    trials = study(plan, a=(MultiStep(0.1, [4], 0.1), 8, 6))
    # c shares a's path up to 6 and forks there: it starts from one of a's checkpoints, and trained nothing yet.
    trials |= study(plan, c=(MultiStep(0.1, [4, 6], 0.1), 8, 0))
    assert [node.fork_iteration for node in plan.path("c")] == [0, 6]
    assert unkept_checkpoints(trials, plan, KEEP_ONE) == []
    # A trial of another study on the plan (not among these trials) keeps its path's too.
    del trials["c"]
    plan.remove_trial("c")
    plan.add_trial("elsewhere", {"lr": MultiStep(0.1, [4], 0.9)}, 8)
    assert points(unkept_checkpoints(trials, plan, KEEP_ONE)) == [(0, 5)]


def test_an_exploited_trials_checkpoints_before_its_exploit_stay_while_it_keeps_them():
    """A PBT exploit took b off its path at 3 onto a's: the plan no longer
    counts b on its old path, but its checkpoint there is still one of its
    results' (Result.checkpoint and best_checkpoints)."""
    plan = SearchPlan()
    trials = study(plan, a=(MultiStep(0.1, [2], 0.1), 6, 6), b=(MultiStep(0.1, [2], 0.5), 6, 6))
    old = plan.path("b")[-1]
    exploited = trials["b"]
    exploited.earlier_paths, exploited.forked_at = ((old, 0, 3),), 3
    exploited.rows = {i: row for i, row in exploited.rows.items() if i <= 3}
    plan.remove_trial("b")
    exploited.node = plan.add_trial("b", {"lr": MultiStep(0.1, [2, 3], 0.1)}, 6).node
    assert [(node.node_id, at) for node, at in exploited.trained_checkpoints()] == [(0, 1), (0, 2), (old.node_id, 3)]
    unkept = points(unkept_checkpoints(trials, plan, KEEP_ONE))
    assert (old.node_id, 3) not in unkept  # its latest, on the path it left
    assert [(old.node_id, 4), (old.node_id, 5), (old.node_id, 6)] == [p for p in unkept if p[0] == old.node_id]
    # a's 3 is where b goes on from: it stays while b has not trained past it, though a keeps only its 6.
    assert (0, 3) not in unkept and (0, 4) in unkept


class DiscardingStore:
    """`CheckpointStore.discard`, recorded: the plan forgets the checkpoint."""

    def __init__(self) -> None:
        self.discarded: list[tuple[int, int]] = []

    def discard(self, plan, node, iteration):
        plan.drop_checkpoint(node.node_id, iteration)
        self.discarded.append((node.node_id, iteration))


def test_a_running_trials_checkpoints_go_as_it_reports_new_ones_not_only_at_the_studys_end():
    plan = SearchPlan()
    trials = study(plan, a=(MultiStep(0.1, [4], 0.1), 8, 0), b=(MultiStep(0.1, [4], 0.5), 8, 0))
    store = DiscardingStore()
    feed = SimpleNamespace(event=lambda *args, **kwargs: None)
    checkpoints = TrialCheckpoints(store, plan, feed, each=False, checkpoint_config=KEEP_ONE, trials=trials)
    for iteration in range(1, 7):  # both report a checkpoint at each iteration, the first 4 shared
        for state in trials.values():
            state.status = RUNNING
            state.rows[iteration] = {"training_iteration": iteration}
        for trial_id, state in trials.items():
            node = plan.path(trial_id)[0 if iteration <= 4 else -1]
            if iteration not in node.checkpoints:
                plan.record_checkpoint(node.node_id, iteration, CheckpointInfo(f"ckpt_{node.node_id}_{iteration}"))
            checkpoints.saved(state, node, iteration)
        # Each trial keeps only its latest: what is before it goes as they go (checked again once the
        # trials registered one more each), not at the study's end.
        left = sorted((node.node_id, at) for node in plan.nodes for at in node.checkpoints)
        assert len(left) <= len(trials) + 1, (iteration, left)
    assert sorted(store.discarded)[:3] == [(0, 1), (0, 2), (0, 3)]
