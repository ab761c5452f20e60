"""What the driver hears from the study controller at each poll
(``StudyController.progress``): the new result rows, the trials' lifecycle
events and the warnings since the last poll, each once and in order.

Ray-free; the driver's callbacks and reporter read it
(`runtime.driver.callbacks`, `runtime.driver.progress`).

Where a callback may ask for a checkpoint at the result it is handed
(``result[SHOULD_CHECKPOINT] = True``), the feed also carries the driver's
answers back: a class trainable waits after each result until the driver's
callbacks had it (`had_all`), and saves there if one asked (`asked_at`),
as Tune saves the trial before it trains on.
"""

from __future__ import annotations

import asyncio
import math
from typing import Any

from ray_stagetree.runtime.control.trials import TrialState


class DriverFeed:
    """A study's news for its driver, kept until the driver takes it.

    ``events`` are dicts with ``event`` ("start" with the trial's
    ``config``, "complete", "error" with its ``error`` text, "recover" (it
    failed with ``error`` and is retried), "checkpoint" with a checkpoint's
    ``path`` in its folder: each as it is registered where a callback wants
    them, else the final one), ``trial_id``, ``name`` and ``dirname``. A trial's
    "start" comes before its rows, which come before its "complete" or "error".
    A row at an iteration the trial reported before (a retry, a PBT
    exploit's) carries `messages.REPORTED_AGAIN` (the driver takes it out).
    """

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.warnings: list[str] = []  # for the driver to show, once each
        self.outputs: list[tuple[str, list[tuple[str, str]]]] = []  # (trial id, [(file, text)]): log_to_file
        self.fed = 0  # rows fed so far
        self._taken = 0  # of them, those the driver took
        self._answered: float = 0  # of them, those the driver's callbacks had (`answer`); inf once released
        self._asked: set[tuple[str, int]] = set()  # (trial id, iteration) a callback asked to checkpoint at
        self._waits: list[tuple[int, asyncio.Future]] = []  # (rows, until the callbacks had them)
        self._driver_needed = asyncio.Event()  # a trainable waits for rows the driver has not taken

    def warn(self, warning: str) -> None:
        self.warnings.append(warning)

    def row(self, row: dict[str, Any]) -> None:
        self.rows.append(row)
        self.fed += 1

    def event(self, kind: str, state: TrialState, **fields: Any) -> None:
        self.events.append(
            {
                "event": kind,
                "trial_id": state.trial_id,
                "name": state.name,
                "dirname": state.dirname,
                "experiment_tag": state.shown_tag,
                **fields,
            }
        )

    def announce(self, state: TrialState) -> None:
        """A trial starts (Tune's on_trial_start) when a batch serving it is
        dispatched, or at its first result if that comes first: not when it
        is admitted, since the driver's loggers open files for each started
        trial and a study admits all its trials at once. A trial that ends
        before either (the time budget, ``stop_all``) ends without starting,
        as a pending trial does in Tune. Once per trial (``state.announced``)."""
        if not state.announced:
            state.announced = True
            self.event("start", state, config=state.shown_config())

    def output(self, trial_id: str, chunks: list[tuple[str, str]]) -> None:
        self.outputs.append((trial_id, chunks))

    def take(self) -> dict[str, Any]:
        """``rows``, ``events``, ``warnings`` and ``output`` since the last
        call, and ``rows_through``: the rows fed up to here, which the
        driver's `answer` names."""
        taken = {"rows": self.rows, "events": self.events, "warnings": self.warnings, "output": self.outputs}
        self.rows, self.events, self.warnings, self.outputs = [], [], [], []
        self._taken = self.fed
        self._driver_needed.clear()
        return {**taken, "rows_through": self.fed}

    # -- the driver's callbacks asking for checkpoints -------------------------------

    def answer(self, rows_through: int, asked: list[tuple[str, int]]) -> None:
        """The driver's callbacks had the rows up to ``rows_through`` and
        asked for a checkpoint at ``asked``: (trial id, iteration)."""
        self._asked.update(asked)
        self._answered = max(self._answered, rows_through)
        self._wake()

    async def had_all(self) -> None:
        """Return once the driver's callbacks had every row fed so far."""
        rows = self.fed
        if self._answered >= rows:
            return
        done = asyncio.get_running_loop().create_future()
        self._waits.append((rows, done))
        if rows > self._taken:
            self._driver_needed.set()
        await done

    def asked_at(self, trial_id: str, iteration: int) -> bool:
        """Whether a callback asked for the trial's checkpoint at ``iteration`` (asked once)."""
        if (trial_id, iteration) not in self._asked:
            return False
        self._asked.discard((trial_id, iteration))
        return True

    async def driver_needed(self, wait_s: float) -> None:
        """Return when a trainable waits for rows the driver has not taken, or after ``wait_s``."""
        try:
            await asyncio.wait_for(self._driver_needed.wait(), wait_s)
        except asyncio.TimeoutError:  # not yet TimeoutError itself on Python 3.10
            pass

    def release(self) -> None:
        """No answer comes any more (the study ended or stopped): nothing waits for one."""
        self._answered = math.inf
        self._driver_needed.set()
        self._wake()

    def _wake(self) -> None:
        waiting = []
        for rows, done in self._waits:
            if rows > self._answered:
                waiting.append((rows, done))
            elif not done.done():
                done.set_result(None)
        self._waits = waiting
