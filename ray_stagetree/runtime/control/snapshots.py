"""The study's snapshot (`experiment_state.StudyState`) as the study
controller keeps it: when to take one, the write in flight, the freeze
of an interrupted study, and the pause while storage refuses it.

Ray-free: the controller gives it what takes a snapshot (the pickled
study) and what starts writing one (the storage actor's call: its
reference is awaitable, and the loop waits on it with its batches); this
decides when, and keeps the cost of snapshots at most
1/`STATE_COST_FACTOR` of the controller's time.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

from ray_stagetree.runtime.control.experiment_state import STATE_COST_FACTOR

logger = logging.getLogger(__name__)

#: Seconds before the first retry of a snapshot storage refused (each write
#: has had its own quick retries: `execution.sealed_storage.with_retries`); the pause
#: doubles up to `STORAGE_RETRY_MAX_S`.
STORAGE_RETRY_S = 1.0
STORAGE_RETRY_MAX_S = 30.0


class NoSnapshots:
    """What the controller's loop asks of its snapshots, for a study that
    takes none (a study attached to a plan service: the service persists
    the shared plan). `Snapshots` takes them."""

    #: The snapshot being written (awaitable), if any: the loop waits on it.
    in_flight: Any = None
    #: Spent taking snapshots, in seconds (the driver's progress shows it).
    seconds: float = 0.0
    #: ``clock()`` when storage began refusing snapshots (None: it takes
    #: them). No stage starts meanwhile: what would be trained could not be
    #: stored, and a driver lost then would lose it.
    refused_since: float | None = None

    def __init__(self) -> None:
        self.changed = True  # something changed since the last snapshot was taken: the loop says so
        self.frozen = False  # interrupted: saved, and changed no more (`freeze`)

    def paused(self) -> bool:
        """Storage refuses the snapshot and the study still waits for it."""
        return False

    def save_soon(self) -> None:
        """Start writing a snapshot if one is due (each turn of the loop)."""

    def due_in(self) -> float | None:
        """Seconds until a snapshot is due (the loop wakes then), or None."""
        return None

    async def written(self) -> None:
        """The write in flight ended (the loop saw ``in_flight`` resolve)."""

    async def save_now(self) -> None:
        """Write a snapshot now, and wait for it."""

    async def ask_storage(self) -> bool:
        """Storage refused a checkpoint the study's end needs: write the
        snapshot now if it changed, so that a refusal pauses the study as it
        does mid-study; True when it was written or refused (the loop turns
        again), False when there was nothing to ask."""
        return False

    def freeze(self) -> None:
        """The driver stops: the study changes no more (later reports are
        dropped, batches told to stop), so that what a restore continues is
        exactly what the driver last heard. Then `save_now`."""
        self.frozen = True

    def restored(self) -> None:
        """The study was restored from a snapshot in storage: until it takes
        a newer one, a restore continues from that one."""

    def not_saved(self) -> str | None:
        """What a restore would continue, when storage did not take the study's
        latest state (after `save_now`); None when it did."""
        return None


class Snapshots(NoSnapshots):
    """A study's snapshots: one is taken when something changed since the
    last, none is being written, and the last one's cost has been paid
    for.

    Parameters
    ----------
    take:
        The snapshot, pickled (``dumps(controller's StudyState)``); it may
        raise (an unpicklable searcher or scheduler), and then the study
        runs on unrestorable, with a warning.
    write:
        Starts writing the bytes; returns an awaitable (a Ray ObjectRef)
        that raises if the write failed.
    period_s:
        Seconds between snapshots; None: as often as their cost allows
        (`STATE_COST_FACTOR`).
    warn:
        Where a warning for the driver goes.
    clock:
        Seconds now (``time.monotonic``; a test passes its own).
    wait_s:
        Seconds the study pauses while storage refuses its snapshot; then it
        goes on without storage (what it trains is kept in memory and
        returned), and still tries the snapshot now and then.
    """

    def __init__(
        self,
        take: Callable[[], bytes],
        write: Callable[[bytes], Awaitable[Any]],
        period_s: float | None,
        warn: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
        wait_s: float = 600.0,
    ) -> None:
        super().__init__()
        self._take = take
        self._write = write
        self.period_s = period_s
        self._warn = warn
        self._clock = clock
        self.in_flight = None
        self.seconds = 0.0
        self._next_at = 0.0  # clock() before which no snapshot is taken
        self._retry_s = STORAGE_RETRY_S
        self.wait_s = wait_s
        self._gave_up = False  # waited wait_s in this outage: the study goes on without storage
        self._last_stored: str | None = None  # the wall-clock time of the snapshot a restore would continue from

    def paused(self) -> bool:
        if self.refused_since is None or self._gave_up:
            return False
        if self._clock() - self.refused_since < self.wait_s:
            return True
        self._gave_up = True
        self._warn(
            f"storage has refused the study's snapshot for {self.wait_s:.0f} s: the study goes on without it "
            "(RAY_STAGETREE_STORAGE_WAIT_S); what it trains is kept in memory and returned by fit(), and lost with "
            "the driver until storage is back"
        )
        return False

    def save_soon(self) -> None:
        now = self._clock()
        if self.in_flight is not None or not self.changed or now < self._next_at:
            return
        if not self._start():
            return  # it cannot be taken: none again (its warning said so)
        cost = self._clock() - now
        self._next_at = now + (STATE_COST_FACTOR * cost if self.period_s is None else max(self.period_s, cost))

    def due_in(self) -> float | None:
        if not self.changed or self.in_flight is not None:
            return None
        return max(0.0, self._next_at - self._clock())

    def _start(self) -> bool:
        """Start a write; False when the snapshot cannot be taken."""
        self.changed = False
        started = self._clock()
        try:
            data = self._take()
        except Exception as error:  # an unpicklable searcher or scheduler: the study runs, unrestorable
            self._next_at = math.inf
            self._warn(
                f"the study cannot be saved for Tuner.restore ({type(error).__name__}: {error}); it runs on, "
                "but a driver lost now loses the study"
            )
            return False
        self.in_flight = self._write(data)
        self.seconds += self._clock() - started
        return True

    async def written(self) -> None:
        write, self.in_flight = self.in_flight, None
        try:
            await write
        except Exception as error:
            self._refused(error)
            return
        self._last_stored = time.strftime("%H:%M:%S")
        if self.refused_since is not None:
            self._warn(
                f"storage takes writes again after {self._clock() - self.refused_since:.0f} s: the study goes on"
            )
            self.refused_since = None
            self._retry_s = STORAGE_RETRY_S
            self._gave_up = False

    def _refused(self, error: Exception) -> None:
        """Storage refused the snapshot (read-only, full, unreachable): the
        study pauses and tries again, less and less often, until it takes one."""
        self.changed = True
        self._next_at = self._clock() + self._retry_s
        self._retry_s = min(2 * self._retry_s, STORAGE_RETRY_MAX_S)
        if self.refused_since is not None:
            logger.debug("the study's snapshot is still refused: %s", error)
            return
        self.refused_since = self._clock()
        error = getattr(error, "cause", None) or error  # the storage actor's own error, not Ray's wrapper
        self._warn(
            f"storage refuses the study's snapshot ({type(error).__name__}: {error}): the study pauses, no new "
            f"stage starts until storage takes writes again, for up to {self.wait_s:.0f} s (running ones finish; "
            f"their checkpoints are kept in memory). Stopped now, {self._restore_from()}"
        )

    async def ask_storage(self) -> bool:
        if self.refused_since is not None or not self.changed or self._next_at == math.inf:
            return False  # already paused (or given up), or nothing new to write, or it cannot be taken
        await self.save_now()
        return True

    def restored(self) -> None:
        self._last_stored = "the one it was restored from"

    def not_saved(self) -> str | None:
        return None if self.refused_since is None else self._restore_from()

    def _restore_from(self) -> str:
        if self._last_stored is None:
            return "it cannot be continued: storage has taken no snapshot of it yet"
        return f"Tuner.restore continues it from its last snapshot ({self._last_stored}), once storage is back"

    async def save_now(self) -> None:
        if self.in_flight is not None:
            await self.written()
        self._start()
        if self.in_flight is not None:
            await self.written()
