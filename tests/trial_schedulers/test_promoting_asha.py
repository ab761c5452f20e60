"""PromotingASHAScheduler: ASHA as its paper defines it (trials promoted to
the next rung once enough results exist), through Tune's TrialScheduler
calls alone and hosted on the simulator."""

from dataclasses import dataclass, field

import pytest

from ray_stagetree import PromotingASHAScheduler
from ray_stagetree.simulation.simulated_study import RESNET20, StudyDefinition, simulate
from ray_stagetree.trial_schedulers.registry import adapter_for, scheduler_max_t

CONTINUE, PAUSE, STOP = "CONTINUE", "PAUSE", "STOP"


@dataclass(eq=False)
class FakeTrial:
    trial_id: str
    status: str = "RUNNING"


@dataclass
class FakeSearch:
    finished: bool = False

    def is_finished(self) -> bool:
        return self.finished


@dataclass
class FakeController:
    """What a Tune scheduler calls on TuneController."""

    trials: list[FakeTrial] = field(default_factory=list)
    search_alg: FakeSearch = field(default_factory=FakeSearch)
    stopped: list[str] = field(default_factory=list)

    def get_trials(self) -> list[FakeTrial]:
        return self.trials

    def stop_trial(self, trial: FakeTrial) -> None:
        trial.status = "TERMINATED"
        self.stopped.append(trial.trial_id)


def _study(n: int, **kwargs) -> tuple[PromotingASHAScheduler, FakeController]:
    scheduler = PromotingASHAScheduler(metric="loss", mode="min", **kwargs)
    controller = FakeController([FakeTrial(f"t{i}") for i in range(n)])
    for trial in controller.trials:
        scheduler.on_trial_add(controller, trial)
    return scheduler, controller


def _report(scheduler, controller, index: int, iteration: int, loss: float) -> str:
    trial = controller.trials[index]
    decision = scheduler.on_trial_result(controller, trial, {"training_iteration": iteration, "loss": loss})
    if decision == PAUSE:
        trial.status = "PAUSED"
    return decision


def test_rungs_follow_grace_period_and_reduction_factor():
    assert PromotingASHAScheduler(max_t=120, grace_period=15, reduction_factor=4).milestones == [15, 60]
    assert PromotingASHAScheduler(max_t=16, grace_period=1, reduction_factor=2).milestones == [1, 2, 4, 8]


def test_a_trial_waits_at_its_rung_until_enough_worse_results_arrive():
    scheduler, controller = _study(4, max_t=16, grace_period=2, reduction_factor=2)
    # The first trial at a rung is never in the top floor(1/2) = 0: it waits (Ray's ASHA would continue it).
    assert _report(scheduler, controller, 0, 2, loss=0.5) == PAUSE
    assert scheduler.choose_trial_to_run(controller) is None  # nothing promotable, nothing pending
    # A worse second result makes the first promotable; the second itself waits.
    assert _report(scheduler, controller, 1, 2, loss=0.9) == PAUSE
    assert scheduler.choose_trial_to_run(controller).trial_id == "t0"
    # A better third result is in the top floor(3/2) = 1 at once: it goes on, the first still waits.
    assert _report(scheduler, controller, 2, 2, loss=0.1) == CONTINUE
    assert scheduler.top(0) == ["t2"]
    assert scheduler.choose_trial_to_run(controller) is None
    # The fourth result (the worst) makes the top two: the first is promoted now, late.
    assert _report(scheduler, controller, 3, 2, loss=0.95) == PAUSE
    assert scheduler.promotable() == ["t0"]


def test_promotion_order_is_highest_rung_first_then_best_result():
    scheduler, controller = _study(6, max_t=64, grace_period=1, reduction_factor=2)
    assert _report(scheduler, controller, 0, 1, 0.5) == PAUSE
    assert _report(scheduler, controller, 1, 1, 0.9) == PAUSE
    controller.trials[0].status = "RUNNING"  # promoted: rung 0's top 1 of 2
    assert _report(scheduler, controller, 0, 2, 0.4) == PAUSE  # alone at rung 1
    assert _report(scheduler, controller, 2, 1, 0.3) == CONTINUE  # rung 0's best of 3
    assert _report(scheduler, controller, 2, 2, 0.45) == PAUSE  # rung 1: t0 is the top 1 of 2
    assert scheduler.promotable() == ["t0"]
    assert _report(scheduler, controller, 3, 1, 0.6) == PAUSE  # not in rung 0's top 2 of 4
    # In rung 0's top, yet it waits: t0, waiting at a higher rung, is promoted first.
    assert _report(scheduler, controller, 4, 1, 0.2) == PAUSE
    assert _report(scheduler, controller, 5, 1, 0.1) == PAUSE
    assert scheduler.promotable() == ["t0", "t5", "t4"]  # highest rung first, then the best result
    assert scheduler.choose_trial_to_run(controller).trial_id == "t0"


def test_pending_trials_start_after_promotions_and_settled_rungs_stop():
    scheduler, controller = _study(3, max_t=8, grace_period=2, reduction_factor=2)
    controller.trials[2].status = "PENDING"
    _report(scheduler, controller, 0, 2, 0.5)
    _report(scheduler, controller, 1, 2, 0.9)
    assert scheduler.choose_trial_to_run(controller).trial_id == "t0"  # a promotion before a new trial
    controller.trials[0].status = "RUNNING"
    assert scheduler.choose_trial_to_run(controller).trial_id == "t2"
    controller.trials[2].status = "RUNNING"
    assert _report(scheduler, controller, 2, 2, 0.99) == PAUSE
    assert scheduler.on_trial_result(controller, controller.trials[0], {"training_iteration": 8, "loss": 0.2}) == STOP
    controller.trials[0].status = "TERMINATED"
    # Nothing runs; while the search may add trials, the waiting ones wait.
    assert scheduler.choose_trial_to_run(controller) is None and controller.stopped == []
    controller.search_alg.finished = True
    assert scheduler.choose_trial_to_run(controller) is None
    assert controller.stopped == ["t1", "t2"]


def test_mode_max_ranks_higher_first():
    scheduler = PromotingASHAScheduler(metric="acc", mode="max", max_t=8, grace_period=2, reduction_factor=2)
    controller = FakeController([FakeTrial("a"), FakeTrial("b")])
    for trial in controller.trials:
        scheduler.on_trial_add(controller, trial)
    scheduler.on_trial_result(controller, controller.trials[0], {"training_iteration": 2, "acc": 0.9})
    scheduler.on_trial_result(controller, controller.trials[1], {"training_iteration": 2, "acc": 0.1})
    assert scheduler.top(0) == ["a"]


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"reduction_factor": 1}, "reduction_factor"),
        ({"max_t": 0}, "max_t"),
        ({"grace_period": 200, "max_t": 100}, "grace_period"),
        ({"mode": "minimize"}, "mode"),
        ({"time_attr": ""}, "time_attr"),
    ],
)
def test_bad_arguments_are_named(kwargs, message):
    with pytest.raises(ValueError, match=message):
        PromotingASHAScheduler(**kwargs)


def test_without_metric_it_refuses_its_first_trial():
    with pytest.raises(ValueError, match="needs a metric and a mode"):
        PromotingASHAScheduler().on_trial_add(FakeController(), FakeTrial("t"))


def test_hosted_with_its_rungs_as_decision_points():
    scheduler = PromotingASHAScheduler(metric="accuracy", mode="max", max_t=120, grace_period=15)
    adapter, exact = adapter_for(scheduler)
    assert adapter.__name__ == "PromotingASHAAdapter" and exact
    assert scheduler_max_t(scheduler) == 120
    hosted = adapter(scheduler, 120, exact)
    assert hosted.decides_at_milestones
    assert [hosted.next_decision("t", at) for at in (0, 15, 59, 60)] == [15, 60, 60, 120]


def test_simulated_study_promotes_through_the_rungs():
    """On the simulator, every trial admitted at once: all 16 reach the
    first rung and wait there unless promoted; a trial goes on only from a
    rung's top quarter (so at least 4 results precede the first promotion),
    the best of the first rung is always promoted, and the trials never
    promoted are not stopped by the scheduler but closed at the study's end."""
    from ray_stagetree import MultiStep

    trials = [
        {"lr": MultiStep(lr, [6], 0.1), "batch_size": 128, "weight_decay": wd}
        for lr in (0.01, 0.02, 0.05, 0.1)
        for wd in (1e-4, 3e-4, 1e-3, 3e-3)
    ]
    made: list[PromotingASHAScheduler] = []

    def scheduler() -> PromotingASHAScheduler:
        made.append(PromotingASHAScheduler(max_t=16, grace_period=1, reduction_factor=4))
        return made[-1]

    run = simulate([StudyDefinition("s", trials, RESNET20, horizon=16, scheduler=scheduler)], gpus=4)
    (asha,) = made
    outcome = run.studies["s"]
    assert len(asha.rungs[0]) == 16
    assert 4 <= len(asha.rungs[1]) < 16
    assert asha.top(0)[0] in asha.rungs[1]
    assert outcome.finished and outcome.finished <= set(asha.rungs[1])
    assert not outcome.stopped
    # Each trial trained its path once: rung 0 (1 iteration), rung 1 (3 more), max_t (12 more).
    assert run.result.iterations == 16 + 3 * len(asha.rungs[1]) + 12 * len(outcome.finished)
