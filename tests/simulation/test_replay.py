"""A finished study's makespan replayed on the simulator (`simulation.replay`),
and the simulator's start-up costs it replays with."""

from __future__ import annotations

import pytest

from ray_stagetree import MultiStep
from ray_stagetree.planning import SearchPlan
from ray_stagetree.simulation.replay import replay
from ray_stagetree.simulation.simulator import Simulation


def _two_trials() -> tuple[SearchPlan, int, int]:
    """Two 3-iteration trials whose learning rates part at iteration 1: node
    ``a`` trains 0-3, node ``b`` forks from it at 1."""
    plan = SearchPlan()
    a = plan.add_trial("a", {"lr": MultiStep(0.1, [2], 0.1)}, 3, "study").node
    b = plan.add_trial("b", {"lr": MultiStep(0.1, [1], 0.1)}, 3, "study").node
    assert b.parent is a and b.fork_iteration == 1
    return plan, a.node_id, b.node_id


def _ran_on_one_worker(plan: SearchPlan, a: int, b: int) -> None:
    """What a runtime with one worker records when an iteration takes 1 s, the
    worker's first batch warms it up for 1.5 s and a restore takes 0.75 s:
    ``a`` from 100 to 104.5, then ``b`` from its checkpoint at 1, to 107.25.
    Timings leave out each batch's first iteration, as the runtime's do."""
    plan.record_run(0, 1, [(a, 0, 3)], began=100.0, ended=104.5)
    plan.record_run(1, 1, [(b, 1, 3)], began=104.5, ended=107.25)
    plan.record_timing(a, 1, 3, 2.0)
    plan.record_timing(b, 2, 3, 1.0)


def test_a_runtime_that_kept_its_plan_is_predicted_to_the_second():
    plan, a, b = _two_trials()
    _ran_on_one_worker(plan, a, b)
    replayed = replay(plan, workers=1)
    assert replayed.measured == pytest.approx(7.25)
    assert replayed.worker_start_seconds == pytest.approx(1.5)
    assert replayed.checkpoint_load_seconds == pytest.approx(0.75)
    assert replayed.batch_start_seconds == 0.0
    assert replayed.predicted == pytest.approx(7.25)
    assert replayed.accuracy == pytest.approx(1.0)


def test_a_runtime_that_lost_time_is_measured_above_its_replay():
    plan, a, b = _two_trials()
    _ran_on_one_worker(plan, a, b)
    # The worker idled 2 s before a third batch, which trained nothing the plan did not have.
    plan.record_run(2, 1, [(a, 2, 3)], began=109.25, ended=110.5)
    replayed = replay(plan, workers=1)
    assert replayed.measured == pytest.approx(10.5)
    assert replayed.accuracy > 1.3


def test_the_tree_limit_is_what_sharing_saves_in_wall_time_on_these_workers():
    plan, a, b = _two_trials()
    _ran_on_one_worker(plan, a, b)
    # On 2 workers both trials train side by side either way; on 1, sharing saves iteration 0 of 6.
    assert replay(plan, workers=2).tree_limit == pytest.approx(1.0)
    one = replay(plan, workers=1)
    assert (one.shared, one.trial_based) == (pytest.approx(5.0), pytest.approx(6.0))


def test_a_plan_without_runs_is_refused():
    plan, _, _ = _two_trials()
    with pytest.raises(ValueError, match="no batch runs"):
        replay(plan, workers=2)


def test_each_worker_warms_up_once_and_a_warm_idle_one_is_used_first():
    """``a`` (1 iteration) and ``b`` (3) start on cold workers at 0 and pay
    5 s each; ``c``, forked from ``b`` at 2 (out at 7), goes to ``a``'s
    worker, warm since 6, not to the third, cold one: it ends at 8."""
    plan = SearchPlan()
    plan.add_trial("a", {"lr": 0.5}, 1)
    plan.add_trial("b", {"lr": MultiStep(0.1, [5], 0.1)}, 3)
    plan.add_trial("c", {"lr": MultiStep(0.1, [2], 0.1)}, 3)
    result = Simulation(workers=3, worker_start_seconds=5.0, batch_start_seconds=0.0).run(plan)
    assert result.makespan == pytest.approx(8.0)


def test_every_batch_pays_its_start_up():
    """``a`` ends at 0.5 + 3; ``b`` starts at 1.5 from ``a``'s checkpoint at 1 and ends at 1.5 + 0.5 + 2."""
    plan, _, _ = _two_trials()
    assert Simulation(workers=2, batch_start_seconds=0.5).run(plan).makespan == pytest.approx(4.0)
