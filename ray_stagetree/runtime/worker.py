"""Stage workers: long-lived Ray actors that run stage batches.

A worker receives a `BatchSpec` (the config of the batch's deepest plan node,
which describes the whole path; the checkpoint to start from; the segments
to train; the steps to checkpoint at), runs the user's trainable through it
and streams records back to the controller in small batches: metrics of
every iteration, checkpoints where asked. The controller's reply to a flush
can add checkpoint steps (a trial arrived that forks here) or move the end
of the batch earlier (no live trial needs the rest).

A checkpoint waits in the worker's outbox until the controller calls
`StageWorker.take_checkpoint`: the payload becomes that call's return value,
an object the controller owns, so it outlives this worker, and its bytes go
from this process to the object store without passing through anyone else.
Workers are threaded actors so that call is served while a batch runs.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import traceback
from typing import Any, Callable

from ray_stagetree.runtime import session
from ray_stagetree.runtime.batches import BatchOutcome, BatchSpec
from ray_stagetree.runtime.context import BatchEnd, StageContext, activate
from ray_stagetree.runtime.payload import (
    CheckpointPayload,
    pack_directory,
    unpack_directory,
)
from ray_stagetree.runtime.rng import capture_rng_state, restore_rng_state


def run_function(trainable: Callable, context: StageContext) -> None:
    activate(context)
    try:
        trainable(context.spec.config)
    except BatchEnd:
        return
    finally:
        activate(None)
    if context.step < context.stop:
        raise RuntimeError(
            f"the trainable returned after {context.step} iterations; the batch needs {context.stop}: "
            "keep calling report() until training ends (a loop that runs until the runtime stops it)"
        )


def run_class(trainable_cls: type, context: StageContext) -> None:
    payload = context.source_payload()
    instance = trainable_cls(context.spec.config)
    try:
        if payload is not None:
            instance._iteration = payload.step
            if payload.state is not None:
                instance.set_state(payload.state)
            else:
                with tempfile.TemporaryDirectory(prefix="stagetree_restore_") as path:
                    unpack_directory(payload.directory, path)
                    instance.load_checkpoint(path)
            restore_rng_state(payload.rng)
        previous: dict[str, Any] = {}
        while context.step < context.stop:
            values = context.hparams()
            changed = {k: v for k, v in values.items() if k not in previous or previous[k] != v}
            if changed:
                instance.hparams = values
                instance.update_hparams(changed)
            previous = values
            metrics = instance.step()
            instance._iteration += 1
            checkpoint = None
            if context.step + 1 in context.save_steps:
                checkpoint = _class_payload(instance, context.step + 1)
            try:
                context._record(dict(metrics or {}), checkpoint)
            except BatchEnd:
                return
    finally:
        instance.cleanup()


def _class_payload(instance: Any, step: int) -> CheckpointPayload:
    state = instance.get_state()
    if state is not None:
        return CheckpointPayload(step, capture_rng_state(), state=state)
    path = tempfile.mkdtemp(prefix="stagetree_save_")
    try:
        instance.save_checkpoint(path)
        return CheckpointPayload(step, capture_rng_state(), directory=pack_directory(path))
    finally:
        shutil.rmtree(path, ignore_errors=True)


def _sequence_hint(error: Exception) -> str:
    """A pointer to get_hparams() when code used a sequence as a plain value."""
    from ray_stagetree.sequences import FAMILIES

    if isinstance(error, TypeError) and any(f"'{family}'" in str(error) for family in FAMILIES):
        return (
            "\nHint: config values that are sequences are objects, not numbers; read this "
            "iteration's value with ray_stagetree.get_hparams()[name] (or StageTrainable.update_hparams)."
        )
    return ""


def _install_tune_shims() -> None:
    """Make Tune's own ``report`` / ``get_checkpoint`` (``ray.tune`` and
    ``ray.train``) ours in this worker process. Outside a Tune session they
    silently do nothing, so an unported ``while True: tune.report(...)``
    trainable would spin forever; with the shims it simply works."""
    import ray.train
    import ray.tune

    for module in (ray.tune, ray.train):
        module.report = session.report
        module.get_checkpoint = session.get_checkpoint


class StageWorker:
    """Ray actor body (run with ``max_concurrency=2``): runs one batch at a
    time and hands out its checkpoints.

    The trainable arrives pickled and is loaded after the Tune shims are in
    place, so names it imported from ``ray.tune`` resolve to ours.
    """

    def __init__(self, trainable_bytes: bytes, controller: Any) -> None:
        import ray.cloudpickle

        _install_tune_shims()
        trainable = ray.cloudpickle.loads(trainable_bytes)
        self._trainable = trainable
        self._controller = controller
        self._is_class = isinstance(trainable, type)
        self._outbox: dict[str, CheckpointPayload] = {}

    def pid(self) -> int:
        return os.getpid()

    def take_checkpoint(self, key: str) -> CheckpointPayload:
        return self._outbox.pop(key)

    def run_batch(self, spec: BatchSpec) -> BatchOutcome:
        context = StageContext(spec, self._controller, self._outbox.__setitem__)
        try:
            if self._is_class:
                run_class(self._trainable, context)
            else:
                run_function(self._trainable, context)
        except Exception as error:
            outcome = context.finish()
            outcome.error = traceback.format_exc() + _sequence_hint(error)
            outcome.error_step = context.step + 1
            outcome.error_node = context.node_at(min(context.step + 1, spec.stop))
            return outcome
        return context.finish()
