"""Trial configurations as the planner sees them.

A user's config is a (possibly nested) dict. The planner splits it into

* *tunable* values: every `Sequence` and every plain scalar (number, string,
  bool). A plain scalar is a constant sequence, so a trial whose plain
  ``lr=0.1`` is later changed by PBT to a sequence still shares its prefix.
* *static* values: everything else (lists, ``None``, numpy arrays, ``nan`` and
  ``inf``, nested structures that are not dicts). They must be equal for two
  trials to share anything, so they go into the key of the plan's roots,
  canonicalised as JSON (numpy values as Python numbers and lists).

NumPy scalars are numbers here, as in Tune: their constant holds the Python
number, the stored form (`TrialConfig.to_json`) too; the trainable still gets
the user's object (`runtime.workers.context` hands plain values over unchanged).

Nested dicts are flattened with ``/`` (Tune's separator), so
``{"optim": {"lr": Exponential(...)}}`` has the tunable ``"optim/lr"``. A key
that itself holds ``/`` (or ``~``) is escaped as in JSON Pointer (RFC 6901:
``~`` -> ``~0``, ``/`` -> ``~1``), so flattening is one-to-one: ``{"a/b": 1}``
is ``"a~1b"`` and ``{"a": {"b": 2}}`` is ``"a/b"``; `unflatten` undoes it.
Keys without ``/`` or ``~`` (nearly all) keep their names.
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import math
import pickle
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from ray_stagetree.planning._deprecated import renamed_arguments
from ray_stagetree.sequences import (
    Sequence,
    as_sequence,
    first_difference_unchecked,
    from_json,
    is_sequence_spec,
)

PATH_SEPARATOR = "/"


def escape_key(key: str) -> str:
    """One config key as a part of a flattened name (JSON Pointer escaping)."""
    return key.replace("~", "~0").replace(PATH_SEPARATOR, "~1") if ("~" in key or PATH_SEPARATOR in key) else key


def unescape_key(part: str) -> str:
    """The config key a part of a flattened name stands for (see `escape_key`)."""
    return part.replace("~1", PATH_SEPARATOR).replace("~0", "~") if "~" in part else part


def split_path(path: str) -> list[str]:
    """The config keys along a flattened name: ``"a~1b/c"`` -> ``["a/b", "c"]``."""
    return [unescape_key(part) for part in path.split(PATH_SEPARATOR)]


def _is_scalar(value: Any) -> bool:
    value = _python(value)
    # nan and inf are valid config values in Tune, but no Constant: they are static.
    return isinstance(value, (bool, int, float, str)) and not (
        isinstance(value, float) and not math.isfinite(value)
    )


def _python(value: Any) -> Any:
    """A numpy scalar as the Python scalar it holds (other values as they are)."""
    return value.item() if isinstance(value, (np.bool_, np.number, np.str_)) else value


def _stored(value: Any) -> Any:
    """A static value in the stored (JSON) form: numpy scalars as Python
    numbers, arrays as lists where a list holds them (Tune's params.json does
    the same); other arrays stay as they are (pickled in study snapshots)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray) and value.dtype.kind in "biuf":
        return value.tolist()
    if isinstance(value, (list, tuple)):
        return type(value)(_stored(item) for item in value)
    if isinstance(value, dict):
        return {key: _stored(item) for key, item in value.items()}
    return value


def _json_default(value: Any) -> Any:
    stored = _stored(value)
    if stored is not value:
        return stored
    if isinstance(value, np.ndarray):  # no list holds it (complex, objects): keyed by its pickle
        return {"ndarray_sha256": hashlib.sha256(pickle.dumps(value)).hexdigest()}
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _static_key(share_key: str, static: Mapping[str, Any]) -> str:
    # allow_nan: nan and inf are keyed as NaN / Infinity, which json reads back.
    # The share key is stored under "study", its name before the vocabulary rename: saved
    # plans key their roots by this text, so it must not change.
    return json.dumps({"study": share_key, "static": static}, sort_keys=True, default=_json_default)


def share_key_of(static_key: str) -> str:
    """The share key a `TrialConfig.static_key` was made with."""
    return json.loads(static_key)["study"]


@functools.lru_cache(maxsize=1024)
def _bare_static_key(share_key: str) -> str:
    # Most configs have no static values: one key per share key, built once.
    return _static_key(share_key, {})


@functools.lru_cache(maxsize=4096)
def _constant(kind: type, value: Any) -> Sequence:
    # Plain values repeat across trials (every trial has momentum=0.9): build
    # each Constant once. The type is part of the key: 1 and 1.0 and True differ.
    return as_sequence(value)


def _flatten(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in config.items():
        if not isinstance(key, str):
            raise TypeError(
                f"config keys must be strings, got {key!r} ({type(key).__name__}) "
                f"under {prefix or 'the top level'!r}"
            )
        path = f"{prefix}{escape_key(key)}"
        if (type(value) is dict or isinstance(value, Mapping)) and not is_sequence_spec(value):
            yield from _flatten(value, path + PATH_SEPARATOR)
        else:
            yield path, value


def _static_json(path: str, value: Any) -> str:
    try:
        return json.dumps(value, sort_keys=True, default=_json_default)
    except (TypeError, ValueError) as error:
        raise ValueError(
            f"config[{path!r}] = {value!r} cannot be stored declaratively ({error}). "
            "ray_stagetree persists configurations as JSON: use numbers (numpy's too), strings, "
            "bools, lists, numpy arrays, dicts or sequences, and pass other objects with "
            "tune.with_parameters(...)."
        ) from None


@dataclass(frozen=True, eq=False)
class TrialConfig:
    """A trial's configuration split for planning.

    Parameters
    ----------
    names:
        Flattened paths of the tunable values, sorted.
    sequences:
        One `Sequence` per name, in the same order.
    static_key:
        Canonical JSON of the static values (plus the share key): trials with
        different keys never share a plan root.
    declared:
        The names the user gave as sequences (the rest were plain scalars).
    """

    names: tuple[str, ...]
    sequences: tuple[Sequence, ...]
    static_key: str
    declared: frozenset[str] = field(default_factory=frozenset)
    static: Mapping[str, Any] = field(default_factory=dict)

    @classmethod
    @renamed_arguments(study="share_key")
    def from_config(
        cls,
        config: "Mapping[str, Any] | TrialConfig",
        share_key: str = "default",
        intern: dict[Sequence, Sequence] | None = None,
    ) -> "TrialConfig":
        """Split ``config``; raises a ValueError naming any value that cannot be planned.

        ``share_key`` names the group of trials that may share stages: trials
        under different keys never share anything (a study's trials share
        one key; each trial has its own when stage sharing is off).

        With ``intern``, equal sequences are replaced by the instance held there
        (added if new), so they compare by identity and share one value cache.
        """
        if isinstance(config, TrialConfig):
            if intern is None:
                return config
            return dataclasses.replace(config, sequences=tuple(intern.setdefault(s, s) for s in config.sequences))
        if not isinstance(config, Mapping):
            raise TypeError(f"config must be a dict, got {type(config).__name__}: {config!r}")
        tunable: dict[str, Sequence] = {}
        static: dict[str, Any] = {}
        declared = set()
        for path, value in _flatten(config):
            if _is_scalar(value):
                value = _python(value)
                tunable[path] = _constant(type(value), value)  # type: ignore[arg-type]  # a type is hashable
            elif isinstance(value, Sequence) or is_sequence_spec(value):
                sequence = value if isinstance(value, Sequence) else from_json(value)
                if not sequence.is_resolved:
                    raise ValueError(
                        f"config[{path!r}] = {sequence!r} still holds Tune search-space "
                        "domains; draw trials with ray_stagetree.searchers.generate_trials "
                        "(or the Tuner) before planning them."
                    )
                tunable[path] = sequence
                declared.add(path)
            else:
                _static_json(path, value)
                static[path] = value
        names = tuple(sorted(tunable))
        key = _static_key(share_key, static) if static else _bare_static_key(share_key)
        sequences = [tunable[name] for name in names]
        if intern is not None:
            sequences = [intern.setdefault(sequence, sequence) for sequence in sequences]
        return cls(
            names=names,
            sequences=tuple(sequences),
            static_key=key,
            declared=frozenset(declared),
            static=static,
        )

    def first_difference(self, other: "TrialConfig", stop: int, start: int = 0) -> int | None:
        """First iteration in ``[start, stop)`` where the trials observe different values."""
        if self is other:
            return None
        if self.static_key != other.static_key or self.names != other.names:
            return start if start < stop else None
        earliest = None
        for mine, theirs in zip(self.sequences, other.sequences):
            if mine is theirs:
                continue
            difference = first_difference_unchecked(mine, theirs, stop, start)
            if difference is not None:
                earliest = stop = difference
                if difference == start:
                    break
        return earliest

    def observed_at(self, iteration: int) -> tuple:
        """Hashable key of what a trainable observes at one iteration: equal
        keys exactly when no value differs in value or type (``128`` and
        ``128.0`` differ), the rule `first_difference` applies."""
        return (self.static_key, self.names) + tuple(sequence.observed(iteration) for sequence in self.sequences)

    def hparams_at(self, iteration: int) -> dict[str, Any]:
        """Every tunable value (sequences, and plain scalars as constants) at
        one iteration, by flattened name."""
        return {name: sequence.value(iteration) for name, sequence in zip(self.names, self.sequences)}

    def to_json(self) -> dict[str, Any]:
        """Flattened declarative form: sequences as their JSON, static values as given."""
        out: dict[str, Any] = {name: _stored(value) for name, value in self.static.items()}
        for name, sequence in zip(self.names, self.sequences):
            out[name] = sequence.to_json() if name in self.declared else sequence.value(0)
        return out

    @classmethod
    @renamed_arguments(study="share_key")
    def from_json(
        cls, data: Mapping[str, Any], share_key: str = "default", intern: dict[Sequence, Sequence] | None = None
    ) -> "TrialConfig":
        return cls.from_config(unflatten(data), share_key=share_key, intern=intern)


def unflatten(flat: Mapping[str, Any]) -> dict[str, Any]:
    """Rebuild the nested dict a trainable expects from ``/``-separated paths
    (keys escaped by flattening come back as they were)."""
    nested: dict[str, Any] = {}
    for path, value in flat.items():
        *parents, leaf = split_path(path)
        level = nested
        for part in parents:
            level = level.setdefault(part, {})
        level[leaf] = value
    return nested
