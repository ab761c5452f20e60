"""The function-trainable API: `report`, `get_checkpoint`, `get_hparams`,
`should_checkpoint`.

A Tune function trainable ports by changing its imports::

    from ray_stagetree import get_checkpoint, get_hparams, report

    def train(config):
        model = make_model(config)
        checkpoint = get_checkpoint()          # a ray.tune.Checkpoint or None
        if checkpoint:
            with checkpoint.as_directory() as path:
                model.load(path)
        while True:
            hparams = get_hparams()            # this iteration's sequence values
            train_one_epoch(model, lr=hparams["lr"])
            with tempfile.TemporaryDirectory() as path:
                model.save(path)
                report({"loss": loss}, checkpoint=tune.Checkpoint.from_directory(path))

A stage worker runs the function for one stage batch: from the batch's
starting checkpoint to its last iteration, where `report` ends the function
(see `ray_stagetree.runtime.workers.context`). Each `report` is one iteration.

Run by ``ray.tune.Tuner`` instead, `report` and `get_checkpoint` are Tune's
own and `get_hparams` reads the trial's config at its iteration, so one
script runs on both Tuners.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ray_stagetree.runtime.workers.context import StageContext, current
from ray_stagetree.runtime.workers.visible_config import values_at
from ray_stagetree.trial_schedulers.ray_fields import in_tune_session

if TYPE_CHECKING:
    from ray.tune import Checkpoint


def _context() -> StageContext:
    context = current()
    if context is None:
        raise RuntimeError(
            "ray_stagetree.report/get_checkpoint/get_hparams/should_checkpoint can only be "
            "called inside a trainable run by ray_stagetree.Tuner"
        )
    return context


def _tune_session_function(name: str) -> Any:
    """Ray Tune's own ``report`` or ``get_checkpoint`` when the caller is a
    trainable that ``ray.tune.Tuner`` runs, else None. (Taken from where Tune
    defines them: a stage worker replaces the ``ray.tune`` names with ours.)"""
    if current() is not None:
        return None
    from ray.tune.trainable import trainable_fn_utils

    return getattr(trainable_fn_utils, name) if in_tune_session() else None


def report(
    metrics: Mapping[str, Any],
    *,
    checkpoint: Checkpoint | None = None,
    checkpoint_dir_name: str | None = None,
    **upload: Any,
) -> None:
    """Report one iteration's metrics, and a checkpoint of the state after it.

    Parameters
    ----------
    metrics:
        A dict of JSON-able values (numbers, strings); ``training_iteration``
        is added by the library.
    checkpoint:
        A ``ray.tune.Checkpoint`` of the state after this iteration. Pass one
        at least where `should_checkpoint` is true: other trials fork from it.
    checkpoint_dir_name, upload:
        Ray Train v2's ``ray.train.report`` options (the checkpoint's folder
        name, how it is uploaded): accepted so that a Train loop runs as
        written, and not used (the stage keeps its checkpoints).
    """
    unknown = set(upload) - TRAIN_UPLOAD_OPTIONS
    if unknown:
        raise TypeError(
            f"report() got unexpected keyword argument(s) {sorted(unknown)}; it takes metrics, checkpoint=, and Ray "
            f"Train's {sorted({'checkpoint_dir_name', *TRAIN_UPLOAD_OPTIONS})}"
        )
    tune_report = _tune_session_function("report")
    if tune_report is not None:
        tune_report(dict(metrics), checkpoint=checkpoint)
        return
    _context().report(metrics, checkpoint)


#: The options of Ray Train v2's ``ray.train.report`` after ``checkpoint_dir_name``.
TRAIN_UPLOAD_OPTIONS = frozenset(
    {"checkpoint_upload_mode", "delete_local_checkpoint_after_upload", "checkpoint_upload_fn", "validation"}
)


def get_checkpoint() -> Checkpoint | None:
    """The checkpoint to resume from (a ``ray.tune.Checkpoint``), or None for a
    fresh start. Calling it also restores the Python, NumPy and torch random
    states saved with the checkpoint, so call it after any seeding."""
    tune_get_checkpoint = _tune_session_function("get_checkpoint")
    if tune_get_checkpoint is not None:
        return tune_get_checkpoint()
    return _context().get_checkpoint()


def get_hparams() -> dict[str, Any]:
    """Every hyper-parameter's value at the current iteration: sequences at
    this iteration, plain numbers and strings as they are; keyed as in the
    config (nested keys joined with ``/``; a key holding ``/`` or ``~`` as
    it is written). Where two entries join to the same key (``{"a/b": ..}``
    and ``{"a": {"b": ..}}``), each is keyed by its JSON Pointer (``"/a~1b"``,
    ``"/a/b"``) and reading the shared key raises a KeyError naming both.

    A trainable that calls it follows its values live; one that never
    does holds its config's values as they were when it started, and is
    restarted from its checkpoint wherever one changes. Under ``ray.tune.Tuner`` it answers too, from the trial's
    config at the trial's iteration (``Trainable.iteration``: it counts on
    after a restore), so one script runs on both Tuners."""
    from ray_stagetree.trainables.live import running_tune_trainable, tune_hparams  # imports Ray

    context = current()
    if context is not None:
        return context.hparams(live=True)
    trainable = running_tune_trainable()
    if trainable is None:
        raise RuntimeError(
            "ray_stagetree.get_hparams() can only be called inside a trainable run by ray_stagetree.Tuner or "
            "ray.tune.Tuner (in a trial's function or a Trainable's step())"
        )
    return tune_hparams(trainable)


def for_ray_tune(trainable: Callable[..., Any]) -> Callable[..., Any]:
    """A function trainable for ``ray.tune.Tuner`` running a `tune_grid`
    space: the config it gets holds each sequence's value at the trial's
    (re)start, a number as on ``ray_stagetree.Tuner``, so a trainable that
    reads ``config["lr"]`` runs on both Tuners side by side. Tune restarts
    nothing where a value changes: what the trainable follows live
    (``get_hparams()``, the framework callbacks' optimizer values) changes,
    the rest stays as it was at the start."""
    if isinstance(trainable, type):
        raise TypeError(f"for_ray_tune takes a function trainable, got the class {trainable.__name__}")

    @functools.wraps(trainable)
    def with_values(config: dict[str, Any], *args: Any, **kwargs: Any) -> Any:
        from ray_stagetree.planning import TrialConfig
        from ray_stagetree.searchers.variants import from_tune_config
        from ray_stagetree.trainables.live import running_tune_trainable

        running = running_tune_trainable()
        flat = TrialConfig.from_config(from_tune_config(config))
        return trainable(values_at(config, flat, frozenset(), running.iteration if running else 0), *args, **kwargs)

    return with_values


def should_checkpoint() -> bool:
    """True when the runtime needs a checkpoint with the next `report`:
    other trials branch off here, a result is requested, or the batch ends."""
    return _context().should_checkpoint()


def timed(name: str) -> contextlib.AbstractContextManager[None]:
    """Count the time in the ``with`` block as phase ``name`` of the running
    stage batch, apart from ``train`` (`runtime.workers.phases`: the
    monitor's timeline, `ResultGrid.phase_seconds`); outside a batch (under
    Ray Tune, say) it counts nothing::

        with ray_stagetree.timed("data_to_device"):
            images = images.to("cuda", non_blocking=True)
    """
    phases = getattr(current(), "phases", None)  # a data-parallel batch's other ranks time nothing
    return contextlib.nullcontext() if phases is None else phases.phase(name)


def get_iteration() -> int:
    """Iterations completed so far (the iteration about to be trained, 0-based)."""
    return _context().iteration


class StageTuneContext:
    """What ``ray.tune.get_context()`` gives a trainable on a stage worker.
    A batch serves every trial whose path passes through it; the trial named
    is the one its deepest plan node was made for."""

    def get_trial_id(self) -> str:
        return _context().spec.trial_id

    def get_trial_name(self) -> str:
        return _context().spec.trial_name

    def get_experiment_name(self) -> str:
        return _context().spec.experiment_name

    def get_trial_dir(self) -> str:
        """A local folder for the trial's own files (the trial's folder under
        a local experiment path, else a temporary one)."""
        return _context().trial_dir()

    def get_trial_resources(self) -> Any:
        return assigned_resources()

    def get_metadata(self) -> dict[str, Any]:
        return {}

    def get_storage(self) -> Any:
        return None

    def get_world_rank(self) -> int:
        return _rank_info("rank", 0)

    def get_local_rank(self) -> int:
        return _rank_info("local_rank", 0)

    def get_node_rank(self) -> int:
        return _rank_info("node_rank", 0)

    def get_world_size(self) -> int:
        return _rank_info("world_size", 1)

    def get_local_world_size(self) -> int:
        return _rank_info("local_world_size", 1)


def _rank_info(field: str, alone: int) -> int:
    """This rank's place in a data-parallel batch's group (`runtime.workers.group`); ``alone`` without one."""
    group = _context().group
    return alone if group is None else getattr(group.info, field)


class StageTrainSession:
    """The fields of Ray Train's internal session that Ray's integrations
    read for their defaults (``setup_wandb``: run id, name and group), for
    the trial a batch is named after."""

    def __init__(self, context: StageContext) -> None:
        self.world_rank = 0 if context.group is None else context.group.info.rank
        self.trial_id = context.spec.trial_id
        self.trial_name = context.spec.trial_name
        self.experiment_name = context.spec.experiment_name


def get_context() -> StageTuneContext:
    """``ray.tune.get_context()`` inside a trainable that ray_stagetree runs."""
    _context()
    return StageTuneContext()


def assigned_resources() -> Any:
    """Tune's ``PlacementGroupFactory`` of the resources Ray assigned this
    worker (one bundle: a multi-bundle request is reserved as their sum),
    what a trial's ``get_trial_resources()`` and ``Trainable.trial_resources``
    read; None for a worker that holds none."""
    import ray
    from ray.tune.execution.placement_groups import PlacementGroupFactory

    assigned = ray.get_runtime_context().get_assigned_resources()
    held = {name: amount for name, amount in assigned.items() if amount}
    return PlacementGroupFactory([held]) if held else None
