"""Search plan persistence: one Parquet table per kind of record, via fsspec.

The tables pickle nothing: configurations are stored in their declarative
JSON form, so a plan written by one version can be read (and audited) by
anything that reads Parquet. Config values JSON cannot hold are stored there
as their `PickledValue` (fingerprint, type, repr), so a plan loads without
unpickling anything and keys such values as they were keyed. The objects
themselves go to a side file, ``objects.pkl`` (`OBJECTS_FILE`), read only
when asked (``load(..., objects=True)``): the runtime never asks (status,
show, the monitor, `Study`, a resumed plan); `Tuner.restore` takes them from
the study's snapshot, a pickle it trusts anyway. `SearchPlan.save` and `SearchPlan.load` call into this module,
which takes the plan as an argument and never imports it (no import circle).
Each table is written to a temporary name and moved into place,
so a crash mid-save leaves the previous table intact.
"""

from __future__ import annotations

import functools
import json
import pickle
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from ray_stagetree.planning.config import TrialConfig, share_key_of
from ray_stagetree.planning.filesystems import arrow_filesystem, resolve

try:  # pickles what the standard pickle refuses (a lambda, a class defined in __main__); Ray depends on it
    import cloudpickle as _pickler
except ImportError:  # pragma: no cover - the planning layer runs without it
    _pickler = pickle

FORMAT = "ray_stagetree.planning.plan"
#: The side file beside the tables with the objects of config values JSON cannot hold.
OBJECTS_FILE = "objects.pkl"
VERSION = 1

# The column names are older than the plan's vocabulary (the vocabulary rename): a
# "fork_step" is a node's fork iteration, a "step" an iteration, a "study" a
# share key. They stay as they are, so that plans saved before read the same
# and plans saved now read in the version before.
SCHEMAS = {
    "nodes": pa.schema(
        [
            ("node_id", pa.int64()),
            ("parent_id", pa.int64()),
            ("fork_step", pa.int64()),
            ("study", pa.string()),
            ("config", pa.string()),
        ]
    ),
    "trials": pa.schema(
        [
            ("trial_id", pa.string()),
            ("node_id", pa.int64()),
            ("step", pa.int64()),
            ("study", pa.string()),
            ("config", pa.string()),
        ]
    ),
    "checkpoints": pa.schema(
        [
            ("node_id", pa.int64()),
            ("step", pa.int64()),
            ("path", pa.string()),
            ("size_bytes", pa.int64()),
            ("checksum", pa.string()),
        ]
    ),
    "metrics": pa.schema([("node_id", pa.int64()), ("step", pa.int64()), ("metrics", pa.string())]),
    "timings": pa.schema(
        [("node_id", pa.int64()), ("start", pa.int64()), ("stop", pa.int64()), ("seconds", pa.float64())]
    ),
}
#: Tables a plan written before them lacks: read as empty.
OPTIONAL_SCHEMAS = {
    "runs": pa.schema(
        [
            ("batch_id", pa.int64()),
            ("worker", pa.int64()),
            ("segments", pa.string()),
            ("began", pa.float64()),
            ("ended", pa.float64()),
            ("outcome", pa.string()),
            ("phases", pa.string()),  # JSON {phase: seconds}; absent from a plan saved before phases were timed
        ]
    ),
}


def _json_or_repr(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    return repr(value)


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=_json_or_repr)


def _arrow(url: str, storage_filesystem: Any) -> tuple[pafs.FileSystem, str]:
    """Parquet's filesystem and path for ``url`` (see `filesystems.resolve`)."""
    filesystem, path = resolve(url, storage_filesystem)
    return arrow_filesystem(filesystem), path


def _encoded(plan: Any, node_id: int, iteration: int, metrics: dict[str, Any]) -> str:
    """The JSON of ``metrics``, recorded at ``(node_id, iteration)``, from the
    plan's cache when they are the dict it encoded (a record replaced is encoded anew)."""
    key = (node_id, iteration)
    cached = plan.encoded_metrics.get(key)
    if cached is None or cached[0] is not metrics:
        cached = plan.encoded_metrics[key] = (metrics, _dumps(metrics))
    return cached[1]


def records(plan: Any) -> dict[str, list[dict[str, Any]]]:
    """The plan as plain rows, one list per table: what `save` writes, and
    what a running study's snapshot pickles. Only durable checkpoints (with
    a storage path) are kept: the others die with the study's processes."""
    rows: dict[str, list[dict[str, Any]]] = {name: [] for name in SCHEMAS}
    for node in plan.nodes:
        rows["nodes"].append(
            {
                "node_id": node.node_id,
                "parent_id": None if node.parent is None else node.parent.node_id,
                "fork_step": node.fork_iteration,
                "study": share_key_of(node.config.static_key),
                "config": _dumps(node.config.to_json()),
            }
        )
        for iteration, info in node.checkpoints.items():
            if info.path is None:
                continue
            rows["checkpoints"].append(
                {
                    "node_id": node.node_id,
                    "step": iteration,
                    "path": info.path,
                    "size_bytes": info.size_bytes,
                    "checksum": info.checksum,
                }
            )
        for iteration, metrics in node.metrics.items():
            rows["metrics"].append(
                {
                    "node_id": node.node_id,
                    "step": iteration,
                    "metrics": _encoded(plan, node.node_id, iteration, metrics),
                }
            )
    for record in plan.trials.values():
        rows["trials"].append(
            {
                "trial_id": record.trial_id,
                "node_id": record.request.node.node_id,
                "step": record.request.iteration,
                "study": record.share_key,
                "config": _dumps(record.config.to_json()),
            }
        )
    for timing in plan.timings:
        rows["timings"].append(
            {"node_id": timing.node_id, "start": timing.start, "stop": timing.stop, "seconds": timing.seconds}
        )
    rows["runs"] = [
        {
            "batch_id": run.batch_id,
            "worker": run.worker,
            "segments": json.dumps([list(segment) for segment in run.segments]),
            "began": run.began,
            "ended": run.ended,
            "outcome": run.outcome,
            "phases": json.dumps(dict(getattr(run, "phases", ()))),
        }
        for run in getattr(plan, "runs", ())  # a plan pickled before runs were recorded has none
    ]
    return rows


def objects(plan: Any) -> dict[str, Any]:
    """The objects behind the plan's `PickledValue` values, by ref (what `save`
    writes to the side file, and a study's snapshot keeps)."""
    found: dict[str, Any] = {}
    for node in plan.nodes:
        found.update(node.config.objects())
    for record in plan.trials.values():
        found.update(record.config.objects())
    return found


def dumps_objects(found: dict[str, Any]) -> bytes:
    """``found`` pickled; a value that will not pickle is left out (its
    trials then continue only from a driver that still holds it)."""
    try:
        return _pickler.dumps(found, protocol=5)
    except Exception:
        kept = {}
        for ref, value in found.items():
            try:
                _pickler.dumps(value, protocol=5)
            except Exception:
                continue
            kept[ref] = value
        return _pickler.dumps(kept, protocol=5)


def _write(filesystem: pafs.FileSystem, final: str, write: Any) -> None:
    temporary = f"{final}.tmp"
    write(temporary)
    filesystem.move(temporary, final)


def save(plan: Any, url: str, storage_filesystem: Any = None) -> None:
    filesystem, root = _arrow(url, storage_filesystem)
    filesystem.create_dir(root, recursive=True)
    schemas = {**SCHEMAS, **OPTIONAL_SCHEMAS}
    for name, rows in records(plan).items():
        table = pa.Table.from_pylist(rows, schema=schemas[name])
        table = table.replace_schema_metadata({"format": FORMAT, "version": str(VERSION)})
        _write(filesystem, f"{root}/{name}.parquet", functools.partial(pq.write_table, table, filesystem=filesystem))
    found = objects(plan)
    if found:  # the plan only grows: a side file written before holds a subset of these
        data = dumps_objects(found)

        def write_objects(path: str) -> None:
            with filesystem.open_output_stream(path) as stream:
                stream.write(data)

        _write(filesystem, f"{root}/{OBJECTS_FILE}", write_objects)


def load_objects(url: str, storage_filesystem: Any = None) -> dict[str, Any]:
    """The side file's objects (empty when the plan has none). Unpickles:
    only for continuing a study from a directory the user chose."""
    filesystem, root = _arrow(url, storage_filesystem)
    path = f"{root}/{OBJECTS_FILE}"
    if filesystem.get_file_info(path).type == pafs.FileType.NotFound:
        return {}
    with filesystem.open_input_stream(path) as stream:
        return pickle.loads(stream.read())


def _read(filesystem: pafs.FileSystem, root: str, name: str) -> list[dict[str, Any]]:
    path = f"{root}/{name}.parquet"
    if filesystem.get_file_info(path).type == pafs.FileType.NotFound:
        raise FileNotFoundError(f"no search plan at {root!r}: {name}.parquet is missing")
    table = pq.read_table(path, filesystem=filesystem)
    metadata = table.schema.metadata or {}
    if metadata.get(b"format") != FORMAT.encode():
        raise ValueError(f"{path!r} is not a ray_stagetree search plan table")
    if int(metadata.get(b"version", b"0")) > VERSION:
        raise ValueError(
            f"{path!r} was written by a newer ray_stagetree (format version "
            f"{metadata[b'version'].decode()}, this one reads {VERSION}); upgrade to load it"
        )
    return table.to_pylist()


def load_into(plan: Any, url: str, storage_filesystem: Any = None, objects: bool = False) -> None:
    """Fill an empty plan with the tables written by `save`; with
    ``objects``, config values JSON cannot hold come back from the side file
    (else they stay `PickledValue` values: nothing is unpickled)."""
    filesystem, root = _arrow(url, storage_filesystem)
    loaded = load_objects(url, storage_filesystem) if objects else None
    tables = {name: _read(filesystem, root, name) for name in SCHEMAS}
    for name in OPTIONAL_SCHEMAS:
        if filesystem.get_file_info(f"{root}/{name}.parquet").type != pafs.FileType.NotFound:
            tables[name] = _read(filesystem, root, name)
    fill(plan, tables, loaded)


#: Where a study's checkpoints live, relative to its experiment directory.
CHECKPOINT_FOLDER = "checkpoints"


def check_checkpoint_path(path: Any, node_id: Any, iteration: Any) -> None:
    """Refuse a checkpoint path that does not name a file in the experiment
    directory's ``checkpoints/`` folder: absolute paths, URLs, ``..`` or
    empty parts, backslashes. The runtime writes nothing else, so anything
    else is a rewritten table pointing at a file the study never wrote."""
    parts = path.split("/") if isinstance(path, str) else []
    if (
        len(parts) < 2
        or parts[0] != CHECKPOINT_FOLDER
        or "\\" in path
        or ":" in path
        or any(part in ("", ".", "..") for part in parts)
    ):
        raise ValueError(
            f"search plan: the checkpoint of node {node_id} at iteration {iteration} has path {path!r}; a checkpoint "
            f"path must name a file under {CHECKPOINT_FOLDER + '/'!r} inside the experiment directory (relative, no "
            "'..'). The plan's checkpoints table was not written by ray_stagetree as it stands: refusing to load it"
        )


def fill(plan: Any, tables: dict[str, list[dict[str, Any]]], objects: dict[str, Any] | None = None) -> None:
    """Fill an empty plan with `records`' rows (and ``objects`` by ref, see
    `objects`); raises ValueError on a checkpoint path outside the
    experiment directory (`check_checkpoint_path`)."""
    for row in sorted(tables["nodes"], key=lambda row: row["node_id"]):
        config = TrialConfig.from_json(json.loads(row["config"]), row["study"], plan._sequences, objects)
        plan._restore_node(row["node_id"], config, row["parent_id"], row["fork_step"])
    for row in tables["checkpoints"]:
        check_checkpoint_path(row["path"], row["node_id"], row["step"])
        plan._restore_checkpoint(row["node_id"], row["step"], row["path"], row["size_bytes"], row["checksum"])
    for row in tables["metrics"]:
        plan.nodes[row["node_id"]].metrics[row["step"]] = json.loads(row["metrics"])
    for row in tables["trials"]:
        config = TrialConfig.from_json(json.loads(row["config"]), row["study"], plan._sequences, objects)
        plan._restore_trial(row["trial_id"], config, row["study"], row["node_id"], row["step"])
    for row in tables["timings"]:
        plan.record_timing(row["node_id"], row["start"], row["stop"], row["seconds"])
    for row in tables.get("runs", ()):  # absent from a plan saved before runs were recorded
        segments = json.loads(row["segments"])
        phases = json.loads(row.get("phases") or "{}")
        plan.record_run(row["batch_id"], row["worker"], segments, row["began"], row["ended"], row["outcome"], phases)
