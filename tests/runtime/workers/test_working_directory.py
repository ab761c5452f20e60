"""Where a trainable runs: its trial's working directory, with the driver's
named by ``TUNE_ORIG_WORKING_DIR``, as Tune names it, so a relative path
from the config can still be resolved as the driver resolves it."""

import os

from ray import tune

from ray_stagetree import Tuner


def report_directories(config):
    tune.report({"cwd": os.getcwd(), "orig": os.environ.get("TUNE_ORIG_WORKING_DIR")})


def test_a_trainable_runs_in_its_trial_folder_and_tunes_variable_names_the_drivers(tmp_path, ray_session):
    result = Tuner(
        report_directories,
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="cwd", verbose=0),
    ).fit()[0]
    assert result.error is None
    assert result.metrics["orig"] == os.getcwd()
    assert result.metrics["cwd"].endswith(f"/cwd/working_dirs/{os.path.basename(result.path)}")
