"""Experiment directories read back: ``stagetree status``, ``show`` and ``ls``.

Only what the study writes as JSON and Parquet is read, never its pickles,
so looking at a directory runs no code from it: the status file its driver
writes from the study's start to its end (``stagetree_status.json``: every
trial's status as the progress line shows it, the study's state), each trial folder's
``params.json`` (the config), ``result.json`` (one row per result, ``done``
on the last one of a trial that ended) and ``error.txt``; the search plan
in ``plan/`` (written when a study ends: its timings say what was trained);
and ``stagetree_job.json``, the spec ``stagetree run`` started it from
(metric and mode). A running study's folders are read as they stand.
"""

from __future__ import annotations

import dataclasses
import json
import math
import posixpath
import time
from typing import Any

from ray.tune.result import EXPR_ERROR_FILE

from ray_stagetree.execution.study_file import (
    ENDED_STUDY,
    JOB_FILE,
    recorded_trials,
    stored_metric_and_mode,
    stored_status,
)
from ray_stagetree.planning.cost import CostModel
from ray_stagetree.planning.filesystems import resolve
from ray_stagetree.planning.lifecycle import ENDED, ERROR, PENDING, TERMINATED
from ray_stagetree.planning.plan import SearchPlan
from ray_stagetree.runtime.control.experiment_state import TUNER_FILE
from ray_stagetree.runtime.driver.callbacks import RESULT_FILE
from ray_stagetree.sequences import from_json, is_sequence_spec
from ray_stagetree.validation import is_number

PLAN_FOLDER = "plan"
PARAMS_FILE = "params.json"
# A trial folder whose trial neither ended nor waits for its first result: running, or interrupted.
UNFINISHED = "UNFINISHED"


@dataclasses.dataclass
class TrialRecord:
    """One trial folder: its config, last result and how it stands."""

    dirname: str
    config: dict[str, Any]
    last: dict[str, Any]  # the last row of result.json ({} before the first result)
    error: str | None
    updated: float  # when its results were last written (epoch seconds), 0 without results
    requested: int | None = None  # the iteration the saved plan requests it up to (None: no plan, or not in it)
    recorded: str | None = None  # its status in the study's status file (None: the file does not list it)
    recorded_iterations: int = 0

    @property
    def status(self) -> str:
        """As the study's status file records it (the progress line's words:
        RUNNING only while a worker trains it, UNFINISHED in a study stopped
        before its end); in a folder without one (written by an earlier
        version), from the folder: TERMINATED (ended: its horizon, a stopper or its scheduler), ERROR
        (its error.txt stays after a restore that finished it, which its last
        result then says), PENDING (no result yet) or UNFINISHED (running now,
        or stopped by an interruption that `stagetree restore` continues).

        A trial a scheduler stopped reports no ``done``: the plan, written when
        the study ends or is interrupted, requests no more of it than it reported."""
        if self.recorded is not None:
            return self.recorded
        if self.last.get("done"):
            return TERMINATED
        if self.error is not None:
            return ERROR
        if not self.last:
            return PENDING
        stopped = self.requested is not None and self.requested <= self.iterations
        return TERMINATED if stopped else UNFINISHED

    @property
    def iterations(self) -> int:
        return max(int(self.last.get("training_iteration", 0)), self.recorded_iterations)


@dataclasses.dataclass
class Experiment:
    """An experiment directory as it stands."""

    path: str
    trials: list[TrialRecord]
    job: dict[str, Any] | None  # stagetree_job.json, when stagetree run started it
    plan: SearchPlan | None  # None until the study's end wrote it
    plan_updated: float
    stored_ranking: tuple[str | None, str | None] = (None, None)  # the study's metric and mode, as stored
    status_record: dict[str, Any] = dataclasses.field(default_factory=dict)  # its status file ({}: none)

    @property
    def state(self) -> str | None:
        """The study's state as its driver last wrote it ("running", "ended",
        "interrupted", "failed"); None in a folder without a status file."""
        return self.status_record.get("state")

    @property
    def started(self) -> float:
        """When its driver last started it (epoch seconds): ``stagetree status``'s latest study."""
        return float(self.status_record.get("started") or self.last_update)

    @property
    def ended(self) -> bool:
        """Its driver says it ended; in a folder without a status file: the
        study's end wrote its plan, every trial folder's trial ended and so
        did every trial the plan holds (one drawn but not started has no folder)."""
        if self.status_record:
            return self.state == ENDED_STUDY
        if self.plan is None or any(trial.status not in ENDED for trial in self.trials):
            return False
        return set(self.plan.trials) <= {trial.last.get("trial_id") for trial in self.trials}

    @property
    def last_update(self) -> float:
        """When the study last wrote anything (epoch seconds; 0 when nothing yet)."""
        return max(
            [trial.updated for trial in self.trials] + [self.plan_updated, self.status_record.get("updated", 0.0)]
        )

    def counts(self) -> dict[str, int]:
        counts: dict[str, int] = {}
        for trial in self.trials:
            counts[trial.status] = counts.get(trial.status, 0) + 1
        return counts

    def metric_and_mode(self, metric: str | None = None, mode: str | None = None) -> tuple[str | None, str | None]:
        """The given ones, else the study's own (its ``TuneConfig``'s, as the
        monitor reads them); None where neither says."""
        stored_metric, stored_mode = self.stored_ranking
        return metric or stored_metric, mode or stored_mode

    def best(self, metric: str | None, mode: str | None) -> TrialRecord | None:
        """The trial whose last ``metric`` is best, as ``ResultGrid.get_best_result`` ranks by default
        (Tune's scope "last"); None without a metric and a mode."""
        if metric is None or mode is None:
            return None
        scored = [
            trial for trial in self.trials if is_number(value := trial.last.get(metric)) and not math.isnan(value)
        ]
        if not scored:
            return None
        sign = 1 if mode == "max" else -1
        return max(scored, key=lambda trial: sign * trial.last[metric])

    def trained(self) -> tuple[int, float] | None:
        """Iterations trained (each shared one once) and the seconds they took,
        from the plan's metrics; None before the study's end wrote its plan."""
        if self.plan is None:
            return None
        times = [seconds for _, _, seconds in iteration_times(self.plan)]
        return sum(len(node.metrics) for node in self.plan.nodes), sum(times)


def iteration_times(plan: SearchPlan) -> list[tuple[Any, int, float]]:
    """``(node, iteration, seconds)`` of every iteration the plan has a result for,
    from the ``time_this_iter_s`` reported with it."""
    return [
        (node, iteration, float(metrics["time_this_iter_s"]))
        for node in plan.nodes
        for iteration, metrics in node.metrics.items()
        if isinstance(metrics.get("time_this_iter_s"), (int, float))
    ]


def cost_model(plan: SearchPlan) -> CostModel:
    """A `CostModel` fitted to what an ended study's iterations took: the
    plan's stage timings, or, in a plan saved before the runtime recorded
    them, each iteration's ``time_this_iter_s`` as a one-iteration timing
    (added to ``plan``).

    Raises ValueError when the plan has no timed iteration."""
    if not plan.timings:
        for node, iteration, seconds in iteration_times(plan):
            plan.record_timing(node.node_id, iteration - 1, iteration, seconds)
    if not plan.timings:
        raise ValueError("the study's plan has no timed iteration (no time_this_iter_s in its results)")
    return CostModel().fit(plan)


def is_experiment(filesystem: Any, path: str) -> bool:
    return filesystem.isfile(posixpath.join(path, TUNER_FILE)) or filesystem.isfile(posixpath.join(path, JOB_FILE))


def read_experiment(path: str) -> Experiment:
    """The experiment at ``path`` (a local path or any fsspec URL).

    Raises FileNotFoundError when ``path`` is not a ray_stagetree experiment directory."""
    filesystem, root = resolve(path)
    root = root.rstrip("/") or "/"
    if not is_experiment(filesystem, root):
        raise FileNotFoundError(
            f"{path!r} is not a ray_stagetree experiment directory (no {TUNER_FILE} or {JOB_FILE} in it)"
            + ("; does not exist" if not filesystem.exists(root) else "")
        )
    trials = []
    for entry in sorted(filesystem.ls(root, detail=True), key=lambda entry: entry["name"]):
        folder = entry["name"].rstrip("/")
        if entry["type"] == "directory" and filesystem.isfile(posixpath.join(folder, PARAMS_FILE)):
            trials.append(_trial(filesystem, folder))
    job = _json(filesystem, posixpath.join(root, JOB_FILE))
    plan_path = posixpath.join(root, PLAN_FOLDER)
    plan, plan_updated = None, 0.0
    if filesystem.isdir(plan_path) and filesystem.ls(plan_path):
        try:
            plan = SearchPlan.load(path.rstrip("/") + "/" + PLAN_FOLDER)
        except FileNotFoundError:  # the study is writing its first snapshot, table by table
            plan = None
    if plan is not None:
        plan_updated = max(_modified(filesystem, name) for name in filesystem.ls(plan_path, detail=False))
        for trial in trials:
            record = plan.trials.get(trial.last.get("trial_id"))
            trial.requested = None if record is None else record.request.iteration
    ranking = stored_metric_and_mode(filesystem, root)
    status = stored_status(filesystem, root)
    _record_statuses(trials, recorded_trials(status))
    return Experiment(
        path=path,
        trials=trials,
        job=job,
        plan=plan,
        plan_updated=plan_updated,
        stored_ranking=ranking,
        status_record=status,
    )


def _record_statuses(trials: list[TrialRecord], recorded: dict[str, dict[str, Any]]) -> None:
    """Each trial's status as the status file records it (`recorded_trials`);
    a trial it lists without a folder yet (admitted, never started) is listed too."""
    by_folder = {trial.dirname: trial for trial in trials}
    for dirname, entry in recorded.items():
        trial = by_folder.get(dirname)
        if trial is None:
            trial = by_folder[dirname] = TrialRecord(dirname, {}, {}, None, 0.0)
            trials.append(trial)
        trial.recorded = str(entry.get("status"))
        trial.recorded_iterations = int(entry.get("iterations") or 0)


def list_experiments(storage_path: str) -> list[Experiment]:
    """The experiments directly under ``storage_path``, the one started last at the end.

    Raises FileNotFoundError when ``storage_path`` does not exist."""
    filesystem, root = resolve(storage_path)
    if not filesystem.isdir(root):
        raise FileNotFoundError(f"{storage_path!r} is not a folder")
    found = [
        read_experiment(f"{storage_path.rstrip('/')}/{posixpath.basename(name.rstrip('/'))}")
        for name in filesystem.ls(root, detail=False)
        if filesystem.isdir(name) and is_experiment(filesystem, name.rstrip("/"))
    ]
    return sorted(found, key=lambda experiment: experiment.started)


def config_text(config: dict[str, Any]) -> str:
    """A config on one line, sequences as their constructor calls."""

    def shown(value: Any) -> Any:
        if is_sequence_spec(value):
            return from_json(value)
        if isinstance(value, dict):
            return {key: shown(item) for key, item in value.items()}
        return value

    return ", ".join(f"{key}={shown(value)!r}" for key, value in config.items())


def age(seconds_since_epoch: float) -> str:
    """How long ago, as 12s, 5m or 3h ("never" for 0: nothing written yet)."""
    if seconds_since_epoch <= 0:
        return "never"
    seconds = max(0.0, time.time() - seconds_since_epoch)
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{seconds / size:.0f}{unit} ago"
    return f"{seconds:.0f}s ago"


def _trial(filesystem: Any, folder: str) -> TrialRecord:
    config = _json(filesystem, posixpath.join(folder, PARAMS_FILE)) or {}
    result_path = posixpath.join(folder, RESULT_FILE)
    last: dict[str, Any] = {}
    updated = 0.0
    if filesystem.isfile(result_path):
        with filesystem.open(result_path, "r") as file:
            rows = [line for line in file.read().splitlines() if line.strip()]
        for line in reversed(rows):  # a line being written may be cut short
            try:
                last = json.loads(line)
                break
            except json.JSONDecodeError:
                continue
        updated = _modified(filesystem, result_path)
    error = None
    error_path = posixpath.join(folder, EXPR_ERROR_FILE)
    if filesystem.isfile(error_path):
        with filesystem.open(error_path, "r") as file:
            lines = file.read().strip().splitlines()
        error = lines[-1] if lines else "error"
    return TrialRecord(posixpath.basename(folder), config, last, error, updated)


def _json(filesystem: Any, path: str) -> dict[str, Any] | None:
    if not filesystem.isfile(path):
        return None
    with filesystem.open(path, "r") as file:
        return json.load(file)


def _modified(filesystem: Any, path: str) -> float:
    modified = filesystem.modified(path)
    return modified.timestamp()
