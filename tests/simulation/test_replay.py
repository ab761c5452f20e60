"""A finished study's makespan replayed on the simulator (`simulation.replay`)."""

from __future__ import annotations

import pytest

from ray_stagetree import MultiStep
from ray_stagetree.planning import SearchPlan
from ray_stagetree.simulation.replay import replay


def _two_trials() -> tuple[SearchPlan, int, int]:
    """Two 3-iteration trials whose learning rates part at iteration 1: node
    ``a`` trains 0-3, node ``b`` forks from it at 1."""
    plan = SearchPlan()
    a = plan.add_trial("a", {"lr": MultiStep(0.1, [2], 0.1)}, 3, "study").node
    b = plan.add_trial("b", {"lr": MultiStep(0.1, [1], 0.1)}, 3, "study").node
    assert b.parent is a and b.fork_iteration == 1
    return plan, a.node_id, b.node_id


def _ran(plan: SearchPlan, a: int, b: int) -> None:
    """What a runtime on 2 workers records when an iteration takes 1 s, a
    batch starts up in 0.5 s and a restore adds 0.25 s: ``a`` from 0 to 3.5,
    with its checkpoint at 1 out at 1.5, when ``b`` starts from it and ends at 4.25.
    Timings leave out each batch's first iteration, as the runtime's do."""
    plan.record_run(0, 1, [(a, 0, 3)], began=100.0, ended=103.5)
    plan.record_run(1, 2, [(b, 1, 3)], began=101.5, ended=104.25)
    plan.record_timing(a, 1, 3, 2.0)
    plan.record_timing(b, 2, 3, 1.0)


def test_a_runtime_that_kept_its_plan_is_predicted_to_the_second():
    plan, a, b = _two_trials()
    _ran(plan, a, b)
    replayed = replay(plan, workers=2)
    assert replayed.measured == pytest.approx(4.25)
    assert replayed.batch_start_seconds == pytest.approx(0.5)
    assert replayed.checkpoint_load_seconds == pytest.approx(0.25)
    assert replayed.predicted == pytest.approx(4.25)
    assert replayed.accuracy == pytest.approx(1.0)


def test_a_runtime_that_lost_time_is_measured_above_its_replay():
    plan, a, b = _two_trials()
    _ran(plan, a, b)
    # A third batch, dispatched late, retrains nothing new: the runtime idled 2 s before it ended.
    plan.record_run(2, 1, [(a, 2, 3)], began=105.0, ended=106.25)
    replayed = replay(plan, workers=2)
    assert replayed.measured == pytest.approx(6.25)
    assert replayed.accuracy > 1.3


def test_the_tree_limit_is_what_sharing_saves_in_wall_time_on_these_workers():
    plan, a, b = _two_trials()
    _ran(plan, a, b)
    # On 2 workers both trials train side by side either way; on 1, sharing saves iteration 0 of 6.
    assert replay(plan, workers=2).tree_limit == pytest.approx(1.0)
    one = replay(plan, workers=1)
    assert (one.shared, one.trial_based) == (pytest.approx(5.0), pytest.approx(6.0))


def test_a_plan_without_runs_is_refused():
    plan, _, _ = _two_trials()
    with pytest.raises(ValueError, match="no batch runs"):
        replay(plan, workers=2)
