"""What a user hands the Tuner, checked on the driver before anything runs.

Ray's config objects check some fields when built and none that are set
afterwards, and Tune checks others late, in the middle of a run; here each
field the study honours is checked against its declared constraints
(`ray_stagetree.validation`), with an error that names the field, what is
allowed and the value given. Environment variables Tune reads are checked
here too.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
import os
from typing import Any

from ray import tune
from ray.tune.search import BasicVariantGenerator, ConcurrencyLimiter, Searcher

from ray_stagetree._extras import MONITOR_MODULES, require_all
from ray_stagetree.execution.scaling import Scaling
from ray_stagetree.execution.storage import CheckpointStorage
from ray_stagetree.planning.filesystems import is_filesystem, is_local
from ray_stagetree.searchers import SequenceGridSearch
from ray_stagetree.trainables import StageTrainable
from ray_stagetree.trial_schedulers.ray_fields import log_files
from ray_stagetree.validation import BOOL, CALLABLE, STR, InstanceOf, Int, Options, Real, check

logger = logging.getLogger("ray_stagetree")

SEARCHERS = InstanceOf(
    (Searcher, BasicVariantGenerator, SequenceGridSearch),
    "a ray.tune Searcher or ray_stagetree.searchers.SequenceGridSearch",
)
MODES = Options(("min", "max"))


@dataclasses.dataclass(frozen=True)
class _PositiveTimedelta:
    def admits_type(self, value: Any) -> bool:
        return isinstance(value, datetime.timedelta)

    def holds(self, value: Any) -> bool:
        return isinstance(value, datetime.timedelta) and value.total_seconds() > 0

    def describe(self) -> str:
        return "a datetime.timedelta > 0"


POSITIVE_TIMEDELTA = _PositiveTimedelta()


def check_trainable(trainable: Any) -> None:
    if isinstance(trainable, type):
        if trainable in (tune.Trainable, StageTrainable):
            raise TypeError(f"{trainable.__name__} is the base class: subclass it and implement step()")
        if not issubclass(trainable, tune.Trainable):
            raise TypeError(
                f"a class trainable must subclass ray.tune.Trainable or ray_stagetree.trainables.StageTrainable, "
                f"got {trainable.__name__}"
            )
    elif not callable(trainable):
        raise TypeError(
            f"trainable must be a function, a ray.tune.Trainable or a StageTrainable subclass, got {trainable!r}"
        )


def check_path(where: str, path: Any) -> None:
    if not isinstance(path, (str, os.PathLike)) or not os.fspath(path):
        raise TypeError(f"{where}: path must be the experiment directory (a str path or URI), got {path!r}")


def check_filesystem(where: str, filesystem: Any) -> None:
    if filesystem is not None and not is_filesystem(filesystem):
        raise TypeError(f"{where} must be a pyarrow.fs.FileSystem or an fsspec filesystem, got {filesystem!r}")


def check_restore_arguments(path: Any, storage_filesystem: Any, param_space: Any, flags: dict[str, Any]) -> None:
    """`Tuner.restore`'s own arguments (the trainable is checked as the Tuner's)."""
    check_path("Tuner.restore", path)
    check_filesystem("Tuner.restore's storage_filesystem", storage_filesystem)
    check("Tuner.restore's param_space", param_space, InstanceOf(dict, "a dict"), None)
    for name, value in flags.items():
        check(f"Tuner.restore's {name}", value, BOOL)


def check_stagetree_arguments(
    stage_sharing: Any, checkpoint_budget_bytes: Any, parked_trainables_per_worker: Any, monitor: Any
) -> None:
    """The Tuner's arguments that Tune's Tuner does not have."""
    check("stage_sharing", stage_sharing, BOOL)
    check("checkpoint_budget_bytes", checkpoint_budget_bytes, Int(low=0))
    check("parked_trainables_per_worker", parked_trainables_per_worker, Int(low=0), meaning=" (0 parks none)")
    check("monitor", monitor, BOOL)
    if monitor:  # here, not once fit() has started Ray and the study
        require_all(MONITOR_MODULES, "Tuner(monitor=True)", "monitor")


def check_tune_config(config: Any) -> None:
    """The TuneConfig fields the study honours (Tune checks some late, some not at all)."""
    check("tune_config", config, InstanceOf(tune.TuneConfig, "a ray.tune.TuneConfig"))
    check("TuneConfig.metric", config.metric, STR, None, meaning=" (a key of the reported metrics)")
    check("TuneConfig.mode", config.mode, MODES, None)
    check("TuneConfig.search_alg", config.search_alg, SEARCHERS, None)
    check(
        "TuneConfig.time_budget_s",
        config.time_budget_s,
        Real(low=0, closed="neither", finite=False),
        POSITIVE_TIMEDELTA,
        None,
        meaning=" (a number is seconds)",
    )
    if config.num_samples != -1 or isinstance(config.search_alg, SequenceGridSearch):
        check(
            "TuneConfig.num_samples",
            config.num_samples,
            Int(low=1),
            meaning=(
                ", or -1 (trials without end, until time_budget_s, a stopper or the searcher ends the study;"
                " not with SequenceGridSearch, which draws every trial before the study starts)"
            ),
        )
    check(
        "TuneConfig.max_concurrent_trials",
        config.max_concurrent_trials,
        Int(low=0),
        None,
        meaning=" (0 or None: no limit)",
    )
    limiter = config.search_alg
    if isinstance(limiter, ConcurrencyLimiter) and config.max_concurrent_trials not in (None, 0):
        if limiter.max_concurrent != config.max_concurrent_trials:  # Tune's own message
            raise ValueError(
                f"You have specified `max_concurrent_trials={config.max_concurrent_trials}`, but the `search_alg` "
                f"is already a `ConcurrencyLimiter` with `max_concurrent={limiter.max_concurrent}. FIX THIS by "
                "setting `max_concurrent_trials=None`."
            )
        logger.warning(
            "You have specified `max_concurrent_trials=%s`, but the `search_alg` is already a `ConcurrencyLimiter`. "
            "`max_concurrent_trials` will be ignored.",
            config.max_concurrent_trials,
        )
    for name in ("trial_name_creator", "trial_dirname_creator"):
        check(
            f"TuneConfig.{name}",
            getattr(config, name, None),
            CALLABLE,
            None,
            meaning=" (a function of the trial that returns a str)",
        )


def check_run_config(run_config: Any) -> None:
    """The RunConfig and FailureConfig fields the study honours."""
    from ray.tune.experimental.output import AirVerbosity
    from ray.tune.utils.log import Verbosity

    check("run_config", run_config, InstanceOf(tune.RunConfig, "a ray.tune.RunConfig"))
    log_files(run_config.log_to_file)  # Tune's error for a value it does not take
    name = run_config.name
    if name is not None and (not isinstance(name, str) or name.strip(" /") == "" or name in (".", "..")):
        raise ValueError(f"RunConfig.name must be a folder name (a non-empty str) or None, got {name!r}")
    check(
        "RunConfig.verbose",
        run_config.verbose,
        Int(low=0, high=3),
        BOOL,
        InstanceOf((Verbosity, AirVerbosity), "a Verbosity"),
        None,
    )
    check_filesystem("RunConfig.storage_filesystem", run_config.storage_filesystem)
    _check_storage_path(run_config.storage_path, run_config.storage_filesystem)
    sync_config = getattr(run_config, "sync_config", None)
    check(
        "RunConfig.sync_config.sync_period",
        getattr(sync_config, "sync_period", 300.0),
        Real(low=0),
        meaning=" (seconds)",
    )
    check(
        "RunConfig.checkpoint_config",
        run_config.checkpoint_config,
        InstanceOf(tune.CheckpointConfig, "a ray.tune.CheckpointConfig"),
        None,
    )
    failure = run_config.failure_config
    if failure is None:
        return
    check("RunConfig.failure_config", failure, InstanceOf(tune.FailureConfig, "a ray.tune.FailureConfig"))
    check(
        "FailureConfig.max_failures",
        failure.max_failures,
        Int(low=-1),
        meaning=" (retries per trial; -1 retries without limit)",
    )
    check("FailureConfig.fail_fast", failure.fail_fast, BOOL, Options(("raise",)))


def _check_storage_path(storage: Any, storage_filesystem: Any) -> None:
    # RunConfig made a pathlib.Path a str
    check("RunConfig.storage_path", storage, STR, None, meaning=" (a path or a URI)")
    if storage and is_local(storage, storage_filesystem) and not os.path.isabs(os.path.expanduser(storage)):
        raise ValueError(
            "RunConfig.storage_path must be an absolute path, a path under '~' or a URI (s3://, gs://, file://, "
            f"...), got {storage!r}: a relative path would land in the working directory of whichever process writes it "
            f"(under `ray job submit`, a temporary one); pass os.path.abspath({storage!r}) to mean this one"
        )


def check_checkpoint_config(config: Any, function_trainable: bool) -> None:
    """``RunConfig.checkpoint_config`` as Tune takes it (Ray checks it when
    built; fields set afterwards are checked here)."""
    if config is None:
        return
    check("CheckpointConfig.num_to_keep", config.num_to_keep, Int(low=1), None, meaning=" (None keeps all)")
    check("CheckpointConfig.checkpoint_score_order", config.checkpoint_score_order, MODES)
    check(
        "CheckpointConfig.checkpoint_score_attribute",
        config.checkpoint_score_attribute,
        STR,
        None,
        meaning=" (None ranks by recency; else a metric name)",
    )
    frequency = check(
        "CheckpointConfig.checkpoint_frequency", config.checkpoint_frequency, Int(low=0), meaning=" (0: never)"
    )
    check("CheckpointConfig.checkpoint_at_end", config.checkpoint_at_end, BOOL, None)
    if not function_trainable:
        return
    if config.checkpoint_at_end:  # Tune's own checks and messages
        raise ValueError(
            "CheckpointConfig(checkpoint_at_end=True) cannot be used with a function trainable: report a "
            "checkpoint in the last call to report(metrics, checkpoint=...) of your training loop instead"
        )
    if frequency:
        raise ValueError(
            f"CheckpointConfig(checkpoint_frequency={frequency}) cannot be set for a function trainable: "
            f"report a checkpoint every {frequency} iterations in your training loop with "
            "report(metrics, checkpoint=...) instead"
        )


def request_bundles(request: Any) -> list[dict[str, float]]:
    """The bundles of a ``PlacementGroupFactory`` or a ``Resources`` request."""
    return getattr(request, "bundles", None) or [request.required_resources]


def check_resource_request(request: Any) -> None:
    """A resource request (``tune.with_resources``, ``default_resource_request``)
    Ray could reserve: amounts >= 0, some > 0. Requests that depend on the
    config are checked when a config is drawn."""
    if request is None or (callable(request) and not hasattr(request, "bundles")):
        return
    if isinstance(request, dict):
        bundles = [request]
    elif hasattr(request, "bundles") or hasattr(request, "required_resources"):
        bundles = request_bundles(request)
    else:
        raise TypeError(
            f"a trainable's resource request must be a dict or a tune.PlacementGroupFactory, got {request!r}"
        )
    for bundle in bundles:
        for key, amount in bundle.items():
            check(f"tune.with_resources: {key!r}", amount, Real(low=0), meaning=f" (in {bundle!r})")
    if not any(amount for bundle in bundles for amount in bundle.values()):
        raise ValueError(
            f"tune.with_resources: the request {bundles!r} asks for nothing; ask for at least some CPU "
            '(e.g. {"cpu": 1}), or fractional amounts such as {"cpu": 0.5}'
        )


def check_writable(storage: CheckpointStorage, experiment_path: str) -> None:
    """Write and remove a probe file where the study will write, through the
    same filesystem: a read-only or unreachable storage fails here, not after
    training. A file system in this process's memory is refused: the
    study's controller, workers and storage actor are other processes."""
    import uuid

    from fsspec.implementations.memory import MemoryFileSystem

    if isinstance(storage.filesystem, MemoryFileSystem):
        raise ValueError(
            f"the experiment directory {experiment_path!r} is in this process's memory (fsspec 'memory'), which "
            "the study's other processes (controller, workers, storage actor) cannot see: set "
            "RunConfig(storage_path=...) to a local folder or shared storage (a path, s3://, gs://, ...)"
        )
    probe = f".stagetree_probe-{uuid.uuid4().hex}"
    try:
        stored = storage.write(probe, b"")
        storage.delete(stored)
    except Exception as error:  # noqa: BLE001 - each fsspec backend raises its own errors
        kind = PermissionError if isinstance(error, PermissionError) else OSError
        raise kind(
            f"the experiment directory {experiment_path!r} is not writable ({type(error).__name__}: {error}); "
            "the study writes its checkpoints, logs and state there: set RunConfig(storage_path=..., name=...) "
            "to a writable place"
        ) from None


# -- Tune's environment variables ------------------------------------------------


def _environment(name: str, default: str, parse: Any, *constraints: Any, meaning: str = "") -> Any:
    """An environment variable, parsed and checked; a value that does not
    parse is reported as the text the user set."""
    value = os.environ.get(name, default)
    try:
        parsed = parse(value)
    except ValueError:
        parsed = value
    return check(name, parsed, *constraints, meaning=meaning)


def state_period() -> float | None:
    """Seconds between study snapshots from Tune's ``TUNE_GLOBAL_CHECKPOINT_S``
    ("auto", the default: as often as costs the controller at most 5% of its time)."""
    if os.environ.get("TUNE_GLOBAL_CHECKPOINT_S", "auto").strip().lower() == "auto":
        return None
    return _environment(
        "TUNE_GLOBAL_CHECKPOINT_S", "auto", float, Options(("auto",)), Real(low=0, finite=False), meaning=" (seconds)"
    )


def max_pending_trials() -> int | None:
    """Tune's ``TUNE_MAX_PENDING_TRIALS_PG``: trials of a searcher that may wait
    for a worker at once; None for "auto" (the default: Tune's rule,
    `SearcherSource.pending_limit`)."""
    if os.environ.get("TUNE_MAX_PENDING_TRIALS_PG", "auto").strip().lower() == "auto":
        return None
    return _environment(
        "TUNE_MAX_PENDING_TRIALS_PG", "auto", int, Options(("auto",)), Int(low=1), meaning=" (pending trials)"
    )


def storage_wait() -> float:
    """``RAY_STAGETREE_STORAGE_WAIT_S``: seconds a study pauses while storage
    refuses its snapshot before it goes on without storage (600 by default)."""
    return _environment("RAY_STAGETREE_STORAGE_WAIT_S", "600", float, Real(low=0, finite=True), meaning=" (seconds)")


def keep_workers_seconds() -> float:
    """``RAY_STAGETREE_KEEP_WORKERS_S``: seconds a driver keeps its last
    study's stage workers for its next one, unless anything waits for their
    resources sooner (10 by default; 0 keeps none, as Tune)."""
    return _environment("RAY_STAGETREE_KEEP_WORKERS_S", "10", float, Real(low=0, finite=True), meaning=" (seconds)")


def restore_retries() -> int:
    """Tune's ``TUNE_RESTORE_RETRY_NUM``: times a trial's failed checkpoint
    load is retried before it counts as one of its failures (0 by default)."""
    return _environment("TUNE_RESTORE_RETRY_NUM", "0", int, Int(low=0), meaning=" (retries of a failed restore)")


def strict_metric_checking() -> bool:
    """Tune's ``TUNE_DISABLE_STRICT_METRIC_CHECKING``: unless it is 1, a
    result without a metric the study's TuneConfig, trial scheduler or
    searcher expects stops the study, as it fails Tune's run."""
    return _environment("TUNE_DISABLE_STRICT_METRIC_CHECKING", "0", int, Int()) != 1


def stall_warning_seconds() -> float:
    """After how long without a result the progress names a running trial
    (``RAY_STAGETREE_STALL_WARNING_S``, 60 by default)."""
    return _environment(
        "RAY_STAGETREE_STALL_WARNING_S", "60", float, Real(low=0, closed="neither"), meaning=" (seconds)"
    )


def scaling_of(scaling_config: Any) -> Scaling | None:
    """``Tuner(scaling_config=...)`` as the study's `Scaling`: each trial's
    stages then run on a group of ``num_workers`` ranks with
    ``resources_per_worker`` each (Ray Train's defaults: a CPU, or a GPU with
    ``use_gpu``), placed by ``placement_strategy``. ``trainer_resources`` is
    Ray Train's trainer actor's, which data-parallel stages do not have."""
    if scaling_config is None:
        return None
    from ray.air.config import ScalingConfig

    from ray_stagetree.trial_schedulers.ray_fields import train_scaling

    check("scaling_config", scaling_config, InstanceOf(ScalingConfig, "a ray.train.ScalingConfig"), None)
    if isinstance(scaling_config.num_workers, int) and scaling_config.num_workers == 0:
        raise ValueError(
            "scaling_config=ScalingConfig(num_workers=0) runs Ray Train's local mode, which has no worker group; "
            "give num_workers >= 1, or leave scaling_config out for one process per trial"
        )
    return train_scaling(scaling_config)
