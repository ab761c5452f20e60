"""`ray_stagetree.run`: Ray Tune 2.60's ``tune.run`` on a `Tuner`, so that a
script calling ``tune.run(...)`` changes its import and nothing else.

The arguments go where Tune's own ``Tuner`` puts them (``TuneConfig``,
``RunConfig``, ``tune.with_resources``), ``resume`` continues the study with
`Tuner.restore`, and the result is Tune's ``ExperimentAnalysis`` of the
``experiment_state-*.json`` the driver writes when ``fit()`` returns
(`tune_state`). What a study cannot honour is refused by name (`REFUSED`).
"""

from __future__ import annotations

import copy
import dataclasses
import datetime
import functools
import logging
import types
import warnings
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from ray import tune
from ray.tune import CheckpointConfig, Experiment, ExperimentAnalysis, ResumeConfig, SyncConfig
from ray.tune.error import TuneError
from ray.tune.experiment import Trial
from ray.tune.schedulers import create_scheduler
from ray.tune.search import create_searcher

from ray_stagetree.execution.storage import CheckpointStorage
from ray_stagetree.execution.study_file import INTERRUPTED_STUDY, stored_status
from ray_stagetree.runtime.driver.callback_hooks import check_driver_hooks
from ray_stagetree.runtime.driver.tune_compat import resolve_trainable
from ray_stagetree.runtime.driver.tuner import Tuner
from ray_stagetree.trial_schedulers.ray_fields import config_interface, deprecated_default, trainable_resources

logger = logging.getLogger("ray_stagetree")

#: The default of Tune's deprecated arguments: one given differs from it.
UNSET = deprecated_default()
#: ``tune.run``'s arguments a study cannot honour, and what is allowed.
REFUSED = {
    "export_formats": "None or [] (export the model from the trainable or its checkpoint)",
    "restore": "None (load the checkpoint in the trainable, given with tune.with_parameters)",
    "_remote": "None or False (the study's driver is this process, not a Ray client's task)",
    "_remote_string_queue": "None (Ray client's output, which Tune's remote driver streams)",
    "_entrypoint": "None (what Tune's own Tuner and trainers pass)",
}
#: ``resume``'s suffix as `Tuner.restore`'s flags (resume_unfinished, resume_errored, restart_errored).
RESUME_SUFFIXES = {
    None: (True, False, False),
    "ERRORED": (True, True, False),
    "RESTART_ERRORED": (True, False, True),
    "ERRORED_ONLY": (False, True, False),
    "RESTART_ERRORED_ONLY": (False, False, True),
}
#: ``tune.run``'s deprecated checkpoint arguments: the ``CheckpointConfig`` field each sets.
CHECKPOINT_ARGUMENTS = {
    "keep_checkpoints_num": "num_to_keep",
    "checkpoint_freq": "checkpoint_frequency",
    "checkpoint_at_end": "checkpoint_at_end",
}


def run(
    run_or_experiment: str | Callable | type | Experiment,
    *,
    name: str | None = None,
    metric: str | None = None,
    mode: str | None = None,
    stop: Mapping | Any | Callable[[str, Mapping], bool] | None = None,
    time_budget_s: float | datetime.timedelta | None = None,
    config: dict[str, Any] | None = None,
    resources_per_trial: Mapping | tune.PlacementGroupFactory | None = None,
    num_samples: int = 1,
    storage_path: str | None = None,
    storage_filesystem: Any = None,
    search_alg: Any = None,
    scheduler: Any = None,
    checkpoint_config: CheckpointConfig | None = None,
    verbose: Any = None,
    progress_reporter: Any = None,
    log_to_file: bool | str | Sequence[str] = False,
    trial_name_creator: Callable[[Trial], str] | None = None,
    trial_dirname_creator: Callable[[Trial], str] | None = None,
    sync_config: SyncConfig | None = None,
    export_formats: Sequence | None = None,
    max_failures: int = 0,
    fail_fast: bool | str = False,
    restore: str | None = None,
    resume: bool | str | None = None,
    resume_config: ResumeConfig | None = None,
    reuse_actors: bool = False,
    raise_on_failed_trial: bool = True,
    callbacks: Sequence[tune.Callback] | None = None,
    max_concurrent_trials: int | None = None,
    keep_checkpoints_num: int | None = None,
    checkpoint_score_attr: str | None = None,
    checkpoint_freq: int = 0,
    checkpoint_at_end: bool = False,
    chdir_to_trial_dir: Any = UNSET,
    local_dir: str | None = None,
    _remote: bool | None = None,
    _remote_string_queue: Any = None,
    _entrypoint: Any = None,
) -> ExperimentAnalysis:
    """Ray Tune's ``tune.run``, every argument where Tune's ``Tuner`` takes it;
    returns Tune's ``ExperimentAnalysis`` of the experiment folder.

    ``run_or_experiment`` is a trainable, a registered name or a
    ``tune.Experiment`` (whose spec replaces ``name``, ``stop``, ``config``,
    ``num_samples``, ... as in Tune). ``resume`` (True, "AUTO", with Tune's
    suffixes "+ERRORED", "+RESTART_ERRORED", "+ERRORED_ONLY",
    "+RESTART_ERRORED_ONLY") or ``resume_config`` continues the study saved at
    ``storage_path/name`` with `Tuner.restore` (its searcher, scheduler and
    stop criteria as saved; this call's callbacks, verbose and
    progress_reporter), or starts it where there is none. As Tune,
    ``raise_on_failed_trial`` raises ``TuneError("Trials did not complete",
    trials)`` when a trial did not end TERMINATED, unless the run was
    interrupted (Ctrl-C).

    Examples
    --------
    >>> from ray_stagetree import run                                   # doctest: +SKIP
    >>> analysis = run(train, config={"lr": tune.grid_search([0.1, 0.01])},
    ...                metric="loss", mode="min", stop={"training_iteration": 10})  # doctest: +SKIP
    >>> analysis.best_config                                            # doctest: +SKIP
    """
    args = types.SimpleNamespace(**locals())
    if local_dir is not None:  # Tune's refusal
        raise DeprecationWarning(
            "The `local_dir` argument is deprecated. You should set the `storage_path` instead. See the docs: "
            "https://docs.ray.io/en/latest/train/user-guides/persistent-storage.html"
            "#setting-the-local-staging-directory"
        )
    if isinstance(run_or_experiment, list):
        args.run_or_experiment = _only_one(run_or_experiment)
    if isinstance(args.run_or_experiment, Experiment):
        vars(args).update(_experiment_arguments(args.run_or_experiment))
    for argument, allowed in REFUSED.items():
        if getattr(args, argument):
            raise ValueError(
                f"tune.run's {argument} is not supported: allowed {allowed}, got {getattr(args, argument)!r}"
            )
    if mode and mode not in ("min", "max"):  # Tune's messages
        raise ValueError("The `mode` parameter passed to `tune.run(...)` must be one of ['min', 'max']")
    if args.config is not None and not isinstance(args.config, (dict, config_interface())):
        raise ValueError(f"The `config` passed to `tune.run(...)` must be a dict. Got '{type(args.config)}' instead.")
    tune_config = tune.TuneConfig(
        metric=metric,
        mode=mode,
        search_alg=create_searcher(search_alg) if isinstance(search_alg, str) else search_alg,
        scheduler=create_scheduler(scheduler) if isinstance(scheduler, str) else scheduler,
        num_samples=args.num_samples,
        max_concurrent_trials=max_concurrent_trials,
        time_budget_s=args.time_budget_s,
        reuse_actors=reuse_actors,
        trial_name_creator=args.trial_name_creator,
        trial_dirname_creator=args.trial_dirname_creator,
        chdir_to_trial_dir=chdir_to_trial_dir,  # refused at fit(), as tune.run refuses it
    )
    run_config = tune.RunConfig(
        name=args.name,
        storage_path=args.storage_path,
        storage_filesystem=args.storage_filesystem,
        failure_config=tune.FailureConfig(max_failures=args.max_failures, fail_fast=fail_fast),
        checkpoint_config=_checkpoint_config(args),
        sync_config=args.sync_config,
        verbose=verbose,
        stop=args.stop,
        callbacks=callbacks,
        progress_reporter=progress_reporter,
        log_to_file=args.log_to_file,
    )
    trainable = _with_resources(args.run_or_experiment, args.resources_per_trial)
    grid = _tuner(trainable, args.config, tune_config, run_config, _restore_flags(resume, resume_config)).fit()
    analysis = ExperimentAnalysis(
        grid.experiment_path,
        storage_filesystem=grid.filesystem if run_config.storage_filesystem is not None else None,
        default_metric=metric,
        default_mode=mode,
    )
    incomplete = [trial for trial in analysis.trials if trial.status != Trial.TERMINATED]
    if incomplete:
        storage = CheckpointStorage(grid.experiment_path, run_config.storage_filesystem)
        interrupted = stored_status(storage.filesystem, storage.root).get("state") == INTERRUPTED_STUDY
        if raise_on_failed_trial and not interrupted:  # as Tune: an interrupted run returns
            raise TuneError("Trials did not complete", incomplete)
        logger.error("Trials did not complete: %s", incomplete)
    return analysis


def run_experiments(
    experiments: Experiment | Mapping | Sequence[Experiment | Mapping],
    scheduler: Any = None,
    verbose: Any = None,
    progress_reporter: Any = None,
    resume: bool | str | None = None,
    resume_config: ResumeConfig | None = None,
    reuse_actors: bool = False,
    raise_on_failed_trial: bool = True,
    concurrent: bool = True,
    callbacks: Sequence[tune.Callback] | None = None,
    _remote: bool | None = None,
) -> list[Trial]:
    """Ray Tune's ``tune.run_experiments``: each experiment (an ``Experiment``,
    or a mapping of names to specs) through `run`; the trials of all. Several
    at once (``concurrent=True``, Tune's default) are refused: pass ``concurrent=False``."""
    if isinstance(experiments, Mapping):
        experiments = [Experiment.from_json(key, spec) for key, spec in experiments.items()]
    experiments = list(experiments) if isinstance(experiments, (list, tuple)) else [experiments]
    if concurrent and len(experiments) > 1:
        raise ValueError(
            f"run_experiments: {len(experiments)} experiments with concurrent=True (one searcher over all) cannot "
            "run as one ray_stagetree study; pass concurrent=False to run them one after another"
        )
    options = dict(verbose=verbose, progress_reporter=progress_reporter, resume=resume, resume_config=resume_config)
    options.update(reuse_actors=reuse_actors, raise_on_failed_trial=raise_on_failed_trial, callbacks=callbacks)
    return [trial for one in experiments for trial in run(one, scheduler=scheduler, _remote=_remote, **options).trials]


def _only_one(experiments: list) -> Any:
    if len(experiments) != 1:
        raise ValueError(
            f"run_or_experiment must be one trainable or one tune.Experiment, got a list of {len(experiments)}: Tune "
            "runs them under one searcher, which one ray_stagetree study cannot; call run() once for each"
        )
    return experiments[0]


def _experiment_arguments(experiment: Experiment) -> dict[str, Any]:
    """What ``tune.run`` takes of an ``Experiment``: its spec, in place of the
    matching arguments (its stopper holds ``time_budget_s`` unless ``stop`` is a dict)."""
    spec, storage = experiment.spec, experiment.storage
    same = ("config", "resources_per_trial", "num_samples", "checkpoint_config", "trial_name_creator")
    same += ("trial_dirname_creator", "export_formats", "max_failures", "restore")
    return {
        **{key: spec[key] for key in same},
        "run_or_experiment": spec["run"],
        "name": storage.experiment_dir_name,
        "stop": spec["stop"] or experiment.stopper,
        "time_budget_s": spec["time_budget_s"] if spec["stop"] else None,
        "storage_path": storage.storage_fs_path,
        "storage_filesystem": storage.storage_filesystem,
        "sync_config": storage.sync_config,
        "log_to_file": spec["log_to_file"] if any(spec["log_to_file"]) else False,  # (stdout file, stderr file)
    }


def _checkpoint_config(args: types.SimpleNamespace) -> CheckpointConfig:
    """``checkpoint_config`` (a copy: Tune's run changes the caller's) with the
    deprecated arguments set on it, each with Tune's warning."""
    checkpoint = copy.copy(args.checkpoint_config) if args.checkpoint_config else CheckpointConfig()
    for argument, field in CHECKPOINT_ARGUMENTS.items():
        if getattr(args, argument) not in (None, 0, False):
            warnings.warn(f"{argument} is deprecated; use checkpoint_config.{field} instead", DeprecationWarning, 3)
            setattr(checkpoint, field, getattr(args, argument))
    attribute = args.checkpoint_score_attr
    if attribute is not None:  # "min-loss" ranks by the lowest loss, "loss" by the highest
        warnings.warn("checkpoint_score_attr is deprecated; use checkpoint_config instead", DeprecationWarning, 3)
        order, _, name = attribute.partition("-") if attribute.startswith("min-") else ("max", "", attribute)
        checkpoint.checkpoint_score_attribute, checkpoint.checkpoint_score_order = name, order
    return checkpoint


def _with_resources(trainable: Any, resources: Any) -> Any:
    """``resources_per_trial`` as ``tune.with_resources``, which sets an
    attribute on a function itself: a copy of the function gets it, so that
    the caller's asks for nothing in a later run without them."""
    if not resources:
        return trainable
    trainable = resolve_trainable(trainable)  # a registered name: its function or class
    if trainable_resources(trainable) is not None:  # Tune's refusal
        raise TuneError(
            f"Resources for {trainable} have been automatically set to {trainable_resources(trainable)} by its "
            "`default_resource_request()` method. Please clear the `resources_per_trial` option."
        )
    if isinstance(trainable, types.FunctionType):
        original = trainable
        trainable = types.FunctionType(
            original.__code__, original.__globals__, original.__name__, original.__defaults__, original.__closure__
        )
        trainable.__kwdefaults__ = original.__kwdefaults__
        functools.update_wrapper(trainable, original)
    return tune.with_resources(trainable, resources)


def _restore_flags(resume: Any, resume_config: ResumeConfig | None) -> tuple[bool, bool, bool] | None:
    """`Tuner.restore`'s flags for ``resume`` / ``resume_config`` as Tune reads
    them (``resume_config`` first); None for a new experiment."""
    if resume_config is not None:
        return _resume_config_flags(resume_config)
    if resume is None or resume is False:
        return None
    head, *suffixes = ["AUTO"] if resume is True else str(resume).split("+")
    if head in ("LOCAL", "REMOTE", "PROMPT", "ERRORED_ONLY"):  # Tune's refusal
        raise DeprecationWarning(f"'{head}' is deprecated. Please pass in one of (True, False, 'AUTO').")
    if not isinstance(resume, (bool, str)) or head != "AUTO":
        raise ValueError(
            "resume must be None, False, True or 'AUTO' (optionally with '+ERRORED', '+RESTART_ERRORED', "
            f"'+ERRORED_ONLY' or '+RESTART_ERRORED_ONLY'), got {resume!r}"
        )
    for suffix in suffixes:
        if suffix not in RESUME_SUFFIXES:
            raise ValueError(f"Invalid resume setting: '{suffix}'")  # Tune's message
    return RESUME_SUFFIXES[suffixes[-1] if suffixes else None]  # as Tune: the last suffix counts


def _resume_config_flags(resume_config: ResumeConfig) -> tuple[bool, bool, bool]:
    """A ``ResumeConfig`` as `Tuner.restore`'s flags: finished trials stay as
    they ended, unfinished ones resume or end, errored ones resume, restart or end."""
    kind = ResumeConfig.ResumeType
    finished, unfinished, errored = map(kind, (resume_config.finished, resume_config.unfinished, resume_config.errored))
    if finished is not kind.SKIP or unfinished is kind.RESTART:
        raise ValueError(
            "resume_config: finished trials stay as they ended, unfinished ones go on from what they trained "
            f"(allowed: finished=SKIP, unfinished=RESUME or SKIP), got finished={finished.name}, "
            f"unfinished={unfinished.name}"
        )
    return unfinished is kind.RESUME, errored is kind.RESUME, errored is kind.RESTART


def _tuner(trainable: Any, config: Any, tune_config: Any, run_config: Any, flags: tuple | None) -> Tuner:
    """The study saved at ``storage_path/name`` continued, when resuming
    (with this call's callbacks and output, as Tune), else a new one."""
    path = f"{run_config.storage_path.rstrip('/')}/{run_config.name}"
    if flags is None or run_config.name is None or not Tuner.can_restore(path, run_config.storage_filesystem):
        return Tuner(trainable, param_space=config, tune_config=tune_config, run_config=run_config)
    unfinished, errored, restart = flags
    tuner = Tuner.restore(
        path,
        trainable,
        resume_unfinished=unfinished,
        resume_errored=errored,
        restart_errored=restart,
        storage_filesystem=run_config.storage_filesystem,
    )
    output = {key: getattr(run_config, key) for key in ("callbacks", "progress_reporter", "verbose")}
    tuner.run_config = dataclasses.replace(tuner.run_config, **output)
    check_driver_hooks(tuner.run_config)
    return tuner
