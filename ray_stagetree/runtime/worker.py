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

import logging
import os
import shutil
import tempfile
import time
import traceback
from dataclasses import dataclass, field
from typing import Any, Callable

from ray_stagetree.runtime import session
from ray_stagetree.planning.config import TrialConfig
from ray_stagetree.runtime.rng import capture_rng_state, restore_rng_state
from ray_stagetree.runtime.storage import pack_directory, unpack_directory

logger = logging.getLogger(__name__)

FLUSH_SECONDS = 0.5


@dataclass
class CheckpointPayload:
    """What a checkpoint holds in the object store and in storage."""

    step: int
    rng: dict[str, Any]
    directory: bytes | None = None  # a packed ray.tune.Checkpoint directory
    state: Any = None  # or a StageTrainable.get_state() object


@dataclass
class BatchSpec:
    batch_id: int
    config: dict[str, Any]
    segments: list[tuple[int, int, int]]  # (node_id, start, stop)
    save_steps: set[int]
    source: Any = None  # ObjectRef of a CheckpointPayload, or None for a fresh start

    @property
    def start(self) -> int:
        return self.segments[0][1]

    @property
    def stop(self) -> int:
        return self.segments[-1][2]


@dataclass
class BatchOutcome:
    batch_id: int
    records: list[tuple[int, int, dict[str, Any]]] = field(default_factory=list)
    checkpoints: list[tuple[int, int, Any, int]] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None
    error_step: int | None = None
    error_node: int | None = None


class StageContext:
    """Per-batch state behind the function API and the class-API driver."""

    def __init__(self, spec: BatchSpec, controller: Any, put: Callable[[str, Any], None]) -> None:
        self.spec = spec
        self.step = spec.start
        self.stop = spec.stop
        self.save_steps = set(spec.save_steps)
        self._controller = controller
        self._put = put
        self._config = TrialConfig.from_config(spec.config)
        self._pending = BatchOutcome(spec.batch_id)
        self._last_flush = self._started = self._iteration_started = time.monotonic()
        self._restored_dir: str | None = None
        self._warned_missing_checkpoint = False

    # -- function API ------------------------------------------------------

    def hparams(self) -> dict[str, Any]:
        return self._config.hparams_at(self.step)

    def should_checkpoint(self) -> bool:
        return self.step + 1 in self.save_steps

    def source_payload(self) -> CheckpointPayload | None:
        import ray

        if self.spec.source is None:
            return None
        payload = ray.get(self.spec.source)
        if payload.step != self.spec.start:
            raise RuntimeError(f"checkpoint holds step {payload.step}, batch starts at {self.spec.start}")
        return payload

    def get_checkpoint(self):
        from ray.tune import Checkpoint

        payload = self.source_payload()
        if payload is None:
            return None
        restore_rng_state(payload.rng)
        if payload.directory is None:
            raise RuntimeError("this checkpoint was saved with get_state(); use a StageTrainable to restore it")
        if self._restored_dir is None:
            self._restored_dir = tempfile.mkdtemp(prefix="stagetree_restore_")
            unpack_directory(payload.directory, self._restored_dir)
        return Checkpoint.from_directory(self._restored_dir)

    def report(self, metrics: Any, checkpoint: Any = None) -> None:
        if not isinstance(metrics, dict):
            raise TypeError(f"report() takes a dict of metrics, got {type(metrics).__name__}: {metrics!r}")
        payload = None
        if self.step + 1 in self.save_steps:
            if checkpoint is not None:
                with checkpoint.as_directory() as path:
                    payload = CheckpointPayload(self.step + 1, capture_rng_state(), directory=pack_directory(path))
            elif not self._warned_missing_checkpoint:
                self._warned_missing_checkpoint = True
                logger.warning(
                    "iteration %d needs a checkpoint (should_checkpoint() was True) but report() got none; "
                    "trials that branch off here will retrain the prefix",
                    self.step + 1,
                )
        self._record(metrics, payload)

    # -- shared by both APIs ------------------------------------------------

    def node_at(self, step: int) -> int:
        for node_id, start, stop in self.spec.segments:
            if start < step <= stop:
                return node_id
        raise ValueError(f"step {step} is outside batch {self.spec.batch_id}")

    def _record(self, metrics: dict[str, Any], payload: CheckpointPayload | None) -> None:
        now = time.monotonic()
        self.step += 1
        row = dict(metrics)
        row["training_iteration"] = self.step
        row["time_this_iter_s"] = now - self._iteration_started
        self._iteration_started = now
        node_id = self.node_at(self.step)
        self._pending.records.append((node_id, self.step, row))
        if payload is not None:
            key = f"{self.spec.batch_id}:{self.step}"
            self._put(key, payload)
            self._pending.checkpoints.append((node_id, self.step, key, _size(payload)))
        if payload is not None or now - self._last_flush >= FLUSH_SECONDS:
            self.flush()
        if self.step >= self.stop:
            raise session.BatchEnd()

    def flush(self) -> None:
        """Send pending records; take the controller's updated instructions."""
        import ray

        if not self._pending.records and not self._pending.checkpoints:
            return
        outcome, self._pending = self._pending, BatchOutcome(self.spec.batch_id)
        outcome.seconds = time.monotonic() - self._last_flush
        self._last_flush = time.monotonic()
        if self._controller is None:
            return
        save_steps, stop = ray.get(self._controller.worker_report.remote(outcome))
        self.save_steps |= set(save_steps)
        self.stop = min(self.stop, max(stop, self.step))

    def finish(self) -> BatchOutcome:
        outcome = self._pending
        outcome.seconds = time.monotonic() - self._last_flush
        if self._restored_dir is not None:
            shutil.rmtree(self._restored_dir, ignore_errors=True)
        return outcome


def run_function(trainable: Callable, context: StageContext) -> None:
    session._activate(context)
    try:
        trainable(context.spec.config)
    except session.BatchEnd:
        return
    finally:
        session._activate(None)
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
            except session.BatchEnd:
                return
    finally:
        instance.cleanup()


def _size(payload: CheckpointPayload) -> int:
    if payload.directory is not None:
        return len(payload.directory)
    import pickle

    return len(pickle.dumps(payload.state, protocol=5))


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
