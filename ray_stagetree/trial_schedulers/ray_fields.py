"""Ray's private fields, read here and nowhere else.

Hosting a scheduler on the plan means reading state Ray keeps private:
ASHA's rungs, HyperBand's bracket milestones, PBT's settings and explore
function. Those names are not Ray's API and may change in any release, so
the adapters read them only through `ray_field`: a Ray upgrade that drops
one fails where it is read, naming the field, the scheduler and the Ray
versions the adapter was tested against, rather than with a bare
``AttributeError`` deep in a study, or silently through a ``getattr``
default that would size requests wrongly.

The runtime and the simulator read a few more, each through a function
below; `tests/trial_schedulers/test_ray_fields.py` checks every one of them
on the installed Ray.
"""

from __future__ import annotations

import types
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray_stagetree.execution.scaling import Scaling

#: The Ray versions whose private fields the adapters were tested against.
TESTED_WITH: tuple[str, ...] = ("2.60",)


class RayFieldMissing(RuntimeError):
    """A private field a scheduler adapter reads is not on this Ray's object."""


def ray_field(owner: Any, name: str, scheduler: Any, tested_with: tuple[str, ...] = TESTED_WITH) -> Any:
    """``owner``'s attribute ``name``, a private field of Ray Tune read on
    behalf of the hosted ``scheduler`` (``owner`` is the scheduler, one of
    its brackets, or a module of Ray's)."""
    try:
        return getattr(owner, name)
    except AttributeError:
        import ray

        where = owner.__name__ if isinstance(owner, types.ModuleType) else type(owner).__name__
        raise RayFieldMissing(
            f"ray_stagetree hosts {type(scheduler).__name__} by reading {where}.{name}, a private field of "
            f"Ray Tune that Ray {ray.__version__} does not have; the adapter was tested against Ray "
            f"{', '.join(tested_with)}: install one of those, or update ray_stagetree.trial_schedulers for this Ray"
        ) from None


def trainable_resources(trainable: Any) -> Any:
    """What ``tune.with_resources`` attached to ``trainable`` (a dict, a
    ``PlacementGroupFactory`` or a function of the config); None when it
    was not wrapped."""
    return getattr(trainable, "_resources", None)


def searcher_metric(searcher: Any) -> str | list[str] | None:
    """The metric (or metrics) a Tune searcher or trial scheduler compares:
    Ray keeps it in their private ``_metric``; None for those without one."""
    return getattr(searcher, "_metric", None)


def point_tune_report_callback(callback: Any, queue: Any) -> None:
    """Make Ray's ``TuneReportCallback`` (Train v2) put the results it passes
    on into ``queue``: the queue it took from Tune's session when it was
    made, a private field."""
    ray_field(callback, "_training_actor_item_queue", callback)  # a clear error where Ray renamed it
    callback._training_actor_item_queue = queue


def in_tune_session() -> bool:
    """True inside a trainable that ``ray.tune.Tuner`` itself runs."""
    from ray.tune.trainable import trainable_fn_utils

    return bool(ray_field(trainable_fn_utils, "_in_tune_session", trainable_fn_utils)())


def treat_as_tune_session(also: Any) -> None:
    """Make Ray's integrations (``setup_mlflow``, ``setup_wandb``) ask
    ``also()`` too when they ask whether they run in a Tune trial
    (``trainable_fn_utils._in_tune_session``): a stage worker's trial is one."""
    from ray.tune.trainable import trainable_fn_utils

    in_session = ray_field(trainable_fn_utils, "_in_tune_session", trainable_fn_utils)
    trainable_fn_utils._in_tune_session = lambda: bool(also()) or bool(in_session())


def set_trainable_iteration(trainable: Any, iteration: int) -> None:
    """Set a class ``Trainable``'s iteration count (its private
    ``_iteration``, which ``train()`` advances and ``Trainable.iteration``
    reads): a trainable restored at a fork, or stepped without ``train()``."""
    ray_field(trainable, "_iteration", trainable)
    trainable._iteration = iteration


def ray_artifacts_folder() -> str:
    """The Ray session's folder Tune stages trials' files in (``<session>/artifacts``),
    where it puts their working directories."""
    from ray.train import constants

    return ray_field(constants, "_get_ray_train_session_dir", constants)()


def use_trial_logdir(trainable_class: type, folder: Any) -> None:
    """A ``ray.tune.Trainable`` made or reset (Tune's private ``_setup_logdir``)
    while ``folder()`` names a trial working directory takes it as its
    ``logdir``, as Tune's takes its trial's; else Tune's own folder."""
    setup_logdir = ray_field(trainable_class, "_setup_logdir", trainable_class)

    def in_trial_folder(self: Any) -> None:
        current = folder()
        if current is None or getattr(self, "_storage", None) is not None:
            setup_logdir(self)
        else:
            self._logdir = current

    trainable_class._setup_logdir = in_trial_folder  # type: ignore[attr-defined]


def storage_context_class() -> type:
    """Ray Train's ``StorageContext`` (``ray.train._internal.storage``): a
    Tune trial's folders, and Tune's default experiment name."""
    from ray.train._internal import storage

    return ray_field(storage, "StorageContext", storage)


def arrow_filesystem_of(path: str, filesystem: Any) -> Any:
    """The ``pyarrow.fs.FileSystem`` Tune resolves ``path`` (and an optional
    ``storage_filesystem``) to (``ray.train._internal.storage.get_fs_and_path``)."""
    from ray.train._internal import storage

    return ray_field(storage, "get_fs_and_path", storage)(path, filesystem)[0]


def json_encoder_class() -> type:
    """The JSON encoder Tune's ``JsonLoggerCallback`` writes ``result.json``
    with (``ray.air._internal.json.SafeFallbackEncoder``: NumPy values as
    numbers, other objects as their ``str``)."""
    from ray.air._internal import json as air_json

    return ray_field(air_json, "SafeFallbackEncoder", air_json)


def deprecated_default() -> Any:
    """The default Ray gives deprecated arguments (``ray.train.constants._DEPRECATED_VALUE``):
    one the user set differs from it."""
    from ray.train import constants

    return ray_field(constants, "_DEPRECATED_VALUE", constants)


def bootstrap_address() -> str | None:
    """The cluster ``ray.init()`` would join (``RAY_ADDRESS``, else the
    latest ``ray start`` on this machine); None when it would start one."""
    from ray._private import services

    return ray_field(services, "canonicalize_bootstrap_address", services)(None)


def metric_windows(run_metadata: Any) -> list[int]:
    """The window sizes of a Tune trial's "last-n-avg" metric statistics
    (``_TrainingRunMetadata._n_steps``)."""
    return ray_field(run_metadata, "_n_steps", run_metadata)


def log_files(log_to_file: Any) -> tuple[str | None, str | None] | None:
    """``RunConfig.log_to_file`` read as Tune reads it (its private
    ``_validate_log_to_file``, with its errors): the files of a trial's folder
    that take its stdout and its stderr, None for a stream not kept; None if neither is."""
    from ray.tune.experiment import experiment

    stdout, stderr = experiment._validate_log_to_file(log_to_file)
    return None if stdout is None and stderr is None else (stdout, stderr)


def hyperband_bracket_class() -> type:
    """Ray's synchronous HyperBand bracket, ``hyperband._Bracket``."""
    from ray.tune.schedulers import hyperband

    return ray_field(hyperband, "_Bracket", hyperband)


def maximum_iterations(stopper: Any) -> int:
    """The limit of a ``tune.stopper.MaximumIterationStopper`` (its private ``_max_iter``)."""
    return ray_field(stopper, "_max_iter", stopper)


def variant_generator_settings(generator: Any) -> dict[str, Any]:
    """How a ``BasicVariantGenerator`` draws: its random state (an int seed
    became a NumPy Generator; None: NumPy's global state),
    ``constant_grid_search`` and ``points_to_evaluate``, all kept private."""
    return {
        "seed": ray_field(ray_field(generator, "_random_state", generator), "_rng", generator),
        "constant_grid_search": ray_field(generator, "_constant_grid_search", generator),
        "points_to_evaluate": ray_field(generator, "_points_to_evaluate", generator),
    }


def config_interface() -> type:
    """Tune's ``_Config``: the base of config objects with a ``to_dict()``
    that Tune takes as a ``param_space`` (their dict)."""
    from ray.tune import tune as tune_module

    return ray_field(tune_module, "_Config", tune_module)


def registered_function(registered: type) -> Any:
    """The function ``tune.register_trainable`` wrapped in a class
    (``wrap_function``): its ``_trainable_func`` closes over it as ``train_func``;
    None when this Ray's wrapper keeps it elsewhere."""
    import inspect

    wrapper = ray_field(registered, "_trainable_func", registered)
    return inspect.getclosurevars(wrapper).nonlocals.get("train_func")


def tune_checkpoint_manager(config: Any, ranked: list[tuple[Any, dict[str, Any]]], latest: Any) -> Any:
    """A Tune trial's checkpoint manager (``ray.train``'s private
    ``_CheckpointManager``) holding ``ranked`` ((``tune.Checkpoint``,
    metrics), best last) and ``latest`` (one of them, or another, or None)
    as they are: registering them one by one would apply ``num_to_keep``
    again and delete folders. What Tune's ``ExperimentAnalysis`` and
    ``ResultGrid`` read back as ``Result.checkpoint`` and ``best_checkpoints``."""
    from ray.train._internal.checkpoint_manager import _CheckpointManager, _TrainingResult

    manager = _CheckpointManager(config)
    results = [_TrainingResult(checkpoint, metrics) for checkpoint, metrics in ranked]
    latest_result = None
    if latest is not None:
        same = [result for result in results if result.checkpoint.path == latest[0].path]
        latest_result = same[0] if same else _TrainingResult(*latest)
    ray_field(manager, "_checkpoint_results", manager)
    manager._checkpoint_results = results
    ray_field(manager, "_latest_checkpoint_result", manager)
    manager._latest_checkpoint_result = latest_result
    return manager


def scaling_resources_per_worker(scaling_config: Any) -> dict[str, float]:
    """One Ray Train worker's resources as Ray Train reserves them for a
    ``ScalingConfig`` (its defaults: a CPU, or a GPU with ``use_gpu``)."""
    return dict(ray_field(scaling_config, "_resources_per_worker_not_none", scaling_config))


def train_scaling(scaling_config: Any) -> Scaling:
    """A Ray Train ``ScalingConfig`` as the `Scaling` of the worker group
    Ray Train would start for it: ``num_workers`` ranks with the resources
    it reserves for each (`scaling_resources_per_worker`), placed by
    ``placement_strategy``, on GPUs with ``use_gpu``."""
    from ray_stagetree.execution.scaling import Scaling

    return Scaling.of(
        scaling_config.num_workers,
        scaling_resources_per_worker(scaling_config),
        scaling_config.use_gpu,
        scaling_config.placement_strategy,
    )


def legacy_train_loop(trainer: Any) -> tuple[Any, dict[str, Any]]:
    """A legacy (``RAY_TRAIN_V2_ENABLED=0``) ``DataParallelTrainer``'s
    ``train_loop_per_worker`` and its own ``train_loop_config``."""
    loop = ray_field(trainer, "_train_loop_per_worker", trainer)
    return loop, dict(ray_field(trainer, "_train_loop_config", trainer) or {})
