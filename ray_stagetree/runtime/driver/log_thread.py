"""Tune's default loggers fed on a thread of their own, off the driver's loop.

The driver's loop polls the controller and calls the callbacks; the default
loggers' files (`runtime.driver.log_files`) are written here instead, in
the order the loop hands them over, with one flush per poll: the loop is
back at the controller while a poll's results are written. What a logger
reads of a trial is what the loop saw when it handed the call over
(`LoggedTrial`), not what the trial became since.

A logger's error other than storage refusing a write (which the study
survives, `CallbackRunner`) is raised on the loop at its next hand-over,
as Tune's loop raises a logger's error.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Any

from ray_stagetree.planning.config import tabular

#: Results handed over and not yet written past which the loop waits for the
#: thread: the loop outruns the files only by this much (the driver's memory).
MOST_PENDING_RESULTS = 50_000


class LoggedTrial:
    """A trial as Tune's default loggers read it, on the log thread: its
    folder, its config (sequences in their JSON form) and searched values."""

    def __init__(self, trial_id: str, name: str, local_path: str, init_local_path: Callable[[], None]) -> None:
        self.trial_id = trial_id
        self.trial_name = name
        self.local_path = self.logdir = local_path
        self.init_local_path = init_local_path
        self.config: dict[str, Any] = {}
        self.evaluated_params: dict[str, Any] = {}
        self.checkpoint = None  # Tune's loggers fetch remote logs when a trial has one: the runner already did

    def __str__(self) -> str:
        return self.trial_name

    __repr__ = __str__


class LogThread:
    """Feeds ``loggers`` (each with ``flush_batch``) on a daemon thread.

    ``on_storage_fault`` takes an ``OSError`` a logger raised (storage
    refused a write); it is called on the thread."""

    def __init__(self, loggers: list[Any], on_storage_fault: Callable[[OSError], None]) -> None:
        self.loggers = loggers
        self._on_storage_fault = on_storage_fault
        self._queue: queue.Queue[list[Callable[[], None]] | None] = queue.Queue()
        self._handing: list[Callable[[], None]] = []  # tasks the loop queued since its last hand-over
        self._trials: dict[str, LoggedTrial] = {}
        self._handed_results = 0  # written by the loop only
        self._written_results = 0  # written by the thread only
        self._error: BaseException | None = None
        self._thread: threading.Thread | None = None

    def _submit(self, task: Callable[[], None]) -> None:
        """Queue ``task`` for the thread; it gets it at the next `_hand_over`."""
        self._handing.append(task)

    def _hand_over(self) -> None:
        """Give the thread the tasks queued since the last hand-over, in one
        piece: a queue put per result costs the loop more than the result's
        own bookkeeping (its lock contended by the thread taking the last)."""
        if not self._handing:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="stagetree-loggers", daemon=True)
            self._thread.start()
        tasks, self._handing = self._handing, []
        self._queue.put(tasks)

    def _work(self) -> None:
        while True:
            tasks = self._queue.get()
            try:
                if tasks is None:
                    return
                for task in tasks:
                    if self._error is not None:
                        break
                    task()
            except BaseException as error:  # noqa: BLE001  (raised on the loop, as Tune raises a logger's error)
                self._error = error
            finally:
                self._queue.task_done()

    def _each(self, call: Callable[[Any], None]) -> None:
        for logger in self.loggers:
            try:
                call(logger)
            except OSError as error:  # storage refused a log file: the study goes on
                self._on_storage_fault(error)

    def raise_error(self) -> None:
        """Raise a logger's error on the loop (once)."""
        error, self._error = self._error, None
        if error is not None:
            raise error

    # -- what the loop hands over ------------------------------------------------------

    def _trial(self, view: Any) -> LoggedTrial:
        trial = self._trials.get(view.trial_id)
        if trial is None:
            trial = self._trials[view.trial_id] = LoggedTrial(
                view.trial_id, view.trial_name, view.local_path, view.init_local_path
            )
        return trial

    def start(self, view: Any) -> None:
        """``view`` (a `callbacks.TrialView`) starts: Tune's ``log_trial_start``."""
        trial, config = self._trial(view), tabular(view.config)

        def task() -> None:
            trial.config = config
            self._each(lambda logger: logger.log_trial_start(trial))

        self._submit(task)

    def result(self, iteration: int, view: Any, row: dict[str, Any]) -> None:
        """A result of ``view``'s: Tune's ``log_trial_result`` (which opens
        the trial's files if it had no start, a trial of an earlier driver)."""
        config = None if view.trial_id in self._trials else tabular(view.config)
        trial = self._trial(view)
        self._handed_results += 1

        def task() -> None:
            if config is not None:
                trial.config = config
            shown = tabular(row)
            self._each(lambda logger: logger.log_trial_result(iteration, trial, shown))
            self._written_results += 1

        self._submit(task)

    def end(self, view: Any, failed: bool) -> None:
        """``view`` ended: Tune's ``log_trial_end`` (its hparams written with its searched values)."""
        trial = self._trials.get(view.trial_id)
        if trial is None:
            return
        params = view.evaluated_params

        def task() -> None:
            trial.evaluated_params = params
            self._each(lambda logger: logger.log_trial_end(trial, failed=failed))

        self._submit(task)

    def then(self, task: Callable[[], None]) -> None:
        """Run ``task`` on the thread once what was handed over before it is written."""
        self._submit(task)
        self._hand_over()

    def batch_done(self) -> None:
        """One poll handed over: flush its writes. The loop waits here only
        when `MOST_PENDING_RESULTS` are still to write."""
        self._submit(lambda: self._each(lambda logger: logger.flush_batch()))
        self._hand_over()
        if self._handed_results - self._written_results > MOST_PENDING_RESULTS:
            self.drain()
        self.raise_error()

    def written(self) -> None:
        """Wait until everything handed over is written and flushed: a
        callback on the loop reads the trials' log files as Tune's loop
        leaves them (MLflow's ``save_artifact`` uploads the folder)."""
        self._submit(lambda: self._each(lambda logger: logger.flush_batch()))
        self.drain()
        self.raise_error()

    def drain(self) -> None:
        """Wait until everything handed over is written."""
        self._hand_over()
        if self._thread is not None:
            self._queue.join()

    def close(self) -> None:
        """Write what is left, then end the thread."""
        self._hand_over()
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
            self._thread = None
