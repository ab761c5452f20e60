"""Results a trial finds already trained when its request moves.

Trials that share a trajectory share its results: when a trial's request
moves on (its scheduler let it go on, or PBT sent it to another trial's
checkpoint), the results the plan already holds beyond that point are the
trial's too, taken at once, in order, with its scheduler deciding on each
as if it had just been trained.

Taken at once, results cost no time, and that is where a loop can hide. An
exploit may send a trial back to a checkpoint behind results it took in
the same pass (PBT copies the donor's latest checkpoint, which may lag);
the plan holds those results still, so the trial takes them again and
meets the same decision, with the same population, for ever (Ray's
``pb2_example.py`` hung so in one run of three). Under Tune the trial
trains those iterations again while the population moves on. Here the
results wait for the loop's next turn in which a worker reported
something, or for a turn with nothing running that could.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


class HeldResults:
    """The queue of trials whose request moved, with the iteration each takes held results after.

    Parameters
    ----------
    history:
        A trial's results in the plan, ``{iteration: metrics}``, or None for a
        trial the plan no longer holds (or that ended).
    taken:
        The iterations the trial has results for.
    add_result:
        Takes one result for the trial (its scheduler decides on it and may
        move its request again, which queues it here again).
    """

    def __init__(
        self,
        history: Callable[[str], dict[int, dict[str, Any]] | None],
        taken: Callable[[str], Any],
        add_result: Callable[[str, int, dict[str, Any]], None],
    ) -> None:
        self._history = history
        self._taken = taken
        self._add_result = add_result
        self._queue: dict[str, int] = {}
        self._taking = False
        self._deferred: dict[str, int] = {}  # trials sent back over results a pass took: the next turn takes them
        self._reported = 0  # results that came from workers, not from this queue
        self._reported_at_deferral = 0

    def moved(self, trial_id: str, since: int) -> None:
        """The trial's request moved on from ``since``: take what the plan holds beyond it."""
        self._queue[trial_id] = since
        self.take()

    def reported(self) -> None:
        """A worker reported a result (the population moved on)."""
        if not self._taking:
            self._reported += 1

    def next_turn(self, idle: bool) -> None:
        """A new turn of the loop (``idle``: no batch runs): take the
        deferred results once a worker reported since, or nothing runs
        that could."""
        if self._deferred and (idle or self._reported > self._reported_at_deferral):
            self._queue.update(self._deferred)
            self._deferred = {}
            self.take(defer=not idle)

    def take(self, defer: bool = True) -> None:
        """Take the queued trials' held results, one trial at a time: a
        result taken may move a request again, which queues that trial
        again instead of recursing (recursion went a level deeper per
        decision point, past Python's limit on a long shared trajectory)."""
        if self._taking:
            return
        self._taking = True
        passed: dict[str, int] = {}  # the furthest iteration each trial took in this pass
        try:
            while self._queue:
                trial_id = next(iter(self._queue))
                since = self._queue.pop(trial_id)
                history = self._history(trial_id)
                if history is None:
                    continue
                if defer and since < passed.get(trial_id, since):
                    self._deferred[trial_id] = min(since, self._deferred.get(trial_id, since))
                    self._reported_at_deferral = self._reported
                    continue
                for later, metrics in list(history.items()):
                    if later > since and later not in self._taken(trial_id):
                        passed[trial_id] = max(passed.get(trial_id, later), later)
                        self._add_result(trial_id, later, metrics)
                        if trial_id in self._queue:
                            break  # its request moved: read its history again from there
        finally:
            self._taking = False
