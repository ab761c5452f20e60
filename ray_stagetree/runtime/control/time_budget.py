"""``TuneConfig.time_budget_s`` as the study controller keeps it.

Ray-free: the controller asks it whether the study is over its budget, which
running batches to kill, and when to wake next; it does the stopping and the
killing.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable

#: Past the budget, a batch that has not stopped at a report by then (its
#: trainable never reports, or takes this long per iteration) is killed.
GRACE_S = 1.0


class TimeBudget:
    """A study's time budget, counted from ``clock()`` at construction, or
    at `start` (as Tune counts from its loop's first step).

    Parameters
    ----------
    seconds:
        The budget; None or infinite: the study is never over it.
    clock:
        Seconds now (``time.time``; a test passes its own).
    """

    def __init__(self, seconds: float | None, clock: Callable[[], float] = time.time) -> None:
        self.seconds = seconds
        self._clock = clock
        self._started = clock()
        self._before = 0.0  # seconds a restored study had run
        self._ended = False  # the study stopped before its budget (`end_now`)
        self._killed: set[int] = set()  # batches whose worker the budget killed

    def restored(self, elapsed: float) -> None:
        """The study continues a snapshot that had run ``elapsed`` seconds."""
        self._before = elapsed
        self._started -= elapsed

    def start(self) -> None:
        """The loop's first step: the budget counts from now (after what a
        restored study had run)."""
        self._started = self._clock() - self._before

    @property
    def elapsed(self) -> float:
        return self._clock() - self._started

    def over(self) -> bool:
        return self._ended or (self.seconds is not None and self.elapsed > self.seconds)

    def end_now(self) -> None:
        """The study stops now (a stopper's ``stop_all``, which Tune obeys at
        once, as its time budget): from here it is past its budget, so a
        batch that has not stopped at a report `GRACE_S` later is killed."""
        self._ended = True
        self.seconds = min(self.elapsed, math.inf if self.seconds is None else self.seconds)

    def to_kill(self, running: Iterable[int]) -> list[int]:
        """Which of the ``running`` batch ids to kill now: those still
        running `GRACE_S` past the budget, each once."""
        if not self.over() or self.elapsed < self.seconds + GRACE_S:
            return []
        doomed = [batch_id for batch_id in running if batch_id not in self._killed]
        self._killed.update(doomed)
        return doomed

    def wake_in(self, running: Iterable[int]) -> float | None:
        """Seconds until the controller must act on the budget: when it ends,
        and when batches still ``running`` past it are to be killed; None
        when nothing is due."""
        if self.seconds is None or math.isinf(self.seconds):
            return None
        left = self.seconds - self.elapsed
        if left > 0:
            return left
        pending = [batch_id for batch_id in running if batch_id not in self._killed]
        return max(0.0, left + GRACE_S) if pending else None
