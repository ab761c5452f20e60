"""The loop <-> study protocol: a `StudyTrials` runs on any loop that offers
`LoopPort`, alone or beside other studies on one plan, and reaches the loop
through that port only. Ray-free: the loop here is a port over a real
`SearchPlan` that folds a worker's records as `BatchLoop.ingest` does."""

from __future__ import annotations

import ast
import inspect

import pytest

from ray_stagetree.planning.lifecycle import TERMINATED
from ray_stagetree.planning.plan import SearchPlan
from ray_stagetree.runtime.control import study_trials
from ray_stagetree.runtime.control.spec import LoopSpec, StudySpec, WorkerSpec
from ray_stagetree.runtime.control.studies import NodeConfigs, Studies
from ray_stagetree.runtime.control.study_trials import LoopPort, StudyTrials
from ray_stagetree.searchers.sources import VariantSource

HORIZON = 3


class PortOverPlan:
    """The smallest loop: `LoopPort` over ``plan``, and ``train``, a worker's record of a node's iteration."""

    def __init__(self, plan: SearchPlan) -> None:
        self.plan = plan
        self.studies = Studies()
        self.nodes = NodeConfigs(plan)
        self.wakes = 0

    def attach(self, configs: list[dict], study_id: str = "", **options) -> StudyTrials:
        source = VariantSource(configs)
        spec = StudySpec(LoopSpec(WorkerSpec(b""), "/x"), trial_source=source, horizon=HORIZON, **options)
        study = StudyTrials(spec, self.plan, self, store=None, study_id=study_id)
        self.studies.add(study)
        return study

    def train(self, node_id: int, iteration: int, loss: float) -> None:
        metrics = {"loss": loss}
        self.plan.record_metrics(node_id, iteration, metrics)
        for trial_id, study in self.studies.owning(self.plan.trials_through(self.plan.nodes[node_id], iteration)):
            study.add_result(study.trials[trial_id], iteration, metrics)

    # -- LoopPort
    def wake(self) -> None:
        self.wakes += 1

    def configure_node(self, node, state, study, restored=False) -> None:
        self.nodes.configure(node, state, study, restored)

    def release_unneeded(self) -> None:
        pass

    def held_trials(self) -> set[str]:
        return set()

    def stalled(self) -> list:
        return []

    def figures(self) -> dict:
        return {}


def losses(study: StudyTrials) -> dict[str, list[float]]:
    return {t: [row["loss"] for _, row in sorted(state.rows.items())] for t, state in study.trials.items()}


def test_one_study_s_trials_on_a_shared_node_each_get_every_result():
    loop = PortOverPlan(SearchPlan())
    study = loop.attach([{"lr": 0.1}, {"lr": 0.1}])
    assert study.admit() is False  # both admitted, the source is empty
    (node,) = {state.node.node_id for state in study.trials.values()}
    for iteration in range(1, HORIZON + 1):
        loop.train(node, iteration, loss=1.0 / iteration)
    assert list(losses(study).values()) == [[1.0, 0.5, 1 / 3]] * 2
    assert {state.status for state in study.trials.values()} == {TERMINATED}
    assert [len(summary.rows) for summary in study.results()] == [HORIZON, HORIZON]
    assert loop.nodes[node].study is study, "the first trial requesting the node configured it"


@pytest.mark.parametrize("studies", [1, 2])
def test_a_study_attached_later_takes_what_the_plan_holds_without_training(studies):
    """The same trial in a second study on the plan (or a later trial of
    the first) is answered from the plan's results: no iteration trained."""
    loop = PortOverPlan(SearchPlan())
    # Alone, the study runs one trial at a time: its second trial comes once the first has ended.
    first = loop.attach([{"lr": 0.1}] * (3 - studies), study_id="first", max_concurrent_trials=1)
    first.admit()
    (state,) = first.trials.values()
    for iteration in range(1, HORIZON + 1):
        loop.train(state.node.node_id, iteration, loss=float(iteration))
    later = loop.attach([{"lr": 0.1}], study_id="second") if studies == 2 else first
    later.admit()
    new = [s for s in later.trials.values() if s is not state]
    assert [sorted(s.rows) for s in new] == [[1, 2, 3]], "taken from the plan's history (the held-results queue)"
    assert all(s.status == TERMINATED for s in new)
    assert losses(first)[state.trial_id] == [1.0, 2.0, 3.0], "the first study's trial is untouched"


def test_study_trials_reach_the_loop_only_through_the_port():
    """`StudyTrials` never imports the loop, and calls on ``self.port`` only what `LoopPort` declares."""
    tree = ast.parse(inspect.getsource(study_trials))
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom)}
    assert not imported & {
        "ray_stagetree.runtime.control.batch_loop",
        "ray_stagetree.runtime.control.controller",
        "ray_stagetree.runtime.service.shared_plan",
    }
    declared = {name for name in vars(LoopPort) if not name.startswith("_")}
    called = {
        node.attr
        for node in ast.walk(tree)
        if isinstance(node, ast.Attribute)
        and isinstance(node.value, ast.Attribute)
        and node.value.attr == "port"
        and isinstance(node.value.value, ast.Name)
        and node.value.value.id == "self"
    }
    assert called and called <= declared, called - declared


def test_the_loops_offer_the_whole_port():
    """`BatchLoop` (so `StudyController` and `SharedPlan`) defines each
    `LoopPort` method, callable as declared."""
    from ray_stagetree.runtime.control.batch_loop import BatchLoop

    for name in (name for name in vars(LoopPort) if not name.startswith("_")):
        declared = inspect.signature(getattr(LoopPort, name)).parameters
        offered = inspect.signature(getattr(BatchLoop, name)).parameters
        assert list(offered)[: len(declared)] == list(declared), name
        assert all(p.default is not p.empty for p in list(offered.values())[len(declared) :]), name


def test_a_row_at_an_iteration_reported_before_goes_to_the_driver_marked_to_be_logged_again():
    """A PBT exploit takes a trial back to an earlier checkpoint (its rows
    after it dropped, `TrialLifecycle._exploit`): Tune logs the iterations
    it reports from there again, where the driver skips rows it logged."""
    from ray_stagetree.runtime.control.messages import REPORTED_AGAIN

    loop = PortOverPlan(SearchPlan())
    study = loop.attach([{"lr": 0.1}])
    study.admit()
    (state,) = study.trials.values()
    for iteration in (1, 2):
        loop.train(state.node.node_id, iteration, loss=1.0 / iteration)
    state.rows = {1: state.rows[1]}  # as an exploit from its checkpoint at 1 leaves them
    study.add_result(state, 2, {"loss": 0.4})
    fed = [(row["training_iteration"], row.get(REPORTED_AGAIN, False)) for row in study.feed.rows]
    assert fed == [(1, False), (2, False), (2, True)]
