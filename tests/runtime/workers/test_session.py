"""The function-trainable API outside a stage worker: under ``ray.tune.Tuner``
`report` and `get_checkpoint` are Tune's own, so a ported trainable still
runs on vanilla Tune; elsewhere they fail with a clear error."""

import json
import os
import tempfile

import pytest
from ray import tune

from ray_stagetree import get_checkpoint, get_hparams, report, should_checkpoint


def counting(config):
    """Resumes from its own checkpoint; fails once after 2 iterations when told to."""
    start = 0
    checkpoint = get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as path:
            with open(os.path.join(path, "state.json")) as file:
                start = json.load(file)["iteration"]
    for iteration in range(start + 1, 5):
        if config["fail_at"] == iteration and checkpoint is None:
            raise RuntimeError("the first attempt fails")
        with tempfile.TemporaryDirectory() as path:
            with open(os.path.join(path, "state.json"), "w") as file:
                json.dump({"iteration": iteration}, file)
            report({"value": iteration, "resumed_from": start}, checkpoint=tune.Checkpoint.from_directory(path))


def test_report_and_get_checkpoint_are_tunes_under_ray_tune(tmp_path, ray_session):
    tuner = tune.Tuner(
        counting,
        param_space={"fail_at": 3},
        run_config=tune.RunConfig(
            storage_path=str(tmp_path), verbose=0, failure_config=tune.FailureConfig(max_failures=1)
        ),
    )
    (result,) = tuner.fit()
    assert result.error is None
    frame = result.metrics_dataframe
    assert frame["value"].tolist()[-1] == 4
    assert frame["resumed_from"].tolist()[-1] == 2, "the retry resumed from Tune's checkpoint"


def test_outside_any_trainable_the_calls_say_where_they_belong():
    with pytest.raises(RuntimeError, match="inside a trainable run by ray_stagetree.Tuner"):
        report({"loss": 1.0})
    with pytest.raises(RuntimeError, match="inside a trainable run by ray_stagetree.Tuner"):
        get_checkpoint()
    with pytest.raises(RuntimeError, match="inside a trainable run by ray_stagetree.Tuner"):
        get_hparams()
    with pytest.raises(RuntimeError, match="inside a trainable run by ray_stagetree.Tuner"):
        should_checkpoint()
