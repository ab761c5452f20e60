"""Running class trainables through a stage batch: `StageTrainable`
subclasses and plain ``ray.tune.Trainable`` subclasses, unchanged.

One object lives through the whole batch (and through its live extensions):
it is restored from the batch's starting checkpoint, gets the iteration's
sequence values (``update_hparams`` when it defines it; `get_hparams` works
inside ``step``), and saves where the plan needs a checkpoint and where a
result asks (``should_checkpoint``, as Tune saves it). Where a value
the object holds fixed changes inside the batch (PBT explored a plain value,
or a plain ``ray.tune.Trainable`` read a sequence's value from ``self.config``
as a number) the object gets the new config through ``reset_config``, as Tune
gives it to a reused actor, then restores it from the checkpoint just
saved, as Tune restores one; if that returns False it is rebuilt from that
checkpoint, as Tune restarts a trial.

With ``TuneConfig(reuse_actors=True)`` the object outlives its batch, as a
Tune actor outlives its trial: the worker keeps it (`KEPT`), and its next
batch of that class gets it through ``Trainable.reset`` (the trainable's
``reset_config``) rather than a new object's ``setup``, then restores the
batch's starting checkpoint, as Tune restores a reused actor. Without a
``reset_config``, or where it returns False, a new object is built, as Tune
starts a new actor.
"""

from __future__ import annotations

import os
import pickle
import shutil
import tempfile
import threading
from typing import Any

from ray.tune.result import SHOULD_CHECKPOINT

from ray_stagetree.execution.payload import CheckpointPayload, pack_directory, unpack_directory
from ray_stagetree.runtime.workers import scratch
from ray_stagetree.runtime.workers.context import BatchEnd, ConfigChange, StageContext, activate
from ray_stagetree.runtime.workers.session import assigned_resources
from ray_stagetree.trial_schedulers.ray_fields import set_trainable_iteration

# Ray Tune's name for a checkpoint that save_checkpoint returned as a dict.
DICT_CHECKPOINT_FILE = "_dict_checkpoint.pkl"


class _BatchTrialInfo:
    """What ``Trainable.trial_id`` / ``trial_name`` read (Tune's ``_TrialInfo``):
    the trial the batch's deepest plan node was made for."""

    def __init__(self, trial_id: str, trial_name: str, experiment_name: str) -> None:
        self.trial_id, self.trial_name, self.experiment_name = trial_id, trial_name, experiment_name
        self.trial_resources = assigned_resources()


class KeptObjects:
    """The object of each class a worker's last batch of it trained, kept
    for the next (``reuse_actors``); thread-safe, as batches run in threads
    of their own."""

    def __init__(self) -> None:
        self._kept: dict[type, Any] = {}
        self._lock = threading.Lock()

    def take(self, trainable_cls: type) -> Any:
        with self._lock:
            return self._kept.pop(trainable_cls, None)

    def keep(self, instance: Any) -> None:
        with self._lock:
            earlier = self._kept.pop(type(instance), None)
            self._kept[type(instance)] = instance
        if earlier is not None:  # a batch of the class ran beside its last one
            _stop(earlier)

    def release(self) -> None:
        """End the kept objects (their ``cleanup`` runs): the study is over."""
        with self._lock:
            kept, self._kept = list(self._kept.values()), {}
        for instance in kept:
            _stop(instance)


#: This worker's kept objects.
KEPT = KeptObjects()


def run_class(trainable_cls: type, context: StageContext) -> None:
    """Train ``context``'s batch with one ``trainable_cls`` object."""
    activate(context)
    reuse = context.spec.reuse_object and context.group is None  # (a group's ranks each hold their own)
    try:
        instance = _reused(KEPT.take(trainable_cls), context) if reuse else None
        instance = instance or _create(trainable_cls, context)
        trained = False
        try:
            _restore_from(instance, context)
            while True:
                try:
                    _train(instance, context)
                    trained = True
                    return
                except ConfigChange:
                    if _reset(instance, context):
                        # As Tune restores a reset actor (its reset_config may have reset its state).
                        _restore_from(instance, context)
                    else:
                        _stop(instance)
                        instance = _create(trainable_cls, context)
                        _restore_from(instance, context)
        finally:
            if reuse and trained:
                KEPT.keep(instance)
            else:
                _stop(instance)
    finally:
        activate(None)


def _reused(instance: Any, context: StageContext) -> Any:
    """A kept object given the batch's config by ``Trainable.reset``, as Tune
    resets a reused actor for its next trial; None where it cannot take it."""
    from ray.tune import Trainable

    if instance is None:
        return None
    logdir = instance.logdir
    if type(instance).reset_config is Trainable.reset_config or not instance.reset(_config(context)):
        _stop(instance)
        return None
    _remove_temporary(logdir)  # reset made the object another
    context.user_generators.new_run()
    return instance


def _create(trainable_cls: type, context: StageContext) -> Any:
    context.user_generators.new_run()
    return trainable_cls(_config(context))


def _config(context: StageContext) -> dict[str, Any]:
    """The batch's config as Tune gives it to a Trainable (with its trial's info)."""
    from ray.tune.trainable.trainable import TRIAL_INFO

    spec = context.spec
    config = dict(context.trainable_config())
    config[TRIAL_INFO] = _BatchTrialInfo(spec.trial_id, spec.trial_name, spec.experiment_name)
    return config


def _is_stage_trainable(instance: Any) -> bool:
    from ray_stagetree.trainables import StageTrainable

    return isinstance(instance, StageTrainable)


def _restore_from(instance: Any, context: StageContext) -> None:
    """Load the batch's starting checkpoint; an error raised here leaves
    ``context.restoring`` set: Tune retries a failed restore
    (``TUNE_RESTORE_RETRY_NUM``) before it counts as the trial's failure."""
    context.restoring = True
    _restore(instance, context)
    context.restoring = False


def _restore(instance: Any, context: StageContext) -> None:
    payload = context.source_payload()
    if payload is None:
        return
    set_trainable_iteration(instance, payload.step)
    if payload.state is not None:
        instance.set_state(payload.state)
    else:
        with tempfile.TemporaryDirectory(prefix="stagetree_restore_") as path:
            unpack_directory(payload.directory, path)
            instance.load_checkpoint(_saved_checkpoint(path))
    context.restore_rng(payload.rng)


def _reset(instance: Any, context: StageContext) -> bool:
    """Give a live object the config PBT changed; False if it cannot take it."""
    from ray.tune import Trainable

    if type(instance).reset_config is Trainable.reset_config:  # not implemented: Tune restarts the trial
        return False
    config = context.trainable_config()
    if not instance.reset_config(config):
        return False
    instance.config = config
    return True


def _train(instance: Any, context: StageContext) -> None:
    stage_trainable = _is_stage_trainable(instance)
    if stage_trainable or hasattr(instance, "update_hparams"):  # told each change: it follows values live
        context.follows_values = True
    previous: dict[str, Any] = {}
    while True:
        values = context.hparams()
        changed = {k: v for k, v in values.items() if k not in previous or previous[k] != v}
        if changed:
            instance.hparams = values
            if hasattr(instance, "update_hparams"):
                instance.update_hparams(changed)
        previous = values
        if stage_trainable:
            metrics = dict(instance.step() or {})
            set_trainable_iteration(instance, instance.iteration + 1)
        else:  # Tune's own bookkeeping (done, time and iteration fields), as under Tune
            metrics = instance.train()
            metrics.pop("config", None)
        try:
            context.record(
                metrics,
                lambda iteration: _payload(instance, iteration, stage_trainable, context),
                asks_save=bool(metrics.get(SHOULD_CHECKPOINT)),
            )
        except BatchEnd:
            return


def _stop(instance: Any) -> None:
    if _is_stage_trainable(instance):
        instance.cleanup()
        return
    logdir = instance.logdir
    instance.stop()  # cleanup(), and Tune's log files closed
    _remove_temporary(logdir)


def _remove_temporary(logdir: str | None) -> None:
    """Remove the temporary folder a Trainable makes outside Tune (at its
    construction, and at each ``reset``)."""
    from ray.tune.trainable.trainable import DEFAULT_STORAGE_PATH

    if logdir and os.path.dirname(os.path.abspath(logdir)) == os.path.abspath(DEFAULT_STORAGE_PATH):
        shutil.rmtree(logdir, ignore_errors=True)


def _payload(instance: Any, iteration: int, stage_trainable: bool, context: StageContext) -> CheckpointPayload:
    # Tune's own Trainable.get_state() is its bookkeeping, not the model.
    state = instance.get_state() if stage_trainable else None
    if state is not None:
        return CheckpointPayload(iteration, context.capture_rng(), state=state)
    path = scratch.mkdtemp("stagetree_save_")
    try:
        saved = instance.save_checkpoint(path)
        if isinstance(saved, dict):  # Tune's dict form: kept in the directory as Tune keeps it
            with open(os.path.join(path, DICT_CHECKPOINT_FILE), "wb") as file:
                pickle.dump(saved, file)
        return CheckpointPayload(iteration, context.capture_rng(), directory=pack_directory(path))
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _saved_checkpoint(path: str) -> str | dict[str, Any]:
    """What `load_checkpoint` takes: the dict `save_checkpoint` returned, else the directory."""
    dict_file = os.path.join(path, DICT_CHECKPOINT_FILE)
    if not os.path.exists(dict_file):
        return path
    with open(dict_file, "rb") as file:  # written by this trial's own save_checkpoint
        return pickle.load(file)
