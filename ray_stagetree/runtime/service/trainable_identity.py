"""What studies sharing one plan must have in common: the trainable.

Trials share a stage only when every value the trainable observes there is
equal (the plan checks the hyper-parameters). Across studies the trainable
itself must be the same too: the same code, and the same objects passed with
``tune.with_parameters``. A plan service keeps one plan per `share_key`,
so studies whose trainables differ, even silently (an edited function under
the same name, other data), never share a stage.

The fingerprint follows code, not names: a function by its bytecode,
constants, defaults and the values its closure holds, recursively (Tune's
``with_parameters`` and ``with_resources`` wrappers are closures and
classes); a class by its functions and bases; ``with_parameters`` objects,
fetched from the object store where Tune put them, by their contents:
containers item by item, arrays and tensors by dtype, shape and bytes (a
tensor's pickle differs between processes), anything else by its pickle.
Module-level globals a function reads are not followed (a global changed
between studies is not seen: put such values in the config or
``with_parameters``, or set a new ``study_group``).
"""

from __future__ import annotations

import hashlib
import re
import types
from collections.abc import Iterator
from typing import Any

import numpy as np
import ray

#: Depth of objects followed from the trainable (wrappers of wrappers).
MAX_DEPTH = 8

# Reprs name objects by memory address (Tune's with_parameters keys its
# objects by ``str(trainable)``): not part of what the trainable computes.
_ADDRESS = re.compile(r" at 0x[0-9a-fA-F]+")


def share_key(study_group: str, trainable: Any, scaling: Any = None) -> str:
    """``"<study_group>:<fingerprint>"``: studies with equal keys share stages.
    A data-parallel study's `execution.scaling.Scaling` is part of it: a
    stage trained by N ranks is not the stage M ranks train."""
    if not isinstance(study_group, str) or not study_group or "/" in study_group:
        raise ValueError(
            f"study_group must be a non-empty string without '/', got {study_group!r} ({type(study_group).__name__})"
        )
    identity = trainable if scaling is None else (trainable, scaling.key())
    return f"{study_group}:{fingerprint(identity)}"


def fingerprint(trainable: Any) -> str:
    """A hex digest of the trainable's code and the objects it carries."""
    digest = hashlib.sha256()
    _feed(digest, trainable, 0, set())
    return digest.hexdigest()[:16]


def _feed(digest: Any, obj: Any, depth: int, seen: set[int]) -> None:
    if depth > MAX_DEPTH or id(obj) in seen:
        digest.update(b"<...>")
        return
    if isinstance(obj, (types.FunctionType, type, types.CodeType, types.MethodType)):
        seen.add(id(obj))
    if isinstance(obj, types.MethodType):
        _feed(digest, obj.__func__, depth + 1, seen)
    elif isinstance(obj, types.FunctionType):
        digest.update(f"function {obj.__module__}.{obj.__qualname__}".encode())
        _feed(digest, obj.__code__, depth + 1, seen)
        for value in (obj.__defaults__ or ()) + tuple((obj.__kwdefaults__ or {}).items()):
            _feed(digest, value, depth + 1, seen)
        for cell in obj.__closure__ or ():
            try:
                _feed(digest, cell.cell_contents, depth + 1, seen)
            except ValueError:  # an empty cell
                digest.update(b"<empty>")
    elif isinstance(obj, types.CodeType):
        digest.update(obj.co_code)
        digest.update(repr(obj.co_names).encode())
        for const in obj.co_consts:
            _feed(digest, const, depth + 1, seen)
    elif isinstance(obj, type):
        digest.update(f"class {obj.__module__}.{obj.__qualname__}".encode())
        for name, member in sorted(vars(obj).items()):
            if isinstance(member, (types.FunctionType, staticmethod, classmethod, property)):
                digest.update(name.encode())
                _feed(digest, getattr(member, "__func__", getattr(member, "fget", member)), depth + 1, seen)
        for base in obj.__bases__:
            if base.__module__.split(".")[0] not in ("builtins", "ray"):
                _feed(digest, base, depth + 1, seen)
    elif type(obj).__name__ == "_ParameterRegistry":  # tune.with_parameters' objects
        _feed_parameters(digest, obj)
    elif isinstance(obj, (str, bytes, int, float, bool, complex, type(None))):
        digest.update(_ADDRESS.sub("", repr(obj)).encode())
    elif isinstance(obj, np.ndarray):
        digest.update(f"array {obj.dtype} {obj.shape}".encode())
        digest.update(np.ascontiguousarray(obj).tobytes())
    elif type(obj).__module__.startswith("torch") and type(obj).__name__ in ("Tensor", "Parameter"):
        _feed(digest, obj.detach().cpu().numpy(), depth + 1, seen)  # a tensor's pickle varies between processes
    elif isinstance(obj, dict):
        digest.update(f"dict[{len(obj)}]".encode())
        for key in sorted(obj, key=repr):
            _feed(digest, key, depth + 1, seen)
            _feed(digest, obj[key], depth + 1, seen)
    elif isinstance(obj, (tuple, list, frozenset, set)):
        items = sorted(obj, key=repr) if isinstance(obj, (set, frozenset)) else obj
        digest.update(f"{type(obj).__name__}[{len(obj)}]".encode())
        for item in items:
            _feed(digest, item, depth + 1, seen)
    else:
        digest.update(_pickled(obj))


def _feed_parameters(digest: Any, registry: Any) -> None:
    """Tune's registry holds objects not yet put (before ``ray.init``) in
    ``to_flush`` and object refs after: hash what they hold, not the refs."""
    values = dict(getattr(registry, "to_flush", {}))
    for name, ref in getattr(registry, "references", {}).items():
        values[name] = ray.get(ref)
    for name in sorted(values):
        digest.update(_ADDRESS.sub("", name).encode())
        _feed(digest, values[name], 1, set())


def _pickled(obj: Any) -> bytes:
    try:
        return ray.cloudpickle.dumps(obj)
    except Exception:  # not picklable: its type and repr are what is left to compare
        return f"{type(obj).__module__}.{type(obj).__qualname__}:{obj!r}".encode()


def parameter_registries(obj: Any, depth: int = 0, seen: set[int] | None = None) -> Iterator[Any]:
    """The ``tune.with_parameters`` registries a trainable carries (in its
    closures and its class's functions), each once."""
    seen = set() if seen is None else seen
    if depth > MAX_DEPTH or id(obj) in seen:
        return
    seen.add(id(obj))
    if type(obj).__name__ == "_ParameterRegistry":
        yield obj
    elif isinstance(obj, types.FunctionType):
        for cell in obj.__closure__ or ():
            try:
                contents = cell.cell_contents
            except ValueError:  # an empty cell
                continue
            yield from parameter_registries(contents, depth + 1, seen)
    elif isinstance(obj, type):
        for member in vars(obj).values():
            if isinstance(member, types.FunctionType):
                yield from parameter_registries(member, depth + 1, seen)
