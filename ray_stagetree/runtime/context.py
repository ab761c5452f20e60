"""The per-batch state a trainable runs against on a stage worker.

`StageContext` is what the function API (`ray_stagetree.runtime.session`) and
the class-API driver call into: this iteration's hyper-parameters, where to
checkpoint, and the recording of each iteration's metrics, which it streams
to the controller. `report` ends the trainable at the batch's last iteration
by raising `BatchEnd`, a BaseException, so ``except Exception`` in user code
does not swallow it.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
import threading
import time
from typing import Any, Callable

from ray_stagetree.planning.config import TrialConfig
from ray_stagetree.runtime.batches import BatchOutcome, BatchSpec
from ray_stagetree.runtime.payload import (
    CheckpointPayload,
    pack_directory,
    size_of,
    unpack_directory,
)
from ray_stagetree.runtime.rng import capture_rng_state, restore_rng_state

logger = logging.getLogger(__name__)

FLUSH_SECONDS = 0.5

_local = threading.local()


class BatchEnd(BaseException):
    """Raised by `report` when the stage batch is complete; the worker catches it."""


def current() -> "StageContext | None":
    """The context of the batch running on this thread, if any."""
    return getattr(_local, "context", None)


def activate(context: "StageContext | None") -> None:
    _local.context = context


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
            self._pending.checkpoints.append((node_id, self.step, key, size_of(payload)))
        if payload is not None or now - self._last_flush >= FLUSH_SECONDS:
            self.flush()
        if self.step >= self.stop:
            raise BatchEnd()

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
