"""Stage workers: long-lived Ray actors that run stage batches.

A worker receives a `BatchSpec` (the config of the batch's deepest plan node,
which describes the whole path; the checkpoint to start from; the segments
to train; the iterations to checkpoint at), runs the user's trainable through it
and streams records back to the controller in small batches: metrics of
every iteration, checkpoints where asked. The controller's reply to a flush
can add checkpoint iterations (a trial arrived that forks here), move the end
of the batch earlier (no live trial needs the rest), or, at the batch's end,
later: the trial goes on, and so does the live function (live continuation).
Class trainables run through `ray_stagetree.runtime.class_trainables`.

A checkpoint waits in the worker's outbox until the controller calls
`StageWorker.take_checkpoint`: the payload becomes that call's return value,
an object the controller owns, so it outlives this worker, and its bytes go
from this process to the object store without passing through anyone else.
Workers are threaded actors so that call is served while a batch runs.
"""

from __future__ import annotations

import os
import traceback
from typing import Any, Callable

import ray

from ray_stagetree.runtime import session
from ray_stagetree.runtime.batches import BatchOutcome, BatchSpec
from ray_stagetree.runtime.class_trainables import run_class
from ray_stagetree.runtime.context import BatchEnd, ConfigChange, ReportError, StageContext, activate
from ray_stagetree.runtime.payload import CheckpointPayload
from ray_stagetree.runtime.reproducibility import seed_stage


def run_function(trainable: Callable, context: StageContext) -> None:
    """Run the function through the batch. It ends at the batch's last
    iteration (`report` raises `BatchEnd`), restarts where PBT changed a plain
    config value, and may return early, which ends the trials it serves."""
    activate(context)
    try:
        while True:
            try:
                trainable(context.trainable_config())
            except ConfigChange:
                continue
            except BatchEnd:
                return
            break
    finally:
        activate(None)
    if context.iteration < context.stop:
        context.returned_at = context.iteration


def _load_error_message(error: Exception) -> str:
    missing = f"module {error.name!r}" if isinstance(error, ModuleNotFoundError) and error.name else "a module"
    return (
        f"the stage workers cannot load the trainable ({type(error).__name__}: {error}). Ray workers import "
        f"the modules a trainable was defined in by name, and {missing} is not importable on them. Make it "
        "importable on every worker: ray.init(runtime_env={'working_dir': '.'}) or "
        "runtime_env={'py_modules': [...]} for code next to the script or notebook (a sys.path change in the "
        "driver does not reach workers), or install the package on the cluster"
    )


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
        module.get_context = session.get_context


class StageWorker:
    """Ray actor body (run with ``max_concurrency=2``): runs one batch at a
    time and hands out its checkpoints.

    The trainable arrives pickled and is loaded after the Tune shims are in
    place, so names it imported from ``ray.tune`` resolve to ours.
    """

    def __init__(self, trainable_bytes: bytes, controller: Any) -> None:
        import ray.cloudpickle

        _install_tune_shims()
        self._controller = controller
        self._outbox: dict[str, CheckpointPayload] = {}
        self._trainable: Any = None
        # Raising here would kill the actor with a C++ stack trace per worker
        # and restart; the controller ends the study with this message instead.
        self._load_error: str | None = None
        try:
            self._trainable = ray.cloudpickle.loads(trainable_bytes)
        except Exception as error:
            self._load_error = _load_error_message(error)
        self._is_class = isinstance(self._trainable, type)

    def pid(self) -> int:
        return os.getpid()

    def take_checkpoint(self, key: str) -> CheckpointPayload:
        return self._outbox.pop(key)

    def run_batch(self, spec: BatchSpec) -> BatchOutcome:
        if self._load_error is not None:
            return BatchOutcome(spec.batch_id, error=self._load_error, trainable_unloadable=True)
        context = StageContext(spec, self._controller, self._outbox.__setitem__)
        try:
            context.source_payload()
        except ray.exceptions.ObjectLostError as error:
            return BatchOutcome(spec.batch_id, source_lost=f"the checkpoint batch {spec.batch_id} starts from is lost: {error}")
        try:
            if spec.reproducibility is not None:  # before the trainable builds anything random
                seed_stage(spec.reproducibility, spec.config, spec.start)
            if self._is_class:
                run_class(self._trainable, context)
            else:
                run_function(self._trainable, context)
        except Exception as error:
            outcome = context.finish()
            outcome.error = traceback.format_exc() + _sequence_hint(error)
            outcome.error_iteration = context.iteration + 1
            outcome.error_node = context.node_at(min(context.iteration + 1, spec.stop))
            outcome.error_retryable = not isinstance(error, ReportError)
            return outcome
        return context.finish()
