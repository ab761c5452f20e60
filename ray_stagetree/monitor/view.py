"""What the web monitor shows, as plain JSON-able data, read from a study's
experiment directory and, while the study runs, from its controller.

* **Trials** come from the trial folders Tune's loggers write (``params.json``,
  ``result.json``, ``error.txt``), so a finished study, a study another
  process is running and one this process runs all read the same way.
* **Stages** come from the search plan: the controller's plan while it runs
  (`StudyController.monitor_view`), else the plan the study saved (``plan/``,
  written when it ends). A plan node is cut into stages where children fork
  off it, as Algorithm 1 cuts it: each stage trained once, however many
  trials pass through it.
* **Workers** and running stages exist only while the controller does.

Nothing here unpickles: the directory may be one the user did not write.
"""

from __future__ import annotations

import functools
import json
import math
import posixpath
import time
from dataclasses import dataclass, field
from typing import Any

import pyarrow.fs as pafs
from ray.tune.result import AUTO_RESULT_KEYS, EXPR_ERROR_FILE, EXPR_PARAM_FILE, EXPR_RESULT_FILE

import ray_stagetree.planning.lifecycle as lifecycle
from ray_stagetree.execution.study_file import recorded_trials, stored_metric_and_mode, stored_status
from ray_stagetree.planning.config import TrialConfig
from ray_stagetree.planning.filesystems import arrow_filesystem, resolve
from ray_stagetree.planning.plan import SearchPlan
from ray_stagetree.sequences import from_json, is_sequence_spec
from ray_stagetree.validation import short

#: Keys of a result row that are bookkeeping, not metrics worth a column or a curve.
BOOKKEEPING = frozenset(AUTO_RESULT_KEYS) | {"trial_id", "done", "experiment_tag", "should_checkpoint"}
PLAN_FOLDER = "plan"
FINISHED, RUNNING, PENDING = "finished", "running", "pending"


@dataclass
class _TrialLog:
    """One trial folder's logs, parsed once per change in size."""

    size: int = -1
    config: dict[str, Any] = field(default_factory=dict)
    rows: list[dict[str, float]] = field(default_factory=list)
    times: list[float | None] = field(default_factory=list)  # each row's wall-clock "timestamp"
    done: bool = False


class ExperimentReader:
    """Reads a study's experiment directory (a path or any fsspec URL, or a
    path in ``storage_filesystem``) for the monitor, caching what has not changed."""

    def __init__(self, path: str, storage_filesystem: Any = None) -> None:
        if not isinstance(path, str) or not path:
            raise ValueError(f"path must be a study's experiment directory (a path or a URI), got {path!r}")
        self.path = path.rstrip("/")
        self._storage_filesystem = storage_filesystem
        self._fsspec, self.root = resolve(self.path, storage_filesystem)
        self.filesystem = arrow_filesystem(self._fsspec)
        info = self.filesystem.get_file_info(self.root)
        if info.type != pafs.FileType.Directory:
            raise FileNotFoundError(f"path {path!r} is not a directory: give a study's experiment directory")
        self._logs: dict[str, _TrialLog] = {}

    def stored_metric_and_mode(self) -> tuple[str | None, str | None]:
        """The metric and mode the study was started with (None where it had none)."""
        return stored_metric_and_mode(self._fsspec, self.root)

    def statuses(self) -> dict[str, str]:
        """Each trial's status by folder, as the study's status file records it
        (the progress line's words); {} without one (an earlier version's folder)."""
        recorded = recorded_trials(stored_status(self._fsspec, self.root))
        return {dirname: entry["status"] for dirname, entry in recorded.items()}

    def trials(self) -> list[dict[str, Any]]:
        """Each trial folder's ``name``, ``config``, ``rows`` (numeric metrics by
        iteration), ``done`` and ``error`` (``error.txt`` is there)."""
        listing = self.filesystem.get_file_info(pafs.FileSelector(self.root, recursive=False))
        trials = []
        for folder in sorted(
            (entry for entry in listing if entry.type == pafs.FileType.Directory), key=lambda e: e.path
        ):
            files = {
                posixpath.basename(entry.path): entry
                for entry in self.filesystem.get_file_info(pafs.FileSelector(folder.path, recursive=False))
            }
            if EXPR_PARAM_FILE not in files:  # plan/, checkpoints/: not a trial
                continue
            log = self._read_log(folder.path, files)
            trials.append(
                {
                    "name": posixpath.basename(folder.path),
                    "config": log.config,
                    "rows": log.rows,
                    "times": log.times,
                    "done": log.done,
                    "error": EXPR_ERROR_FILE in files,
                }
            )
        return trials

    def _read_log(self, folder: str, files: dict[str, pafs.FileInfo]) -> _TrialLog:
        results = files.get(EXPR_RESULT_FILE)
        size = results.size if results is not None else 0
        log = self._logs.get(folder)
        if log is not None and log.size == size:
            return log
        log = self._logs[folder] = _TrialLog(size=size, config=self._read_json(f"{folder}/{EXPR_PARAM_FILE}") or {})
        if results is None:
            return log
        with self.filesystem.open_input_stream(results.path) as stream:
            lines = stream.read().decode("utf-8", errors="replace").splitlines()
        for line in lines:
            try:
                row = json.loads(line)
            except ValueError:  # the line being written
                continue
            log.rows.append(_numbers(row))
            stamp = row.get("timestamp")
            log.times.append(float(stamp) if isinstance(stamp, (int, float)) and not isinstance(stamp, bool) else None)
            log.done = bool(row.get("done"))
        return log

    def _read_json(self, path: str) -> Any:
        try:
            with self.filesystem.open_input_stream(path) as stream:
                return json.loads(stream.read())
        except (OSError, ValueError):
            return None

    def plan_records(self) -> dict[str, list[dict[str, Any]]] | None:
        """The saved plan's records, or None before the study saved one."""
        url = f"{self.path}/{PLAN_FOLDER}"
        try:
            return SearchPlan.load(url, self._storage_filesystem).records()
        except FileNotFoundError:
            return None


def _numbers(row: dict[str, Any]) -> dict[str, float]:
    """A result row's finite numbers (metrics and ``training_iteration``)."""
    out = {}
    for key, value in row.items():
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value):
            if key == "training_iteration" or key not in BOOKKEEPING:
                out[key] = value
    return out


def default_metric(trials: list[dict[str, Any]]) -> str | None:
    """The first metric any trial reported, for a monitor not told which."""
    for trial in trials:
        for row in trial["rows"]:
            for key in row:
                if key != "training_iteration":
                    return key
    return None


def trial_table(
    trials: list[dict[str, Any]],
    metric: str | None,
    mode: str,
    live: dict[str, str],
    held: set[str] | None = None,
) -> list[dict]:
    """One row per trial: status, flattened config, iterations, latest
    ``metric`` (what ranks the trial, as Tune's ``get_best_result`` ranks by
    default: scope "last") and ``best``, its best at any iteration.

    ``live`` is a running study's status by trial folder; ``held`` the
    folders of the trials a worker is training now (their stage batch's):
    a trial the study admitted (RUNNING to its scheduler) that no worker
    holds is shown PENDING, waiting for a worker."""
    pick = max if mode == "max" else min
    table = []
    for trial in trials:
        values = [row[metric] for row in trial["rows"] if metric in row]
        if trial["name"] in live:
            status = live[trial["name"]]
            if status == lifecycle.RUNNING and held is not None and trial["name"] not in held:
                status = lifecycle.PENDING
        else:
            status = (  # a trial retried after a failure keeps its error.txt, as under Tune: `done` says it ended
                lifecycle.TERMINATED
                if trial["done"]
                else lifecycle.ERROR
                if trial["error"]
                else lifecycle.RUNNING
                if trial["rows"]
                else lifecycle.PENDING
            )
        table.append(
            {
                "name": trial["name"],
                "status": status,
                "config": _flat_config(trial["config"]),
                "iterations": int(trial["rows"][-1].get("training_iteration", len(trial["rows"])))
                if trial["rows"]
                else 0,
                "latest": values[-1] if values else None,
                "best": pick(values) if values else None,
            }
        )
    return table


def _flat_config(config: dict[str, Any], prefix: str = "") -> dict[str, str]:
    """A config as ``{"lr": "MultiStep(init=0.1, ...)", "optim/momentum": "0.9"}``."""
    out: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if is_sequence_spec(value):
            out[name] = _sequence_text(value)
        elif isinstance(value, dict):
            out.update(_flat_config(value, f"{name}/"))
        else:
            out[name] = json.dumps(value)
    return out


def _sequence_text(spec: dict[str, Any]) -> str:
    """A stored sequence as its constructor call; as JSON if this version cannot read it."""
    try:
        return repr(from_json(spec))
    except (ValueError, TypeError, KeyError):
        return json.dumps(spec, sort_keys=True)


def best_trials(trials: list[dict[str, Any]], metric: str | None, mode: str, count: int) -> list[dict[str, Any]]:
    """The ``count`` best trials by their latest ``metric``: the trials
    ``ResultGrid.get_best_result`` and ``stagetree status`` rank first
    (Tune's scope "last"), not those that peaked once."""
    scored = []
    for trial in trials:
        values = [row[metric] for row in trial["rows"] if metric in row]
        if values:
            scored.append((values[-1], trial))
    scored.sort(key=lambda item: item[0], reverse=mode == "max")
    return [trial for _, trial in scored[:count]]


def stage_tree(records: dict[str, list[dict[str, Any]]], running: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The plan's stages, parents before children: ``id`` ("H<node>:<start>-<stop>":
    an id names the same iterations for as long as the page shows it; a
    stage later cut where a trial forks becomes two new ids),
    ``parent`` (a stage id or None), ``node``, ``start``, ``stop``,
    ``status`` (finished / running / pending), ``checkpoints`` (stored iterations
    in ``(start, stop]``), ``trials`` (how many trials train through it) and
    ``hparams`` (the values at its first iteration). ``running`` lists the
    live batches' ``segments`` ``[node, start, stop]``."""
    # Rows as stored (`planning.persistence`): a "step" is an iteration, a "fork_step" a fork iteration.
    nodes = {row["node_id"]: row for row in records["nodes"]}
    trained: dict[int, int] = {}
    for row in records["metrics"]:
        trained[row["node_id"]] = max(trained.get(row["node_id"], 0), row["step"])
    checkpoints: dict[int, list[int]] = {}
    for row in records["checkpoints"]:
        checkpoints.setdefault(row["node_id"], []).append(row["step"])
    cuts: dict[int, set[int]] = {node_id: {row["fork_step"]} for node_id, row in nodes.items()}
    for node_id, row in nodes.items():
        if row["parent_id"] is not None:
            cuts[row["parent_id"]].add(row["fork_step"])
        if node_id in trained:
            cuts[node_id].add(trained[node_id])
    for row in records["trials"]:
        cuts[row["node_id"]].add(row["step"])
    live: dict[int, list[tuple[int, int]]] = {}
    for batch in running:
        for node_id, start, stop in batch["segments"]:
            live.setdefault(node_id, []).append((start, stop))
            cuts[node_id].update((start, stop))

    stages: dict[tuple[int, int], dict[str, Any]] = {}
    for node_id in sorted(nodes):
        row = nodes[node_id]
        points = sorted(at for at in cuts[node_id] if at >= row["fork_step"])
        previous = row["fork_step"]  # the start of the stage before, on this node
        for start, stop in zip(points, points[1:]):
            if start == row["fork_step"]:
                parent = (
                    None
                    if row["parent_id"] is None
                    else _stage_id(row["parent_id"], _stage_start(cuts, row["parent_id"], start), start)
                )
            else:
                parent = _stage_id(node_id, previous, start)
            if stop <= trained.get(node_id, row["fork_step"]):
                status = FINISHED
            elif any(s < stop and start < e for s, e in live.get(node_id, ())):
                status = RUNNING
            else:
                status = PENDING
            stages[node_id, start] = {
                "id": _stage_id(node_id, start, stop),
                "parent": parent,
                "node": node_id,
                "start": start,
                "stop": stop,
                "status": status,
                "checkpoints": sorted(s for s in checkpoints.get(node_id, ()) if start < s <= stop),
                "trials": 0,
                "hparams": _stage_hparams(row["config"], start),
            }
            previous = start
    by_node: dict[int, list[dict[str, Any]]] = {}
    for (node_id, _), stage in stages.items():
        by_node.setdefault(node_id, []).append(stage)
    for row in records["trials"]:  # each trial trains through its path's stages up to its request
        node_id, iteration = row["node_id"], row["step"]
        while node_id is not None:
            for stage in by_node.get(node_id, ()):
                if stage["start"] < iteration:
                    stage["trials"] += 1
            iteration, node_id = nodes[node_id]["fork_step"], nodes[node_id]["parent_id"]
    return list(stages.values())


@functools.lru_cache(maxsize=65536)
def _stage_hparams(config: str, start: int) -> dict[str, Any]:
    """A node's values at a stage's first iteration, from its stored config.
    Cached across the page's polls: plan nodes never change."""
    values = TrialConfig.from_json(json.loads(config)).hparams_at(start)
    return {name: _short(value) for name, value in values.items()}


def _stage_id(node_id: int, start: int, stop: int) -> str:
    return f"H{node_id}:{start}-{stop}"


def _stage_start(cuts: dict[int, set[int]], node_id: int, stop: int) -> int:
    """The start of the stage of ``node_id`` that ends at ``stop``."""
    return max(at for at in cuts[node_id] if at < stop)


def _short(value: Any) -> Any:
    return float(short(value)) if isinstance(value, float) else value


def sharing(
    records: dict[str, list[dict[str, Any]]] | None, executed: int | None, reached: int | None = None
) -> dict[str, Any]:
    """Iterations executed (trained once, shared or not) against trial by
    trial (every trial's iterations). From a saved plan, executed counts the
    iterations the plan holds metrics for.

    ``reached`` (the iterations the trials have reached so far) makes the
    figures partial, for a study that is running or did not finish: trial
    by trial then counts what the trials reached, not what they asked for
    (which a study still on its shared prefixes is far from), and
    ``partial`` says so."""
    if records is None:
        return {"executed": executed, "trial_by_trial": None, "saving": None, "partial": reached is not None}
    if executed is None:
        executed = len(records["metrics"])
    trial_by_trial = sum(row["step"] for row in records["trials"]) if reached is None else reached
    return {
        "executed": executed,
        "trial_by_trial": trial_by_trial,
        "saving": round(trial_by_trial / executed, 2) if executed else None,
        "partial": reached is not None,
    }


def study_state(
    reader: ExperimentReader,
    metric: str | None,
    mode: str,
    live_view: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Everything the page shows, as one JSON-able dict."""
    import ray_stagetree.monitor.analysis as analysis  # the module, not the package (it imports the server)

    now = time.time()
    trials = reader.trials()
    metric = metric or default_metric(trials)
    records = live_view["plan"] if live_view is not None else reader.plan_records()
    running = live_view["running"] if live_view is not None else []
    statuses = live_view["trials"] if live_view is not None else reader.statuses()
    held = {name for batch in running for name in batch.get("trials", ())} if live_view is not None else None
    table = trial_table(trials, metric, mode, statuses, held)
    stages = stage_tree(records, running) if records is not None else []
    workers = live_view["workers"] if live_view is not None else []
    for worker in workers:  # the stage ids of what each worker runs, as the tree and timeline name them
        worker["stages"] = [
            analysis.stage_ids(stages, node, start, stop) for node, start, stop in worker.get("segments", ())
        ]
    ended = all(row["status"] in (lifecycle.TERMINATED, lifecycle.ERROR) for row in table)
    partial = live_view is not None or not ended
    parallel = analysis.parallel_coordinates(trials, metric)
    return {
        "path": reader.path,
        "live": live_view is not None,
        "updated": now,
        "metric": metric,
        "mode": mode,
        "trials": table,
        "stages": stages,
        "plan_saved": records is not None,
        "workers": workers,
        "sharing": sharing(
            records,
            live_view["iterations"] if live_view is not None else None,
            sum(row["iterations"] for row in table) if partial else None,
        ),
        "history": analysis.best_so_far(trials, metric, mode),
        "parallel": parallel,
        "timeline": analysis.timeline(records, [w for w in workers if "batch" in w], stages, now),
    }
