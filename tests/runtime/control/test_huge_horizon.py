"""stop={"training_iteration": 10**9}: a horizon far beyond what a study
trains (ended by a time budget, a metric threshold or the trainable) is
never expanded into one value or one save per iteration (issue 30 point 4:
the worker listed a plain value's 10**6 values before the first iteration,
and a time budget of 15 s ended the study with 0 result rows)."""

import os
from types import SimpleNamespace

import pytest
from ray import tune
from trainables_for_tests import fit_under_a_budget

from ray_stagetree import Constant, Tuner
from ray_stagetree.execution.batches import BatchSpec
from ray_stagetree.execution.payload import CheckpointPayload
from ray_stagetree.planning import TrialConfig
from ray_stagetree.runtime.control.study_trials import SAVES_AHEAD, StudyTrials
from ray_stagetree.runtime.workers.context import ConfigChange, StageContext
from ray_stagetree.sequences import Sequence
from ray_stagetree.trainables import StageTrainable

HORIZON = 10**9
STOP = {"training_iteration": HORIZON, "score": 12}  # Tune's stop: the trial ends once score >= 12


@pytest.fixture
def few_values(monkeypatch):
    """Sequence.value raises past a few thousand calls: a test of a 10**9
    horizon fails at once where the code lists the horizon's values."""
    value = Sequence.value
    calls = []

    def counted(self, iteration):
        calls.append(iteration)
        if len(calls) > 5_000:
            raise AssertionError("a sequence's values were listed one by one over the horizon")
        return value(self, iteration)

    monkeypatch.setattr(Sequence, "value", counted)


def plain_batch(lr, stop=HORIZON):
    """A batch over ``[0, stop)`` of a trial whose ``lr`` the user gave as a
    plain value (PBT's explored values make it a sequence)."""
    config = {"lr": lr}
    return BatchSpec(
        1,
        config,
        segments=[(0, 0, stop)],
        save_iterations=set(),
        trial_config=TrialConfig.from_config(config),
        plain=frozenset({"lr"}),
    )


def test_a_batch_over_a_huge_horizon_finds_its_plain_value_changes_without_listing_values(few_values):
    assert StageContext(plain_batch(0.1), controller=None, put=None).save_iterations == set()
    explored = Constant(0.1).then(0.2, at=3).then(0.3, at=10**8)
    context = StageContext(plain_batch(explored), controller=None, put={}.__setitem__)
    assert context.save_iterations == {3}, "the trainable saves where the value changes, and restarts there"

    def payload(iteration):
        return CheckpointPayload(iteration, {}, state=iteration)

    for _ in range(2):
        context.record({"loss": 1.0}, payload)
    with pytest.raises(ConfigChange):
        context.record({"loss": 1.0}, payload)
    assert context.save_iterations == {3, 10**8}, "then the next change"


def test_checkpoint_frequency_sends_the_next_saves_not_every_save_to_a_huge_horizon():
    # StudyTrials.configured_saves reads only the study's CheckpointConfig (no end: that reads the plan).
    config = tune.CheckpointConfig(checkpoint_frequency=1000, checkpoint_at_end=False)
    study = SimpleNamespace(spec=SimpleNamespace(checkpoint_config=config, class_trainable=True))
    saves = StudyTrials.configured_saves(study, [(0, 0, HORIZON)], None)
    assert saves == list(range(1000, 1000 * SAVES_AHEAD + 1, 1000))
    saves = StudyTrials.configured_saves(study, [(0, 0, HORIZON)], (0, 3000))
    assert saves[:2] == [3000, 4000], "the last reported iteration's save is decided after the reply, at a batch's end"
    assert len(saves) == SAVES_AHEAD
    assert StudyTrials.configured_saves(study, [(0, 0, 2500)], None) == [1000, 2000]


def counting(config):
    for score in range(1, HORIZON + 1):
        tune.report({"score": score, "lr": config["lr"]})


class Counting(StageTrainable):
    def setup(self, config):
        self.steps = 0

    def step(self):
        self.steps += 1
        return {"score": self.steps}

    def get_state(self):
        return {"steps": self.steps}

    def set_state(self, state):
        self.steps = state["steps"]


def fit(tmp_path, name, trainable, **run_config):
    return Tuner(
        trainable,
        param_space={"lr": tune.grid_search([0.1, 0.2])},
        run_config=tune.RunConfig(name=name, storage_path=str(tmp_path), stop=STOP, verbose=0, **run_config),
    ).fit()


@pytest.mark.timeout(240)
def test_a_function_study_to_a_huge_horizon_gives_its_results(tmp_path, ray_session):
    grid = fit(tmp_path, "function", counting)
    assert grid.num_errors == 0
    assert sorted(len(result.metrics_dataframe) for result in grid) == [12, 12]


@pytest.mark.timeout(240)
def test_a_class_study_to_a_huge_horizon_keeps_its_checkpoint_frequency(tmp_path, ray_session):
    grid = fit(tmp_path, "class", Counting, checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=5))
    assert grid.num_errors == 0
    assert [len(result.metrics_dataframe) for result in grid] == [12, 12]
    for result in grid:  # every 5th iteration, and the trial's last (the study's end keeps it), numbered as Tune
        kept = sorted(entry for entry in os.listdir(result.path) if entry.startswith("checkpoint_"))
        assert kept == ["checkpoint_000000", "checkpoint_000001", "checkpoint_000002"]
        assert [metrics["training_iteration"] for _, metrics in result.best_checkpoints] == [5, 10, 12]


def reports_forever(config):
    while True:
        tune.report({"score": 0.0})


@pytest.mark.timeout(300)  # the backlog this guards against ran 323 s; a loaded CI needs ~60 s a budget
def test_a_huge_horizon_under_a_time_budget_ends_near_the_budget_with_every_row_logged(tmp_path, ray_session):
    """Issue 30: a 10**6-iteration study under time_budget_s=15 ran 323 s,
    its driver logging a backlog of rows long after the budget. The loggers
    now keep up (batched, off the driver's loop): fit() returns within the
    test's timeout, and every result row is in the trial's result.json."""

    def fit(budget):
        return Tuner(
            reports_forever,
            param_space={"lr": tune.grid_search([0.1, 0.2])},
            tune_config=tune.TuneConfig(time_budget_s=budget),
            run_config=tune.RunConfig(
                name=f"budget_{budget}", storage_path=str(tmp_path), stop={"training_iteration": 10**6}, verbose=0
            ),
        ).fit()

    def row_count(result):
        return 0 if result.metrics_dataframe is None else len(result.metrics_dataframe)

    # Under the full suite 5 s once started neither trial, and 10 s neither while benchmarks ran beside it.
    grid = fit_under_a_budget(fit, lambda grid: any(row_count(result) for result in grid), budgets=(15, 40))
    assert grid.num_errors == 0
    logged = {}
    for result in grid:
        path = os.path.join(result.path, "result.json")
        with open(path) if os.path.exists(path) else open(os.devnull) as file:
            logged[result.path] = (sum(1 for _ in file), row_count(result))
    assert all(lines == rows for lines, rows in logged.values()), logged
    assert any(rows for _, rows in logged.values()), "a loaded machine may start one trial late, not both"
