"""`Tuner.restore` as Ray Tune's own restore tests pin it (issue 29.3):
errored trials resumed from their latest checkpoint or restarted from
scratch, moved experiment folders, TUNE_RESTORE_RETRY_NUM, the trainable and
``param_space`` given again (checked as Tune checks them),
``tune.with_parameters`` trainables. Configs are JSON values here (a marker
file's path as a str)."""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time

import numpy as np
import pytest
from ray import tune

from ray_stagetree import Tuner


def fails_after_a_report(config):
    """Tune's test trainable: reports ``it`` with a checkpoint
    ``num_epochs`` times (going on from its checkpoint), raises while the
    file ``config["fail"]`` exists, hangs while ``config["hang"]`` does,
    else reports once more and returns."""
    state = {"it": 0}
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as path, open(os.path.join(path, "state.json")) as file:
            state = json.load(file)

    def report():
        with tempfile.TemporaryDirectory() as path:
            with open(os.path.join(path, "state.json"), "w") as file:
                json.dump(state, file)
            tune.report(dict(state), checkpoint=tune.Checkpoint.from_directory(path))

    for _ in range(config.get("num_epochs", 1)):
        state["it"] += 1
        report()
    if config.get("fail") and os.path.exists(config["fail"]):
        raise RuntimeError("failing while the marker exists")
    if config.get("hang") and os.path.exists(config["hang"]):
        time.sleep(60)
    state["it"] += 1
    report()


def study(folder, name: str, **run_config) -> Tuner:
    """Four trials, the second and fourth failing after their first report
    while ``folder/fail`` exists."""
    marker = str(folder / "fail")
    return Tuner(
        fails_after_a_report,
        param_space={"fail": tune.grid_search([None, marker, None, marker])},
        run_config=tune.RunConfig(name=name, storage_path=str(folder), verbose=0, **run_config),
    )


@pytest.fixture(scope="module")
def errored(ray_session, tmp_path_factory):
    """An experiment whose second and fourth trials errored after their
    first report; the marker that made them fail is gone."""
    folder = tmp_path_factory.mktemp("errored")
    (folder / "fail").touch()
    grid = study(folder, "exp").fit()
    (folder / "fail").unlink()
    return grid


def copy_of(grid, tmp_path, name: str = "moved") -> str:
    """The experiment copied to a new folder and name (a moved experiment)."""
    shutil.copytree(grid.experiment_path, tmp_path / name)
    return str(tmp_path / name)


def test_the_errored_study_is_tunes(errored):
    assert len(errored.errors) == 2
    assert [result.metrics["it"] for result in errored] == [2, 1, 2, 1]


def test_resume_errored_goes_on_from_the_checkpoint_reported_before_the_error(errored, tmp_path):
    grid = Tuner.restore(copy_of(errored, tmp_path), fails_after_a_report, resume_errored=True).fit()
    assert not grid.errors
    assert [result.metrics["it"] for result in grid] == [2, 3, 2, 3], "resumed from it=1, two more reports"
    resumed = [grid[1], grid[3]]
    assert [result.metrics["training_iteration"] for result in resumed] == [3, 3]
    assert [result.metrics["iterations_since_restore"] for result in resumed] == [2, 2]


def test_restart_errored_loads_no_checkpoint_of_the_failed_run(errored, tmp_path):
    grid = Tuner.restore(copy_of(errored, tmp_path), fails_after_a_report, restart_errored=True).fit()
    assert not grid.errors
    assert [result.metrics["it"] for result in grid] == [2, 2, 2, 2], "restarted from scratch"


def test_errored_trials_stay_errored_without_resume_or_restart(errored, tmp_path):
    grid = Tuner.restore(copy_of(errored, tmp_path), fails_after_a_report).fit()
    assert len(grid.errors) == 2
    assert [result.metrics["it"] for result in grid] == [2, 1, 2, 1]


def test_a_moved_and_renamed_experiment_resumes_where_it_now_is(errored, tmp_path):
    """Restored by its new path; what it writes goes there, none to where it ran."""
    before = sorted(os.listdir(errored.experiment_path))
    path = copy_of(errored, tmp_path, "new_name")
    grid = Tuner.restore(path, fails_after_a_report, resume_errored=True).fit()
    assert grid.experiment_path == path
    assert all(result.path.startswith(path + "/") for result in grid)
    assert [result.metrics["it"] for result in grid] == [2, 3, 2, 3]
    assert grid[1].checkpoint.path.startswith(path + "/")
    assert sorted(os.listdir(errored.experiment_path)) == before, "nothing written where it ran"


def test_tunes_experiment_analysis_reads_a_moved_experiment(errored, tmp_path):
    """Scripts written for Tune read results with ``ExperimentAnalysis``
    (and ``ResultGrid`` over it), also from a moved folder: the trials,
    their configs, errors (the trainable's own), checkpoints where the folder now is."""
    from ray.tune import ExperimentAnalysis
    from ray.tune import ResultGrid as TunesResultGrid

    path = copy_of(errored, tmp_path, "read_by_tune")
    analysis = ExperimentAnalysis(path)
    assert sorted(trial.trial_id for trial in analysis.trials) == sorted(r.metrics["trial_id"] for r in errored)
    grid = TunesResultGrid(analysis)
    by_id = {result.metrics["trial_id"]: result for result in grid}
    for ours in errored:
        theirs = by_id[ours.metrics["trial_id"]]
        assert theirs.config == ours.config and theirs.metrics["it"] == ours.metrics["it"]
        assert theirs.path.startswith(path + "/")
        assert theirs.checkpoint.path.startswith(path + "/")
        assert os.path.basename(theirs.checkpoint.path) == os.path.basename(ours.checkpoint.path)
        assert theirs.metrics["experiment_tag"] == ours.metrics["experiment_tag"]
        assert [metrics for _, metrics in theirs.best_checkpoints] == [metrics for _, metrics in ours.best_checkpoints]
        assert type(theirs.error) is type(ours.error) and (ours.error is None or isinstance(theirs.error, RuntimeError))
        assert len(theirs.metrics_dataframe) == len(ours.metrics_dataframe)
    assert len(grid.errors) == 2
    best = analysis.get_best_trial("it", "max")
    assert best.last_result["it"] == 2


def test_tunes_own_resume_continues_a_moved_experiment(errored, tmp_path):
    """``tune.run(..., resume="AUTO+ERRORED")`` on the folder (Tune's own
    loop, no ray_stagetree in it) resumes the errored trials from their
    latest checkpoints, adds no trial, and numbers checkpoints on."""
    path = copy_of(errored, tmp_path, "resumed_by_tune")
    analysis = tune.run(
        fails_after_a_report, name="resumed_by_tune", storage_path=str(tmp_path), resume="AUTO+ERRORED", verbose=0
    )
    by_id = {trial.trial_id: trial for trial in analysis.trials}
    assert sorted(by_id) == sorted(result.metrics["trial_id"] for result in errored)
    assert all(trial.status == "TERMINATED" for trial in analysis.trials)
    assert [by_id[result.metrics["trial_id"]].last_result["it"] for result in errored] == [2, 3, 2, 3]
    resumed = by_id[errored[1].metrics["trial_id"]]
    assert os.path.basename(resumed.checkpoint.path) == "checkpoint_000002"
    assert resumed.checkpoint.path.startswith(path + "/")


def test_a_moved_experiment_restores_by_a_uri(errored, tmp_path):
    """Another storage path: the folder named by a file:// URI."""
    path = copy_of(errored, tmp_path, "by_uri")
    uri = f"file://{path}"
    assert Tuner.can_restore(uri)
    grid = Tuner.restore(uri, fails_after_a_report, resume_errored=True).fit()
    assert not grid.errors
    assert [result.metrics["it"] for result in grid] == [2, 3, 2, 3]


class FailsToLoadTwice(tune.Trainable):
    """Tune's retry test trainable: the first run fails at idx 2; each load
    of a checkpoint fails while the count in ``config["tag"]`` is below 2."""

    def setup(self, config):
        self.idx, self.tag, self.restored = 0, config["tag"], False

    def step(self):
        time.sleep(0.1)
        if self.idx == 0 and self.restored:
            raise RuntimeError("a restored trial must not start from scratch")
        if self.idx == 2 and not self.restored:
            raise RuntimeError("the first run fails at idx 2")
        self.idx += 1
        return {"score": self.idx}

    def save_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "state.json"), "w") as file:
            json.dump({"idx": self.idx}, file)

    def load_checkpoint(self, checkpoint_dir):
        self.restored = True
        with open(self.tag) as file:
            failed = json.load(file)["failed"]
        with open(self.tag, "w") as file:
            json.dump({"failed": failed + 1}, file)
        if failed < 2:
            raise RuntimeError(f"failing load #{failed + 1}")
        with open(os.path.join(checkpoint_dir, "state.json")) as file:
            self.idx = json.load(file)["idx"]


@pytest.mark.parametrize("retries, score", [(0, 2), (2, 5)])
def test_a_failed_load_checkpoint_is_retried_as_TUNE_RESTORE_RETRY_NUM_says(
    ray_session, tmp_path, monkeypatch, retries, score
):
    """max_failures=1: the error at idx 2 is the one failure allowed; the
    two failed loads after it end the trial unless they are retried without
    counting (then the third load succeeds and it trains to the end)."""
    monkeypatch.setenv("TUNE_RESTORE_RETRY_NUM", str(retries))
    tag = tmp_path / "tag"
    tag.write_text(json.dumps({"failed": 0}))
    grid = Tuner(
        FailsToLoadTwice,
        param_space={"tag": str(tag)},
        run_config=tune.RunConfig(
            storage_path=str(tmp_path),
            stop={"training_iteration": 5},
            failure_config=tune.FailureConfig(max_failures=1),
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1),
            verbose=0,
        ),
    ).fit()
    assert grid[0].metrics["score"] == score
    assert bool(grid.errors) == (retries == 0)


def test_TUNE_RESTORE_RETRY_NUM_must_be_a_count(tmp_path, monkeypatch):
    from ray_stagetree.runtime.driver.arguments import restore_retries

    monkeypatch.setenv("TUNE_RESTORE_RETRY_NUM", "two")
    with pytest.raises(ValueError, match="TUNE_RESTORE_RETRY_NUM must be an int >= 0.*'two'"):
        restore_retries()


def renamed(config):
    fails_after_a_report(config)


def same_name_other_code():
    def fails_after_a_report(config):
        pass

    return fails_after_a_report


SPACE = {"a": 1, "b": {"c": tune.choice([0, 1])}, "d": tune.uniform(0, 1)}


@pytest.fixture(scope="module")
def finished(ray_session, tmp_path_factory):
    """A finished experiment of ``fails_after_a_report`` over ``SPACE``."""
    folder = tmp_path_factory.mktemp("finished")
    run_config = tune.RunConfig(name="exp", storage_path=str(folder), verbose=0)
    return Tuner(fails_after_a_report, param_space=SPACE, run_config=run_config).fit().experiment_path


def test_restore_refuses_another_trainable_as_tune_does(finished):
    expected = "Invalid `trainable` input to `Tuner.restore\\(\\)`.*identifier '{}' but expected 'fails_after_a_report'"
    with pytest.raises(ValueError, match=expected.format("renamed")):
        Tuner.restore(finished, renamed)
    with pytest.raises(ValueError, match=expected.format("FailsToLoadTwice")):
        Tuner.restore(finished, FailsToLoadTwice)
    Tuner.restore(finished, same_name_other_code())  # accepted, as in Tune


def test_restore_takes_a_param_space_with_the_original_keys_only(finished):
    """A param_space given again may refresh values (object refs), not add
    or drop hyper-parameters: Tune's ValueError and message."""
    for bad in ({}, {"a": 1, "b": {}, "d": 2}, {"a": 1, "b": {"c": 2, "e": 3}, "d": 4}):
        with pytest.raises(
            ValueError,
            match=r"Invalid `param_space` input to `Tuner.restore\(\)`(.|\n)*"
            r"Expected: \['a', 'b/c', 'd'\]",
        ):
            Tuner.restore(finished, fails_after_a_report, param_space=bad)
    tuner = Tuner.restore(finished, fails_after_a_report, param_space={"a": 2, "b": {"c": 1}, "d": 0.5})
    assert tuner.param_space == {"a": 2, "b": {"c": 1}, "d": 0.5}


def with_data(config, data_str=None, data_obj=None):
    assert data_str == "data" and data_obj.shape == (1000,)
    fails_after_a_report(config)


class WithData(tune.Trainable):
    def setup(self, config, data_str=None, data_obj=None):
        assert data_str == "data" and data_obj.shape == (1000,)
        self.idx, self.fail = 0, config["fail"]

    def step(self):
        if os.path.exists(self.fail):
            raise RuntimeError("failing while the marker exists")
        self.idx += 1
        return {"it": self.idx}

    def save_checkpoint(self, checkpoint_dir):
        return {"idx": self.idx}

    def load_checkpoint(self, checkpoint):
        self.idx = checkpoint["idx"]


@pytest.mark.parametrize("trainable", [with_data, WithData])
def test_with_parameters_trainables_restore_when_given_again(ray_session, tmp_path, trainable):
    """The objects with_parameters holds are not saved: the user passes the
    wrapped trainable again, and the errored trial resumes with them."""

    def wrapped():
        return tune.with_parameters(trainable, data_str="data", data_obj=np.zeros(1000))

    (tmp_path / "fail").touch()
    is_class = isinstance(trainable, type)
    Tuner(
        wrapped(),
        param_space={"fail": str(tmp_path / "fail")},
        run_config=tune.RunConfig(
            name="exp",
            storage_path=str(tmp_path),
            stop={"training_iteration": 3},
            checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=1 if is_class else 0),
            verbose=0,
        ),
    ).fit()
    (tmp_path / "fail").unlink()
    grid = Tuner.restore(str(tmp_path / "exp"), wrapped(), resume_errored=True).fit()
    assert not grid.errors
    assert grid[0].metrics["training_iteration"] == 3
    if not is_class:
        assert grid[0].metrics["it"] == 3, "resumed from the checkpoint reported before the error"


def by_case(config):
    """`fails_after_a_report` on ``config["case"]`` (one grid over whole cases)."""
    fails_after_a_report(config["case"])


class FailsOnceTwoEnded(tune.Callback):
    """Raises from ``on_step_begin`` one step after two trials ended."""

    def __init__(self):
        self.fail_at = None

    def on_step_begin(self, iteration, trials, **info):
        if self.fail_at is not None and iteration >= self.fail_at:
            raise RuntimeError("the callback fails")
        if self.fail_at is None and sum(trial.status in ("TERMINATED", "ERROR") for trial in trials) >= 2:
            self.fail_at = iteration + 1


@pytest.fixture
def stopped_by_a_callback(ray_session, tmp_path, monkeypatch):
    """Trials [finishes, hangs, fails, hangs] and a callback that raised
    once two had ended: fit() raised the callback's error, as Tune's does,
    and the study was saved for Tuner.restore."""
    monkeypatch.setenv("TUNE_GLOBAL_CHECKPOINT_S", "0")
    fail, hang = tmp_path / "fail", tmp_path / "hang"
    fail.touch()
    hang.touch()
    cases = [{"hang": None}, {"hang": str(hang)}, {"fail": str(fail)}, {"hang": str(hang)}]
    tuner = Tuner(
        by_case,
        param_space={"case": tune.grid_search(cases)},
        run_config=tune.RunConfig(name="exp", storage_path=str(tmp_path), callbacks=[FailsOnceTwoEnded()], verbose=0),
    )
    with pytest.raises(RuntimeError, match="the callback fails"):
        tuner.fit()
    fail.unlink()
    hang.unlink()
    return str(tmp_path / "exp")


def restored_without_the_callback(path, **options):
    tuner = Tuner.restore(path, by_case, **options)
    tuner.run_config.callbacks = None
    return tuner.fit()


def test_a_study_a_callback_stopped_resumes_its_unfinished_trials(stopped_by_a_callback):
    grid = restored_without_the_callback(stopped_by_a_callback)
    assert len(grid) == 4
    assert len(grid.errors) == 1 and grid[2].error is not None
    assert grid[2].metrics["it"] == 1, "the errored trial stays"
    assert grid[0].metrics["it"] == 2, "the finished trial stays"
    assert all(result.metrics["it"] >= 2 for result in (grid[1], grid[3])), "the hanging trials went on to the end"


def test_resume_errored_only_ends_the_unfinished_trials_where_they_stood(stopped_by_a_callback):
    grid = restored_without_the_callback(stopped_by_a_callback, resume_unfinished=False, resume_errored=True)
    assert not grid.errors
    assert grid[0].metrics["it"] == 2
    assert grid[2].metrics["it"] == 3, "the errored trial resumed from it=1"
    assert all(result.metrics.get("it", 0) <= 1 for result in (grid[1], grid[3])), "nothing more trained"
