"""Where a stage batch's time goes (runtime.workers.phases): the worker's
own phases around the trainable, the trainable's named ones
(`ray_stagetree.timed`), summed in `ResultGrid.phase_seconds` and kept with
each run of the plan (the monitor's timeline)."""

import pytest
from ray import tune
from trainables_for_tests import report_step, restored_step

from ray_stagetree import MultiStep, Tuner, get_hparams, timed
from ray_stagetree.planning.plan import SearchPlan
from ray_stagetree.runtime.workers import phases
from ray_stagetree.runtime.workers.phases import PhaseClock


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock(monkeypatch):
    """The phase clock's time, moved by the test."""
    fake = FakeClock()
    monkeypatch.setattr(phases.time, "perf_counter", fake)
    return fake


def test_time_in_a_phase_counts_for_it_and_the_rest_is_train(clock):
    spent = PhaseClock()
    with spent.phase("save"):
        clock.now += 2.0
    clock.now += 1.0  # the trainable's own, in no phase
    assert spent.take(total=10.0) == {"save": 2.0, "train": 8.0}
    assert spent.take(total=1.0) == {"train": 1.0}, "each take counts from the last"


def test_an_inner_phase_counts_apart_from_the_outer_one(clock):
    spent = PhaseClock()
    with spent.phase("data"):
        clock.now += 1.0
        with spent.phase("report"):
            clock.now += 3.0
        clock.now += 0.5
    assert spent.take(total=4.5) == {"data": 1.5, "report": 3.0, "train": 0.0}


def test_a_phase_open_at_a_take_is_split_between_the_takes(clock):
    spent = PhaseClock()
    with spent.phase("data"):
        clock.now += 1.0
        first = spent.take(total=1.0)
        clock.now += 2.0
    assert first == {"data": 1.0, "train": 0.0}
    assert spent.take(total=2.0) == {"data": 2.0, "train": 0.0}


def staged(config):
    """Trains from its checkpoint, moving its 'data' in a phase of its own."""
    step = restored_step()
    while True:
        step += 1
        with timed("data_to_device"):
            lr = get_hparams()["lr"]
        report_step({"loss": lr / step}, step)


def test_a_studys_worker_seconds_by_phase_and_each_runs_phases(ray_session, tmp_path):
    """Two trials share [0, 2): a stage that starts from the checkpoint at 2
    fetches and restores it."""
    results = Tuner(
        staged,
        param_space={"lr": tune.grid_search([MultiStep(0.1, [2], 0.1), MultiStep(0.1, [2], 0.5)])},
        run_config=tune.RunConfig(storage_path=str(tmp_path), stop={"training_iteration": 4}, verbose=0),
    ).fit()
    assert not results.errors
    spent = results.phase_seconds
    assert {"dispatch", "fetch", "restore", "train", "save", "report", "data_to_device"} <= spent.keys()
    assert all(seconds >= 0 for seconds in spent.values())
    runs = SearchPlan.load(f"{results.experiment_path}/plan").runs
    assert all({"train", "save", "dispatch"} <= dict(run.phases).keys() for run in runs)
    forks = [run for run in runs if run.segments[0][1] == 2]
    assert forks and all({"fetch", "restore"} <= dict(run.phases).keys() for run in forks), "from the checkpoint at 2"
