"""Simulated studies: schedule-dependent learning curves, Ray Tune schedulers
driven on the simulator, stage-based against trial-based execution."""

import functools
import importlib.util
import os
import random
import sys

import pytest
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
from ray.tune.search import Searcher

from ray_stagetree import MultiStep, Warmup
from ray_stagetree.planning import SearchPlan
from ray_stagetree.simulation.paper_spaces import SuccessiveHalving
from ray_stagetree.simulation.simulated_study import (
    RESNET20,
    Curves,
    LearningCurve,
    ModelProfile,
    StudyDefinition,
    simulate,
)
from ray_stagetree.simulation.simulator import Simulation

# Every iteration costs one second and checkpoints are free, so the same
# rung is reached at the same instant however the stages are cut.
UNIT = ModelProfile(
    "unit",
    "accuracy",
    1.0,
    LearningCurve(0.1, 0.94, 10.0, 0.06, {"lr": 0.1, "momentum": 0.9, "batch_size": 128}),
    checkpoint_load_seconds=0.0,
    checkpoint_save_seconds=0.0,
    step_overhead=0.0,
)


def small_space(model: str = "unit") -> list[dict]:
    """16 trials that share prefixes of different lengths."""
    return [
        {
            "lr": lr,
            "batch_size": batch_size,
            "momentum": momentum,
            "model": model,
        }
        for lr in (
            MultiStep(0.1, [20], 0.1),
            MultiStep(0.1, [30], 0.1),
            Warmup(0.01, 5, MultiStep(0.1, [25], 0.1)),
            MultiStep(0.05, [20], 0.1),
        )
        for batch_size in (128, MultiStep(values=(128, 256), milestones=[15]))
        for momentum in (0.9, 0.5)
    ]


def test_learning_curves_equal_on_shared_prefixes():
    configs = small_space()
    shared, alone = SearchPlan(), SearchPlan()
    for index, config in enumerate(configs):
        shared.add_trial(f"t{index}", config, 40)
        alone.add_trial(f"t{index}", config, 40, share_key=f"t{index}")  # a tree per trial
    profiles = {"unit": UNIT}
    curves_shared, curves_alone = Curves(profiles), Curves(profiles)

    def curve(plan, curves, trial_id):
        path = plan.path(trial_id)
        node = path[-1]
        points = []
        for iteration in range(1, 41):
            # the node of the path that trains iteration iteration - 1
            owner = next(n for n in reversed(path) if n.fork_iteration < iteration)
            points.append(curves.metrics(owner, iteration)["accuracy"])
        assert points[-1] == curves.metrics(node, 40)["accuracy"]
        return points

    for index in range(len(configs)):
        assert curve(shared, curves_shared, f"t{index}") == curve(alone, curves_alone, f"t{index}")
    # lr decays at 20 for t0 and at 30 for t4: equal up to 20, different after.
    first, second = curve(shared, curves_shared, "t0"), curve(shared, curves_shared, "t4")
    assert first[:20] == second[:20]
    assert first[20] != second[20]
    # ...and the decay pays off within a few epochs, as in real iteration-decay curves.
    assert first[23] > second[23]


def test_simulation_records_the_same_metrics_shared_and_alone():
    profiles = {"unit": UNIT}
    histories = []
    for share in (True, False):
        plan = SearchPlan()
        for index, config in enumerate(small_space()):
            plan.add_trial(f"t{index}", config, 30, share_key="s" if share else f"t{index}")
        curves = Curves(profiles)
        Simulation(4, seconds_per_iteration=curves.seconds, metrics=curves.metrics).run(plan)
        histories.append({t: {s: m["accuracy"] for s, m in plan.history(t).items()} for t in plan.trials})
    assert histories[0] == histories[1]
    assert all(len(history) == 30 for history in histories[0].values())


def test_asha_stops_the_same_trials_stage_based_and_trial_based():
    trials = small_space()
    study = StudyDefinition(
        "asha",
        trials,
        UNIT,
        horizon=40,
        scheduler=lambda: ASHAScheduler(max_t=40, grace_period=5, reduction_factor=2),
    )
    # As many workers as trials: every rung is reached at the same instant both ways.
    stage = simulate([study], gpus=len(trials), share=True)
    trial = simulate([study], gpus=len(trials), share=False)
    assert stage.studies["asha"].stopped == trial.studies["asha"].stopped
    assert stage.studies["asha"].finished == trial.studies["asha"].finished
    assert 0 < len(stage.studies["asha"].stopped) < len(trials)
    assert stage.result.worker_seconds < trial.result.worker_seconds
    assert stage.result.makespan <= trial.result.makespan
    assert trial.explored_merge_rate == 1.0 < stage.explored_merge_rate


@pytest.mark.parametrize("scheduler", ["sha", "asha", None])
def test_stage_based_uses_no_more_gpu_seconds_than_trial_based(scheduler):
    trials = [{**config, "model": "resnet20"} for config in small_space()]
    schedulers = {
        "sha": lambda: SuccessiveHalving(len(trials), grace_period=5, max_t=40, reduction_factor=4),
        "asha": lambda: ASHAScheduler(max_t=40, grace_period=5, reduction_factor=4),
        None: None,
    }
    study = StudyDefinition("s", trials, RESNET20, 40, schedulers[scheduler], final_iterations=10)
    stage = simulate([study], gpus=4, share=True)
    trial = simulate([study], gpus=4, share=False)
    assert stage.result.worker_seconds <= trial.result.worker_seconds
    assert stage.studies["s"].best_trial is not None
    if scheduler == "sha":
        # 16 trials, rungs 5, 20, 40: 4 go on to 20 and one to the end.
        assert len(stage.studies["s"].finished) == 1
        assert len(stage.studies["s"].stopped) == 15
        assert stage.studies["s"].stopped == trial.studies["s"].stopped


def test_multi_study_shares_across_studies():
    first, second = small_space("resnet20")[:8], small_space("resnet20")[4:12]
    studies = [StudyDefinition(f"s{i}", trials, RESNET20, 30) for i, trials in enumerate((first, second))]
    together = simulate(studies, gpus=4)
    apart = sum(simulate([study], gpus=4).result.iterations for study in studies)
    assert together.result.iterations < apart


def test_quick_benchmark_runs(capsys, monkeypatch):
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.path.join(repo, "release", "bench_simulator.py")
    monkeypatch.syspath_prepend(os.path.dirname(path))  # its shared `harness`, as when run as a script
    spec = importlib.util.spec_from_file_location("bench_simulator", path)
    bench = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, bench)  # its dataclasses look their module up
    spec.loader.exec_module(bench)
    studies = bench.single_studies(every=32)
    runs = bench.report_single(studies)
    bench.report_multi(every=32, sizes=[1, 2])
    out = capsys.readouterr().out
    assert "ResNet56 ASHA" in out and "k-wise" in out
    for trial, stage in runs.values():
        assert stage.result.worker_seconds <= trial.result.worker_seconds


def test_an_execution_policy_instance_runs_as_its_name_does():
    from ray_stagetree import RoundRobinPolicy, ThroughputPolicy
    from ray_stagetree.simulation.simulator import KnownCosts

    study = StudyDefinition("s", small_space(), UNIT, 30)
    by_name = simulate([study], gpus=4, policy="thr")
    given = ThroughputPolicy(cost_model=KnownCosts(Curves({"unit": UNIT}).seconds))
    by_instance = simulate([study], gpus=4, policy=given)
    assert by_instance.result == by_name.result
    assert given._forest is None, "the caller's policy is copied, not used up"
    round_robin = RoundRobinPolicy(quantum_s=5.0)
    shared = simulate([study], gpus=4, policy=round_robin)
    assert shared.result.iterations == by_name.result.iterations and round_robin.metric is None
    assert Simulation(workers=2).policy(given) is not given


def test_the_bound_of_a_run_puts_the_best_trials_final_training_after_its_study():
    # Four unshared trials of 10 one-second iterations on 2 GPUs, then the
    # best trains 5 more: 20 s before it can start, 25 s in all, where the
    # work alone (45 s over 2 GPUs) and the longest path (15 s) say less.
    trials = [{"lr": 0.1 + index / 100} for index in range(4)]
    run = simulate([StudyDefinition("s", trials, UNIT, 10, final_iterations=5)], gpus=2)
    assert run.bound_hours * 3600 == pytest.approx(25.0)
    assert run.result.makespan >= run.bound_hours * 3600
    search = run.studies["s"].search_seconds
    assert (search, run.result.makespan - search) == pytest.approx((20.0, 5.0)), "the search, then the final 5"


def test_in_trial_order_the_oldest_trial_runs_first_whatever_its_path():
    # Two unshared trials on one GPU: the second admitted has the longer path
    # (a smaller batch: 2 s an iteration against 0.5 s), so critical path runs
    # it first; in trial order (the runtime's, for a scheduler comparing
    # trials) the first admitted runs first.
    import dataclasses

    paced = dataclasses.replace(UNIT, step_overhead=1.0)
    trials = [{"lr": 0.1, "batch_size": 256}, {"lr": 0.2, "batch_size": 64}]
    study = StudyDefinition("s", trials, paced, 10)
    first_done = {
        order: simulate([study], gpus=1, trial_order=order).studies["s"].finishes[0][0] for order in (False, True)
    }
    assert first_done == pytest.approx({False: 20.0, True: 5.0})
    # By default as the runtime runs it: the policy's order without a
    # scheduler, trial order under one that compares trials (ASHA).
    assert simulate([study], gpus=1).studies["s"].finishes[0][0] == pytest.approx(20.0)
    asha = functools.partial(ASHAScheduler, max_t=10, grace_period=10)  # no rung before the horizon: none stops
    compared = dataclasses.replace(study, scheduler=asha)
    assert simulate([compared], gpus=1).studies["s"].finishes[0][0] == pytest.approx(5.0)


def test_a_pending_limit_admits_a_grid_as_workers_free_up():
    """max_pending_trials (Tune's TUNE_MAX_PENDING_TRIALS_PG) bounds listed
    trials too: with 1 on 2 GPUs, the scheduler hears of 3 trials before the
    first ends (the grid all at once without it)."""
    events = []

    class Logged(FIFOScheduler):
        def on_trial_add(self, tune_controller, trial):
            events.append("add")

        def on_trial_complete(self, tune_controller, trial, result):
            events.append("complete")

    trials = [{"lr": 0.01 * (index + 1)} for index in range(8)]
    for pending, before_first_end in ((1, 3), (None, 8)):
        events.clear()
        study = StudyDefinition("s", trials, UNIT, horizon=10, scheduler=Logged, max_pending_trials=pending)
        run = simulate([study], gpus=2)
        assert len(run.studies["s"].finished) == 8
        assert events.count("add") == 8 and events.index("complete") == before_first_end, (pending, events)


def test_a_searcher_is_asked_as_its_trials_start_as_the_controller_asks_it():
    """Without max_concurrent_trials, a searcher's next trial is admitted
    only while none of its trials waits for a worker (Tune's pending-trial
    limit, as the controller applies it): on 2 GPUs it proposes 3 trials
    before the first ends, not all 8."""
    events = []

    class Logged(Searcher):
        def __init__(self):
            super().__init__(metric="accuracy", mode="max")
            self.rng = random.Random(0)

        def suggest(self, trial_id):
            events.append("suggest")
            return {"lr": self.rng.uniform(0.01, 0.2)}

        def on_trial_complete(self, trial_id, result=None, error=False):
            events.append("complete")

    study = StudyDefinition(
        "s", [], UNIT, horizon=10, searcher=Logged, param_space={"lr": tune.uniform(0.01, 0.2)}, num_samples=8
    )
    run = simulate([study], gpus=2)
    assert len(run.studies["s"].finished) == 8
    assert events.count("suggest") == 8 and events.index("complete") <= 3, events
