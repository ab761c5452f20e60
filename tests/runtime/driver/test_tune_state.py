"""Tune's experiment snapshot: the metric statistics ray_stagetree writes
for a trial are those Tune's own loop leaves after feeding it every result."""

from __future__ import annotations

import json
import math
import random

import pytest
from ray.tune.experiment import Trial
from ray.tune.utils.serialization import TuneFunctionEncoder

from ray_stagetree.runtime.driver.tune_state import metric_analysis
from ray_stagetree.trial_schedulers.ray_fields import metric_windows


def rows(count: int, seed: int) -> list[dict]:
    """Results as trainables report them: ints, floats, bools, -0.0 and NaN,
    nested metrics, metrics missing from some rows, a string, the config."""
    draw = random.Random(seed)
    made = []
    for index in range(count):
        row = {
            "training_iteration": index + 1 if index != 3 else None,
            "loss": draw.uniform(-1, 1),
            "count": draw.randint(0, 9),
            "flag": draw.random() < 0.5,
            "nested": {"a": draw.random(), "b": {"c": -0.0 if index % 7 == 0 else draw.gauss(0, 1)}},
            "tag": f"row{index}",
            "config": {"lr": 0.1},
        }
        if index % 3:
            row["sometimes"] = math.nan if index % 5 == 0 else draw.random()
        if index == 0:
            row["once"] = 3  # an int seen once: its window averages stay the int
        if index == count - 1:
            row["late"] = 7
        made.append(row)
    return made


@pytest.mark.parametrize("count", [1, 2, 4, 6, 12, 40])
def test_the_statistics_equal_tunes_own_after_every_row(count):
    reported = rows(count, seed=count)
    tunes = Trial("train", config={}, stub=True)
    for row in reported:
        tunes.update_last_result(dict(row))

    ours = Trial("train", config={}, stub=True)
    metadata = ours.run_metadata
    metadata.metric_analysis, metadata.metric_n_steps = metric_analysis(reported[:-1], metric_windows(metadata))
    ours.update_last_result(dict(reported[-1]))

    def written(trial: Trial) -> tuple[str, str]:  # as the snapshot's JSON has them (NaN, -0.0 and int/float kept)
        state = trial.run_metadata
        return (
            json.dumps(state.metric_analysis, cls=TuneFunctionEncoder),
            json.dumps(state.metric_n_steps, cls=TuneFunctionEncoder),
        )

    assert written(ours) == written(tunes)
    windows = {m: {n: q.maxlen for n, q in w.items()} for m, w in ours.run_metadata.metric_n_steps.items()}
    assert windows == {m: {n: q.maxlen for n, q in w.items()} for m, w in tunes.run_metadata.metric_n_steps.items()}
