"""A batch's working directory on its worker (`runtime.workers.trial_workdir`):
files it cannot copy from where it forks never fail the batch."""

from __future__ import annotations

import os

from ray_stagetree.execution.batches import BatchSpec
from ray_stagetree.execution.working_dirs import ORIGINAL_DIR_VARIABLE, WorkingDir
from ray_stagetree.planning import TrialConfig
from ray_stagetree.runtime.workers import trial_workdir


def _spec(trial_folder: str, source_point=None) -> BatchSpec:
    return BatchSpec(
        batch_id=1,
        config={"lr": 0.1},
        trial_config=TrialConfig.from_config({"lr": 0.1}),
        segments=[(4, 3, 6)],
        save_iterations=set(),
        working_dir=WorkingDir("stamp/study", trial_folder),
        source_point=source_point,
    )


def test_a_pipe_where_a_trial_forks_is_left_behind_and_the_batch_runs(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(trial_workdir, "ray_artifacts_folder", lambda: str(tmp_path))
    monkeypatch.setenv(ORIGINAL_DIR_VARIABLE, str(tmp_path))
    monkeypatch.chdir(tmp_path)
    kept = tmp_path / "stamp/study/stage_ends/node000002_step0000003"
    kept.mkdir(parents=True)
    (kept / "log.txt").write_text("shared\n")
    os.mkfifo(kept / "service.pipe")  # a service's pipe in the folder, which no file copy reads
    trial_workdir.enter(_spec("trial_b", source_point=(2, 3)))
    assert os.getcwd() == str(tmp_path / "stamp/study/working_dirs/trial_b") == trial_workdir.current()
    assert "misses files of where it forks" in caplog.text
    assert open("log.txt").read() == "shared\n"  # what could be copied was
    trial_workdir.leave(_spec("trial_b"), reached=6)
    assert os.getcwd() == str(tmp_path) and trial_workdir.current() is None
