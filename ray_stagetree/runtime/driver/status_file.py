"""The study's state as ``stagetree status``, ``ls``, ``show`` and the
monitor read it from another process (`execution.study_file.STATUS_FILE`):
one record the driver writes when ``fit()`` starts (before any result), as
its trials change, and when it ends, so that what they say agrees with what
``fit()`` returns: the same trials, each counted once, in the status words
the progress line uses (RUNNING only while a worker trains the trial).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from ray_stagetree.execution.storage import CheckpointStorage
from ray_stagetree.execution.study_file import (
    FAILED_STUDY,
    INTERRUPTED_STUDY,
    RUNNING_STUDY,
    STATUS_FILE,
    UNFINISHED,
    status_record,
)
from ray_stagetree.planning.lifecycle import ENDED
from ray_stagetree.runtime.control.messages import Progress

logger = logging.getLogger("ray_stagetree")

#: A write of the status file while the study runs waits this many times as
#: long as the last one took: the writes keep under 5% of the driver's time.
WRITE_COST_FACTOR = 20


class StatusFile:
    """The status record of the study in ``experiment_path``, kept from the
    study's progress (`Progress.statuses`, ``rows``) and written to storage."""

    def __init__(self, experiment_path: str, storage_filesystem: Any = None, continues: bool = False) -> None:
        self._storage = CheckpointStorage(experiment_path, storage_filesystem)
        self.started = time.time()
        self.state = RUNNING_STUDY
        # Trial id -> dirname, status, iterations; a run that continues the folder's study (a restore,
        # `Study.evaluate`) keeps the trials the earlier runs recorded.
        self.trials: dict[str, dict[str, Any]] = self._recorded() if continues else {}
        self._written_at = 0.0
        self._write_seconds = 0.0
        self._refused = False
        self._behind = False  # changes not written yet (the last write was too recent for its cost)
        self.write()

    def update(self, progress: Progress) -> None:
        """One poll's changes: trials' statuses, and their iterations from the
        new rows; written when any changed (as often as its cost allows)."""
        for trial_id, (dirname, status) in progress.statuses.items():
            trial = self.trials.setdefault(trial_id, {"iterations": 0})
            trial["dirname"], trial["status"] = dirname, status
        for row in progress.rows:
            trial = self.trials.get(row.get("trial_id"))
            if trial is not None:
                trial["iterations"] = max(trial["iterations"], int(row.get("training_iteration", 0)))
        changed = bool(progress.statuses or progress.rows) or self._behind
        self._behind = changed and time.monotonic() - self._written_at < WRITE_COST_FACTOR * self._write_seconds
        if changed and not self._behind:
            self.write()

    def close(self, state: str) -> None:
        """The study ended (``ENDED_STUDY``), or its driver stopped it
        (``INTERRUPTED_STUDY``) or failed (``FAILED_STUDY``): a trial that
        had not ended is then UNFINISHED (a restore continues it). Once."""
        if self.state != RUNNING_STUDY:
            return
        self.state = state
        if state in (INTERRUPTED_STUDY, FAILED_STUDY):
            for trial in self.trials.values():
                if trial["status"] not in ENDED:
                    trial["status"] = UNFINISHED
        self.write()

    def _recorded(self) -> dict[str, dict[str, Any]]:
        try:
            trials = json.loads(self._storage.read_key(STATUS_FILE)).get("trials", {})
        except Exception:  # noqa: BLE001 - none yet, or unreadable: the run records its own
            return {}
        return trials if isinstance(trials, dict) else {}

    def write(self) -> None:
        began = time.monotonic()
        try:
            self._storage.write_text(STATUS_FILE, status_record(self.started, time.time(), self.state, self.trials))
        except Exception as error:  # each fsspec backend raises its own errors; the study goes on without it
            if not self._refused:
                self._refused = True
                logger.warning(
                    "storage refused the study's status file (%s: %s): stagetree status and the monitor read "
                    "the trial folders instead",
                    type(error).__name__,
                    error,
                )
        self._written_at = time.monotonic()
        self._write_seconds = self._written_at - began
