"""Trial configurations as the planner sees them.

A user's config is a (possibly nested) dict. The planner splits it into

* *tunable* values: every `Sequence` and every plain scalar (number, string,
  bool). A plain scalar is a constant sequence, so a trial whose plain
  ``lr=0.1`` is later changed by PBT to a sequence still shares its prefix.
* *static* values: everything else (lists, ``None``, numpy arrays, ``nan`` and
  ``inf``, nested structures that are not dicts, and any picklable object).
  They must be equal for two trials to share anything, so they go into the
  key of the plan's roots, canonicalised as JSON (numpy values as Python
  numbers and lists).

A static value JSON cannot hold (a ``pathlib.Path``, a tuple holding one, an
``argparse.Namespace``, a dataset object...) is keyed by a `PickledValue`: the
SHA-256 of its pickle (protocol 5; the standard pickle, or cloudpickle for
what only it takes, see `_fingerprint`), else a token of its own. Equal
pickles mean the trainable receives equal state, so such trials may share;
the value's ``__eq__`` is not used: it is identity for most classes (and
Tune hands each trial its own copy), it may call values equal that a
trainable tells apart (``1 == 1.0``), and its hash is not stable across
processes, so it cannot key a stored plan. A value without a fingerprint
(pickled twice it gives different bytes) gets a unique token: its trial
shares nothing and still runs. The stored form (`TrialConfig.to_json`, the plan's tables) holds
the `PickledValue`'s JSON (fingerprint, type, repr), never the pickle: the
objects themselves (`TrialConfig.objects`) are kept apart, in the study's
snapshot (which `Tuner.restore` loads) and a side file beside the plan's
tables (`planning.persistence`); `TrialConfig.from_json` takes them back by
ref when it is given them.

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
import importlib
import json
import math
import pickle
import sys
import uuid
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

#: The key of a `PickledValue`'s stored (JSON) form: ``{"__pickled__": {...}}``.
PICKLED = "__pickled__"
#: A fingerprint's pickle protocol, fixed so that a new Python's default does not change stored keys
#: (5: large buffers out of band, see `_Digest`).
FINGERPRINT_PROTOCOL = 5
#: How much of a value's repr its stored form keeps, for status / show / the monitor.
REPR_LIMIT = 200


@dataclass(frozen=True)
class PickledValue:
    """What the plan stores of a config value JSON cannot hold.

    ``ref`` is ``"sha256:<hex>"`` (the fingerprint of the value's pickle:
    equal refs, equal values) or ``"unique:<hex>"`` (a value without a
    stable fingerprint: no other trial's ref equals it). ``type`` and
    ``text`` (the value's repr, cut to `REPR_LIMIT`) are for display only;
    only ``ref`` is part of the plan's key.
    """

    ref: str
    type: str
    text: str

    @classmethod
    def of(cls, value: Any) -> PickledValue:
        kind = type(value)
        try:
            text = repr(value)
        except Exception:  # a broken __repr__ must not stop the trial
            text = f"<{kind.__qualname__}>"
        if len(text) > REPR_LIMIT:
            text = text[: REPR_LIMIT - 3] + "..."
        fingerprint = _fingerprint(value)
        ref = "unique:" + uuid.uuid4().hex if fingerprint is None else "sha256:" + fingerprint
        return cls(ref, f"{kind.__module__}.{kind.__qualname__}", text)

    @property
    def shareable(self) -> bool:
        return self.ref.startswith("sha256:")

    def key(self) -> dict[str, str]:
        """The part of the plan's key this value stands for."""
        return {PICKLED: self.ref}

    def to_json(self) -> dict[str, dict[str, str]]:
        return {PICKLED: {"ref": self.ref, "type": self.type, "repr": self.text}}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> PickledValue:
        inner = data[PICKLED]
        return cls(inner["ref"], inner.get("type", ""), inner.get("repr", ""))

    def __repr__(self) -> str:
        # What status, show and the monitor print where the object is not loaded.
        return f"<pickled {self.text}>"


def _picklers() -> Iterator[Any]:
    """The standard pickle's Pickler, then cloudpickle's where this process
    has it (the Ray controller always has Ray's; nothing here imports Ray)."""
    yield pickle.Pickler
    by_value = sys.modules.get("ray.cloudpickle") or sys.modules.get("cloudpickle")
    if by_value is None:
        try:
            by_value = importlib.import_module("cloudpickle")
        except ImportError:
            return
    yield by_value.Pickler


class _Digest:
    """A pickle's SHA-256, taken as it is written: large buffers (NumPy
    arrays, bytes) are hashed in place, out of band, never copied into a
    stream (a 16 MB array costs one pass of hashing)."""

    def __init__(self) -> None:
        self.sha = hashlib.sha256()

    def write(self, data: Any) -> None:
        self.sha.update(data)

    def buffer(self, buffer: pickle.PickleBuffer) -> bool:
        raw = buffer.raw()
        self.sha.update(b"%d:" % raw.nbytes)  # the stream marks where a buffer goes, this its length
        self.sha.update(raw)
        return False  # out of band: not written to the stream again


def _fingerprint(value: Any) -> str | None:
    """The SHA-256 of ``value``'s pickle, or None when it has none that repeats.

    The standard pickle's bytes (classes and functions by reference) are the
    same in every process. A value only cloudpickle takes (a class defined in
    a script's ``__main__``, a lambda: pickled by value, classes tagged with a
    tracker id drawn per process) gets bytes that are the same within the
    process that keys the study's trials (its controller), which is all
    sharing needs: a stored plan keeps its keys, and a value fingerprinted
    again elsewhere only misses a saving. Equal bytes from either mean equal
    state, so sharing never joins values a trainable could tell apart. A
    value pickled twice to different bytes (its state holds a clock or a
    counter), or that neither pickles, has no fingerprint."""
    for pickler in _picklers():
        digests = []
        try:
            for _ in range(2):
                digest = _Digest()
                pickler(digest, protocol=FINGERPRINT_PROTOCOL, buffer_callback=digest.buffer).dump(value)
                digests.append(digest.sha.hexdigest())
        except Exception:  # this pickler refuses it: the next may take it
            continue
        return digests[0] if digests[0] == digests[1] else None
    return None


def is_pickled_spec(value: Any) -> bool:
    """True for a `PickledValue`'s stored form."""
    return type(value) is dict and len(value) == 1 and isinstance(value.get(PICKLED), dict)


def escape_key(key: str) -> str:
    """One config key as a part of a flattened name (JSON Pointer escaping)."""
    return key.replace("~", "~0").replace(PATH_SEPARATOR, "~1") if ("~" in key or PATH_SEPARATOR in key) else key


def unescape_key(part: str) -> str:
    """The config key a part of a flattened name stands for (see `escape_key`)."""
    return part.replace("~1", PATH_SEPARATOR).replace("~0", "~") if "~" in part else part


def split_path(path: str) -> list[str]:
    """The config keys along a flattened name: ``"a~1b/c"`` -> ``["a/b", "c"]``."""
    return [unescape_key(part) for part in path.split(PATH_SEPARATOR)]


def json_pointer(name: str) -> str:
    """A flattened name as an RFC 6901 JSON Pointer: ``"a~1b/c"`` -> ``"/a~1b/c"``
    (the escaped keys, each after a ``/``): one string per config path, always."""
    return PATH_SEPARATOR + name


class HParams(dict):
    """What `get_hparams()` returns: this iteration's values by key (see
    `planning.config.hparam_keys`). A key two config entries join to is
    not in it; reading it names their JSON Pointers rather than raising a
    bare KeyError."""

    def __init__(self, values: dict[str, Any], ambiguous: dict[str, tuple[str, ...]]) -> None:
        super().__init__(values)
        self.ambiguous = ambiguous

    def __missing__(self, key: Any) -> Any:
        self._refuse_ambiguous(key)
        raise KeyError(key)

    def get(self, key: Any, default: Any = None) -> Any:
        """As a dict's, but a key two config entries join to raises, as reading it does (no silent default)."""
        self._refuse_ambiguous(key)
        return super().get(key, default)

    def __contains__(self, key: Any) -> bool:
        self._refuse_ambiguous(key)
        return super().__contains__(key)

    def _refuse_ambiguous(self, key: Any) -> None:
        pointers = self.ambiguous.get(key) if isinstance(key, str) else None
        if pointers is None:
            return
        reads = " and ".join(f"{_config_path(pointer)} as get_hparams()[{pointer!r}]" for pointer in pointers)
        raise KeyError(
            f"{key!r} names {len(pointers)} config entries (a key holding '/', and nested keys): read {reads}"
        )


def _config_path(pointer: str) -> str:
    """``"/a~1b"`` -> ``"config['a/b']"``: where a JSON Pointer leads in the config."""
    return "config" + "".join(f"[{part!r}]" for part in split_path(pointer[1:]))


@functools.lru_cache(maxsize=1024)
def hparam_keys(names: tuple[str, ...]) -> tuple[dict[str, str], dict[str, tuple[str, ...]]]:
    """(the key `get_hparams()` gives each flattened name, the keys it cannot give).

    A hyper-parameter is keyed by the config's keys as written, joined with
    ``/``: a key holding ``/`` or ``~`` reads as in the config and in
    ``result.config`` (``{"a/b": ..}`` is ``"a/b"``, not its escaped name).
    Where two config entries join to the same key (the key ``"a/b"`` and
    ``{"a": {"b": ..}}``), neither gets it: each is keyed by its JSON Pointer
    (``"/a~1b"``, ``"/a/b"``), and the ambiguous key maps to those pointers,
    so reading it can say which is which instead of returning one of them.
    """
    written: dict[str, list[str]] = {}
    for name in names:
        written.setdefault(PATH_SEPARATOR.join(split_path(name)), []).append(name)
    keys: dict[str, str] = {}
    ambiguous: dict[str, tuple[str, ...]] = {}
    for key, named in written.items():
        if len(named) == 1:
            keys[named[0]] = key
            continue
        for name in named:
            keys[name] = json_pointer(name)
        ambiguous[key] = tuple(sorted(json_pointer(name) for name in named))
    return keys, ambiguous


def _is_scalar(value: Any) -> bool:
    value = _python(value)
    # nan and inf are valid config values in Tune, but no Constant: they are static.
    return isinstance(value, (bool, int, float, str)) and not (isinstance(value, float) and not math.isfinite(value))


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


def _json_for_key(value: Any) -> Any:
    stored = _stored(value)
    if stored is not value:
        return stored
    if isinstance(value, np.ndarray):  # no list holds it (complex, objects): keyed by its pickle
        return {"ndarray_sha256": hashlib.sha256(pickle.dumps(value)).hexdigest()}
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _static_key(share_key: str, static: Mapping[str, Any], pickled: Mapping[str, PickledValue]) -> str:
    # allow_nan: nan and inf are keyed as NaN / Infinity, which json reads back.
    # The share key is stored under "study", its name before the vocabulary rename: saved
    # plans key their roots by this text, so it must not change. A pickled
    # value is keyed by its ref alone (its repr may hold a memory address).
    keyed = {path: pickled[path].key() if path in pickled else value for path, value in static.items()}
    return json.dumps({"study": share_key, "static": keyed}, sort_keys=True, default=_json_for_key)


def share_key_of(static_key: str) -> str:
    """The share key a `TrialConfig.static_key` was made with."""
    return json.loads(static_key)["study"]


@functools.lru_cache(maxsize=1024)
def _bare_static_key(share_key: str) -> str:
    # Most configs have no static values: one key per share key, built once.
    return _static_key(share_key, {}, {})


@functools.lru_cache(maxsize=4096)
def _constant(kind: type, value: Any) -> Sequence:
    # Plain values repeat across trials (every trial has momentum=0.9): build
    # each Constant once. The type is part of the key: 1 and 1.0 and True differ.
    return as_sequence(value)


def _flatten(config: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in config.items():
        if not isinstance(key, str):
            raise TypeError(
                f"config keys must be strings, got {key!r} ({type(key).__name__}) under {prefix or 'the top level'!r}"
            )
        path = f"{prefix}{escape_key(key)}"
        if (type(value) is dict or isinstance(value, Mapping)) and not (
            is_sequence_spec(value) or is_pickled_spec(value)
        ):
            yield from _flatten(value, path + PATH_SEPARATOR)
        else:
            yield path, value


def _json_holds(value: Any) -> bool:
    """Whether the stored (JSON) form can hold ``value`` as it is keyed."""
    try:
        json.dumps(value, sort_keys=True, default=_json_for_key)
    except (TypeError, ValueError, RecursionError):  # an object, a cycle, or a non-string dict key
        return False
    return True


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
    static:
        The static values by flattened name: the user's objects, or, for a
        value JSON cannot hold that was read back without its object, its
        `PickledValue`.
    pickled:
        The `PickledValue` of each static value JSON cannot hold, by name.
    lineage:
        ``(iteration, token)`` pairs, by iteration: from each pair's
        iteration on, the trial follows a path of its own that no trial of
        another token shares, whatever its values (a PBT clone's: under Tune
        it trains on in a process of its own, its own randomness setting it
        apart from its source even where the explored values are the same).
        What it trains before the first pair it shares as any trial does.
    """

    names: tuple[str, ...]
    sequences: tuple[Sequence, ...]
    static_key: str
    declared: frozenset[str] = field(default_factory=frozenset)
    static: Mapping[str, Any] = field(default_factory=dict)
    pickled: Mapping[str, PickledValue] = field(default_factory=dict)
    lineage: tuple[tuple[int, str], ...] = ()

    def __setstate__(self, state: dict[str, Any]) -> None:
        # Study snapshots pickled before values JSON cannot hold (or lineages) were planned hold none.
        state.setdefault("pickled", {})
        state.setdefault("lineage", ())
        self.__dict__.update(state)

    @classmethod
    @renamed_arguments(study="share_key")
    def from_config(
        cls,
        config: Mapping[str, Any] | TrialConfig,
        share_key: str = "default",
        intern: dict[Sequence, Sequence] | None = None,
        objects: Mapping[str, Any] | None = None,
        copied_from: TrialConfig | None = None,
    ) -> TrialConfig:
        """Split ``config``; raises a ValueError naming any value that cannot be planned.

        ``share_key`` names the group of trials that may share stages: trials
        under different keys never share anything (a study's trials share
        one key; each trial has its own when stage sharing is off).

        With ``intern``, equal sequences are replaced by the instance held there
        (added if new), so they compare by identity and share one value cache.

        ``objects`` (by ref, see `objects`) gives stored `PickledValue` values
        their objects back; one it lacks stays a `PickledValue`, keyed the same.

        ``copied_from``: a config whose static values ``config``'s are copies
        of (PBT's exploit deep-copies its source's): a value JSON cannot hold
        at a path it pickled takes its `PickledValue`, so a value without a
        fingerprint still keys equal to the one it was copied from.
        """
        if isinstance(config, TrialConfig):
            if intern is None:
                return config
            return dataclasses.replace(config, sequences=tuple(intern.setdefault(s, s) for s in config.sequences))
        if not isinstance(config, Mapping):
            raise TypeError(f"config must be a dict, got {type(config).__name__}: {config!r}")
        tunable: dict[str, Sequence] = {}
        static: dict[str, Any] = {}
        pickled: dict[str, PickledValue] = {}
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
                if is_pickled_spec(value):
                    value = PickledValue.from_json(value)
                if isinstance(value, PickledValue):  # read back from the stored form
                    pickled[path] = value
                    value = objects.get(value.ref, value) if objects else value
                elif copied_from is not None and path in copied_from.pickled:
                    pickled[path] = copied_from.pickled[path]
                elif not _json_holds(value):
                    pickled[path] = PickledValue.of(value)
                static[path] = value
        names = tuple(sorted(tunable))
        key = _static_key(share_key, static, pickled) if static else _bare_static_key(share_key)
        sequences = [tunable[name] for name in names]
        if intern is not None:
            sequences = [intern.setdefault(sequence, sequence) for sequence in sequences]
        return cls(
            names=names,
            sequences=tuple(sequences),
            static_key=key,
            declared=frozenset(declared),
            static=static,
            pickled=pickled,
        )

    def first_difference(self, other: TrialConfig, stop: int, start: int = 0) -> int | None:
        """First iteration in ``[start, stop)`` where the trials observe
        different values (or follow different lineages)."""
        if self is other:
            return None
        if self.static_key != other.static_key or self.names != other.names:
            return start if start < stop else None
        earliest = _lineage_difference(self.lineage, other.lineage, stop, start)
        if earliest == start:
            return earliest
        stop = stop if earliest is None else earliest
        for mine, theirs in zip(self.sequences, other.sequences):
            if mine is theirs:
                continue
            difference = first_difference_unchecked(mine, theirs, stop, start)
            if difference is not None:
                earliest = stop = difference
                if difference == start:
                    break
        return earliest

    @property
    def identity(self) -> tuple:
        """Hashable key equal exactly for configs of one trial: the same
        static values and sequences (which compare canonically), and lineage."""
        return (self.static_key, self.names, self.sequences, self.lineage)

    def observed_at(self, iteration: int) -> tuple:
        """Hashable key of what a trainable observes at one iteration: equal
        keys exactly when no value differs in value or type (``128`` and
        ``128.0`` differ) and the lineages agree, the rule `first_difference` applies."""
        observed = (self.static_key, self.names) + tuple(sequence.observed(iteration) for sequence in self.sequences)
        token = _token_at(self.lineage, iteration)
        return observed if token is None else (*observed, token)

    def branched(self, iteration: int, token: str) -> TrialConfig:
        """This config on a path of its own from ``iteration`` on (`lineage`),
        keeping the lineage it has before."""
        kept = tuple((start, mine) for start, mine in self.lineage if start < iteration)
        return dataclasses.replace(self, lineage=(*kept, (iteration, token)))

    def hparams_at(self, iteration: int) -> dict[str, Any]:
        """Every tunable value (sequences, and plain scalars as constants) at
        one iteration, by flattened name."""
        return {name: sequence.value(iteration) for name, sequence in zip(self.names, self.sequences)}

    def to_json(self) -> dict[str, Any]:
        """Flattened declarative form: sequences as their JSON, static values as
        given (numpy's as Python's), those JSON cannot hold as their `PickledValue`."""
        out: dict[str, Any] = {
            name: self.pickled[name].to_json() if name in self.pickled else _stored(value)
            for name, value in self.static.items()
        }
        for name, sequence in zip(self.names, self.sequences):
            out[name] = sequence.to_json() if name in self.declared else sequence.value(0)
        if self.lineage:
            out[LINEAGE_KEY] = [list(pair) for pair in self.lineage]
        return out

    def to_config(self) -> dict[str, Any]:
        """The nested config a trainable takes: sequences as objects, static
        values as held (a `PickledValue` where the object was not loaded)."""
        flat: dict[str, Any] = dict(self.static)
        for name, sequence in zip(self.names, self.sequences):
            flat[name] = sequence if name in self.declared else sequence.value(0)
        return unflatten(flat)

    def objects(self) -> dict[str, Any]:
        """The objects behind this config's `PickledValue` values, by ref: what the
        side file of a stored plan holds for it (`from_json`'s ``objects``)."""
        return {
            pickled.ref: self.static[name]
            for name, pickled in self.pickled.items()
            if not isinstance(self.static[name], PickledValue)
        }

    @property
    def complete(self) -> bool:
        """False when some value JSON cannot hold was read back without its object."""
        return not any(isinstance(self.static[name], PickledValue) for name in self.pickled)

    @classmethod
    @renamed_arguments(study="share_key")
    def from_json(
        cls,
        data: Mapping[str, Any],
        share_key: str = "default",
        intern: dict[Sequence, Sequence] | None = None,
        objects: Mapping[str, Any] | None = None,
    ) -> TrialConfig:
        """The config `to_json` wrote (with its lineage)."""
        data = dict(data)
        lineage = tuple((int(start), str(token)) for start, token in data.pop(LINEAGE_KEY, ()))
        config = cls.from_config(unflatten(data), share_key=share_key, intern=intern, objects=objects)
        return dataclasses.replace(config, lineage=lineage) if lineage else config


#: The entry of a config's JSON form (`TrialConfig.to_json`) that holds its lineage.
LINEAGE_KEY = "__stagetree_lineage__"


def _token_at(lineage: tuple[tuple[int, str], ...], iteration: int) -> str | None:
    """The lineage's token at ``iteration``: its last pair's at or before it."""
    token = None
    for start, mine in lineage:
        if start > iteration:
            break
        token = mine
    return token


def _lineage_difference(
    mine: tuple[tuple[int, str], ...], theirs: tuple[tuple[int, str], ...], stop: int, start: int
) -> int | None:
    """First iteration in ``[start, stop)`` where two lineages' tokens differ."""
    if mine == theirs:
        return None
    changes = sorted({start} | {at for at, _ in (*mine, *theirs) if start < at < stop})
    return next(
        (at for at in changes if at < stop and _token_at(mine, at) != _token_at(theirs, at)),
        None,
    )


def replaced(config: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """``config`` with the values at the given flattened paths replaced,
    copying only the dicts on those paths (the user's objects are shared, not copied)."""
    out = dict(config)
    for path, value in values.items():
        *parents, leaf = split_path(path)
        level = out
        for part in parents:
            level[part] = dict(level[part])
            level = level[part]
        level[leaf] = value
    return out


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


def tabular(value: Any) -> Any:
    """``value`` (a result row, a config) with each sequence as its JSON form,
    through dicts: tables flatten a sequence into its parameters
    (``config/lr/gamma`` columns), as they did when ``result.config`` held
    that form. Other objects stay as they are, as in Tune's dataframes."""
    if isinstance(value, Sequence):
        return value.to_json()
    if type(value) is dict:
        return {key: tabular(item) for key, item in value.items()}
    return value
