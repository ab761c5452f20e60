"""Where a trainable runs: the driver's working directory, named by
``TUNE_ORIG_WORKING_DIR`` as Tune names it, so relative paths in a config
resolve as they would in the driver."""

import os

from ray import tune

from ray_stagetree import Tuner


def report_directories(config):
    tune.report({"cwd": os.getcwd(), "orig": os.environ.get("TUNE_ORIG_WORKING_DIR")})


def test_a_trainable_sees_the_drivers_directory_and_tunes_variable(tmp_path, ray_session):
    result = Tuner(
        report_directories,
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="cwd", verbose=0),
    ).fit()[0]
    assert result.error is None
    assert result.metrics["orig"] == result.metrics["cwd"] == os.getcwd()
