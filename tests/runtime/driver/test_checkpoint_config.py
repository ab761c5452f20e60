"""RunConfig(checkpoint_config=tune.CheckpointConfig(...)): what each trial
keeps in its folder, Result.checkpoint and Result.best_checkpoints, and the
saves class trainables make for checkpoint_frequency / checkpoint_at_end."""

import os
import pickle

import pytest
from ray import tune
from ray.tune.schedulers import ASHAScheduler
from trainables_for_tests import noisy_descent

from ray_stagetree import MultiStep, Tuner
from ray_stagetree.execution.payload import STATE_FILE
from ray_stagetree.execution.retention import kept_checkpoints
from ray_stagetree.trainables import StageTrainable

PEAK = 4.2  # the score peaks between iterations 4 and 5, and no two iterations tie


class Scored(StageTrainable):
    def setup(self, config):
        self.steps = 0

    def step(self):
        self.steps += 1
        return {"score": -abs(self.steps - PEAK), "lr": self.hparams["lr"]}

    def get_state(self):
        return {"steps": self.steps}

    def set_state(self, state):
        self.steps = state["steps"]


def fit(tmp_path, name, trainable, checkpoint_config, space=None, stop=None):
    tuner = Tuner(
        trainable,
        param_space=space or {"lr": MultiStep(0.1, [3], 0.5)},
        run_config=tune.RunConfig(
            name=name,
            storage_path=str(tmp_path),
            stop=stop or {"training_iteration": 9},
            checkpoint_config=checkpoint_config,
            verbose=0,
        ),
    )
    return tuner.fit()


def folder_numbers(result):
    """The numbers of the trial's checkpoint folders: Tune counts a trial's
    checkpoints from 0 (``checkpoint_000000`` is its first)."""
    return sorted(
        int(entry[len("checkpoint_") :]) for entry in os.listdir(result.path) if entry.startswith("checkpoint_")
    )


def folder_steps(result):
    """The steps saved in a `Scored` trial's checkpoint folders."""
    return sorted(
        saved_steps(tune.Checkpoint(os.path.join(result.path, entry)))
        for entry in os.listdir(result.path)
        if entry.startswith("checkpoint_")
    )


def saved_steps(checkpoint):
    with open(os.path.join(checkpoint.path, STATE_FILE), "rb") as file:
        return pickle.load(file)["steps"]


# -- validation at Tuner(...) ---------------------------------------------------


@pytest.mark.parametrize(
    "field, value, message",
    [
        ("num_to_keep", 0, "num_to_keep must be an int >= 1 or None (None keeps all), got 0"),
        ("num_to_keep", -2, "num_to_keep must be an int >= 1 or None (None keeps all), got -2"),
        ("num_to_keep", 1.5, "num_to_keep must be an int >= 1 or None (None keeps all), got 1.5"),
        ("checkpoint_score_order", "best", "checkpoint_score_order must be 'min' or 'max', got 'best'"),
        ("checkpoint_frequency", -1, "checkpoint_frequency must be an int >= 0 (0: never), got -1"),
        (
            "checkpoint_score_attribute",
            3,
            "checkpoint_score_attribute must be a str or None (None ranks by recency; else a metric name)",
        ),
        ("checkpoint_at_end", "yes", "checkpoint_at_end must be True, False or None, got 'yes'"),
    ],
)
def test_invalid_values_are_refused_at_tuner(field, value, message):
    config = tune.CheckpointConfig()
    setattr(config, field, value)  # Ray checks at construction; a later change reaches the Tuner
    with pytest.raises(ValueError, match=f"CheckpointConfig.{message}".replace("(", r"\(").replace(")", r"\)")):
        Tuner(Scored, run_config=tune.RunConfig(checkpoint_config=config))


def test_checkpoint_config_must_be_tunes():
    with pytest.raises(
        TypeError,
        match=r"RunConfig.checkpoint_config must be a ray.tune.CheckpointConfig or None, got \{'num_to_keep': 1\}",
    ):
        Tuner(Scored, run_config=tune.RunConfig(checkpoint_config={"num_to_keep": 1}))


@pytest.mark.parametrize(
    "config, message",
    [
        (tune.CheckpointConfig(checkpoint_at_end=True), r"checkpoint_at_end=True\) cannot be used with a function"),
        (tune.CheckpointConfig(checkpoint_frequency=2), r"checkpoint_frequency=2\) cannot be set for a function"),
    ],
)
def test_function_trainables_refuse_class_only_options_at_fit(tmp_path, config, message):
    """As Tune: ``Tuner()`` takes the config, ``fit()`` refuses it before anything runs."""
    tuner = Tuner(noisy_descent, run_config=tune.RunConfig(storage_path=str(tmp_path), checkpoint_config=config))
    with pytest.raises(ValueError, match=message):
        tuner.fit()
    Tuner(Scored, run_config=tune.RunConfig(checkpoint_config=config))  # class trainables take them


# -- which checkpoints a trial keeps (Tune's checkpoint manager's rules) ---------


SCORES = {step: -abs(step - PEAK) for step in range(1, 10)}  # best at 4, then 5, 3, 6, ...


@pytest.mark.parametrize(
    "keep, attribute, order, kept, best",
    [
        (2, "score", "max", [4, 5, 9], [5, 4]),  # the latest, 9, always stays; best last
        (2, "score", "min", [8, 9], [8, 9]),
        (1, "score", "max", [4, 9], [4]),
        (2, None, "max", [8, 9], [8, 9]),  # no attribute: the most recent
        (None, "score", "max", list(range(1, 10)), [9, 8, 1, 7, 2, 6, 3, 5, 4]),
        (20, None, "max", list(range(1, 10)), list(range(1, 10))),
    ],
)
def test_kept_checkpoints_rank_as_tune(keep, attribute, order, kept, best):
    config = tune.CheckpointConfig(num_to_keep=keep, checkpoint_score_attribute=attribute, checkpoint_score_order=order)
    assert kept_checkpoints(list(SCORES), lambda step: {"score": SCORES[step]}, config) == (kept, best)


def test_missing_and_nan_scores_rank_lowest():
    config = tune.CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="score", checkpoint_score_order="min")
    metrics = {1: {"score": 5.0}, 2: {}, 3: {"score": float("nan")}, 4: {"score": 7.0}, 5: {"score": 9.0}}
    assert kept_checkpoints(list(metrics), metrics.__getitem__, config) == ([1, 4, 5], [4, 1])
    assert kept_checkpoints([], metrics.__getitem__, config) == ([], [])
    assert kept_checkpoints([3, 6], metrics.get, None) == ([3, 6], [3, 6])  # no CheckpointConfig: all


# -- end to end ----------------------------------------------------------------


def test_num_to_keep_and_score_choose_the_trials_checkpoints(tmp_path, ray_session):
    config = tune.CheckpointConfig(
        num_to_keep=2, checkpoint_score_attribute="score", checkpoint_score_order="max", checkpoint_frequency=1
    )
    (result,) = fit(tmp_path, "ranked", Scored, config)
    assert result.error is None
    assert folder_steps(result) == [4, 5, 9]  # every iteration saved; the best two and the latest kept
    assert folder_numbers(result) == [3, 4, 8]  # the 4th, 5th and 9th checkpoint, as Tune numbers them
    assert result.checkpoint.path == os.path.join(result.path, "checkpoint_000008")
    assert saved_steps(result.checkpoint) == 9
    assert [metrics["training_iteration"] for _, metrics in result.best_checkpoints] == [5, 4]
    for checkpoint, metrics in result.best_checkpoints:
        step = metrics["training_iteration"]
        assert saved_steps(checkpoint) == step
        assert metrics["score"] == pytest.approx(SCORES[step])
        assert metrics["config"] == result.config


def test_frequency_and_at_end_save_class_trainables(tmp_path, ray_session):
    """Two trials share iterations 0..6; a stopper ends the first at 4 while
    the second goes on through the same batch, so nothing but
    checkpoint_at_end saves iteration 4 (without it the folder holds [3]).
    checkpoint_frequency=3 saves at 3 and 6."""
    space = {"lr": tune.grid_search([MultiStep(0.1, [6], 0.5), MultiStep(0.1, [6], 0.2)])}

    def stop(trial_id, result):
        end = 4 if result["config"]["lr"].gamma == 0.5 else 8
        return result["training_iteration"] >= end

    config = tune.CheckpointConfig(checkpoint_frequency=3, checkpoint_at_end=True)
    grid = fit(tmp_path, "at_end", Scored, config, space=space, stop=stop)
    stopped, full = sorted(grid, key=lambda r: r.config["lr"].gamma, reverse=True)
    assert stopped.metrics["training_iteration"] == 4 and full.metrics["training_iteration"] == 8
    assert folder_steps(stopped) == [3, 4]
    assert saved_steps(stopped.checkpoint) == 4
    assert folder_steps(full) == [3, 6, 8]  # not 4, the first trial's end on the shared path: Tune saves it not


class AsksAtThree(tune.Trainable):
    """A plain Tune class trainable whose third result asks to be saved (Tune's ``should_checkpoint``)."""

    def setup(self, config):
        self.steps = 0

    def step(self):
        self.steps += 1
        return {"score": self.steps * self.config["lr"], "should_checkpoint": self.steps == 3}

    def save_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "steps.pkl"), "wb") as file:
            pickle.dump(self.steps, file)

    def load_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "steps.pkl"), "rb") as file:
            self.steps = pickle.load(file)


def test_a_class_trainable_shows_only_the_saves_tune_makes(tmp_path, ray_session):
    """The runtime checkpoints a class trainable at ASHA's rungs (1, 3) to
    pre-empt it there; Tune saves it where its result asks (3) and at its
    end only, and so do its folder and Result (as Ray Tune 2.60 ran this)."""
    grid = Tuner(
        AsksAtThree,
        param_space={"lr": tune.grid_search([0.6, 0.5, 0.4, 0.3, 0.2, 0.1])},  # the best first: ASHA stops others
        tune_config=tune.TuneConfig(
            metric="score", mode="max", scheduler=ASHAScheduler(max_t=9, grace_period=1, reduction_factor=3)
        ),
        run_config=tune.RunConfig(name="asks", storage_path=str(tmp_path), verbose=0),
    ).fit()
    shown = {
        result.metrics["training_iteration"]: [metrics["training_iteration"] for _, metrics in result.best_checkpoints]
        for result in grid
    }
    assert min(shown) < 9 and max(shown) == 9, shown  # ASHA stopped some
    for result in grid:
        end = result.metrics["training_iteration"]
        saved = sorted({3, end}) if end >= 3 else [end]
        assert [metrics["training_iteration"] for _, metrics in result.best_checkpoints] == saved, shown
        assert folder_numbers(result) == list(range(len(saved)))
        assert result.checkpoint.path == os.path.join(result.path, f"checkpoint_{len(saved) - 1:06d}")


def test_checkpoint_at_end_false_leaves_a_class_trainable_without_checkpoints(tmp_path, ray_session):
    """As Tune: no frequency and no save at the end keep nothing, though
    the runtime checkpointed the stage the two trials share (at 3) to fork it."""
    space = {"lr": tune.grid_search([MultiStep(0.1, [3], 0.5), MultiStep(0.1, [3], 0.2)])}
    grid = fit(tmp_path, "no_end", Scored, tune.CheckpointConfig(checkpoint_at_end=False), space=space)
    assert grid.iterations_executed < grid.trial_by_trial_iterations  # they shared, through a checkpoint
    for result in grid:
        assert result.error is None
        assert result.checkpoint is None and result.best_checkpoints == [] and folder_numbers(result) == []


def test_function_trainable_exposes_its_path_checkpoints(tmp_path, ray_session):
    """A function trainable keeps the checkpoints the plan asked for on its
    path: the shared prefix's branch point (3), and its end."""
    space = {"lr": tune.grid_search([MultiStep(0.1, [3], 0.5), MultiStep(0.1, [3], 0.2)])}
    grid = fit(tmp_path, "function", noisy_descent, tune.CheckpointConfig(num_to_keep=5), space=space)
    for result in grid:
        assert result.error is None
        assert folder_numbers(result) == [0, 1]
        assert [m["training_iteration"] for _, m in result.best_checkpoints] == [3, 9]
        assert result.best_checkpoints[-1][0].path == result.checkpoint.path
        assert os.path.exists(os.path.join(result.checkpoint.path, "state.json"))


def checkpoints_every_report(config):
    """Tune's usual loop: a checkpoint with every `interval`-th report, the
    step count carried through it."""
    import json
    import tempfile

    step = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as path, open(os.path.join(path, "step.json")) as file:
            step = json.load(file)["step"]
    while True:
        step += 1
        metrics = {"score": -abs(step - PEAK), "step": step}
        if step % config["interval"]:
            tune.report(metrics)
            continue
        with tempfile.TemporaryDirectory() as path:
            with open(os.path.join(path, "step.json"), "w") as file:
                json.dump({"step": step}, file)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(path))


def checkpointed_step(checkpoint):
    import json

    with open(os.path.join(checkpoint.path, "step.json")) as file:
        return json.load(file)["step"]


def test_num_to_keep_keeps_the_best_checkpoints_a_function_reported(tmp_path, ray_session):
    """Issue 29: a single trial (nothing shared, so the plan asks for no
    checkpoint but the end) kept only its final one. With num_to_keep, every
    reported checkpoint is a candidate, as in Tune."""
    config = tune.CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="score", checkpoint_score_order="max")
    (result,) = fit(tmp_path, "best_reported", checkpoints_every_report, config, space={"interval": 1})
    assert result.error is None
    assert folder_numbers(result) == [3, 4, 8]  # the best two (4.2 peaks between them) and the latest
    assert [metrics["step"] for _, metrics in result.best_checkpoints] == [5, 4]  # worst first, as Tune
    for checkpoint, metrics in result.best_checkpoints:
        assert checkpointed_step(checkpoint) == metrics["step"] == metrics["training_iteration"]
    assert checkpointed_step(result.checkpoint) == 9


def test_num_to_keep_bounds_the_stored_checkpoints_to_those_the_trials_keep(tmp_path, ray_session):
    """Each checkpoint a function reports is stored as it reports it; under
    num_to_keep those no trial keeps go, where trials shared them too, so
    the study's storage holds what Tune's trial folders would, not every
    report. The results, and a restore of the finished study, are Tune's."""
    space = {"lr": tune.grid_search([MultiStep(0.1, [3], 0.5), MultiStep(0.1, [3], 0.2)]), "interval": 1}
    config = tune.CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="score", checkpoint_score_order="max")
    grid = fit(tmp_path, "bounded", checkpoints_every_report, config, space=space)
    stored = os.path.join(str(tmp_path), "bounded", "checkpoints")
    # Each trial's best two (4.2 peaks between 4 and 5) and its latest, on its own path: the shared 1..3 went.
    assert len(os.listdir(stored)) == 2 * 3
    for result in [*grid, *Tuner.restore(os.path.join(str(tmp_path), "bounded"), checkpoints_every_report).fit()]:
        assert result.error is None and folder_numbers(result) == [3, 4, 8]
        assert [checkpointed_step(checkpoint) for checkpoint, _ in result.best_checkpoints] == [5, 4]
        assert checkpointed_step(result.checkpoint) == 9


def test_every_reported_checkpoint_is_listed_up_to_num_to_keep(tmp_path, ray_session):
    config = tune.CheckpointConfig(num_to_keep=6)
    (result,) = fit(
        tmp_path, "every_other", checkpoints_every_report, config, space={"interval": 2}, stop={"training_iteration": 6}
    )
    assert [metrics["step"] for _, metrics in result.best_checkpoints] == [2, 4, 6]
    assert folder_numbers(result) == [0, 1, 2]
    assert [checkpointed_step(checkpoint) for checkpoint, _ in result.best_checkpoints] == [2, 4, 6]


# -- checkpoint folders across a failure and a resume, as Tune numbers them ---------


def reports_twice_then_fails_while_flagged(config):
    """Two checkpointed reports; then it fails while ``config["flag"]``
    exists, else reports twice more and ends."""
    import json
    import tempfile

    step = checkpointed_step(tune.get_checkpoint()) if tune.get_checkpoint() else 0
    for _ in range(2 if step == 0 else 3):
        if step == 2 and os.path.exists(config["flag"]):
            raise RuntimeError("failing while the flag exists")
        step += 1
        with tempfile.TemporaryDirectory() as path:
            with open(os.path.join(path, "step.json"), "w") as file:
                json.dump({"step": step}, file)
            tune.report({"step": step}, checkpoint=tune.Checkpoint.from_directory(path))
    if os.path.exists(config["flag"]):
        raise RuntimeError("failing while the flag exists")


class SavesEveryStepFailsWhileFlagged(tune.Trainable):
    def setup(self, config):
        self.step_count = 0

    def step(self):
        if self.step_count == 2 and os.path.exists(self.config["flag"]):
            raise RuntimeError("failing while the flag exists")
        self.step_count += 1
        return {"step": self.step_count, "done": self.step_count >= 5}

    def save_checkpoint(self, checkpoint_dir):
        import json

        with open(os.path.join(checkpoint_dir, "step.json"), "w") as file:
            json.dump({"step": self.step_count}, file)

    def load_checkpoint(self, checkpoint_dir):
        import json

        with open(os.path.join(checkpoint_dir, "step.json")) as file:
            self.step_count = json.load(file)["step"]


def checkpoint_folders(result):
    names = sorted(entry for entry in os.listdir(result.path) if entry.startswith("checkpoint_"))
    return names, [checkpointed_step(tune.Checkpoint(os.path.join(result.path, name))) for name in names]


@pytest.mark.parametrize("trainable", [reports_twice_then_fails_while_flagged, SavesEveryStepFailsWhileFlagged])
def test_an_errored_trial_keeps_its_checkpoints_and_a_resume_numbers_on(tmp_path, ray_session, trainable):
    """As Tune: an errored trial's folder holds the checkpoints it reported
    (``checkpoint_000000`` first); after ``resume_errored`` the numbering goes
    on and ``num_to_keep`` counts the earlier run's folders, removing the oldest."""
    flag = tmp_path / "flag"
    flag.touch()
    checkpoint_config = tune.CheckpointConfig(
        num_to_keep=4, checkpoint_frequency=1 if isinstance(trainable, type) else 0
    )
    (first,) = Tuner(
        trainable,
        param_space={"flag": str(flag)},
        run_config=tune.RunConfig(name="resumed", storage_path=str(tmp_path), checkpoint_config=checkpoint_config),
    ).fit()
    assert isinstance(first.error, RuntimeError) and first.metrics["training_iteration"] == 2
    assert checkpoint_folders(first) == (["checkpoint_000000", "checkpoint_000001"], [1, 2])
    flag.unlink()
    (resumed,) = Tuner.restore(str(tmp_path / "resumed"), trainable, resume_errored=True).fit()
    assert resumed.error is None and resumed.metrics["training_iteration"] == 5
    assert checkpoint_folders(resumed) == ([f"checkpoint_00000{i}" for i in range(1, 5)], [2, 3, 4, 5])
    assert resumed.checkpoint.path == os.path.join(resumed.path, "checkpoint_000004")


# -- the latest reported checkpoint, when later reports carry none -------------------


def checkpoints_every_third(config):
    """Reports steps 1..8 with a checkpoint at every third (3, 6), so its
    last two reports carry none; fails at step 5 while ``config["flag"]``
    exists. Each report says which step the run resumed from."""
    import json
    import tempfile

    resumed_from = step = checkpointed_step(tune.get_checkpoint()) if tune.get_checkpoint() else 0
    while step < config["last"]:
        if step == 4 and os.path.exists(config["flag"]):
            os.remove(config["flag"])
            raise RuntimeError("failing once")
        step += 1
        metrics = {"step": step, "resumed_from": resumed_from, "done": step == config["done_at"]}
        if step % 3:
            tune.report(metrics)
            continue
        with tempfile.TemporaryDirectory() as path:
            with open(os.path.join(path, "step.json"), "w") as file:
                json.dump({"step": step}, file)
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(path))


@pytest.mark.parametrize(
    "ending", [{"last": 8, "done_at": 0}, {"last": 99, "done_at": 8}, {"last": 99, "done_at": 0, "stop": 8}]
)
def test_result_checkpoint_is_the_latest_reported_however_the_trial_ends(tmp_path, ray_session, ending):
    """As Tune: the function returns, reports ``done``, or meets the stop
    criterion two reports after its last checkpoint, and that checkpoint is
    ``Result.checkpoint``, with no ``num_to_keep`` asking to keep reports."""
    stop = {"training_iteration": ending.pop("stop")} if "stop" in ending else None
    space = {**ending, "flag": str(tmp_path / "absent")}
    (result,) = fit(tmp_path, "latest", checkpoints_every_third, None, space=space, stop=stop)
    assert result.error is None and result.metrics["step"] == 8
    assert checkpointed_step(result.checkpoint) == 6


@pytest.mark.parametrize("max_failures", [0, 1])
def test_a_failed_trial_keeps_and_a_retry_resumes_from_its_latest_checkpoint(tmp_path, ray_session, max_failures):
    """The function fails at step 5, two steps past its checkpoint at 3: the
    errored trial's ``Result.checkpoint`` is step 3's, and a retry under
    ``FailureConfig`` resumes there (as Tune does), not from the start."""
    flag = tmp_path / "flag"
    flag.touch()
    (result,) = Tuner(
        checkpoints_every_third,
        param_space={"last": 8, "done_at": 0, "flag": str(flag)},
        run_config=tune.RunConfig(
            storage_path=str(tmp_path), failure_config=tune.FailureConfig(max_failures=max_failures), verbose=0
        ),
    ).fit()
    if max_failures:
        assert result.error is None and result.metrics["step"] == 8
        assert result.metrics["resumed_from"] == 3
        assert checkpointed_step(result.checkpoint) == 6
    else:
        assert isinstance(result.error, RuntimeError) and result.metrics["step"] == 4
        assert checkpointed_step(result.checkpoint) == 3


def draws_then_fails_once(config):
    """Reports a draw from torch's generator and a checkpoint at steps 1..4;
    at step 3, while ``config["flag"]`` exists, it draws, then fails."""
    import json
    import tempfile

    import torch

    torch.manual_seed(0)
    step = checkpointed_step(tune.get_checkpoint()) if tune.get_checkpoint() else 0
    while step < 4:
        step += 1
        draw = float(torch.rand(()))
        if step == 3 and os.path.exists(config["flag"]):
            os.remove(config["flag"])
            raise RuntimeError("failing once, after a draw")
        with tempfile.TemporaryDirectory() as path:
            with open(os.path.join(path, "step.json"), "w") as file:
                json.dump({"step": step}, file)
            tune.report({"step": step, "draw": draw}, checkpoint=tune.Checkpoint.from_directory(path))


def test_a_retry_resumes_the_random_states_of_its_checkpoint_not_of_the_failure(tmp_path, ray_session):
    """The failed attempt drew at step 3 before it raised: the retry resumes
    from step 2's checkpoint with the generators as they were at that report,
    and draws what a run without the failure draws."""
    flag = tmp_path / "flag"
    flag.touch()
    failed, clean = Tuner(
        draws_then_fails_once,
        param_space={"flag": tune.grid_search([str(flag), str(tmp_path / "absent")])},
        run_config=tune.RunConfig(
            storage_path=str(tmp_path), failure_config=tune.FailureConfig(max_failures=1), verbose=0
        ),
    ).fit()
    assert not flag.exists(), "the first attempt failed"
    draws = [
        result.metrics_dataframe.drop_duplicates("step", keep="last")["draw"].tolist() for result in (failed, clean)
    ]
    assert draws[0] == draws[1]


def accumulate(config):
    """x grows by lr each iteration; every report carries a checkpoint of x."""
    import json
    import tempfile
    import time

    x, start = 0.0, 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as path, open(os.path.join(path, "x.json")) as file:
            x, start = json.load(file)
    for iteration in range(start, 8):
        x += config["lr"]
        time.sleep(0.05)
        with tempfile.TemporaryDirectory() as path:
            with open(os.path.join(path, "x.json"), "w") as file:
                json.dump([x, iteration + 1], file)
            tune.report({"score": x}, checkpoint=tune.Checkpoint.from_directory(path))


@pytest.mark.parametrize("num_to_keep", [None, 20, 1])
def test_an_exploited_trial_keeps_its_own_checkpoints_from_before_the_exploit(tmp_path, ray_session, num_to_keep):
    """As under Tune, a trial PBT exploits keeps the checkpoints it saved
    itself before the exploit, each beside its own result there (they were
    the source's, beside the trial's own results: a best checkpoint chosen
    by score held another trial's model)."""
    import json

    from ray.tune.schedulers import PopulationBasedTraining

    pbt = PopulationBasedTraining(  # synchronous: the exploits do not depend on timing
        time_attr="training_iteration", perturbation_interval=2, hyperparam_mutations={"lr": [0.5]}, synch=True
    )
    grid = Tuner(
        tune.with_resources(accumulate, {"cpu": 0.5}),
        param_space={"lr": tune.grid_search([0.1, 0.2, 0.3, 0.4])},
        tune_config=tune.TuneConfig(metric="score", mode="max", scheduler=pbt),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path),
            checkpoint_config=tune.CheckpointConfig(num_to_keep=num_to_keep),
            verbose=0,
        ),
    ).fit()
    assert grid.num_errors == 0
    exploited = [result for result in grid if "config_schedule" in result.metrics]
    assert exploited, "the weakest trial exploited the strongest"
    for result in grid:
        for checkpoint, metrics in result.best_checkpoints:
            with open(os.path.join(checkpoint.path, "x.json")) as file:
                x, iteration = json.load(file)
            assert (iteration, x) == (metrics["training_iteration"], pytest.approx(metrics["score"]))
    if num_to_keep == 1:  # the best and the latest of each, nothing else stored (the exploits' sources went too)
        assert all(len(result.best_checkpoints) == 1 for result in grid)
        assert len(os.listdir(os.path.join(grid.experiment_path, "checkpoints"))) <= 2 * len(grid)
    if num_to_keep == 20:  # every report stored: the exploited trials' own from before the fork too
        for result in exploited:
            fork = result.metrics["config_schedule"]["lr"].milestones[0]
            assert any(metrics["training_iteration"] <= fork for _, metrics in result.best_checkpoints)
