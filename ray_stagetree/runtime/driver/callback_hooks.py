"""What a study's callbacks are, before it runs: ``RunConfig.callbacks`` and
``progress_reporter`` checked as Tune checks them, and what the callbacks
ask of the study (each checkpoint written as it is registered, a class
trainable waiting for their checkpoint requests). `callbacks` calls them.
"""

from __future__ import annotations

from typing import Any

from ray.tune import Callback
from ray.tune.logger import LoggerCallback


def check_driver_hooks(run_config: Any) -> None:
    """``RunConfig.callbacks`` and ``RunConfig.progress_reporter`` are what
    Tune takes, checked before anything runs."""
    from ray.tune import ProgressReporter

    for index, callback in enumerate(run_config.callbacks or ()):
        if not isinstance(callback, Callback):
            raise TypeError(
                f"RunConfig.callbacks[{index}] must be a ray.tune.Callback (or one of its logger classes), "
                f"got {callback!r}"
            )
    reporter = run_config.progress_reporter
    if reporter is not None and not isinstance(reporter, ProgressReporter):
        raise TypeError(
            "RunConfig.progress_reporter must be a ray.tune.ProgressReporter (CLIReporter, "
            f"JupyterNotebookReporter, ...) or None, got {reporter!r}"
        )


def wants_each_checkpoint(callbacks: list[Callback] | None) -> bool:
    """Whether a callback acts on each checkpoint as Tune registers it
    (``on_checkpoint``, ``on_trial_save``, a logger's ``log_trial_save``:
    W&B's artifact upload): the study then writes each into the trial's
    folder as it is registered, not only the kept ones at its end."""

    def overrides(callback: Callback, hook: str, base: type) -> bool:
        return getattr(type(callback), hook) is not getattr(base, hook)

    return any(
        overrides(callback, "on_checkpoint", Callback)
        or (overrides(callback, "on_trial_save", LoggerCallback if isinstance(callback, LoggerCallback) else Callback))
        or (isinstance(callback, LoggerCallback) and overrides(callback, "log_trial_save", LoggerCallback))
        for callback in callbacks or ()
    )


def asks_for_checkpoints(callbacks: list[Callback] | None, trainable: Any) -> bool:
    """Whether a callback may ask ``trainable`` for a checkpoint at a
    result (``result[SHOULD_CHECKPOINT] = True``), which Tune saves before
    the trainable trains on: a class trainable (a function saves only what
    it reports, under Tune too), and a callback whose ``on_trial_result``
    (a logger's ``log_trial_result``) is the user's, not Ray's (Ray's never
    ask). The trainable then waits for the driver's callbacks after each
    result."""
    if not isinstance(trainable, type):
        return False

    def users(callback: Callback, hook: str) -> bool:
        module = getattr(getattr(type(callback), hook), "__module__", None) or ""
        return not module.startswith(("ray.", "ray_stagetree."))

    return any(
        users(callback, "on_trial_result")
        or (isinstance(callback, LoggerCallback) and users(callback, "log_trial_result"))
        for callback in callbacks or ()
    )
