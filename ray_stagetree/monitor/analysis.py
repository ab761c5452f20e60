"""The monitor's study-wide views, as plain JSON-able data (`view` reads the
trials and the plan; this module turns them into what the page draws):

* `best_so_far`: the best result of the trials ended so far, in the order
  they ended (by wall time and by count), in the study's mode;
* `parallel_coordinates`: one axis per hyper-parameter that varies (a
  sequence by its own parameters: MultiStep's ``init``, ``milestones``,
  ``gamma``; choices and lists on categorical axes), one line per trial;
* `importance`: how much each hyper-parameter explains the metric (see
  `importance` for the method, which the page names);
* `curves`: the learning curves the page asked for;
* `timeline`: the stage batches each worker ran, with their stages,
  checkpoints and where each started from (a fork or a checkpoint).
"""

from __future__ import annotations

import functools
import json
import math
import re
from typing import Any

from ray_stagetree.sequences import is_sequence_spec
from ray_stagetree.validation import is_finite_number

#: Importance needs at least this many trials with a result.
MIN_TRIALS_FOR_IMPORTANCE = 3
#: The random forest's size: enough for stable ranks on a few hundred trials, fast enough to poll.
FOREST_TREES = 64
RANDOM_FOREST = (
    "random-forest impurity importance (scikit-learn, {trees} trees) of each hyper-parameter for the last "
    "{metric}: an fANOVA-like share of the variance each explains"
)
RANK_CORRELATION = (
    "|Spearman rank correlation| of each hyper-parameter with the last {metric} (scikit-learn is not "
    "installed; categories ordered by their mean), normalised to sum to 1"
)


def _last(trial: dict[str, Any], metric: str | None) -> float | None:
    values = [row[metric] for row in trial["rows"] if metric in row]
    return values[-1] if values else None


def best_so_far(trials: list[dict[str, Any]], metric: str | None, mode: str) -> list[dict[str, Any]]:
    """One point per ended trial (finished or errored, with a result), in the
    order they ended: ``trial``, ``at`` (seconds from the study's first
    result to the trial's last), ``count`` (trials ended so far), ``value``
    (its last result, Tune's scope "last") and ``best`` (the best of those so far)."""
    stamps = [t for trial in trials for t in trial.get("times", ()) if t is not None]
    start = min(stamps) if stamps else None
    ended = []
    for trial in trials:
        value = _last(trial, metric)
        if value is None or not (trial["done"] or trial["error"]):
            continue
        times = [t for t in trial.get("times", ()) if t is not None]
        ended.append((times[-1] if times else math.inf, trial["name"], value))
    ended.sort()
    points, best = [], None
    for count, (at, name, value) in enumerate(ended, start=1):
        if best is None or (value > best if mode == "max" else value < best):
            best = value
        seconds = None if start is None or at == math.inf else round(at - start, 3)
        points.append({"trial": name, "at": seconds, "count": count, "value": value, "best": best})
    return points


def hyperparameters(config: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    """A trial's config as named scalar parameters: a sequence by its own
    parameters (``lr.init``, ``lr.milestones``, ``lr.gamma``; ``lr.family``
    too), a sequence inside one by its parameters in turn (``lr.func.init``;
    a `Concat`'s parts as ``lr.parts.0.init``), a nested dict by ``a/b``;
    any other list stays a list (a categorical value)."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if is_sequence_spec(value):
            out.update(_sequence_parameters(name, value))
        elif isinstance(value, dict):
            out.update(hyperparameters(value, f"{name}/"))
        else:
            out[name] = value
    return out


def _sequence_parameters(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for part, inner in spec.items():
        if inner is None:
            continue
        if is_sequence_spec(inner):
            out.update(_sequence_parameters(f"{name}.{part}", inner))
        elif isinstance(inner, list) and any(is_sequence_spec(item) for item in inner):
            for index, item in enumerate(inner):
                if is_sequence_spec(item):
                    out.update(_sequence_parameters(f"{name}.{part}.{index}", item))
                else:
                    out[f"{name}.{part}.{index}"] = item
        else:
            out[f"{name}.{part}"] = inner
    return out


#: The most characters of a legend label (`legend_labels`).
LABEL_WIDTH = 48


def legend_labels(trials: list[dict[str, Any]], width: int = LABEL_WIDTH) -> dict[str, str]:
    """Each trial's label in a legend, by its folder name: its short id (the
    trial's index in the study) and the parameters whose values differ
    between ``trials`` (``lr.milestones=[30]``), cut to ``width`` characters;
    what the trials share is left out, so the labels of a plot tell its lines apart."""
    params = {trial["name"]: hyperparameters(trial["config"]) for trial in trials}
    names = sorted({name for values in params.values() for name in values})
    differing = [name for name in names if len({_category(values.get(name)) for values in params.values()}) > 1]
    labels = {}
    for trial in trials:
        values = params[trial["name"]]
        shown = ", ".join(f"{name}={_category(values[name])}" for name in differing if name in values)
        label = f"{short_id(trial['name'])} {shown}".strip()
        labels[trial["name"]] = label if len(label) <= width else label[: width - 1] + "\u2026"
    return labels


def short_id(folder: str) -> str:
    """A trial folder's short name: the index Tune numbers trials with
    (``train_fn_1e9e0_00003_3_lr=...`` gives ``#3``), else its first characters."""
    found = re.search(r"_(\d{5})(?:_|$)", folder)
    return f"#{int(found.group(1))}" if found else folder[:16]


def _category(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, sort_keys=True)


def parallel_coordinates(trials: list[dict[str, Any]], metric: str | None) -> dict[str, Any]:
    """``axes``: each hyper-parameter that takes more than one value (all of
    them if none varies), as ``{"name", "kind": "number", "low", "high",
    "log"}`` or ``{"name", "kind": "category", "categories"}``; ``rows``: per
    trial, ``trial``, ``values`` (a number, or a category's index, per axis)
    and ``metric`` (its last result, or None)."""
    params = [(trial, hyperparameters(trial["config"])) for trial in trials]
    names = sorted({name for _, values in params for name in values})
    axes = []
    for name in names:
        seen = [values[name] for _, values in params if name in values]
        distinct = {_category(value) for value in seen}
        if len(distinct) < 2 and len(names) > 1:
            continue
        if all(is_finite_number(value) for value in seen):
            low, high = min(seen), max(seen)
            log = low > 0 and high / low >= 100
            axes.append({"name": name, "kind": "number", "low": low, "high": high, "log": log})
        else:
            axes.append({"name": name, "kind": "category", "categories": sorted(distinct, key=_category_order)})
    rows = []
    for trial, values in params:
        row = []
        for axis in axes:
            value = values.get(axis["name"])
            if value is None:
                row.append(None)
            elif axis["kind"] == "number":
                row.append(value)
            else:
                row.append(axis["categories"].index(_category(value)))
        rows.append({"trial": trial["name"], "values": row, "metric": _last(trial, metric)})
    return {"axes": axes, "rows": rows}


def _category_order(text: str) -> tuple[int, float, str]:
    """Numbers (as JSON text) in numeric order, before any other value."""
    try:
        return (0, float(text), text)
    except ValueError:
        return (1, 0.0, text)


def importance(parallel: dict[str, Any], metric: str | None) -> dict[str, Any]:
    """Each axis of `parallel_coordinates`' share in explaining the metric,
    summing to 1, most important first, and the ``method`` used: a random
    forest's impurity importance when scikit-learn is installed (a
    dependency of StructuredBO; fANOVA-lite: the share of the metric's
    variance a forest's splits on the parameter remove), else the absolute
    Spearman rank correlation. Needs `MIN_TRIALS_FOR_IMPORTANCE` trials with
    a result; ``params`` is empty (and ``reason`` says why) before. A
    parameter a trial lacks (a Warmup's ``period`` in a trial whose learning
    rate is a MultiStep) is a level of its own, below all its values: trials
    of several families still count."""
    axes = parallel["axes"]
    rows = [row for row in parallel["rows"] if row["metric"] is not None]
    try:
        import sklearn.ensemble  # noqa: F401

        method = RANDOM_FOREST.format(trees=FOREST_TREES, metric=metric)
        forest = True
    except ImportError:
        method = RANK_CORRELATION.format(metric=metric)
        forest = False
    result: dict[str, Any] = {"method": method, "trials": len(rows), "params": [], "reason": None}
    if not axes:
        result["reason"] = "no hyper-parameters"
        return result
    if len(rows) < MIN_TRIALS_FOR_IMPORTANCE:
        result["reason"] = f"{len(rows)} trial(s) with a result: importance needs {MIN_TRIALS_FOR_IMPORTANCE}"
        return result
    names = tuple(axis["name"] for axis in axes)
    absent = [_below_every_value(axis) for axis in axes]
    features = tuple(
        tuple(float(level if value is None else value) for value, level in zip(row["values"], absent)) for row in rows
    )
    target = tuple(float(row["metric"]) for row in rows)
    scores = (_forest_importance if forest else _rank_importance)(features, target)
    total = sum(scores)
    shares = [score / total if total > 0 else 0.0 for score in scores]
    result["params"] = sorted(
        ({"name": name, "importance": round(share, 4)} for name, share in zip(names, shares)),
        key=lambda item: -item["importance"],
    )
    return result


def _below_every_value(axis: dict[str, Any]) -> float:
    if axis["kind"] == "number":
        return axis["low"] - (axis["high"] - axis["low"]) - 1.0
    return -1.0  # category indices start at 0


@functools.lru_cache(maxsize=8)
def _forest_importance(features: tuple[tuple[float, ...], ...], target: tuple[float, ...]) -> list[float]:
    """Cached: the page polls every 2 s and the trials rarely change between polls."""
    from sklearn.ensemble import RandomForestRegressor

    if len(set(target)) < 2:
        return [0.0] * len(features[0])
    forest = RandomForestRegressor(n_estimators=FOREST_TREES, random_state=0, min_samples_leaf=1)
    forest.fit([list(row) for row in features], list(target))
    return [float(value) for value in forest.feature_importances_]


def _ranks(values: list[float]) -> list[float]:
    """Average ranks (ties share theirs)."""
    order = sorted(range(len(values)), key=lambda i: values[i])
    ranks = [0.0] * len(values)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and values[order[j + 1]] == values[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2
        i = j + 1
    return ranks


def _rank_importance(features: tuple[tuple[float, ...], ...], target: tuple[float, ...]) -> list[float]:
    y = _ranks(list(target))
    scores = []
    for column in zip(*features):
        x = _ranks(list(column))
        mx, my = sum(x) / len(x), sum(y) / len(y)
        sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
        sxx, syy = sum((a - mx) ** 2 for a in x), sum((b - my) ** 2 for b in y)
        scores.append(abs(sxy) / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else 0.0)
    return scores


def curves(
    trials: list[dict[str, Any]], metric: str | None, names: list[str] | None = None, limit: int | None = None
) -> list[dict[str, Any]]:
    """``metric`` by iteration, ``{"trial", "label", "points": [[iteration, value], ...]}``,
    of the trials ``names`` (in that order; all of them if None), at most
    ``limit``; ``label`` tells the curves shown apart (`legend_labels`)."""
    by_name = {trial["name"]: trial for trial in trials}
    chosen = ([by_name[name] for name in names if name in by_name] if names is not None else trials)[:limit]
    labels = legend_labels(chosen)
    out = []
    for trial in chosen:
        points = [
            [row.get("training_iteration", i + 1), row[metric]] for i, row in enumerate(trial["rows"]) if metric in row
        ]
        out.append({"trial": trial["name"], "label": labels[trial["name"]], "points": points})
    return out


def stage_ids(stages: list[dict[str, Any]], node: int, start: int, stop: int) -> list[str]:
    """The ids of ``stages`` that ``[start, stop)`` of ``node`` trains through."""
    return [s["id"] for s in stages if s["node"] == node and s["start"] < stop and start < s["stop"]]


def _pieces(stages: list[dict[str, Any]], node: int, start: int, stop: int) -> list[dict[str, Any]]:
    """``[start, stop)`` of ``node`` cut where its stages are, each piece with
    the id of its stage (``stages`` empty: one piece, named by its range)."""
    cuts = sorted({start, stop} | {s[k] for s in stages if s["node"] == node for k in ("start", "stop")})
    cuts = [at for at in cuts if start <= at <= stop]
    pieces = []
    for a, b in zip(cuts, cuts[1:]):
        ids = stage_ids(stages, node, a, b)
        pieces.append({"node": node, "start": a, "stop": b, "stages": ids or [f"H{node}:{a}-{b}"]})
    return pieces


def timeline(
    records: dict[str, list[dict[str, Any]]] | None,
    running: list[dict[str, Any]],
    stages: list[dict[str, Any]],
    now: float,
) -> dict[str, Any]:
    """Each worker's stage batches over wall time, from the plan's ``runs``
    (`SearchPlan.record_run`) and the ``running`` batches of a live study:
    ``runs`` of ``{"worker", "batch", "began", "ended" (now for a running
    one), "outcome" ("done", "failed", "released", "running"), "phases"
    ({phase: seconds}, `runtime.workers.phases`; empty while running),
    "segments": [{"node", "start", "stop", "stages"}] (cut where the
    stage tree's stages are: one id each), "checkpoints":
    [[node, iteration, time]], "source": {"worker", "time", "kind"} or
    None}``: where the batch started from, the run that trained that
    iteration (``kind`` "fork" when it is a parent node's, "continue" when
    its own node's). ``recorded`` is False for a plan saved before runs were
    recorded."""
    rows = list(records.get("runs", ())) if records is not None else []
    runs = []
    for row in rows:
        segments = row["segments"] if isinstance(row["segments"], list) else json.loads(row["segments"])
        phases = row.get("phases") or {}
        runs.append(
            {
                "worker": row["worker"],
                "batch": row["batch_id"],
                "began": row["began"],
                "ended": row["ended"],
                "outcome": row["outcome"],
                "segments": segments,
                "phases": phases if isinstance(phases, dict) else json.loads(phases),
            }
        )
    for batch in running:
        if "began" in batch:
            runs.append(
                {
                    "worker": batch.get("worker", 0),
                    "batch": batch["batch"],
                    "began": batch["began"],
                    "ended": max(now, batch["began"]),
                    "outcome": "running",
                    "segments": batch["segments"],
                }
            )
    runs.sort(key=lambda run: (run["began"], run["worker"]))
    nodes = {row["node_id"]: row for row in records["nodes"]} if records is not None else {}
    checkpoints = [(row["node_id"], row["step"]) for row in records["checkpoints"]] if records is not None else []

    def time_at(run: dict[str, Any], node: int, iteration: int) -> float | None:
        """When ``run`` finished ``iteration`` of ``node`` (iterations taken as equally long)."""
        total = sum(stop - start for _, start, stop in run["segments"]) or 1
        done = 0
        for seg_node, start, stop in run["segments"]:
            if seg_node == node and start < iteration <= stop:
                done += iteration - start
                return run["began"] + (run["ended"] - run["began"]) * done / total
            done += stop - start
        return None

    out = []
    for index, run in enumerate(runs):
        marks = []
        for node, iteration in checkpoints:
            at = time_at(run, node, iteration)
            if at is not None:
                marks.append([node, iteration, at])
        source = None
        if run["segments"]:
            node, start, _ = run["segments"][0]
            row = nodes.get(node)
            if start > 0 and row is not None:
                origin, kind = (node, "continue") if start > row["fork_step"] else (row["parent_id"], "fork")
                if origin is not None:
                    for earlier in reversed(runs[:index]):
                        at = time_at(earlier, origin, start)
                        if at is not None:
                            source = {"worker": earlier["worker"], "time": at, "kind": kind}
                            break
        out.append(
            {
                **run,
                "segments": [piece for n, a, b in run["segments"] for piece in _pieces(stages, n, a, b)],
                "checkpoints": marks,
                "source": source,
            }
        )
    workers = sorted({run["worker"] for run in out})
    return {
        "runs": out,
        "workers": workers,
        "start": min((run["began"] for run in out), default=None),
        "end": max((run["ended"] for run in out), default=None),
        "recorded": records is not None and "runs" in records,
    }
