"""Ray Train v2's Tune pattern on a stage worker: a trial function that
builds a ``TorchTrainer`` (any v2 ``DataParallelTrainer``) and calls its
``fit()``, Ray 2.60's documented way to tune a data-parallel run.

Where the trainer's workers have the stage's shape (``num_workers`` equal to
the ranks of the stage: one for a plain stage worker, N for a study with
``Tuner(..., scaling_config=ScalingConfig(num_workers=N))``; a GPU each when
``use_gpu`` and the stage holds one; no Ray Data ``datasets``), ``fit()``
runs ``train_loop_per_worker`` right here, on the stage's ranks: its
``ray.train.report(metrics, checkpoint=...)`` is the trial's report and its
``ray.train.get_checkpoint()`` the stage's starting checkpoint, so the loop
shares stages like any trainable written for Tune. ``fit()`` returns a
``ray.train.Result`` of its last report.

Where it asks for more workers than a plain stage worker's one rank (the
common case: ``ray.tune.Tuner(driver_function)`` with ``num_workers=N``),
the stage worker learns the shape there: at that first ``fit()``, before
the batch reported anything, it becomes rank 0 of a group of N ranks (the
other N-1 in a placement group of their own, started by the worker and
going with it, `StageWorker._grow`); they train the batch from its start
and the loop runs on all N, sharing stages as above. They stay for the
worker's next trainer of that shape; one of another shape replaces them. As under Tune, the study does not count
those ranks' resources: limit ``max_concurrent_trials`` so that they fit
(a group that cannot be placed within `group.PLACEMENT_WAIT_S` fails its
trial with a message that says so).

Otherwise (Ray Data ``datasets``, GPUs the stage does not hold, a report
before ``fit()``) the trainer runs as under Tune, unshared: Ray Train starts
its own controller and workers (uncounted likewise), and the metrics Ray's
``TuneReportCallback`` passes on are the trial's results. A message says so
once per worker.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from ray.util import log_once

from ray_stagetree.runtime.workers.context import StageContext
from ray_stagetree.trial_schedulers.ray_fields import (
    point_tune_report_callback,
    ray_field,
    train_scaling,
)

logger = logging.getLogger("ray_stagetree")

#: How often the trial's thread looks for a result while a nested Train run goes on.
POLL_S = 0.5

UNSHARED_RUN = (
    "{trainer}.fit() inside a ray_stagetree trial runs as a Ray Train run of its own, as under Tune, and shares no "
    "stages: {why}. Its workers hold resources the study does not count (limit max_concurrent_trials so they fit), "
    "and the trial's results are what ray.tune.integration.ray_train.TuneReportCallback passes on (this message is "
    "shown once per worker)"
)


GROWN_GROUP = (
    "{trainer}.fit() inside a ray_stagetree trial asks for {n} workers: each stage worker meeting it becomes rank 0 "
    "of a group of {n} ranks (the other {n}-1 with {resources} each, in a placement group of their own, which the "
    "study does not count: limit max_concurrent_trials so they fit, as Tune's docs advise for Train runs in trials), "
    "and train_loop_per_worker runs on the group's ranks, sharing stages (this message is shown once per worker)"
)


def host(current: Callable[[], StageContext | None], when_imported: Callable[..., None]) -> None:
    """Make a v2 trainer's ``fit()`` inside a trial run as this module says
    (``current``: the stage context of the calling thread, None outside a
    trial); outside a trial it is Ray's. ``when_imported(module, patch)``
    patches Ray's modules once a trainable imports them (most never do)."""

    def patch_trainer(module: Any) -> None:
        trainer_class = module.DataParallelTrainer
        fit = trainer_class.fit

        def hosted_fit(self: Any) -> Any:
            context = current()
            if context is None:
                return fit(self)
            why = _why_unshared(self, context)
            if why is None or _grew(self, context):
                return _run_on_stage(self, context)
            if context.group is not None:  # every rank would start a Train run of its own
                raise ValueError(
                    f"{type(self).__name__}.fit() on a stage trained by a group of "
                    f"{context.group.info.world_size} ranks: {why}. A study's trials run on groups of one shape "
                    "(its scaling_config, or the first trainer its workers met): give every trial's trainer "
                    "that ScalingConfig"
                )
            message = UNSHARED_RUN.format(trainer=type(self).__name__, why=why)
            if log_once(message):
                logger.warning(message)
            return _run_beside(self, fit)

        hosted_fit.__doc__ = fit.__doc__
        trainer_class.fit = hosted_fit

    def patch_report_callback(module: Any) -> None:
        train_session = module.get_session
        module.get_session = lambda: _TuneSessionStandIn() if current() is not None else train_session()

    when_imported("ray.train.v2.api.data_parallel_trainer", patch_trainer)
    when_imported("ray.tune.integration.ray_train", patch_report_callback)


def _why_unshared(trainer: Any, context: StageContext) -> str | None:
    """Why the trainer's workers are not the stage's ranks; None when they are."""
    import ray

    scaling = trainer.scaling_config
    ranks = 1 if context.group is None else context.group.info.world_size
    if trainer.datasets:
        return "it reads Ray Data datasets, which Ray Train shards across its own workers"
    if max(scaling.num_workers, 1) != ranks:
        return f"its ScalingConfig asks for {scaling.num_workers} workers and the stage has {ranks}"
    if scaling.use_gpu and not ray.get_gpu_ids():
        return "its ScalingConfig asks for a GPU per worker and the stage holds none"
    return None


def _grew(trainer: Any, context: StageContext) -> bool:
    """Whether the stage's worker became a group of the trainer's shape
    (`StageWorker._grow`): it can when it is a worker of its own, the
    trainer asks for more workers, reads no Ray Data ``datasets``, finds a
    GPU on this rank if it asks for GPUs, and the batch reported nothing yet
    (its other ranks train it from its start)."""
    import ray

    scaling = trainer.scaling_config
    if (
        context.grow_group is None
        or context.reported_any()
        or trainer.datasets
        or scaling.num_workers <= 1
        or (scaling.use_gpu and not ray.get_gpu_ids())
    ):
        return False
    group = train_scaling(scaling)
    message = GROWN_GROUP.format(trainer=type(trainer).__name__, n=group.num_workers, resources=group.resources)
    if log_once(message):
        logger.info(message)
    context.grow_group(group)
    return True


def _run_on_stage(trainer: Any, context: StageContext) -> Any:
    """``train_loop_per_worker`` on this rank, reporting to the stage."""
    from ray.train import Result

    train_function = ray_field(trainer, "_get_train_func", trainer)()
    train_function()
    return Result(
        metrics=dict(context.last_metrics),
        checkpoint=None,
        error=None,
        path=context.trial_dir(),
    )


def _run_beside(trainer: Any, fit: Callable[[Any], Any]) -> Any:
    """Ray Train's own run, on a thread of its own, while this (the trial's)
    thread reports what TuneReportCallback passes on. When the trial ends
    first (stopped), the queue is closed: Ray's callback fails its next
    ``put`` and the Train run ends."""
    from ray.tune.integration.ray_train import TuneReportCallback
    from ray.util.queue import Empty, Queue

    from ray_stagetree.runtime.workers import session

    callbacks = [c for c in trainer.run_config.callbacks or () if isinstance(c, TuneReportCallback)]
    if not callbacks:  # nothing is passed on: the trial reports after fit(), as under Tune
        return fit(trainer)
    queue = Queue(1, actor_options={"num_cpus": 0})
    for callback in callbacks:
        point_tune_report_callback(callback, queue)
    outcome: dict[str, Any] = {}

    def run() -> None:
        try:
            outcome["result"] = fit(trainer)
        except BaseException as error:  # raised in the trial's thread below
            outcome["error"] = error

    runner = threading.Thread(target=run, name="ray_stagetree-train-run", daemon=True)
    runner.start()
    try:
        while runner.is_alive() or not queue.empty():
            try:
                metrics = queue.get(timeout=POLL_S)
            except Empty:
                continue
            session.report(metrics)
    finally:
        import ray

        ray.kill(queue.actor)
    if "error" in outcome:
        raise outcome["error"]
    return outcome["result"]


class _TuneSessionStandIn:
    """What Ray's ``TuneReportCallback`` reads of Tune's session when it is
    made in a trial here: the queue it will put results into, made when the
    trainer runs beside the stage (`_run_beside`)."""

    def _get_or_create_inter_actor_queue(self) -> None:
        return None
