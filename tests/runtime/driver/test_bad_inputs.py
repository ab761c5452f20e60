"""Malformed inputs at every boundary a user reaches,
each with the clear error it gets (the parameter named, the value shown) or,
where Tune accepts it, accepted. Everything here is checked before Ray
starts, except the few resource cases at the end."""

import datetime
import math
import os
import pathlib
import subprocess
import sys
import threading

import numpy as np
import pytest
from ray import tune
from ray.train import ScalingConfig
from ray.tune.error import TuneError
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search import ConcurrencyLimiter, Searcher
from ray.tune.utils.log import Verbosity

import ray_stagetree
from ray_stagetree import (
    Constant,
    Cosine,
    Exponential,
    MultiStep,
    OneCycle,
    Step,
    Tuner,
    Values,
    Warmup,
)
from ray_stagetree.execution.batches import BatchSpec
from ray_stagetree.planning.config import TrialConfig
from ray_stagetree.runtime.driver.trial_sources import trial_source
from ray_stagetree.runtime.workers.context import StageContext, activate
from ray_stagetree.searchers import SequenceGridSearch


def train(config):
    pass


class NotATrainable:
    pass


def tuner(**kwargs):
    kwargs.setdefault("trainable", train)
    return Tuner(kwargs.pop("trainable"), **kwargs)


def _nested(levels):
    """``{"k": {"k": ... {"v": 1}}}``, ``levels`` dicts deep."""
    value = {"v": 1}
    for _ in range(levels - 1):
        value = {"k": value}
    return value


def tune_config(**kwargs):
    return Tuner(train, tune_config=tune.TuneConfig(**kwargs))


def run_config(**kwargs):
    return Tuner(train, run_config=tune.RunConfig(**kwargs))


def failure_config(**kwargs):
    return run_config(failure_config=tune.FailureConfig(**kwargs))


def failure_config_changed(name, value):
    """A FailureConfig changed after construction, which its own checks miss."""
    config = tune.FailureConfig()
    setattr(config, name, value)
    return run_config(failure_config=config)


def resources(request):
    def fresh(config):  # tune.with_resources sets the request on the function itself
        pass

    return Tuner(tune.with_resources(fresh, request))


def draw(space, **kwargs):
    """The trials fit() would run (drawn and checked on the driver, before Ray)."""
    return trial_source(Tuner(train, param_space=space, tune_config=tune.TuneConfig(**kwargs)))


def restore(path, trainable=train, **kwargs):
    return Tuner.restore(path, trainable, **kwargs)


# (id, call, exception, message fragment): every message names the parameter and shows the value.
REFUSED = [
    # Tuner(...) arguments
    ("trainable-none", lambda: tuner(trainable=None), TuneError, "You need to provide a trainable to tune"),
    ("trainable-name", lambda: tuner(trainable="train"), TuneError, "Unknown trainable: train"),  # not registered
    ("trainable-base-class", lambda: tuner(trainable=tune.Trainable), TypeError, "Trainable is the base class"),
    ("trainable-other-class", lambda: tuner(trainable=NotATrainable), TypeError, "must subclass.*NotATrainable"),
    ("trainable-number", lambda: tuner(trainable=42), TypeError, "trainable must be.*got 42"),
    (
        "param-space-list",
        lambda: tuner(param_space=[1]),
        ValueError,
        "`param_space` passed to the `Tuner` must be a dict. Got '<class 'list'>'",
    ),
    (
        "tune-config-dict",
        lambda: tuner(tune_config={}),
        TypeError,
        r"tune_config must be a ray.tune.TuneConfig, got \{\} \(dict\)",
    ),
    (
        "run-config-str",
        lambda: tuner(run_config="x"),
        TypeError,
        r"run_config must be a ray.tune.RunConfig, got 'x' \(str\)",
    ),
    (
        "stage-sharing-str",
        lambda: tuner(stage_sharing="no"),
        TypeError,
        "stage_sharing must be True or False, got 'no'",
    ),
    ("stage-sharing-int", lambda: tuner(stage_sharing=1), TypeError, "stage_sharing must be True or False, got 1"),
    (
        "policy-unknown",
        lambda: tuner(execution_policy="fastest"),
        ValueError,
        "execution_policy must be an ExecutionPolicy or one of.*'fastest'",
    ),
    (
        "policy-list",
        lambda: tuner(execution_policy=["thr"]),
        ValueError,
        r"execution_policy must be an ExecutionPolicy or one of.*\['thr'\]",
    ),
    (
        "grid-search-empty",
        lambda: draw({"lr": tune.grid_search([])}),
        ValueError,
        r"param_space\['lr'\]: tune.grid_search\(\[\]\) has no values",
    ),
    (
        "grid-search-empty-in-a-sequence",
        lambda: draw({"lr": MultiStep(0.1, tune.grid_search([]), 0.1)}),
        ValueError,
        r"param_space\['lr'\]\['milestones'\]: tune.grid_search\(\[\]\) has no values, so no trial would run",
    ),
    ("budget-bytes-negative", lambda: tuner(checkpoint_budget_bytes=-1), ValueError, "checkpoint_budget_bytes.*got -1"),
    ("budget-bytes-float", lambda: tuner(checkpoint_budget_bytes=1.5), ValueError, "checkpoint_budget_bytes.*got 1.5"),
    ("budget-bytes-bool", lambda: tuner(checkpoint_budget_bytes=True), ValueError, "checkpoint_budget_bytes.*got True"),
    # TuneConfig
    ("metric-int", lambda: tune_config(metric=3), TypeError, "TuneConfig.metric must be a str.*got 3"),
    (
        "mode-word",
        lambda: tune_config(mode="minimum"),
        ValueError,
        "TuneConfig.mode must be 'min', 'max' or None, got 'minimum'",
    ),
    ("mode-int", lambda: tune_config(mode=1), ValueError, "TuneConfig.mode must be 'min', 'max' or None, got 1"),
    ("num-samples-zero", lambda: tune_config(num_samples=0), ValueError, "num_samples must be an int >= 1.*got 0"),
    (
        "num-samples-minus-one-drawn-up-front",
        lambda: tune_config(num_samples=-1, search_alg=SequenceGridSearch()),
        ValueError,
        r"or -1 \(trials without end.*not with SequenceGridSearch.*got -1",
    ),
    ("num-samples-float", lambda: tune_config(num_samples=2.5), ValueError, "num_samples.*got 2.5"),
    ("num-samples-bool", lambda: tune_config(num_samples=True), ValueError, "num_samples.*got True"),
    ("concurrent-negative", lambda: tune_config(max_concurrent_trials=-2), ValueError, "max_concurrent_trials.*got -2"),
    (
        "concurrent-and-a-limiter-disagree",  # Tune's own check and message
        lambda: tune_config(max_concurrent_trials=2, search_alg=ConcurrencyLimiter(Searcher(), max_concurrent=3)),
        ValueError,
        "`max_concurrent_trials=2`, but the `search_alg` is already a `ConcurrencyLimiter` with `max_concurrent=3",
    ),
    ("concurrent-float", lambda: tune_config(max_concurrent_trials=1.5), ValueError, "max_concurrent_trials.*got 1.5"),
    ("concurrent-str", lambda: tune_config(max_concurrent_trials="4"), ValueError, "max_concurrent_trials.*got '4'"),
    (
        "budget-zero",
        lambda: tune_config(time_budget_s=0),
        ValueError,
        "time_budget_s must be a number > 0, a datetime.timedelta > 0 or None \\(a number is seconds\\), got 0",
    ),
    ("budget-negative", lambda: tune_config(time_budget_s=-5), ValueError, "time_budget_s.*got -5"),
    ("budget-nan", lambda: tune_config(time_budget_s=math.nan), ValueError, "time_budget_s.*got nan"),
    ("budget-str", lambda: tune_config(time_budget_s="10"), ValueError, "time_budget_s.*got '10'"),
    (
        "budget-negative-timedelta",
        lambda: tune_config(time_budget_s=datetime.timedelta(seconds=-1)),
        ValueError,
        r"time_budget_s.*got datetime.timedelta\(days=-1",
    ),
    (
        "search-alg-str",
        lambda: tune_config(search_alg="optuna"),
        TypeError,
        r"TuneConfig.search_alg must be.*got 'optuna' \(str\)",
    ),
    ("scheduler-str", lambda: tune_config(scheduler="asha"), TypeError, "TuneConfig.scheduler must be.*got str"),
    ("scheduler-without-metric", lambda: tune_config(scheduler=ASHAScheduler()), ValueError, "needs a metric"),
    (
        "param-space-nested-too-deep",
        lambda: tuner(param_space={"model": _nested(150)}),
        ValueError,
        r"param_space\['model'\]\['k'\]\['k'\]\.\.\. nests dicts and lists 151 levels deep; up to 100",
    ),
    (
        "scheduler-metric-also-in-tune-config",  # Tune's rule: the scheduler's own metric and mode, or TuneConfig's
        lambda: tune_config(scheduler=ASHAScheduler(metric="acc", mode="max"), metric="loss", mode="min"),
        ValueError,
        r"metric='loss', mode='min'.*AsyncHyperBandScheduler\(metric='acc', mode='max'\).*Either remove the arguments",
    ),
    ("trial-name-creator-str", lambda: tune_config(trial_name_creator="x"), TypeError, "trial_name_creator.*got 'x'"),
    (
        "trial-dirname-creator-int",
        lambda: tune_config(trial_dirname_creator=5),
        TypeError,
        "trial_dirname_creator.*got 5",
    ),
    # RunConfig
    ("name-int", lambda: run_config(name=3), ValueError, "RunConfig.name must be a folder name.*got 3"),
    ("name-empty", lambda: run_config(name=""), ValueError, "RunConfig.name must be a folder name.*got ''"),
    ("name-parent", lambda: run_config(name=".."), ValueError, r"RunConfig.name must be a folder name.*got '\.\.'"),
    ("storage-path-int", lambda: run_config(storage_path=3), TypeError, "RunConfig.storage_path must be a str.*got 3"),
    ("storage-path-relative", lambda: run_config(storage_path="results"), ValueError, "absolute path.*got 'results'"),
    ("storage-filesystem-str", lambda: run_config(storage_filesystem="s3"), TypeError, "storage_filesystem.*got 's3'"),
    (
        "verbose-7",
        lambda: run_config(verbose=7),
        ValueError,
        "RunConfig.verbose must be an int >= 0 and <= 3, True, False, a Verbosity or None, got 7",
    ),
    ("verbose-negative", lambda: run_config(verbose=-1), ValueError, "RunConfig.verbose.*got -1"),
    ("verbose-str", lambda: run_config(verbose="loud"), ValueError, "RunConfig.verbose.*got 'loud'"),
    ("stop-str", lambda: run_config(stop="never"), ValueError, "RunConfig.stop must be None, a dict.*got 'never'"),
    (
        "stop-horizon-zero",
        lambda: run_config(stop={"training_iteration": 0}),
        ValueError,
        r"stop\['training_iteration'\].*got 0",
    ),
    ("stop-horizon-float", lambda: run_config(stop={"training_iteration": 2.5}), ValueError, "got 2.5"),
    (
        "stop-threshold-str",
        lambda: run_config(stop={"loss": "low"}),
        ValueError,
        r"RunConfig.stop\['loss'\].*got 'low'",
    ),
    (
        "stop-threshold-nan",
        lambda: run_config(stop={"loss": math.nan}),
        ValueError,
        r"RunConfig.stop\['loss'\].*got nan",
    ),
    (
        "sync-period-negative",
        lambda: run_config(sync_config=tune.SyncConfig(sync_period=-1)),
        ValueError,
        "sync_period.*got -1",
    ),
    (
        "sync-period-str",
        lambda: run_config(sync_config=tune.SyncConfig(sync_period="x")),
        ValueError,
        "sync_period.*got 'x'",
    ),
    ("callbacks-int", lambda: run_config(callbacks=[3]), TypeError, r"RunConfig.callbacks\[0\] must be.*got 3"),
    ("reporter-str", lambda: run_config(progress_reporter="cli"), TypeError, "progress_reporter must be.*got 'cli'"),
    ("failure-config-str", lambda: run_config(failure_config="x"), TypeError, "failure_config must be.*got 'x'"),
    (
        "checkpoint-config-str",
        lambda: run_config(checkpoint_config="x"),
        TypeError,
        "checkpoint_config must be.*got 'x'",
    ),
    # FailureConfig
    (
        "max-failures-negative",
        lambda: failure_config(max_failures=-5),
        ValueError,
        "max_failures must be an int >= -1 \\(retries per trial; -1 retries without limit\\), got -5",
    ),
    ("max-failures-str", lambda: failure_config(max_failures="3"), ValueError, "max_failures.*got '3'"),
    ("max-failures-float", lambda: failure_config(max_failures=1.5), ValueError, "max_failures.*got 1.5"),
    ("fail-fast-word", lambda: failure_config(fail_fast="yes"), ValueError, "fail_fast.*yes"),  # Ray's own check
    (
        "fail-fast-changed",
        lambda: failure_config_changed("fail_fast", "yes"),
        ValueError,
        "fail_fast must be.*got 'yes'",
    ),
    (
        "max-failures-changed",
        lambda: failure_config_changed("max_failures", None),
        ValueError,
        "max_failures.*got None",
    ),
    # CheckpointConfig (Ray checks its own fields)
    ("num-to-keep-negative", lambda: tune.CheckpointConfig(num_to_keep=-1), ValueError, "num_to_keep: -1"),
    ("num-to-keep-zero", lambda: tune.CheckpointConfig(num_to_keep=0), ValueError, "num_to_keep: 0"),
    ("checkpoint-frequency", lambda: tune.CheckpointConfig(checkpoint_frequency=-1), ValueError, "frequency.*got -1"),
    ("score-order", lambda: tune.CheckpointConfig(checkpoint_score_order="up"), ValueError, "checkpoint_score_order"),
    # tune.with_resources
    ("resources-negative", lambda: resources({"cpu": -1}), ValueError, "'CPU' must be a finite number >= 0.*got -1.0"),
    ("resources-nan", lambda: resources({"cpu": 1, "gpu": math.nan}), ValueError, "'GPU' must be a finite.*got nan"),
    ("resources-inf", lambda: resources({"cpu": math.inf}), ValueError, "'CPU' must be a finite.*got inf"),
    (
        "resources-bundle-negative",
        lambda: resources(tune.PlacementGroupFactory([{"CPU": 1}, {"GPU": -1}])),
        ValueError,
        "'GPU' must be a finite number >= 0.*got -1",
    ),
    # param_space values
    ("space-int-key", lambda: draw({1: 0.1}), ValueError, "config keys must be strings, got 1"),
    # any picklable value is taken (tests/drop_in/test_any_config_value.py); Tune's variants deep-copy the space
    ("space-unpicklable", lambda: draw({"opt": {"lock": threading.Lock()}}), TypeError, "cannot pickle '_thread.lock'"),
    # sequence constructors
    ("multistep-decreasing", lambda: MultiStep(0.1, [30, 10], 0.1), ValueError, r"milestones.*got \[30, 10\]"),
    ("multistep-zero", lambda: MultiStep(0.1, [0], 0.1), ValueError, r"MultiStep: milestones.*got \[0\]"),
    (
        "multistep-gamma",
        lambda: MultiStep(0.1, [30], -0.1),
        ValueError,
        "MultiStep: gamma must be a finite number > 0, got -0.1",
    ),
    ("multistep-milestones-str", lambda: MultiStep(0.1, "30", 0.1), TypeError, "MultiStep: milestones.*got '30'"),
    ("multistep-lengths", lambda: MultiStep(values=[1, 2], milestones=[10, 20]), ValueError, "values must have.*got 2"),
    ("multistep-2d-array", lambda: MultiStep(0.1, np.array([[30]]), 0.1), TypeError, "milestones.*array"),
    (
        "exponential-nan",
        lambda: Exponential(math.nan, 0.9),
        ValueError,
        "Exponential: init must be a finite number, got nan",
    ),
    ("exponential-np-inf", lambda: Exponential(np.float32(np.inf), 0.9), ValueError, "Exponential: init.*got inf"),
    (
        "exponential-gamma",
        lambda: Exponential(0.1, 0),
        ValueError,
        "Exponential: gamma must be a finite number > 0, got 0",
    ),
    ("exponential-str", lambda: Exponential("a", 0.9), TypeError, "Exponential: init must be a finite number, got 'a'"),
    ("step-size-zero", lambda: Step(0.1, 0, 0.5), ValueError, "Step: step_size must be an int > 0, got 0"),
    ("step-size-float", lambda: Step(0.1, 2.5, 0.5), TypeError, "Step: step_size must be an int > 0, got 2.5"),
    ("cosine-period", lambda: Cosine(0.1, 0.0, 0), ValueError, "Cosine: period must be an int > 0, got 0"),
    ("warmup-period", lambda: Warmup(0.01, -1, Cosine(0.1, 0.0, 10)), ValueError, "Warmup: period.*got -1"),
    ("values-empty", lambda: Values([]), ValueError, r"Values: values must be a non-empty list of scalars, got \[\]"),
    ("constant-nan", lambda: Constant(math.nan), ValueError, "Constant: init must be a scalar.*got nan"),
    ("constant-list", lambda: Constant([1, 2]), TypeError, r"Constant: init must be a scalar.*got \[1, 2\]"),
    ("onecycle-steps", lambda: OneCycle(0.1, 0), ValueError, "OneCycle: total_steps must be an int > 0, got 0"),
    # Tuner.restore / Tuner.can_restore
    (
        "restore-none",
        lambda: restore(None),
        TypeError,
        "Tuner.restore: path must be the experiment directory.*got None",
    ),
    ("restore-int", lambda: restore(3), TypeError, "Tuner.restore: path.*got 3"),
    ("restore-empty", lambda: restore(""), TypeError, "Tuner.restore: path.*got ''"),
    (
        "restore-missing",
        lambda: restore("/nonexistent/study"),
        ValueError,
        "no ray_stagetree study to restore at '/nonexistent/study'",
    ),
    (
        "restore-trainable-name",  # a name is checked against the saved study's, as in Tune
        lambda: restore("/nonexistent/study", "train"),
        ValueError,
        "no ray_stagetree study to restore at '/nonexistent/study'",
    ),
    ("restore-trainable-none", lambda: restore("/nonexistent/study", None), TypeError, "trainable must be.*got None"),
    (
        "restore-flag-str",
        lambda: restore("/x", resume_errored="yes"),
        TypeError,
        "resume_errored must be True or False, got 'yes'",
    ),
    (
        "restore-flag-int",
        lambda: restore("/x", restart_errored=1),
        TypeError,
        "restart_errored must be True or False, got 1",
    ),
    ("restore-filesystem", lambda: restore("/x", storage_filesystem="s3"), TypeError, "storage_filesystem.*got 's3'"),
    (
        "restore-space",
        lambda: restore("/x", param_space=[1]),
        TypeError,
        r"param_space must be a dict or None, got \[1\]",
    ),
    ("scaling-not-a-config", lambda: tuner(scaling_config=2), TypeError, "scaling_config must be a ray.train.Scal"),
    (
        "scaling-local-mode",
        lambda: tuner(scaling_config=ScalingConfig(num_workers=0)),
        ValueError,
        r"ScalingConfig\(num_workers=0\) runs Ray Train's local mode",
    ),
    (
        "scaling-strategy",
        lambda: tuner(scaling_config=ScalingConfig(num_workers=2, placement_strategy="TIGHT")),
        ValueError,
        "ScalingConfig.placement_strategy must be 'PACK', .*'STRICT_SPREAD', got 'TIGHT'",
    ),
    (
        "scaling-and-with-resources",
        lambda: tuner(trainable=tune.with_resources(train, {"cpu": 1}), scaling_config=ScalingConfig(num_workers=2)),
        ValueError,
        "scaling_config gives each rank's resources.*give only scaling_config",
    ),
    ("can-restore-none", lambda: Tuner.can_restore(None), TypeError, "Tuner.can_restore: path.*got None"),
    (
        "can-restore-filesystem",
        lambda: Tuner.can_restore("/x", storage_filesystem=3),
        TypeError,
        "storage_filesystem.*got 3",
    ),
]


@pytest.mark.parametrize("call, error, message", [case[1:] for case in REFUSED], ids=[case[0] for case in REFUSED])
def test_refused_with_a_clear_error(call, error, message):
    with pytest.raises(error, match=message):
        call()


ACCEPTED = [
    ("concurrent-zero-is-no-limit", lambda: tune_config(max_concurrent_trials=0)),
    ("concurrent-numpy", lambda: tune_config(max_concurrent_trials=np.int64(2))),
    ("budget-timedelta", lambda: tune_config(time_budget_s=datetime.timedelta(seconds=10))),
    ("budget-inf", lambda: tune_config(time_budget_s=math.inf)),
    ("budget-numpy", lambda: tune_config(time_budget_s=np.float32(10))),
    ("num-samples-numpy", lambda: tune_config(num_samples=np.int64(2))),
    ("mode-without-metric", lambda: tune_config(mode="min")),  # a searcher or scheduler may name the metric
    ("verbose-enum", lambda: run_config(verbose=Verbosity.V0_MINIMAL)),
    ("verbose-false", lambda: run_config(verbose=False)),
    ("name-nested", lambda: run_config(name="project/run1")),
    ("storage-pathlike", lambda: run_config(storage_path=pathlib.Path("/tmp/studies"))),
    ("stop-numpy", lambda: run_config(stop={"training_iteration": np.int64(5), "loss": np.float32(0.1)})),
    ("max-failures-unlimited", lambda: failure_config(max_failures=-1)),
    ("fail-fast-raise", lambda: failure_config(fail_fast="raise")),
    ("resources-fractional", lambda: resources({"cpu": 0.5, "gpu": 0.25})),
    ("resources-custom", lambda: resources({"cpu": 1, "accelerator": 1})),  # checked against the cluster in fit()
    ("multistep-numpy", lambda: MultiStep(np.float64(0.1), [30], 0.1)),
    ("multistep-numpy-milestones", lambda: MultiStep(0.1, np.array([30, 60]), np.float32(0.1))),
    ("exponential-numpy", lambda: Exponential(np.float32(0.1), np.float64(0.9))),
    ("step-numpy", lambda: Step(0.1, np.int64(2), 0.5)),
    ("values-array", lambda: Values(np.array([1, 2, 3]))),
    ("can-restore-missing", lambda: Tuner.can_restore("/nonexistent/study") is False or pytest.fail()),
]


@pytest.mark.parametrize("call", [case[1] for case in ACCEPTED], ids=[case[0] for case in ACCEPTED])
def test_accepted_as_tune_accepts_it(call):
    call()


SPACES = [
    ("numpy-float32", {"lr": np.float32(0.1)}),
    ("numpy-int64", {"layers": np.int64(3)}),
    ("numpy-bool", {"flag": np.bool_(True)}),
    ("numpy-str", {"name": np.str_("adam")}),
    ("numpy-array", {"weights": np.arange(3)}),
    ("numpy-2d-array", {"matrix": np.eye(2)}),
    ("numpy-array-with-nan", {"weights": np.array([1.0, np.nan])}),
    ("numpy-complex-array", {"roots": np.array([1 + 2j])}),
    ("list-of-numpy", {"sizes": [np.int64(1), np.float32(2.5)]}),
    ("nan", {"lr": math.nan}),
    ("inf", {"clip": math.inf}),
    ("minus-inf", {"floor": -math.inf}),
    ("numpy-nan", {"lr": np.float32("nan")}),
    ("grid-linspace", {"lr": tune.grid_search(np.linspace(0.1, 0.3, 3))}),
    ("grid-arange", {"batch": tune.grid_search(np.arange(1, 4) * 64)}),
    ("choice-numpy", {"lr": tune.choice(np.array([0.1, 0.2]))}),
    ("sequence-of-numpy", {"lr": MultiStep(np.float64(0.1), [30], 0.1)}),
    ("metric-like-slash-key", {"optim": {"lr/base": 0.1}}),
]


@pytest.mark.parametrize("space", [case[1] for case in SPACES], ids=[case[0] for case in SPACES])
def test_param_space_values_tune_accepts(space):
    source = draw(space, num_samples=2)
    config = source.peek()
    flat = TrialConfig.from_config(config)
    stored = flat.to_json()
    # The stored form is what JSON and Parquet hold: Python numbers and lists.
    assert not any(isinstance(value, np.generic) for value in stored.values())
    assert TrialConfig.from_json(stored).static_key == flat.static_key, "the stored form must plan as the original"


def _context(save_iterations=()):
    config = {"lr": 0.1}
    spec = BatchSpec(
        batch_id=0,
        config=config,
        trial_config=TrialConfig.from_config(config),
        segments=[(0, 0, 3)],
        save_iterations=set(save_iterations),
    )
    context = StageContext(spec, None, lambda key, payload: None)
    activate(context)
    return context


@pytest.mark.parametrize(
    "metrics, checkpoint, message",
    [
        ([1.0], None, r"report\(\) takes a dict of metrics, got list: \[1.0\]"),
        (0.5, None, r"report\(\) takes a dict of metrics, got float: 0.5"),
        (None, None, r"report\(\) takes a dict of metrics, got NoneType"),
        (
            {"loss": 1.0},
            "/tmp/checkpoint",
            r"report\(\)'s checkpoint must be a ray.tune.Checkpoint.*got str: '/tmp/checkpoint'",
        ),
        ({"loss": 1.0}, {"weights": 1}, r"report\(\)'s checkpoint must be a ray.tune.Checkpoint.*got dict"),
    ],
    ids=["list", "float", "none", "checkpoint-path", "checkpoint-dict"],
)
def test_report_arguments(metrics, checkpoint, message):
    _context(save_iterations=[1])
    try:
        with pytest.raises(TypeError, match=message):
            ray_stagetree.report(metrics, checkpoint=checkpoint)
    finally:
        activate(None)


@pytest.mark.timeout(60)
@pytest.mark.parametrize(
    "request_, message",
    [({"cpu": 64}, "each trial asks for 64 CPU but the Ray cluster has 2"), ({"tpu_v9": 1}, "asks for 1 tpu_v9")],
    ids=["more-than-the-cluster", "unknown-resource"],
)
def test_resources_the_cluster_cannot_give(tmp_path, ray_session, request_, message):
    def fresh(config):
        pass

    study = Tuner(
        tune.with_resources(fresh, request_), run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0)
    )
    with pytest.raises(ValueError, match=message):
        study.fit()


def test_a_ray_train_run_config_is_taken_as_tune_takes_it(tmp_path):
    """Tune 2.60 takes Train's RunConfig with a deprecation warning; so does the Tuner, as Tune's."""
    import ray.train
    from ray.util.annotations import RayDeprecationWarning

    given = ray.train.RunConfig(
        name="from_train",
        storage_path=str(tmp_path),
        checkpoint_config=ray.train.CheckpointConfig(num_to_keep=2, checkpoint_score_attribute="loss"),
        failure_config=ray.train.FailureConfig(max_failures=3),
    )
    with pytest.warns(RayDeprecationWarning, match="should be imported from `ray.tune`"):
        converted = tuner(run_config=given).run_config
    assert isinstance(converted, tune.RunConfig) and isinstance(converted.checkpoint_config, tune.CheckpointConfig)
    assert (converted.name, converted.storage_path) == ("from_train", str(tmp_path))
    assert (converted.checkpoint_config.num_to_keep, converted.checkpoint_config.checkpoint_score_attribute) == (
        2,
        "loss",
    )
    assert converted.failure_config.max_failures == 3


def test_tunes_run_config_is_taken_as_it_is_with_rays_train_v1_api_on(tmp_path):
    """With RAY_TRAIN_V2_ENABLED=0 (read when Ray Train is first imported: a
    process of its own), Tune's RunConfig is a Train RunConfig too: the Tuner
    takes it without the warning Train's own gets, as Tune's Tuner does."""
    check = (
        "import warnings; from ray import tune; import ray_stagetree\n"
        "warnings.filterwarnings('error', message='.*should be imported')\n"
        f"given = tune.RunConfig(name='v1', storage_path={str(tmp_path)!r})\n"
        "assert ray_stagetree.Tuner(lambda config: None, run_config=given).run_config is given\n"
        "print('taken as it is')"
    )
    env = {**os.environ, "RAY_TRAIN_V2_ENABLED": "0"}
    done = subprocess.run([sys.executable, "-c", check], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and "taken as it is" in done.stdout, done.stderr[-3000:]


def test_a_config_object_is_taken_as_its_dict_as_tune_takes_it():
    from ray_stagetree.trial_schedulers.ray_fields import config_interface

    class Space(config_interface()):
        def to_dict(self):
            return {"lr": tune.grid_search([0.1, 0.2])}

    assert tuner(param_space=Space()).param_space == {"lr": {"grid_search": [0.1, 0.2]}}


def test_an_uncopyable_value_is_named_by_its_key(tmp_path, ray_session):
    """Tune copies the param_space for each trial: a value that cannot be
    copied (a lock) fails there, and the error says which value it is."""
    study = Tuner(
        train, param_space={"data": {"lock": threading.Lock()}}, run_config=tune.RunConfig(storage_path=str(tmp_path))
    )
    with pytest.raises(
        TypeError, match=r"param_space\['data'\]\['lock'\] = <unlocked _thread.lock .* cannot be copied"
    ):
        study.fit()
