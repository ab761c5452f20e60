"""Where a stage batch's time goes, by phase.

The worker times what it does itself around the trainable: ``fetch`` (the
starting checkpoint from the object store), ``restore`` (unpacked into a
folder the trainable reads), ``save`` (a reported checkpoint packed and put
in the object store), ``report`` (results sent to the controller and its
answer awaited), ``parameters`` (``tune.with_parameters`` objects got from
the object store, `parameters`); the trainable's own time is ``train``. A trainable names
its own phases inside that with `session.timed` (``timed("data_to_device")``,
``timed("cuda_init")``), and they are counted apart from ``train``. The
controller adds ``dispatch``, what the worker did not spend in the batch
between its dispatch and its outcome coming back (`RunRecords`). The
monitor's timeline shows each run's phases; `ResultGrid.phase_seconds`
sums them over the study.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator

#: The phase of whatever no named phase claims: the trainable's own work.
TRAIN = "train"


class PhaseClock:
    """Seconds spent per phase since the last `take`. Phases nest: time in
    an inner one counts for it alone."""

    def __init__(self) -> None:
        self._spent: dict[str, float] = {}
        self._stack: list[tuple[str, float]] = []  # (phase, when it or its last inner phase ended)

    @contextlib.contextmanager
    def phase(self, name: str) -> Iterator[None]:
        now = time.perf_counter()
        if self._stack:
            outer, since = self._stack[-1]
            self._add(outer, now - since)
        self._stack.append((name, now))
        try:
            yield
        finally:
            _, since = self._stack.pop()
            now = time.perf_counter()
            self._add(name, now - since)
            if self._stack:
                self._stack[-1] = (self._stack[-1][0], now)

    def _add(self, name: str, seconds: float) -> None:
        self._spent[name] = self._spent.get(name, 0.0) + seconds

    def take(self, total: float) -> dict[str, float]:
        """The seconds per phase since the last take, ``total`` in all: what
        no phase claimed is ``train``. A phase still open counts from the next take."""
        now = time.perf_counter()
        for index, (name, since) in enumerate(self._stack):
            if index == len(self._stack) - 1:
                self._add(name, now - since)
            self._stack[index] = (name, now)
        spent, self._spent = self._spent, {}
        spent[TRAIN] = spent.get(TRAIN, 0.0) + max(0.0, total - sum(spent.values()))
        return spent
