"""Failures as the study controller counts them (Tune's ``FailureConfig``
and ``TUNE_RESTORE_RETRY_NUM``): which failures a trial retries and which
end it in error, which errors of a shared stage are retried once first,
and whether the study stopped (``fail_fast``, a stopper's ``stop_all``, a
trainable no worker can load); and an error raised handling a result, as
Tune's loop raises it (`as_tune_raises`).

It decides and counts (the counts are the trial's, `trials.TrialState`);
the controller ends the trials (`planning.lifecycle`) and tells the driver.
"""

from __future__ import annotations

import logging
import traceback
from typing import TYPE_CHECKING, Any

from ray.tune.error import TuneError

if TYPE_CHECKING:
    from ray_stagetree.execution.batches import BatchOutcome

logger = logging.getLogger(__name__)


class Failures:
    """A study's failure policy and its stop.

    Parameters
    ----------
    max_failures:
        Failures a trial retries (``FailureConfig.max_failures``; ``math.inf``
        for Tune's -1); the next ends it in error.
    restore_retries:
        Failed loads of a trial's starting checkpoint retried before one
        counts as a failure (``TUNE_RESTORE_RETRY_NUM``; reset when it trains).
    fail_fast:
        ``FailureConfig.fail_fast``: True or "raise" stop the study at its first errored trial.
    """

    def __init__(self, max_failures: float = 0, restore_retries: int = 0, fail_fast: bool | str = False) -> None:
        self.max_failures = max_failures
        self.restore_retries = restore_retries
        self.fail_fast = fail_fast
        self.halted = False  # the study stopped: nothing more runs
        self.study_error: str | None = None  # why the whole study stopped in error (`abort`)

    def retried(self, state: Any, retry: bool = True, in_restore: bool = False) -> bool:
        """Count a failure of the trial ``state``: True when it is retried,
        False when it ends in error. ``retry`` False: a retry would fail
        the same way (it still counts). ``in_restore``: loading its
        starting checkpoint raised, which is first retried
        ``restore_retries`` times without counting, as in Tune."""
        if in_restore and retry and state.restore_failures < self.restore_retries:
            state.restore_failures += 1
            return True
        state.failures += 1
        return retry and state.failures <= self.max_failures

    def ends_study(self) -> bool:
        """Whether a trial ending in error stops the study (``fail_fast``)."""
        return bool(self.fail_fast)

    def halt(self) -> bool:
        """The study stops; True the first time (its trials are then stopped)."""
        if self.halted:
            return False
        self.halted = True
        return True

    def abort(self, error: str) -> None:
        """No worker can run the trainable: the study stops in ``error``."""
        self.study_error = error
        self.halted = True


class SharedStageRetries:
    """The errors of stages several live trials share, each retried once
    before it counts against them (the loop's: a shared stage may serve
    several studies' trials)."""

    def __init__(self) -> None:
        self._retried: set[tuple[int, frozenset[str]]] = set()  # (node, its trials) retried once

    def retry(self, node_id: int, trial_ids: set[str]) -> bool:
        """The trainable raised on a stage that several live trials share:
        their first error there is retried once before it counts against
        them (in Tune each of those trials trains the prefix on its own, and
        a transient error would cost one of them, not all). Once per stage
        and trials, not per iteration: a trainable that fails after a report
        fails further on at each retry that goes on from a later checkpoint."""
        point = (node_id, frozenset(trial_ids))
        if len(trial_ids) < 2 or point in self._retried:
            return False
        self._retried.add(point)
        return True

    def retry_batch(self, outcome: BatchOutcome, affected: set[str]) -> bool:
        """Whether a batch's error is retried once as a shared stage's
        (`retry`), ``affected`` the live trials through where it raised."""
        if not outcome.error_retryable:  # the trainable reported something it must not: a retry repeats it
            return False
        if not self.retry(outcome.error_node, affected):
            return False
        logger.warning(
            "iteration %d, shared by %d trials, failed; retrying it once before it counts as their failure:\n%s",
            outcome.error_iteration,
            len(affected),
            outcome.error,
        )
        return True


def as_tune_raises(error: Exception, as_is: bool) -> Exception:
    """An error raised handling a trial's result (a stopper's, a scheduler's,
    a searcher's) as Tune's loop raises it: a ``TuneError`` holding its
    traceback, unless it is one or ``as_is`` (``fail_fast="raise"``)."""
    if as_is or isinstance(error, TuneError):
        return error
    return TuneError("".join(traceback.format_exception(error)))
