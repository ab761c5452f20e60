"""Tune's results made from reported metrics (runtime.control.result_rows),
without Ray: the fields Tune adds, the metric checks, RunConfig.stop."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from ray import tune
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler
from ray.tune.search import Searcher
from ray.tune.search.basic_variant import BasicVariantGenerator

from ray_stagetree.execution.batches import REPORTED_CHECKPOINT
from ray_stagetree.planning.config import TrialConfig
from ray_stagetree.runtime.control.messages import PackedRows
from ray_stagetree.runtime.control.result_rows import STOPPER_POLL_S, ResultRows, expected_metrics, metric_consumers
from ray_stagetree.runtime.control.trials import TrialState


def trial(restored_at: int = 0) -> TrialState:
    state = TrialState(trial_id="t1", config={"lr": 0.1}, name="train_t1", restored_at=restored_at)
    state.configure({"lr": 0.1}, TrialConfig.from_config({"lr": 0.1}))
    return state


def rows(metric=None, consumers=None, stop_thresholds=None, stopper=None) -> tuple[ResultRows, list[str]]:
    warnings: list[str] = []
    return ResultRows(metric, consumers or {}, stop_thresholds or {}, stopper, warnings.append), warnings


def test_a_row_carries_tunes_fields_and_its_times_add_up():
    made, _ = rows()
    state = trial()
    first = made.row(state, 1, {"loss": 3.0, "time_this_iter_s": 2.0}, horizon=10)
    assert first == {
        "loss": 3.0,
        "time_this_iter_s": 2.0,
        "trial_id": "t1",
        "training_iteration": 1,
        "done": False,
        "config": {"lr": 0.1},
        "time_total_s": 2.0,
        "time_since_restore": 2.0,
        "iterations_since_restore": 1,
    }
    state.reported.append(first)
    second = made.row(state, 2, {"loss": 2.0, "time_this_iter_s": 0.5}, horizon=10)
    assert (second["time_total_s"], second["time_since_restore"]) == (2.5, 2.5)
    assert made.row(state, 10, {}, horizon=10)["done"]  # the horizon
    assert made.row(state, 3, {"done": True}, horizon=10)["done"]  # the trainable said so


def test_the_time_since_restore_starts_again_at_a_restore():
    made, _ = rows()
    state = trial(restored_at=4)
    state.reported.append({"training_iteration": 4, "time_total_s": 9.0, "time_since_restore": 9.0})
    row = made.row(state, 5, {"time_this_iter_s": 1.0}, horizon=float("inf"))
    assert (row["time_total_s"], row["time_since_restore"], row["iterations_since_restore"]) == (10.0, 1.0, 1)


def test_a_function_trainables_rows_name_its_checkpoints_folders_as_tune_numbers_them():
    """Tune's ``checkpoint_dir_name``: the n-th checkpoint the function
    reported is ``checkpoint_<n-1>``, None where a report had none; an
    iteration reported again (a retry) names the folder it had. A class
    trainable's rows (no marker) have no such key, as in Tune."""
    from ray.train.constants import CHECKPOINT_DIR_NAME as TUNES

    made, _ = rows()
    state = trial()
    names = []
    for iteration, reported in enumerate([True, False, True, True], start=1):
        row = made.row(state, iteration, {REPORTED_CHECKPOINT: reported}, horizon=10)
        assert REPORTED_CHECKPOINT not in row
        state.rows[iteration] = row
        names.append(row[TUNES])
    assert names == ["checkpoint_000000", None, "checkpoint_000001", "checkpoint_000002"]
    assert made.row(state, 3, {REPORTED_CHECKPOINT: True}, horizon=10)[TUNES] == "checkpoint_000001"
    assert made.row(state, 5, {REPORTED_CHECKPOINT: True}, horizon=10)[TUNES] == "checkpoint_000003"
    assert TUNES not in made.row(trial(), 1, {"loss": 1.0}, horizon=10)


def test_checkpoint_folders_are_those_the_rows_name_else_numbered_by_position():
    state = trial()
    state.rows = {1: {"checkpoint_dir_name": "checkpoint_000000"}, 4: {"checkpoint_dir_name": "checkpoint_000003"}}
    assert state.checkpoint_folders([1, 4]) == ["checkpoint_000000", "checkpoint_000003"]
    state.rows = {1: {}, 4: {}}  # a class trainable's, or rows restored from before they named folders
    assert state.checkpoint_folders([1, 4]) == ["checkpoint_000000", "checkpoint_000001"]


def test_a_value_a_scheduler_compares_must_be_a_number():
    made, _ = rows(consumers={"loss": "the trial scheduler (ASHAScheduler)"})
    state = trial()
    assert made.invalid(state, 1, {"loss": 1}) is None
    assert made.invalid(state, 1, {"loss": np.float32(0.5)}) is None
    assert made.invalid(state, 1, {"other": "text"}) is None  # nobody compares it
    assert made.invalid(state, 1, {"loss": None}) is None  # not reported
    for value in ("0.5", True, [1.0]):
        problem = made.invalid(state, 3, {"loss": value})
        assert f"trial train_t1 reported loss={value!r}" in problem and "at iteration 3" in problem
        assert "the trial scheduler (ASHAScheduler) compares 'loss': it must be a number" in problem


def test_the_expected_metrics_are_tunes_in_the_order_it_checks_them():
    class TwoObjectives(Searcher):
        def __init__(self):
            super().__init__()
            self._metric = ["loss", "gain"]  # as OptunaSearch(metric=["loss", "gain"]) keeps them

    asha = ASHAScheduler(metric="acc", mode="max")
    assert expected_metrics("loss", TwoObjectives(), asha) == [
        ("tune.TuneConfig()", ["loss"]),
        ("AsyncHyperBandScheduler", ["acc"]),
        ("TwoObjectives", ["loss", "gain"]),
    ]
    # Tune's placeholder metric (set where none was given) and FIFO's None expect nothing
    assert expected_metrics(None, None, FIFOScheduler()) == []
    assert expected_metrics(None, None, ASHAScheduler(metric="_metric", mode="max")) == []


def test_a_result_without_an_expected_metric_stops_the_study_as_tunes_strict_check_does():
    expected = [("tune.TuneConfig()", ["loss"]), ("OptunaSearch", ["loss", "gain"])]
    strict = ResultRows("loss", {}, {}, None, [].append, expected, strict=True)
    state = trial()
    problem = strict.missing_metric(state, 2, {"acc": 0.5, "training_iteration": 2, "time_this_iter_s": 1.0})
    assert problem is not None and problem.startswith("Trial train_t1 returned a result which did not include")
    assert "metric(s) `loss` that `tune.TuneConfig()` expects (it reported ['acc'] at iteration 2)" in problem
    assert "TUNE_DISABLE_STRICT_METRIC_CHECKING environment variable to 1" in problem
    assert "`gain` that `OptunaSearch` expects" in strict.missing_metric(state, 1, {"loss": 1.0})
    assert strict.missing_metric(state, 1, {"loss": 1.0, "gain": 2.0}) is None
    # a row that holds nothing reported (the function returned) is not checked, as in Tune
    assert strict.missing_metric(state, 3, {"done": True, "training_iteration": 3}) is None
    lenient = ResultRows("loss", {}, {}, None, [].append, expected, strict=False)
    assert lenient.missing_metric(state, 2, {"acc": 0.5}) is None


def test_a_missing_metric_is_warned_of_once_per_study():
    made, warnings = rows(metric="loss")
    state = trial()
    assert made.invalid(state, 1, {"acc": 0.5, "time_this_iter_s": 1.0}) is None
    assert made.invalid(state, 2, {"acc": 0.6}) is None
    assert len(warnings) == 1
    assert "reported ['acc'] at iteration 1, without TuneConfig's metric 'loss'" in warnings[0]


def test_the_consumers_are_the_searcher_and_a_comparing_scheduler():
    asha = ASHAScheduler(metric="loss", mode="min")
    assert metric_consumers(None, asha) == {"loss": "the trial scheduler (AsyncHyperBandScheduler)"}
    assert metric_consumers(None, FIFOScheduler()) == {}
    assert metric_consumers(BasicVariantGenerator(), None) == {}


def test_stop_thresholds_and_a_stopper_end_a_trial_and_stop_all_ends_the_study():
    made, _ = rows(stop_thresholds={"acc": 0.9})
    assert not made.stop_met("t1", {"acc": 0.5}) and made.stop_met("t1", {"acc": 0.9})
    assert not made.stop_met("t1", {"acc": "high"}) and not made.stop_all()
    assert made.poll_in() is None, "thresholds are met at a result: nothing to ask between results"

    class Enough(tune.Stopper):
        def __init__(self):
            self.all = False

        def __call__(self, trial_id, result):
            return result["training_iteration"] >= 3

        def stop_all(self):
            return self.all

    stopper = Enough()
    made, _ = rows(stopper=stopper)
    assert not made.stop_met("t1", {"training_iteration": 2}) and made.stop_met("t1", {"training_iteration": 3})
    assert not made.stop_all()
    stopper.all = True
    assert made.stop_all()
    assert made.poll_in() == STOPPER_POLL_S, "a stopper is asked between results too, as Tune asks it each step"


@pytest.mark.parametrize("metric", [["loss", "gain"]])
def test_a_multi_objective_searcher_compares_each_of_its_metrics(metric):
    optuna = pytest.importorskip("ray.tune.search.optuna")
    pytest.importorskip("optuna")
    searcher = optuna.OptunaSearch(metric=metric, mode=["min", "max"])
    assert metric_consumers(searcher, None) == {name: "the searcher (OptunaSearch)" for name in metric}


def test_a_result_of_over_ten_thousand_values_is_warned_of_once():
    """A 100,000-key metric dict took the driver to 1.6 GB without a word:
    every result stays in memory, so an unusually large one is named."""
    made, warnings = rows()
    state = trial()
    assert made.invalid(state, 1, {"loss": 1.0, "curve": list(range(9_000)), "hist": {"a": 1}}) is None
    assert warnings == [], "under the bound"
    made.invalid(state, 2, {"loss": 1.0, "weights": np.zeros((100, 200))})
    assert len(warnings) == 1 and "trial train_t1 reported more than 10,000 values at iteration 2" in warnings[0]
    assert "save large arrays in the trial's checkpoints" in warnings[0]
    made.invalid(state, 3, {f"k{i}": {"v": i} for i in range(100_000)})
    assert len(warnings) == 1, "once per study"
    rows_again, fresh = rows()
    rows_again.invalid(state, 1, {f"k{i}": {"v": i} for i in range(100_000)})
    assert len(fresh) == 1


def test_a_summary_carries_the_rows_packed_and_reads_them_back_whole():
    """The driver holds every trial's summary at a study's end: the rows but
    the last (Result.metrics) stay pickled until read."""
    reported = [{"training_iteration": i, "loss": 1.0 / i, "config": {"lr": 0.1}} for i in range(1, 6)]
    packed = pickle.loads(pickle.dumps(PackedRows(reported)))  # as it travels from the controller
    assert len(packed) == 5 and bool(packed) and packed[-1] == packed[4] == reported[-1]
    assert list(packed) == reported and packed[:-1] == reported[:-1] and packed[1] == reported[1]
    assert not PackedRows([]) and list(PackedRows([])) == [] and list(PackedRows(reported[:1])) == reported[:1]


def test_strict_checking_is_on_unless_tunes_variable_is_1(monkeypatch):
    from ray_stagetree.runtime.driver.arguments import strict_metric_checking

    monkeypatch.delenv("TUNE_DISABLE_STRICT_METRIC_CHECKING", raising=False)
    assert strict_metric_checking()
    for value, strict in (("1", False), ("0", True), ("2", True)):
        monkeypatch.setenv("TUNE_DISABLE_STRICT_METRIC_CHECKING", value)
        assert strict_metric_checking() is strict
    monkeypatch.setenv("TUNE_DISABLE_STRICT_METRIC_CHECKING", "yes")
    with pytest.raises(ValueError, match="TUNE_DISABLE_STRICT_METRIC_CHECKING.*'yes'"):
        strict_metric_checking()
