"""The study's snapshot (`experiment_state.StudyState`) as the study
controller keeps it: when to take one, the write in flight, and the freeze
of an interrupted study.

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


class NoSnapshots:
    """What the controller's loop asks of its snapshots, for a study that
    takes none (a study attached to a plan service: the service persists
    the shared plan). `Snapshots` takes them."""

    #: The snapshot being written (awaitable), if any: the loop waits on it.
    in_flight: Any = None
    #: Spent taking snapshots, in seconds (the driver's progress shows it).
    seconds: float = 0.0

    def __init__(self) -> None:
        self.changed = True  # something changed since the last snapshot was taken: the loop says so
        self.frozen = False  # interrupted: saved, and changed no more (`freeze`)

    def save_soon(self) -> None:
        """Start writing a snapshot if one is due (each turn of the loop)."""

    def due_in(self) -> float | None:
        """Seconds until a snapshot is due (the loop wakes then), or None."""
        return None

    async def written(self) -> None:
        """The write in flight ended (the loop saw ``in_flight`` resolve)."""

    async def save_now(self) -> None:
        """Write a snapshot now, and wait for it."""

    def freeze(self) -> None:
        """The driver stops: the study changes no more (later reports are
        dropped, batches told to stop), so that what a restore continues is
        exactly what the driver last heard. Then `save_now`."""
        self.frozen = True


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
    """

    def __init__(
        self,
        take: Callable[[], bytes],
        write: Callable[[bytes], Awaitable[Any]],
        period_s: float | None,
        warn: Callable[[str], None],
        clock: Callable[[], float] = time.monotonic,
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
            logger.warning("the study's snapshot could not be written: %s", error)
            self.changed = True

    async def save_now(self) -> None:
        if self.in_flight is not None:
            await self.written()
        self._start()
        if self.in_flight is not None:
            await self.written()
