"""`execution.working_dirs`: a batch's folder, seeded from the files kept
where it starts, and the files kept where trials fork."""

from __future__ import annotations

import os

import pytest

from ray_stagetree.execution import working_dirs
from ray_stagetree.execution.working_dirs import WorkingDir

TRIAL_A = WorkingDir("2026-12-07_10-00-00/study", "trial_a")
TRIAL_B = WorkingDir("2026-12-07_10-00-00/study", "trial_b")


@pytest.fixture
def worker_dir(tmp_path, monkeypatch):
    """A worker's own directory, which it returns to between batches."""
    home = tmp_path / "worker"
    home.mkdir()
    monkeypatch.chdir(home)
    monkeypatch.setenv(working_dirs.ORIGINAL_DIR_VARIABLE, str(home))
    return home


def test_a_batch_runs_in_its_trials_folder_and_returns_to_the_workers(tmp_path, worker_dir):
    folder = working_dirs.enter(TRIAL_A, str(tmp_path), starts_at=None)
    assert folder == os.getcwd() == str(tmp_path / "2026-12-07_10-00-00/study/working_dirs/trial_a")
    working_dirs.leave(str(tmp_path))
    assert os.getcwd() == str(worker_dir)


def test_a_new_trial_folder_starts_from_the_files_kept_where_its_batch_starts(tmp_path, worker_dir):
    working_dirs.enter(TRIAL_A, str(tmp_path), starts_at=None)
    with open("log.txt", "w") as file:
        file.write("shared stage\n")
    working_dirs.keep(TRIAL_A, str(tmp_path), (0, 3))
    with open("log.txt", "a") as file:
        file.write("trial a after the fork\n")
    working_dirs.leave(str(tmp_path))

    working_dirs.enter(TRIAL_B, str(tmp_path), starts_at=(0, 3))
    assert open("log.txt").read() == "shared stage\n"
    working_dirs.leave(str(tmp_path))
    # Trial A's own folder goes on as it was: it exists, so nothing is seeded into it.
    working_dirs.enter(TRIAL_A, str(tmp_path), starts_at=(0, 3))
    assert open("log.txt").read() == "shared stage\ntrial a after the fork\n"


def test_no_kept_files_or_an_empty_folder_leave_a_new_folder_empty(tmp_path, worker_dir):
    working_dirs.enter(TRIAL_A, str(tmp_path), starts_at=None)
    working_dirs.keep(TRIAL_A, str(tmp_path), (0, 3))  # an empty folder keeps nothing
    assert not os.path.exists(tmp_path / TRIAL_A.stage_end(0, 3))
    working_dirs.enter(TRIAL_B, str(tmp_path), starts_at=(0, 3))
    assert os.listdir(".") == []


def test_keeping_a_point_again_replaces_what_was_kept(tmp_path, worker_dir):
    working_dirs.enter(TRIAL_A, str(tmp_path), starts_at=None)
    for text in ("failed attempt", "retry"):
        with open("log.txt", "w") as file:
            file.write(text)
        working_dirs.keep(TRIAL_A, str(tmp_path), (2, 5))
    assert (tmp_path / TRIAL_A.stage_end(2, 5) / "log.txt").read_text() == "retry"


@pytest.mark.parametrize(("value", "changes"), [(None, True), ("1", True), ("0", False), ("false", False)])
def test_ray_chdir_to_trial_dir_decides_as_under_tune(monkeypatch, value, changes):
    if value is None:
        monkeypatch.delenv(working_dirs.CHDIR_VARIABLE, raising=False)
    else:
        monkeypatch.setenv(working_dirs.CHDIR_VARIABLE, value)
    assert working_dirs.changes_directory() is changes
