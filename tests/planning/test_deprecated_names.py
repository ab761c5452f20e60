"""The names the vocabulary rename changed keep working for one release: old keyword
arguments, attributes and module names do what the new ones do, and warn
with the new name, at the caller's line."""

from __future__ import annotations

import warnings

import pytest

import ray_stagetree
from ray_stagetree import MultiStep
from ray_stagetree.planning import CheckpointSource, SearchPlan, TrialConfig, build_stage_tree, stage_tree
from ray_stagetree.planning.decisions import Exploit

LR = {"lr": MultiStep(0.1, [5], 0.1)}
LATER = {"lr": MultiStep(0.1, [8], 0.1)}


def deprecated(new: str):
    """Expect one DeprecationWarning naming ``new``, raised at this file's line."""
    return pytest.warns(DeprecationWarning, match=f"is deprecated: use {new}")


def test_old_keyword_arguments_do_what_the_new_ones_do():
    old, new = SearchPlan(), SearchPlan()
    with deprecated("iteration=...") as caught:
        old.add_trial("a", LR, step=10)
    assert caught[0].filename == __file__, "the warning points at the caller"
    with deprecated("share_key=..."):
        old.add_trial("b", LATER, 10, study="other")
    new.add_trial("a", LR, iteration=10)
    new.add_trial("b", LATER, 10, share_key="other")
    assert old.records() == new.records()

    with deprecated("share_key=..."):
        old.add_trials([("c", LATER, 10)], study="other")
    with deprecated("iteration=..."):
        old.extend_trial("c", step=12)
    with deprecated("iteration=..."):
        assert old.follow(LR, step=10)[1] == new.follow(LR, iteration=10)[1] == 10
    with deprecated("share_key=..."):
        assert old.covered_iterations([LATER], 10, study="other") == [10]
    config = TrialConfig.from_config(LR)
    with deprecated("iteration=..."):
        assert old.locate(config, step=10) is old.trials["a"].request.node
    node = old.trials["a"].request.node
    with deprecated("iteration=..."):
        assert old.record_metrics(node.node_id, step=10, metrics={"loss": 1.0})
    with deprecated("iteration=..."):
        assert old.trials_through(node, step=10) == {"a"}
    with deprecated("share_key=..."):
        assert TrialConfig.from_config(LR, study="other").static_key == TrialConfig.from_config(LR, "other").static_key
    with deprecated("share_key=..."):
        old_json = TrialConfig.from_json({"lr": 0.1}, study="x")
    assert old_json.static_key == TrialConfig.from_json({"lr": 0.1}, "x").static_key


def test_an_old_and_a_new_name_together_are_refused():
    with pytest.raises(TypeError, match="got both 'step' .* and 'iteration'"):
        SearchPlan().add_trial("a", LR, step=10, iteration=10)


def test_old_attribute_names_read_and_write_the_new_ones():
    plan = SearchPlan()
    plan.add_trial("a", LR, 10)
    request = plan.add_trial("b", LATER, 10, share_key="other")
    with deprecated("Request.iteration"):
        assert request.step == 10
    with deprecated("Request.iteration"):
        request.step = 10
    with deprecated("PlanNode.fork_iteration"):
        assert plan.trials["a"].request.node.fork_step == 0
    with deprecated("TrialRecord.share_key"):
        assert plan.trials["b"].study == "other"
    source = build_stage_tree(plan).roots[0].source
    with deprecated("CheckpointSource.iteration"):
        assert source.step == source.iteration == 0
    with deprecated("Exploit.iteration"):
        assert Exploit("a", 4, {}).step == 4


@pytest.mark.parametrize(
    "name, new",
    [
        ("SearchPlan", "SearchPlan"),
        ("TrialConfig", "TrialConfig"),
        ("PlanNode", "PlanNode"),
        ("Request", "Request"),
        ("RequestState", "RequestState"),
        ("CheckpointInfo", "CheckpointInfo"),
        ("build_stage_tree", "build_stage_tree"),
        ("StageTree", "StageTree"),
        ("Stage", "Stage"),
        ("StageBatch", "StageBatch"),
        ("CostModel", "CostModel"),
        ("Source", "CheckpointSource"),
    ],
)
def test_planning_names_at_the_top_level_point_to_ray_stagetree_planning(name, new):
    with deprecated(f"ray_stagetree.planning.{new}"):
        moved = getattr(ray_stagetree, name)
    assert moved is getattr(ray_stagetree.planning, new)
    assert name not in ray_stagetree.__all__


def test_stage_tree_source_is_checkpoint_source():
    with deprecated("ray_stagetree.planning.stage_tree.CheckpointSource"):
        assert stage_tree.Source is CheckpointSource
    with pytest.raises(AttributeError, match="has no attribute 'Sauce'"):
        stage_tree.Sauce  # noqa: B018 (reading it is what raises)


def test_the_top_level_api_is_the_users():
    namespace: dict = {}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        exec("from ray_stagetree import *", namespace)
    assert {"Tuner", "report", "get_iteration", "MultiStep", "CriticalPathPolicy", "merge_rate"} <= namespace.keys()
    assert not {"SearchPlan", "PlanNode", "Request", "Source", "CheckpointSource"} & namespace.keys()
