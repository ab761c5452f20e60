"""`ResultGrid.get_dataframe` as Tune's (``ExperimentAnalysis.dataframe``):
the last result per trial, or the best by a metric and mode, and bad
arguments refused by name."""

import logging

import pandas as pd
import pytest
from ray import tune

from ray_stagetree.runtime.driver.results import ResultGrid


def trial(path, losses, **more):
    frame = pd.DataFrame([{"loss": loss, "training_iteration": i + 1, **more} for i, loss in enumerate(losses)])
    return tune.Result(metrics={"loss": losses[-1]}, checkpoint=None, error=None, path=path, metrics_dataframe=frame)


def grid():
    return ResultGrid([trial("/s/a", [3.0, 1.0, 2.0]), trial("/s/b", [0.5, 4.0]), trial("/s/c", [1.0], acc=0.9)], "/s")


def test_the_last_result_per_trial_unless_a_metric_and_mode_pick_one():
    last = grid().get_dataframe()
    assert last["loss"].tolist() == [2.0, 4.0, 1.0] and last["logdir"].tolist() == ["/s/a", "/s/b", "/s/c"]
    assert grid().get_dataframe(filter_metric="loss")["loss"].tolist() == [2.0, 4.0, 1.0], "no mode: the last, as Tune"
    lowest = grid().get_dataframe(filter_metric="loss", filter_mode="min")
    assert lowest[["loss", "training_iteration"]].values.tolist() == [[1.0, 2], [0.5, 1], [1.0, 1]]
    assert grid().get_dataframe(filter_metric="loss", filter_mode="max")["loss"].tolist() == [3.0, 4.0, 1.0]
    by_accuracy = grid().get_dataframe(filter_metric="acc", filter_mode="max")
    assert by_accuracy["loss"].tolist() == [2.0, 4.0, 1.0], "a trial without the metric: its last result"


def test_a_trial_that_reported_no_number_for_the_metric_is_left_out_with_a_warning(caplog):
    results = ResultGrid([trial("/s/a", [None, None]), trial("/s/b", [0.5, 4.0])], "/s")
    with caplog.at_level(logging.WARNING):
        frame = results.get_dataframe(filter_metric="loss", filter_mode="min")
    assert frame["logdir"].tolist() == ["/s/b"]
    assert any("/s/a reported no number for 'loss'" in record.getMessage() for record in caplog.records)


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        ({"filter_metric": "loss", "filter_mode": "maximum"}, "filter_mode='maximum'.*'min', 'max' or None"),
        ({"filter_mode": "min"}, "filter_mode='min'.*needs the filter_metric"),
    ],
)
def test_bad_filter_arguments_are_refused_by_name(arguments, message):
    with pytest.raises(ValueError, match=message):
        grid().get_dataframe(**arguments)


def test_a_result_prints_as_tunes_result():
    from ray_stagetree.runtime.driver.results import TrialResult

    fields = dict(metrics={"loss": 0.5, "training_iteration": 3}, checkpoint=None, error=None, path="/s/a")
    ours, tunes = TrialResult([fields["metrics"]], **fields), tune.Result(**fields)
    assert repr(ours) == repr(tunes) and repr(ours).startswith("Result(\n  metrics={'loss': 0.5}")
    assert ours._repr(indent=2) == tunes._repr(indent=2), "as in ResultGrid's text"


def test_a_grid_prints_as_tunes_each_result_in_turn():
    shown = repr(grid())
    assert shown.startswith("ResultGrid<[\n  Result(\n    metrics={'loss': 2.0},\n    path='/s/a',")
    assert shown.count("  Result(\n") == 3 and shown.endswith("\n  )\n]>")
