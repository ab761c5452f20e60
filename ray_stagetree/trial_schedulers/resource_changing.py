"""``ResourceChangingScheduler`` on a search plan: resources change at stage boundaries.

Ray's scheduler wraps a base scheduler: where the base lets a trial go on,
its ``resources_allocation_function`` may give the trial other resources,
and it pauses the trial so that Tune restarts it from its checkpoint with
them. Here the user's object is fed as Tune feeds it (`TuneFedAdapter`):
the pause ends the trial's stage at that result, and the stage that
resumes it runs on a worker holding its new resources (the pool starts one
and retires idle workers to make room, `runtime.control.worker_pool`); a
stage never runs across two shapes. The allocation function reads the
cluster's CPUs and GPUs and the live trials through the same controller
calls as under Tune (``_resource_updater``, ``get_live_trials``).

What differs, on purpose: a trainable that keeps no checkpoint is not
restarted from scratch to change its resources (Tune's only way); it
continues where it paused, on the worker it had. Trials that share a stage
train it on a worker that covers each one's resources.
"""

from __future__ import annotations

from typing import Any

from ray_stagetree.trial_schedulers.tune_fed import TuneFedAdapter


class ResourceChangingAdapter(TuneFedAdapter):
    """Ray's ``ResourceChangingScheduler`` over a base scheduler fed as Tune feeds it."""

    changes_resources = True

    @classmethod
    def wrapped(cls, scheduler: Any) -> Any:
        return cls._ray_field(scheduler, "_base_scheduler")
