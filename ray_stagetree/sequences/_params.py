"""Parameter validation and Tune-domain detection shared by the sequence families.

Every check names the family, the parameter and the value it got, so a bad
schedule fails at construction with a message the user can act on.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ray_stagetree.validation import Int, Interval, Real, check, is_number

# The "kind" of a sequence is the type of all its values; it fixes the dtype of
# values() and the Python type value() returns.
_DTYPES: dict[str, Any] = {"int": np.int64, "float": np.float64, "bool": np.bool_, "object": object}
_EMPTY = np.empty(0)
_SCALAR_TYPES = frozenset((float, int, str, bool, type(None)))
_INT64_MIN, _INT64_MAX = -(2**63), 2**63 - 1

# first_difference compares in growing chunks so that an early difference on a
# long horizon costs little, while equal sequences still take few numpy calls.
_FIRST_CHUNK = 1024

# Values of iterations [0, n) are cached on the (immutable) instance for n up to
# this bound: trials are compared and queried over the same horizons again and
# again, and a slice is ~50x cheaper than recomputing. Longer ranges (step-level
# horizons) are computed each time rather than held in memory.
_CACHE_LIMIT = 1 << 14


# --------------------------------------------------------------------------
# Tune domains and scalar helpers
# --------------------------------------------------------------------------


def _is_domain(value: Any) -> bool:
    """True for a Ray Tune search-space domain, recognised without importing Ray.

    Ray's ``Domain`` objects (``tune.uniform``, ``tune.choice``, ``sample_from``,
    ...) have callable ``sample`` and ``is_grid``; ``tune.grid_search`` returns a
    plain ``{"grid_search": [...]}`` dict.
    """
    if isinstance(value, dict):
        return set(value) == {"grid_search"}
    return callable(getattr(value, "sample", None)) and callable(getattr(value, "is_grid", None))


def _is_unresolved(value: Any) -> bool:
    """True if ``value`` is, or contains, a Tune domain still to be drawn."""
    # A Sequence answers for itself; duck-typed, since sequences build on this module.
    resolved = getattr(value, "is_resolved", None)
    if resolved is not None:
        return not resolved
    if isinstance(value, tuple):
        return any(_is_unresolved(item) for item in value)
    return _is_domain(value)


def _plain(value: Any) -> Any:
    """numpy scalars -> Python scalars, so that JSON and type checks see one world."""
    if isinstance(value, np.bool_):
        return bool(value)
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    return value


def _is_finite(value: int | float) -> bool:
    # math.isfinite converts to float, which overflows for huge ints.
    return isinstance(value, int) or math.isfinite(value)


def _scalar_kind(value: Any) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int" if _INT64_MIN <= value <= _INT64_MAX else "object"
    if isinstance(value, float):
        return "float"
    return "object"


def _combine_kinds(kinds: list[str]) -> str:
    distinct = set(kinds)
    if len(distinct) == 1:
        return distinct.pop()
    # int and float mix as numbers do; anything else (str, bool + number) is categorical.
    return "float" if distinct <= {"int", "float"} else "object"


def _to_python(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value


def _type_name(value: Any) -> str:
    return type(value).__name__


# --------------------------------------------------------------------------
# Parameter validation (every check passes Tune domains through untouched)
# --------------------------------------------------------------------------


_FINITE = Real()
_POSITIVE_INT = Int(low=0, closed="neither")


def _number(family: str, name: str, value: Any, allowed: Interval = _FINITE) -> Any:
    """A finite int or float (not bool) in ``allowed``."""
    if _is_domain(value):
        return value
    return check(f"{family}: {name}", _plain(value), allowed)


def _integer(family: str, name: str, value: Any, allowed: Interval = _POSITIVE_INT) -> Any:
    """An int (not bool) in ``allowed``; positive by default."""
    if _is_domain(value):
        return value
    return check(f"{family}: {name}", _plain(value), allowed)


def _scalar(family: str, name: str, value: Any) -> Any:
    """A hyper-parameter value: a finite number, str, bool or None."""
    if _is_domain(value):
        return value
    value = _plain(value)
    allowed = "a scalar (finite number, str, bool or None)"
    if not (value is None or isinstance(value, (str, bool)) or is_number(value)):
        raise TypeError(f"{family}: {name} must be {allowed}, got {value!r} ({_type_name(value)})")
    if is_number(value) and not _is_finite(value):
        raise ValueError(f"{family}: {name} must be {allowed}, got {value!r}")
    return value


def _list(family: str, name: str, value: Any, allowed: str) -> tuple | Any:
    """A list or tuple, stored as a tuple so that the sequence stays immutable."""
    if _is_domain(value):
        return value
    if isinstance(value, np.ndarray) and value.ndim == 1:  # np.arange(30, 90, 30), as a list
        return tuple(value.tolist())
    if not isinstance(value, (list, tuple)):
        raise TypeError(f"{family}: {name} must be {allowed}, got {value!r} ({_type_name(value)})")
    return tuple(value)


def _milestones(family: str, name: str, value: Any) -> tuple | Any:
    """Strictly increasing positive ints (elements may be Tune domains)."""
    allowed = "a list of strictly increasing positive ints"
    items = _list(family, name, value, allowed)
    if _is_domain(items):
        return items
    items = tuple(_plain(item) for item in items)
    for item in items:
        if not _is_domain(item) and (not isinstance(item, int) or isinstance(item, bool)):
            raise TypeError(f"{family}: {name} must be {allowed}, got {list(items)!r}")
    if not _is_unresolved(items):
        if any(item <= 0 for item in items) or any(a >= b for a, b in zip(items, items[1:])):
            raise ValueError(f"{family}: {name} must be {allowed}, got {list(items)!r}")
    return items


def _scalars(family: str, name: str, value: Any) -> tuple | Any:
    """A non-empty list of scalars (elements may be Tune domains)."""
    items = _list(family, name, value, "a non-empty list of scalars")
    if _is_domain(items):
        return items
    if not items:
        raise ValueError(f"{family}: {name} must be a non-empty list of scalars, got []")
    return tuple(_scalar(family, f"{name}[{k}]", item) for k, item in enumerate(items))


def _length_check(family: str, items_name: str, items: Any, milestones: Any) -> None:
    if isinstance(items, tuple) and isinstance(milestones, tuple) and len(items) != len(milestones) + 1:
        raise ValueError(
            f"{family}: {items_name} must have len(milestones) + 1 = {len(milestones) + 1} entries, got {len(items)}"
        )


def _iteration(where: str, name: str, value: Any) -> int:
    value = _plain(value)
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{where}: {name} must be an int >= 0, got {value!r} ({_type_name(value)})")
    if value < 0:
        raise ValueError(f"{where}: {name} must be an int >= 0, got {value!r}")
    return value


# --------------------------------------------------------------------------
# Base class
# --------------------------------------------------------------------------
