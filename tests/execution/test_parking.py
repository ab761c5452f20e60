"""The controller's record of parked trainables, without Ray: which batches
may continue one, on which worker, and when one is let go."""

import pytest

from ray_stagetree import CriticalPathPolicy, MultiStep
from ray_stagetree.execution.parking import Parking
from ray_stagetree.planning import SearchPlan


def paused_at(plan: SearchPlan, trial_id: str, lr: float, iteration: int):
    """A trial of ``MultiStep(lr, [50], 0.5)`` trained to ``iteration`` and paused there; its node."""
    node = plan.add_trial(trial_id, {"lr": MultiStep(lr, [50], 0.5)}, iteration).node
    plan.record_metrics(node.node_id, iteration, {"x": 1.0})
    return node


def test_a_batch_ending_where_a_trial_is_paused_parks_unless_parking_is_off():
    plan = SearchPlan()
    node = paused_at(plan, "a", 0.1, 10)
    assert Parking(plan).wanted(node, 10, paused=lambda trial_id: trial_id == "a")
    assert not Parking(plan).wanted(node, 10, paused=lambda trial_id: False)
    assert not Parking(plan, per_worker=0).wanted(node, 10, paused=lambda trial_id: True)


def test_the_batch_continuing_a_parked_trainable_runs_on_its_worker_once_it_is_idle():
    plan = SearchPlan()
    parking = Parking(plan)
    a = paused_at(plan, "a", 0.1, 10)
    parking.park("w1", batch_id=7, node=a, iteration=10)
    plan.extend_trial("a", 20)

    def select(idle):
        chosen = CriticalPathPolicy().select(plan, 2, admit=parking.admit(idle))
        for batch in chosen:
            plan.release_batch(batch.batch_id)
        return chosen

    assert select(idle=["w2"]) == []  # its worker is busy: nothing else wants to go
    (batch,) = select(idle=["w1", "w2"])
    assert parking.source_of(batch).batch_id == 7 and batch.segments[0][1:] == (10, 20)


def test_one_parked_trainable_serves_one_batch():
    plan = SearchPlan()
    parking = Parking(plan)
    node = paused_at(plan, "a", 0.1, 10)
    assert parking.park("w1", 3, node, 10) == [] and node.parked == {10}
    plan.extend_trial("a", 20)
    (batch,) = CriticalPathPolicy().select(plan, 1, admit=parking.admit(["w1"]))
    parking.take(parking.source_of(batch))
    assert node.parked == set() and len(parking) == 0


def test_a_worker_keeps_at_most_its_share_of_parked_trainables_oldest_out_first():
    plan = SearchPlan()
    parking = Parking(plan, per_worker=2)
    nodes = [paused_at(plan, f"t{i}", 0.1 * (i + 1), 10) for i in range(3)]
    assert parking.park("w1", 1, nodes[0], 10) == []
    assert parking.park("w1", 2, nodes[1], 10) == []
    (evicted,) = parking.park("w1", 3, nodes[2], 10)
    assert (evicted.batch_id, evicted.node) == (1, nodes[0])
    assert nodes[0].parked == set() and nodes[2].parked == {10}
    assert parking.park("w2", 4, nodes[0], 10) == []  # another worker's share


def test_parked_trainables_no_unfinished_trial_needs_are_let_go():
    plan = SearchPlan()
    parking = Parking(plan)
    a, b = paused_at(plan, "a", 0.1, 10), paused_at(plan, "b", 0.1, 10)
    assert a is b  # both paused at the same point of one configuration
    parking.park("w1", 1, a, 10)
    assert parking.unneeded(unfinished=lambda trial_id: trial_id == "b") == []  # b still needs it
    (gone,) = parking.unneeded(unfinished=lambda trial_id: False)
    assert gone.batch_id == 1 and a.parked == set()


def test_a_dead_workers_parked_trainables_are_forgotten():
    plan = SearchPlan()
    parking = Parking(plan)
    nodes = [paused_at(plan, f"t{i}", 0.1 * (i + 1), 10) for i in range(2)]
    parking.park("w1", 1, nodes[0], 10)
    parking.park("w2", 2, nodes[1], 10)
    parking.forget_worker("w1")
    assert len(parking) == 1 and nodes[0].parked == set() and nodes[1].parked == {10}


@pytest.mark.parametrize("per_worker", [-1, 1.5, True])
def test_the_tuner_refuses_a_bad_parking_limit(per_worker):
    from ray_stagetree import Tuner

    with pytest.raises(ValueError, match=f"parked_trainables_per_worker must be an int >= 0.*got {per_worker!r}"):
        Tuner(lambda config: None, parked_trainables_per_worker=per_worker)
