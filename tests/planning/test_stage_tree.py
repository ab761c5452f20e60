"""Algorithm 1 on the paper's worked examples, reproduced exactly."""

import networkx as nx
from paper_examples import (
    FIGURE_4_HORIZON,
    FIGURE_4_TRIALS,
    FIGURE_5_TRIAL,
    FIGURE_6_CONFIGS,
    figure_6_plan,
)

from ray_stagetree import MultiStep
from ray_stagetree.planning import SearchPlan, build_stage_tree
from ray_stagetree.planning.plan import CheckpointInfo


def shape(tree):
    """Stages as (node, start, stop, parent's (node, start, stop) or source)."""
    out = set()
    for stage in tree.stages:
        if stage.parent is not None:
            above = ("after", stage.parent.node.node_id, stage.parent.start, stage.parent.stop)
        elif stage.source.is_initialization:
            above = ("init",)
        else:
            above = ("ckpt", stage.source.node.node_id, stage.source.iteration)
        out.add((stage.node.node_id, stage.start, stage.stop, above))
    return out


def figure_4_plan():
    plan = SearchPlan()
    for trial_id, config in FIGURE_4_TRIALS.items():
        plan.add_trial(trial_id, config, FIGURE_4_HORIZON)
    return plan


def test_figure_4_stage_tree_shares_a1_among_four_and_b1_among_three():
    plan = figure_4_plan()
    tree = build_stage_tree(plan)
    a1 = ("after", 0, 0, 100)
    b1 = ("after", 1, 100, 200)
    # A1 = H0[0,100) serves all four trials; A2+E = H0[100,300) is trial 1's
    # own continuation (no fork at 200, so no stage boundary there);
    # B1 = H1[100,200) is shared by trials 2-4; C, D and B2 branch from it.
    assert shape(tree) == {
        (0, 0, 100, ("init",)),
        (0, 100, 300, a1),
        (1, 100, 200, a1),
        (1, 200, 300, b1),
        (2, 200, 300, b1),
        (3, 200, 300, b1),
    }
    (root,) = tree.roots
    served = {
        stage.node.node_id: sorted(t for r in stage.requests for t in r.trials)
        for stage in tree.stages
        if stage.requests
    }
    assert served == {0: ["trial_1"], 1: ["trial_2"], 2: ["trial_3"], 3: ["trial_4"]}
    assert len(nx.descendants(tree.to_networkx(), root)) == 5
    assert tree.iterations == plan.unique_iterations() == 700
    assert plan.total_iterations() == 1200


def test_figure_5_trial_5_splits_a2_and_forks_f_from_step_150():
    plan = figure_4_plan()
    nodes_before = len(plan.nodes)
    request = plan.add_trial("trial_5", FIGURE_5_TRIAL, FIGURE_4_HORIZON)
    assert len(plan.nodes) == nodes_before + 1, "adding a trial adds at most one plan node"
    assert request.node.parent.node_id == 0 and request.node.fork_iteration == 150
    tree = build_stage_tree(plan)
    a1, a3 = ("after", 0, 0, 100), ("after", 0, 100, 150)
    assert {s for s in shape(tree) if s[0] in (0, request.node.node_id)} == {
        (0, 0, 100, ("init",)),
        (0, 100, 150, a1),  # A3
        (0, 150, 300, a3),  # A4 + E
        (request.node.node_id, 150, 300, a3),  # F
    }
    assert tree.iterations == plan.unique_iterations() == 850


def test_figure_6_plan_becomes_figure_7_stage_tree():
    plan, h = figure_6_plan()
    assert [plan.nodes[h[n]].fork_iteration for n in ("H1", "H2", "H3", "H4")] == [0, 10, 20, 40]
    assert plan.nodes[h["H4"]].parent is plan.nodes[h["H3"]]
    tree = build_stage_tree(plan)
    assert shape(tree) == {
        (h["H1"], 10, 15, ("ckpt", h["H1"], 10)),
        (h["H1"], 20, 30, ("ckpt", h["H1"], 20)),
        (h["H2"], 20, 25, ("ckpt", h["H2"], 20)),
        (h["H3"], 30, 35, ("ckpt", h["H3"], 30)),
        (h["H3"], 35, 40, ("after", h["H3"], 30, 35)),
        (h["H4"], 40, 50, ("after", h["H3"], 35, 40)),
    }
    assert tree.iterations == 40
    graph = tree.to_networkx()
    assert nx.is_forest(graph) and len(tree.roots) == 4


def test_answered_requests_and_scheduled_requests_are_not_in_the_tree():
    plan, h = figure_6_plan()
    # H3's 25 has metrics already: asking for it again trains nothing.
    again = plan.add_trial("late", FIGURE_6_CONFIGS["H3"], 25)
    assert again.answered
    tree = build_stage_tree(plan)
    assert all(request is not again for request in tree.requests())


def test_stage_restarts_from_latest_checkpoint_not_from_scratch():
    plan = SearchPlan()
    request = plan.add_trial("t", {"lr": 0.1}, 100)
    plan.record_checkpoint(request.node.node_id, 40, CheckpointInfo(path="a"))
    plan.record_checkpoint(request.node.node_id, 70, CheckpointInfo(path="b"))
    (stage,) = build_stage_tree(plan).stages
    assert (stage.start, stage.stop, stage.source.iteration) == (70, 100, 70)
    plan.drop_checkpoint(request.node.node_id, 70)
    (stage,) = build_stage_tree(plan).stages
    assert (stage.start, stage.source.iteration) == (40, 40)


def test_child_starts_from_parent_checkpoint_at_fork():
    plan = SearchPlan()
    parent = plan.add_trial("a", {"lr": MultiStep(0.1, [80], 0.1)}, 100).node
    child = plan.add_trial("b", {"lr": MultiStep(0.1, [50], 0.1)}, 100).node
    assert child.parent is parent and child.fork_iteration == 50
    plan.record_checkpoint(parent.node_id, 50, CheckpointInfo(path="p50"))
    stages = {(s.node.node_id, s.start): s for s in build_stage_tree(plan).stages}
    assert stages[(child.node_id, 50)].source.node is parent
    assert stages[(child.node_id, 50)].ready


def test_a_parked_trainable_is_where_its_node_and_forks_from_it_go_on():
    """A trainable paused without a checkpoint waits alive at its point
    (`SearchPlan.record_parked`): stages continuing that node, or forking from
    it there or later, start from it instead of from scratch."""
    plan = SearchPlan()
    paused = plan.add_trial("a", {"lr": MultiStep(0.1, [80], 0.1)}, 30)
    node = paused.node
    plan.record_parked(node.node_id, 30)
    plan.extend_trial("a", 100)
    at_fork = plan.add_trial("b", {"lr": MultiStep(0.1, [30], 0.1)}, 100).node
    later = plan.add_trial("c", {"lr": MultiStep(0.1, [50], 0.1)}, 100).node
    assert (at_fork.fork_iteration, later.fork_iteration) == (30, 50)
    stages = {(stage.node.node_id, stage.start): stage for stage in build_stage_tree(plan).stages}
    assert (stages[(node.node_id, 30)].source.node, stages[(node.node_id, 30)].source.iteration) == (node, 30)
    assert stages[(at_fork.node_id, 30)].source == stages[(node.node_id, 30)].source
    assert stages[(later.node_id, 50)].parent is stages[(node.node_id, 30)]
    assert not any(stage.start == 0 for stage in stages.values())
    plan.drop_parked(node.node_id, 30)
    assert {stage.start for stage in build_stage_tree(plan).roots} == {0}
