"""Declarative checks of public arguments: one place for "an int >= 1, not a bool".

Modelled on scikit-learn's parameter constraints: a constructor states what
each argument may be, as a tuple of constraints, and :func:`check` raises one
error that names the argument, what is allowed and the value it got::

    check("TuneConfig.num_samples", num_samples, Int(low=1))
    check("CheckpointConfig.num_to_keep", keep, None, Int(low=1), meaning=" (None keeps all)")

A value no constraint's *type* accepts is a ``TypeError``; a value of an
accepted type outside its range is a ``ValueError``. Both raise
:class:`InvalidArgumentError`, which is both, so that a caller catching
either of Python's conventions (or Tune's, which mostly raises
``ValueError``) catches it.

``bool`` is never a number here (``True`` is never a sensible learning rate or
worker count), and NaN is never in a range. Ray Tune domains are not
resolved here: the sequence families pass them through before checking.
"""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeGuard

import numpy as np


class InvalidArgumentError(ValueError, TypeError):
    """A public argument that breaks its declared constraints."""


class Constraint(Protocol):
    """What an argument may be: ``admits_type`` tells a wrong type (a
    ``TypeError`` to the user) from a value out of range."""

    def admits_type(self, value: Any) -> bool: ...

    def holds(self, value: Any) -> bool: ...

    def describe(self) -> str: ...


def is_number(value: Any) -> TypeGuard[float]:
    """A real number that is not a bool (numpy scalars included; NaN included)."""
    return isinstance(value, numbers.Real) and not isinstance(value, (bool, np.bool_))


def is_finite_number(value: Any) -> TypeGuard[float]:
    """`is_number`, and neither NaN nor infinite (what a plot or a model can place)."""
    return is_number(value) and (isinstance(value, numbers.Integral) or math.isfinite(value))


def short(value: Any) -> str:
    """A value as tables and messages show it: a float to 4 significant digits."""
    return f"{value:.4g}" if isinstance(value, float) else str(value)


def duration(seconds: float) -> str:
    """Seconds as a person reads them, in the unit their size calls for:
    ``42 s``, ``3.5 min``, ``2.1 h``, ``3.2 days`` (``-`` when unknown)."""
    if not math.isfinite(seconds):
        return "-"
    if round(seconds) < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    value, unit = seconds / 60, "min"
    # Up a unit where this one would show 60 minutes, or 48 hours.
    for next_unit, factor, limit in (("h", 60, 60), ("days", 24, 48)):
        if round(value, 1) < limit:
            break
        value, unit = value / factor, next_unit
    return f"{value:.1f} {unit}"


@dataclass(frozen=True)
class Interval:
    """A number in ``[low, high]`` (either bound may be open or absent).

    ``integer`` asks for an ``int`` (``numbers.Integral``, not bool);
    otherwise any real number. ``finite`` rules out infinities where no upper
    bound does.
    """

    integer: bool
    low: float | None = None
    high: float | None = None
    closed: str = "both"  # which bounds are included: "both", "left", "right" or "neither"
    finite: bool = True

    def admits_type(self, value: Any) -> bool:
        if self.integer:
            return isinstance(value, numbers.Integral) and is_number(value)
        return is_number(value)

    def holds(self, value: Any) -> bool:
        if not self.admits_type(value) or math.isnan(value):
            return False
        if self.finite and not math.isfinite(value):
            return False
        if self.low is not None and not (value >= self.low if self.closed in ("both", "left") else value > self.low):
            return False
        return self.high is None or (value <= self.high if self.closed in ("both", "right") else value < self.high)

    def describe(self) -> str:
        what = "an int" if self.integer else ("a finite number" if self.finite else "a number")
        bounds = []
        if self.low is not None:
            bounds.append(f"{'>=' if self.closed in ('both', 'left') else '>'} {_number_text(self.low)}")
        if self.high is not None:
            bounds.append(f"{'<=' if self.closed in ('both', 'right') else '<'} {_number_text(self.high)}")
        return f"{what} {' and '.join(bounds)}" if bounds else what


def Int(low: int | None = None, high: int | None = None, closed: str = "both") -> Interval:  # noqa: N802 - reads as a type
    """An int (not bool) between ``low`` and ``high``."""
    return Interval(integer=True, low=low, high=high, closed=closed)


def Real(  # noqa: N802 - reads as a type
    low: float | None = None, high: float | None = None, closed: str = "both", finite: bool = True
) -> Interval:
    """A real number (not bool, not NaN) between ``low`` and ``high``."""
    return Interval(integer=False, low=low, high=high, closed=closed, finite=finite)


@dataclass(frozen=True)
class Options:
    """One of a few values, compared with ``==`` (``True`` is not ``1`` here)."""

    values: tuple[Any, ...]

    def admits_type(self, value: Any) -> bool:
        return any(type(value) is type(option) for option in self.values)

    def holds(self, value: Any) -> bool:
        return any(type(value) is type(option) and value == option for option in self.values)

    def describe(self) -> str:
        return _alternatives(self.parts())

    def parts(self) -> list[str]:
        """Each option, for a list of alternatives that includes them."""
        return [repr(option) for option in self.values]


@dataclass(frozen=True)
class InstanceOf:
    """An instance of ``types``, described to the user as ``name``."""

    types: type | tuple[type, ...]
    name: str

    def admits_type(self, value: Any) -> bool:
        return isinstance(value, self.types)

    def holds(self, value: Any) -> bool:
        return isinstance(value, self.types)

    def describe(self) -> str:
        return self.name


BOOL = Options((True, False))
STR = InstanceOf(str, "a str")


@dataclass(frozen=True)
class _Callable:
    def admits_type(self, value: Any) -> bool:
        return callable(value)

    def holds(self, value: Any) -> bool:
        return callable(value)

    def describe(self) -> str:
        return "a callable"


CALLABLE = _Callable()


@dataclass(frozen=True)
class _NoneConstraint:
    def admits_type(self, value: Any) -> bool:
        return value is None

    def holds(self, value: Any) -> bool:
        return value is None

    def describe(self) -> str:
        return "None"


def check(where: str, value: Any, *constraints: Constraint | None, meaning: str = "") -> Any:
    """Return ``value`` if any of ``constraints`` holds, else raise.

    ``where`` names the argument as the user wrote it (``"TuneConfig.num_samples"``,
    ``"Tuner.restore's resume_errored"``); ``None`` among the constraints
    allows ``None``; ``meaning`` is appended to what is allowed, to say what
    the values mean (``" (0 parks none)"``).
    """
    declared = [_NoneConstraint() if constraint is None else constraint for constraint in constraints]
    if any(constraint.holds(value) for constraint in declared):
        return value
    allowed = _alternatives([part for constraint in declared for part in _parts(constraint)])
    kind = "" if any(constraint.admits_type(value) for constraint in declared) else f" ({type(value).__name__})"
    raise InvalidArgumentError(f"{where} must be {allowed}{meaning}, got {value!r}{kind}")


def _parts(constraint: Constraint) -> list[str]:
    """A constraint's alternatives, listed among the others' (options one by one)."""
    return constraint.parts() if isinstance(constraint, Options) else [constraint.describe()]


def _alternatives(descriptions: list[str]) -> str:
    """``a``, ``a or b``, ``a, b or c``."""
    return " or ".join(filter(None, [", ".join(descriptions[:-1]), descriptions[-1]]))


def _number_text(bound: float) -> str:
    return str(int(bound)) if float(bound).is_integer() else repr(bound)


def did_you_mean(word: Any, choices: Iterable[str]) -> str:
    """`` (did you mean 'gamma'?)`` for the choice closest to a misspelt
    ``word`` (``gama``, ``Multistep``, ``run_confg``; case is ignored), else
    "": for messages that name a key or a class the user got wrong."""
    if not isinstance(word, str):
        return ""
    by_lower = {choice.lower(): choice for choice in choices if isinstance(choice, str)}
    close = difflib.get_close_matches(word.lower(), list(by_lower), n=1)
    return f" (did you mean {by_lower[close[0]]!r}?)" if close and by_lower[close[0]] != word else ""
