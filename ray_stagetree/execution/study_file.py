"""The study's metric and mode, and its status as it runs, in JSON at its
experiment root, for readers that never unpickle (the monitor, ``stagetree
status / show / ls``).

The Tuner's settings are pickled (``stagetree_tuner.pkl``): a reader of a
folder it did not write must not load them. So the Tuner also writes
``stagetree_study.json`` with what those readers rank trials by; an
experiment from before that file was written still has the job spec
``stagetree run`` saved (``stagetree_job.json``), whose ``tune_config`` says the same.
"""

from __future__ import annotations

import json
import posixpath
from typing import Any

#: The study's metric and mode, written by the Tuner.
STUDY_FILE = "stagetree_study.json"
#: The spec a study was started from, at its experiment root (written by ``stagetree run``).
JOB_FILE = "stagetree_job.json"


def study_record(metric: str | None, mode: str | None) -> str:
    """The study file's text for a study ranked by ``metric`` in ``mode``."""
    return json.dumps({"metric": metric, "mode": mode}, indent=2)


def stored_metric_and_mode(filesystem: Any, root: str) -> tuple[str | None, str | None]:
    """The metric and mode the study at ``root`` (in the fsspec ``filesystem``)
    was started with: its study file, else its job spec's ``tune_config``;
    (None, None) where neither says."""
    study = _json(filesystem, posixpath.join(root, STUDY_FILE))
    if study.get("metric") or study.get("mode"):
        return study.get("metric"), study.get("mode")
    spec = _json(filesystem, posixpath.join(root, JOB_FILE)).get("spec")
    tune_config = spec.get("tune_config") if isinstance(spec, dict) else None
    if not isinstance(tune_config, dict):
        return None, None
    return tune_config.get("metric"), tune_config.get("mode")


#: The study's state as it runs, written by its driver (`runtime.driver.status_file`).
STATUS_FILE = "stagetree_status.json"
#: The study's own state in its status file.
RUNNING_STUDY, ENDED_STUDY, INTERRUPTED_STUDY, FAILED_STUDY = "running", "ended", "interrupted", "failed"
#: A trial of an interrupted (or failed) study that had not ended: a restore continues it.
UNFINISHED = "UNFINISHED"


def status_record(started: float, updated: float, state: str, trials: dict[str, dict[str, Any]]) -> str:
    """The status file's text: when the study's driver started and last wrote
    it (epoch seconds), the study's state, and each trial's folder, status and
    iterations, by trial id."""
    return json.dumps({"started": started, "updated": updated, "state": state, "trials": trials})


def recorded_trials(status: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The trials a status record lists, by folder: each entry's ``status``
    and ``iterations`` (entries without a folder name are left out)."""
    trials = status.get("trials", {})
    return {
        entry["dirname"]: entry
        for entry in (trials.values() if isinstance(trials, dict) else ())
        if isinstance(entry, dict) and isinstance(entry.get("dirname"), str) and "status" in entry
    }


def stored_status(filesystem: Any, root: str) -> dict[str, Any]:
    """The status file of the study at ``root``; {} without one (a study
    from before it was written, or a folder being made)."""
    return _json(filesystem, posixpath.join(root, STATUS_FILE))


def _json(filesystem: Any, path: str) -> dict[str, Any]:
    """The JSON object in ``path``; {} when it is missing or unreadable (a
    study being written, a folder from another version)."""
    try:
        with filesystem.open(path, "r") as file:
            value = json.load(file)
    except (OSError, ValueError):
        return {}
    return value if isinstance(value, dict) else {}
