"""Hyper-parameter sequences: a hyper-parameter as a function of the iteration.

A *sequence* maps a 0-based iteration index to the hyper-parameter value a
trainable observes in that iteration (a learning-rate schedule, batch-size
steps, an optimizer switch, ...).  Sequences are immutable, compare
structurally, hash, and serialise to a declarative JSON form, so that search
plans can store them without pickle.  The planner compares thousands of them,
so every family computes ``values(start, stop)`` with vectorised numpy and
``first_difference`` stops at the first chunk that differs.

The families reproduce the PyTorch schedulers users already know.  With an
optimizer whose base learning rate is ``b``, the ``lr`` read before each
``scheduler.step()`` at iteration ``i`` equals ``value(i)`` for:

=======================================  ==========================================================
family                                   PyTorch equivalent (``torch.optim.lr_scheduler``)
=======================================  ==========================================================
``Constant(b)``                          no scheduler
``Exponential(b, gamma)``                ``ExponentialLR(gamma)``
``Step(b, step_size, gamma)``            ``StepLR(step_size, gamma)``
``MultiStep(b, milestones, gamma)``      ``MultiStepLR(milestones, gamma)``
``MultiStep(values=v, milestones=m)``    ``LambdaLR`` with a piecewise-constant lambda
``CyclicLR(b, max_y, up, down)``         ``CyclicLR(b, max_y, up, down, cycle_momentum=False)`` [1]
``Cosine(b, min_y, period, gamma)``      ``CosineAnnealingWarmRestarts(period, gamma, min_y)`` [2]
``Linear(b * f0, b * f1, n)``            ``LinearLR(start_factor=f0, end_factor=f1, total_iters=n)``
``OneCycle(max_value, steps, ...)``      ``OneCycleLR(max_value, steps, ..., cycle_momentum=False)`` [3]
``Polynomial(b, steps, power)``          ``PolynomialLR(total_iters=steps, power)`` (``end`` = 0)
``Warmup(w, period, func)``              ``SequentialLR([LinearLR(w / f, 1.0, period), F], [period])`` [4]
``Concat(parts, milestones)``            ``SequentialLR(schedulers, milestones)``
``Values([...])``                        ``LambdaLR`` with a list lookup
``InverseSqrt(peak, W)``                 none; ``Warmup(0, W, InverseSqrt(peak, W))`` is fairseq's
                                         ``inverse_sqrt`` schedule
=======================================  ==========================================================

[1] ``mode="triangular"``; torch names ``base_lr, max_lr, step_size_up,
step_size_down``.  [2] ``T_0=period, T_mult=gamma, eta_min=min_y``;
``CosineAnnealingLR(T_max=period, eta_min=min_y)`` agrees on ``[0, period)``
only (it then rises again where ``Cosine`` restarts).  [3] Torch raises after
``total_steps``; ``OneCycle`` holds its final value.  [4] ``f = func.value(0)``
and ``F`` is the scheduler equivalent to ``func``.

Parameters may be Ray Tune search-space domains (``tune.loguniform(...)``,
``tune.grid_search([...])``): the sequence is then *unresolved*; it can be
written with :meth:`Sequence.to_spec`, resolved by Tune like any nested config,
and rebuilt (and validated) with :func:`from_json`.  This module never imports
Ray: domains are recognised by duck typing.

Example:
    >>> lr = Warmup(0.0, 5, MultiStep(0.1, [100, 150], 0.1))
    >>> lr.value(5), lr.value(105)
    (0.1, 0.010000000000000002)
    >>> from_json(lr.to_json()) == lr
    True
    >>> MultiStep(0.1, [100], 0.1).first_difference(MultiStep(0.1, [150], 0.1), stop=200)
    100
"""

from __future__ import annotations

import abc
import bisect
import inspect
import json
import math
from collections.abc import Callable
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np

__all__ = [
    "FAMILIES",
    "Concat",
    "Constant",
    "Cosine",
    "CyclicLR",
    "Exponential",
    "InverseSqrt",
    "Linear",
    "MultiStep",
    "OneCycle",
    "Polynomial",
    "Sequence",
    "Step",
    "Values",
    "Warmup",
    "as_sequence",
    "from_json",
    "is_sequence_spec",
]

FAMILIES: dict[str, type[Sequence]] = {}
"""Family name -> class, filled as the families are defined."""

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
    if isinstance(value, Sequence):
        return not value.is_resolved
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


def _is_number(value: Any) -> bool:
    # bool is an int subclass, but True is never a sensible learning rate.
    return isinstance(value, (int, float)) and not isinstance(value, bool)


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


def _number(
    family: str,
    name: str,
    value: Any,
    rule: str = "",
    ok: Callable[[int | float], bool] = lambda x: True,
) -> Any:
    """A finite int or float (not bool) satisfying ``ok``; ``rule`` describes ``ok``."""
    if _is_domain(value):
        return value
    value = _plain(value)
    allowed = f"a finite number{rule}"
    if not _is_number(value):
        raise TypeError(f"{family}: {name} must be {allowed}, got {value!r} ({_type_name(value)})")
    if not _is_finite(value) or not ok(value):
        raise ValueError(f"{family}: {name} must be {allowed}, got {value!r}")
    return value


def _integer(
    family: str,
    name: str,
    value: Any,
    rule: str = " > 0",
    ok: Callable[[int], bool] = lambda x: x > 0,
) -> Any:
    """An int (not bool) satisfying ``ok``; positive by default."""
    if _is_domain(value):
        return value
    value = _plain(value)
    allowed = f"an int{rule}"
    if not isinstance(value, int) or isinstance(value, bool):
        raise TypeError(f"{family}: {name} must be {allowed}, got {value!r} ({_type_name(value)})")
    if not ok(value):
        raise ValueError(f"{family}: {name} must be {allowed}, got {value!r}")
    return value


def _scalar(family: str, name: str, value: Any) -> Any:
    """A hyper-parameter value: a finite number, str, bool or None."""
    if _is_domain(value):
        return value
    value = _plain(value)
    allowed = "a scalar (finite number, str, bool or None)"
    if not (value is None or isinstance(value, (str, bool)) or _is_number(value)):
        raise TypeError(f"{family}: {name} must be {allowed}, got {value!r} ({_type_name(value)})")
    if _is_number(value) and not _is_finite(value):
        raise ValueError(f"{family}: {name} must be {allowed}, got {value!r}")
    return value


def _list(family: str, name: str, value: Any, allowed: str) -> tuple | Any:
    """A list or tuple, stored as a tuple so that the sequence stays immutable."""
    if _is_domain(value):
        return value
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


def _part(family: str, name: str, value: Any) -> Sequence | Any:
    """A sequence slot: a Sequence, a sequence spec dict, a plain value or a Tune domain.

    A domain is kept as is rather than wrapped in ``Constant``, so that Tune may
    choose between whole sequences (``tune.choice([Exponential(...), Cosine(...)])``).
    """
    if isinstance(value, Sequence) or _is_domain(value):
        return value
    if isinstance(value, dict):
        return from_json(value)
    return Constant(_scalar(family, name, value))


def _length_check(family: str, items_name: str, items: Any, milestones: Any) -> None:
    if isinstance(items, tuple) and isinstance(milestones, tuple) and len(items) != len(milestones) + 1:
        raise ValueError(
            f"{family}: {items_name} must have len(milestones) + 1 = {len(milestones) + 1} "
            f"entries, got {len(items)}"
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


class Sequence(abc.ABC):
    """A hyper-parameter value per 0-based training iteration.

    Subclasses (the *families*) are immutable; their constructor parameters are
    in :attr:`params` and are also read-only attributes of the same name (except
    ``values``, which would hide the :meth:`values` method).  They are
    registered in :data:`FAMILIES` under their class name.
    """

    family: ClassVar[str]
    _param_names: ClassVar[tuple[str, ...]]
    _defaults: ClassVar[dict[str, Any]]

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        # The JSON keys are the constructor parameters, read once from the signature.
        params = list(inspect.signature(cls.__init__).parameters.values())[1:]
        cls._param_names = tuple(p.name for p in params)
        cls._defaults = {p.name: p.default for p in params if p.default is not p.empty}
        cls.family = cls.__name__
        FAMILIES[cls.family] = cls

    # -- construction ------------------------------------------------------

    def _setup(self, **params: Any) -> None:
        """Store validated parameters, find unresolved ones, finish if resolved."""
        object.__setattr__(self, "_params", {name: params[name] for name in self._param_names})
        unresolved: list[str] = []
        for name in self._param_names:
            unresolved.extend(_unresolved_paths(name, params[name]))
        object.__setattr__(self, "_unresolved", tuple(unresolved))
        object.__setattr__(self, "_key", None)
        object.__setattr__(self, "_cache", _EMPTY)
        if not unresolved:
            object.__setattr__(self, "_kind", self._prepare())

    def _prepare(self) -> str:
        """Check rules that need every parameter resolved, precompute, return the kind.

        The default is a float-valued family with no cross-parameter rule.
        """
        return "float"

    @abc.abstractmethod
    def _range(self, start: int, stop: int) -> np.ndarray:
        """Values for iterations [start, stop) of a resolved sequence."""

    @property
    def params(self) -> MappingProxyType[str, Any]:
        """The constructor parameters, by name (read-only)."""
        return MappingProxyType(self._params)

    def __getattr__(self, name: str) -> Any:
        # Only reached when normal lookup fails; reads __dict__ directly because
        # unpickling probes attributes before the instance state is restored.
        params = self.__dict__.get("_params")
        if params is None or name not in params:
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        return params[name]

    def __getstate__(self) -> dict[str, Any]:
        # The value cache is rebuilt on demand; don't ship it to Ray workers.
        return {name: value for name, value in self.__dict__.items() if name != "_cache"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _cache=_EMPTY)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{self.family} is immutable; build a new sequence instead")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{self.family} is immutable; build a new sequence instead")

    # -- values ------------------------------------------------------------

    @property
    def is_resolved(self) -> bool:
        """False if any parameter (recursively) is an unresolved Tune domain."""
        return not self._unresolved

    def _require_resolved(self, action: str) -> None:
        if self._unresolved:
            raise ValueError(
                f"{self.family}: cannot {action}: parameter(s) {', '.join(self._unresolved)} "
                "are unresolved Tune search-space domains; a trial must be drawn first "
                "(e.g. by the Tuner or a searcher), then rebuild the sequence from the "
                "resolved spec with from_json()"
            )

    def value(self, iteration: int) -> Any:
        """The value at ``iteration`` as a Python scalar (int, float, bool, str, ...).

        Computed through :meth:`values`, so that what a trainable observes can
        never disagree with what the planner compared.
        """
        if type(iteration) is not int or not 0 <= iteration < _CACHE_LIMIT:
            iteration = _iteration(f"{self.family}.value", "iteration", iteration)
            return _to_python(self.values(iteration, iteration + 1)[0])
        cache = self._cache
        if iteration >= len(cache):
            cache = self._cached_prefix(iteration + 1)
        return _to_python(cache[iteration])

    def _cached_prefix(self, stop: int) -> np.ndarray:
        """Values of [0, n) for some n >= stop (stop <= _CACHE_LIMIT), cached."""
        cache = self._cache
        if stop > len(cache):
            self._require_resolved("compute values")
            length = min(_CACHE_LIMIT, max(stop, 2 * len(cache), 256))
            cache = self._range(0, length).astype(_DTYPES[self._kind], copy=False)
            cache.flags.writeable = False
            object.__setattr__(self, "_cache", cache)
        return cache

    def values(self, start: int, stop: int) -> np.ndarray:
        """Values for iterations ``[start, stop)``.

        The dtype is int64, float64 or bool when all values are of that type,
        object otherwise (categorical values).
        """
        self._require_resolved("compute values")
        where = f"{self.family}.values"
        start = _iteration(where, "start", start)
        stop = _iteration(where, "stop", stop)
        if stop < start:
            raise ValueError(f"{where}: stop must be >= start, got start={start}, stop={stop}")
        if stop <= _CACHE_LIMIT:
            return self._cached_prefix(stop)[start:stop].copy()
        return self._range(start, stop).astype(_DTYPES[self._kind], copy=False)

    def first_difference(self, other: Sequence | Any, stop: int, start: int = 0) -> int | None:
        """First iteration in ``[start, stop)`` where the two sequences differ, else None.

        Values differ when they are unequal or of different types (``128`` vs
        ``128.0``, ``1`` vs ``True``): a trainable can observe the type, and
        sharing iterations that differ is a correctness bug, while not sharing
        is only a lost saving.

        Args:
            other: a sequence, or a plain value (compared as a ``Constant``).
            stop: end of the range (exclusive).
            start: beginning of the range.

        Example:
            >>> Constant(0.1).first_difference(Exponential(0.1, 1.0), stop=50)
            >>> Step(1.0, 10, 0.5).first_difference(Exponential(1.0, 0.5), stop=50)
            1
        """
        other = as_sequence(other)
        where = f"{self.family}.first_difference"
        start = _iteration(where, "start", start)
        stop = _iteration(where, "stop", stop)
        self._require_resolved("compare values")
        other._require_resolved("compare values")
        return first_difference_unchecked(self, other, stop, start)


    # -- composition ------------------------------------------------------

    def _pieces(self, until: int | None = None) -> tuple[tuple[Any, ...], tuple[int, ...]]:
        """(parts, milestones) of this sequence as a Concat, cut at iteration ``until``."""
        return (self,), ()

    def then(self, other: Sequence | Any, at: int) -> Concat:
        """This sequence on ``[0, at)``, then ``other`` restarting at its own iteration 0.

        Chaining flattens: ``a.then(b, 10).then(c, 20)`` is
        ``Concat([a, b, c], [10, 20])``, not a nested Concat.

        Example:
            >>> s = Constant(0.1).then(0.01, at=100).then(0.001, at=150)
            >>> s.parts, s.milestones
            ((Constant(init=0.1), Constant(init=0.01), Constant(init=0.001)), (100, 150))
        """
        at = _integer(f"{self.family}.then", "at", at)
        if _is_domain(at):
            return Concat([self, other], [at])
        head_parts, head_milestones = self._pieces(until=at)
        tail = _part(f"{self.family}.then", "other", other)
        tail_parts, tail_milestones = tail._pieces() if isinstance(tail, Sequence) else ((tail,), ())
        return Concat(
            parts=head_parts + tail_parts,
            milestones=head_milestones + (at,) + tuple(at + m for m in tail_milestones),
        )

    # -- serialisation ----------------------------------------------------

    def _form(self, spec: bool) -> dict[str, Any]:
        form = {"family": self.family}
        for name, value in self._params.items():
            form[name] = _form_value(value, spec)
        return form

    def to_json(self) -> dict[str, Any]:
        """Declarative, JSON-serialisable form: ``{"family": ..., <parameters>}``.

        Raises:
            ValueError: if a parameter is an unresolved Tune domain (use :meth:`to_spec`).
        """
        self._require_resolved("serialise to JSON")
        return self._form(spec=False)

    def to_spec(self) -> dict[str, Any]:
        """Like :meth:`to_json`, but unresolved Tune domains stay in place.

        Put the result in a Tune ``param_space``; once Tune has drawn the
        domains, :func:`from_json` rebuilds and validates the sequence.
        """
        return self._form(spec=True)

    def _canonical_key(self) -> tuple:
        # Sequences are immutable, so the key is computed once. Scalars carry
        # their type: Constant(1), Constant(1.0) and Constant(True) differ.
        if self._key is None:
            if self.is_resolved:
                key = (self.family,) + tuple(_key_of(value) for value in self._params.values())
            else:
                # Domains have no canonical form; their repr keeps distinct ones apart.
                key = ("repr", repr(self))
            object.__setattr__(self, "_key", key)
            object.__setattr__(self, "_hash", hash(key))
        return self._key

    def __eq__(self, other: object) -> bool:
        if self is other:
            return True
        if not isinstance(other, Sequence):
            return NotImplemented
        return self._canonical_key() == other._canonical_key()

    def __hash__(self) -> int:
        self._canonical_key()
        return self._hash

    def observed(self, iteration: int) -> tuple:
        """Hashable token of the value at ``iteration``: equal tokens exactly
        when `first_difference` sees no difference there (value and type)."""
        cache = self._cache
        if iteration >= len(cache):
            if iteration >= _CACHE_LIMIT:
                value = self.value(iteration)
                return (type(value), value)
            cache = self._cached_prefix(iteration + 1)
        value = cache[iteration]
        return (type(value), value) if self._kind == "object" else (self._kind, value)

    def __repr__(self) -> str:
        shown = []
        for name, value in self._params.items():
            if name in self._defaults and _is_default(value, self._defaults[name]):
                continue
            shown.append(f"{name}={_repr_value(value)}")
        return f"{self.family}({', '.join(shown)})"



def first_difference_unchecked(a: Sequence, b: Sequence, stop: int, start: int = 0) -> int | None:
    """`Sequence.first_difference` for two resolved sequences and valid ints,
    without the argument checks: the planner's inner loop."""
    if start >= stop or a is b or a == b:
        return None
    if stop <= _CACHE_LIMIT:
        differs = _differs(a._cached_prefix(stop)[start:stop], a._kind, b._cached_prefix(stop)[start:stop], b._kind)
        return start + int(differs.argmax()) if differs.any() else None
    chunk = _FIRST_CHUNK
    while start < stop:
        end = min(stop, start + chunk)
        differs = _differs(a.values(start, end), a._kind, b.values(start, end), b._kind)
        if differs.any():
            return start + int(differs.argmax())
        start, chunk = end, chunk * 4
    return None


def _key_of(value: Any) -> Any:
    if type(value) in _SCALAR_TYPES:
        return (type(value), value)
    if isinstance(value, Sequence):
        return value._canonical_key()
    if isinstance(value, tuple):
        return ("list",) + tuple(_key_of(item) for item in value)
    return (type(value), value)


def _unresolved_paths(name: str, value: Any) -> list[str]:
    """Dotted paths of the unresolved domains under parameter ``name``."""
    if isinstance(value, Sequence):
        return [f"{name}.{path}" for path in value._unresolved]
    if isinstance(value, tuple):
        paths: list[str] = []
        for k, item in enumerate(value):
            paths.extend(_unresolved_paths(f"{name}[{k}]", item))
        return paths
    return [name] if _is_domain(value) else []


def _form_value(value: Any, spec: bool) -> Any:
    if isinstance(value, Sequence):
        return value.to_spec() if spec else value.to_json()
    if isinstance(value, tuple):
        return [_form_value(item, spec) for item in value]
    return value


def _is_default(value: Any, default: Any) -> bool:
    if _is_unresolved(value):
        return False
    return type(value) is type(default) and value == default


def _repr_value(value: Any) -> str:
    if isinstance(value, tuple):
        return "[" + ", ".join(_repr_value(item) for item in value) + "]"
    return repr(value)


def _differs(a: np.ndarray, kind_a: str, b: np.ndarray, kind_b: str) -> np.ndarray:
    """Element-wise 'value or type differs' for two value arrays."""
    if kind_a == kind_b and kind_a != "object":
        return a != b
    if "object" not in (kind_a, kind_b):
        # int vs float vs bool: every value differs in type.
        return np.ones(len(a), dtype=bool)
    return _scalar_differs(a.astype(object), b.astype(object)).astype(bool)


_scalar_differs = np.frompyfunc(lambda x, y: type(x) is not type(y) or x != y, 2, 1)


# --------------------------------------------------------------------------
# Families
# --------------------------------------------------------------------------


class Constant(Sequence):
    """The same value at every iteration.

    Args:
        init: any scalar: a finite number, str, bool or None.

    Example:
        >>> Constant(128).value(1000), Constant("adam").value(0)
        (128, 'adam')
    """

    def __init__(self, init: Any) -> None:
        self._setup(init=_scalar("Constant", "init", init))

    def _prepare(self) -> str:
        return _scalar_kind(self.init)

    def _range(self, start: int, stop: int) -> np.ndarray:
        return np.full(stop - start, self.init, dtype=_DTYPES[self._kind])


class Exponential(Sequence):
    """``init * gamma**i`` (torch ``ExponentialLR``).

    Args:
        init: value at iteration 0.
        gamma: multiplicative factor per iteration, > 0.

    Example:
        >>> Exponential(0.1, 0.5).value(2)
        0.025
    """

    def __init__(self, init: float, gamma: float) -> None:
        self._setup(
            init=_number("Exponential", "init", init),
            gamma=_number("Exponential", "gamma", gamma, " > 0", lambda x: x > 0),
        )

    def _range(self, start: int, stop: int) -> np.ndarray:
        exponents = np.arange(start, stop, dtype=np.float64)
        return self.init * np.power(float(self.gamma), exponents)


class Step(Sequence):
    """``init * gamma**(i // step_size)`` (torch ``StepLR``).

    Args:
        init: value at iteration 0.
        step_size: iterations between two decays, a positive int.
        gamma: factor applied every ``step_size`` iterations, > 0.

    Example:
        >>> [Step(1.0, 2, 0.5).value(i) for i in range(5)]
        [1.0, 1.0, 0.5, 0.5, 0.25]
    """

    def __init__(self, init: float, step_size: int, gamma: float) -> None:
        self._setup(
            init=_number("Step", "init", init),
            step_size=_integer("Step", "step_size", step_size),
            gamma=_number("Step", "gamma", gamma, " > 0", lambda x: x > 0),
        )

    def _range(self, start: int, stop: int) -> np.ndarray:
        decays = np.arange(start, stop, dtype=np.int64) // self.step_size
        return self.init * np.power(float(self.gamma), decays.astype(np.float64))


class MultiStep(Sequence):
    """Piecewise constant, changing at ``milestones``.

    Either ``init * gamma**k`` where ``k`` is the number of milestones ``<= i``
    (torch ``MultiStepLR``), or explicit ``values``: ``values[k]`` on
    ``[milestones[k-1], milestones[k])``.  Values may be ints (batch sizes stay
    ints; ``init`` and ``gamma`` both ints also give ints) or categorical.

    Args:
        init: value before the first milestone (with ``gamma``).
        milestones: strictly increasing positive ints.
        gamma: factor applied at each milestone, > 0 (with ``init``).
        values: keyword-only alternative to ``init``/``gamma``:
            ``len(milestones) + 1`` scalars.

    Example:
        >>> MultiStep(0.1, [100, 150], 0.1).value(120)
        0.010000000000000002
        >>> MultiStep(values=[128, 256], milestones=[70]).value(70)
        256
        >>> MultiStep(values=["adam", "sgd"], milestones=[40]).value(39)
        'adam'
    """

    def __init__(
        self,
        init: float | None = None,
        milestones: list[int] | tuple[int, ...] = (),
        gamma: float | None = None,
        *,
        values: list[Any] | tuple[Any, ...] | None = None,
    ) -> None:
        if values is None:
            if init is None or gamma is None:
                raise ValueError(
                    "MultiStep: give either init and gamma, or values; "
                    f"got init={init!r}, gamma={gamma!r}, values=None"
                )
            init = _number("MultiStep", "init", init)
            gamma = _number("MultiStep", "gamma", gamma, " > 0", lambda x: x > 0)
        elif init is not None or gamma is not None:
            raise ValueError(
                "MultiStep: give either init and gamma, or values, not both; "
                f"got init={init!r}, gamma={gamma!r}, values={values!r}"
            )
        else:
            values = _scalars("MultiStep", "values", values)
        milestones = _milestones("MultiStep", "milestones", milestones)
        if values is not None:
            _length_check("MultiStep", "values", values, milestones)
        self._setup(init=init, milestones=milestones, gamma=gamma, values=values)

    def _prepare(self) -> str:
        if self._params["values"] is not None:
            table = list(self._params["values"])
        else:
            # Python arithmetic keeps int * int**k exact (batch-size doubling).
            table = [self.init * self.gamma**k for k in range(len(self.milestones) + 1)]
        kind = _combine_kinds([_scalar_kind(v) for v in table])
        object.__setattr__(self, "_table", np.array(table, dtype=_DTYPES[kind]))
        object.__setattr__(self, "_milestone_array", np.array(self.milestones, dtype=np.int64))
        return kind

    def _range(self, start: int, stop: int) -> np.ndarray:
        iterations = np.arange(start, stop, dtype=np.int64)
        return self._table[np.searchsorted(self._milestone_array, iterations, side="right")]


class CyclicLR(Sequence):
    """Triangular cycle (torch ``CyclicLR(mode="triangular", cycle_momentum=False)``).

    Rises linearly from ``init`` to ``max_y`` over ``period1`` iterations, falls
    back over ``period2``, and repeats.

    Args:
        init: lowest value (torch ``base_lr``).
        max_y: highest value (torch ``max_lr``).
        period1: iterations of the rise, a positive int (``step_size_up``).
        period2: iterations of the fall, a positive int; None means ``period1``.

    Example:
        >>> [CyclicLR(0.0, 1.0, 2).value(i) for i in range(5)]
        [0.0, 0.5, 1.0, 0.5, 0.0]
    """

    def __init__(self, init: float, max_y: float, period1: int, period2: int | None = None) -> None:
        self._setup(
            init=_number("CyclicLR", "init", init),
            max_y=_number("CyclicLR", "max_y", max_y),
            period1=_integer("CyclicLR", "period1", period1),
            period2=None if period2 is None else _integer("CyclicLR", "period2", period2),
        )

    def _range(self, start: int, stop: int) -> np.ndarray:
        # Same operations, in the same order, as torch's CyclicLR.get_lr.
        period2 = self.period1 if self.period2 is None else self.period2
        total = float(self.period1 + period2)
        step_ratio = self.period1 / total
        i = np.arange(start, stop, dtype=np.float64)
        cycle = np.floor(1 + i / total)
        x = 1.0 + i / total - cycle
        scale = np.where(x <= step_ratio, x / step_ratio, (x - 1) / (step_ratio - 1))
        return self.init + (self.max_y - self.init) * scale


class Cosine(Sequence):
    """Cosine annealing with warm restarts, SGDR (torch ``CosineAnnealingWarmRestarts``).

    Each cycle starts at ``init`` and anneals towards ``min_y``; cycle ``k``
    lasts ``period * gamma**k`` iterations.

    Args:
        init: value at the start of each cycle.
        min_y: value approached at the end of each cycle (``eta_min``).
        period: length of the first cycle, a positive int (``T_0``).
        gamma: cycle length multiplier, an int >= 1 (``T_mult``).

    Example:
        >>> [round(Cosine(1.0, 0.0, 2).value(i), 6) for i in range(4)]
        [1.0, 0.5, 1.0, 0.5]
    """

    def __init__(self, init: float, min_y: float, period: int, gamma: int = 1) -> None:
        self._setup(
            init=_number("Cosine", "init", init),
            min_y=_number("Cosine", "min_y", min_y),
            period=_integer("Cosine", "period", period),
            gamma=_integer("Cosine", "gamma", gamma, " >= 1", lambda x: x >= 1),
        )

    def _range(self, start: int, stop: int) -> np.ndarray:
        iterations = np.arange(start, stop, dtype=np.int64)
        if self.gamma == 1:
            t_cur = iterations % self.period
            t_len = np.full(len(iterations), self.period, dtype=np.int64)
        else:
            # Cycle starts grow geometrically: only O(log stop) of them, built
            # with exact integer arithmetic (a float log misplaces boundaries).
            starts, lengths = [0], [self.period]
            while starts[-1] + lengths[-1] < stop:
                starts.append(starts[-1] + lengths[-1])
                lengths.append(lengths[-1] * self.gamma)
            cycle = np.searchsorted(np.array(starts, dtype=np.int64), iterations, side="right") - 1
            t_cur = iterations - np.array(starts, dtype=np.int64)[cycle]
            t_len = np.array(lengths, dtype=np.float64)[cycle]
        return self.min_y + (self.init - self.min_y) * (1 + np.cos(np.pi * t_cur / t_len)) / 2


class Warmup(Sequence):
    """Linear warm-up from ``init`` to ``func.value(0)``, then ``func`` shifted by ``period``.

    ``value(i) = init + (func.value(0) - init) * i / period`` for ``i < period``,
    and ``func.value(i - period)`` after, so ``value(period) == func.value(0)``.

    Args:
        init: value at iteration 0.
        period: warm-up length, a positive int.
        func: the numeric sequence that follows; a plain number means ``Constant``.

    Example:
        >>> w = Warmup(0.0, 4, Exponential(0.1, 0.5))
        >>> [round(w.value(i), 4) for i in range(6)]
        [0.0, 0.025, 0.05, 0.075, 0.1, 0.05]
    """

    def __init__(self, init: float, period: int, func: Sequence | Any) -> None:
        self._setup(
            init=_number("Warmup", "init", init),
            period=_integer("Warmup", "period", period),
            func=_part("Warmup", "func", func),
        )

    def _prepare(self) -> str:
        if self.func._kind not in ("int", "float"):
            raise ValueError(f"Warmup: func must have numeric values to warm up to, got {self.func!r}")
        object.__setattr__(self, "_target", float(self.func._range(0, 1)[0]))
        return "float"

    def _range(self, start: int, stop: int) -> np.ndarray:
        out = np.empty(stop - start, dtype=np.float64)
        split = min(max(start, self.period), stop)
        ramp = np.arange(start, split, dtype=np.float64)
        out[: split - start] = self.init + (self._target - self.init) * ramp / self.period
        if split < stop:
            out[split - start :] = self.func._range(split - self.period, stop - self.period)
        return out


class Linear(Sequence):
    """Linear from ``init`` to ``end`` over ``period`` iterations, then ``end`` (torch ``LinearLR``).

    Args:
        init: value at iteration 0 (torch: ``base_lr * start_factor``).
        end: value from iteration ``period`` on (torch: ``base_lr * end_factor``).
        period: a positive int (torch ``total_iters``).

    Example:
        >>> [Linear(0.0, 1.0, 4).value(i) for i in (0, 1, 4, 9)]
        [0.0, 0.25, 1.0, 1.0]
    """

    def __init__(self, init: float, end: float, period: int) -> None:
        self._setup(
            init=_number("Linear", "init", init),
            end=_number("Linear", "end", end),
            period=_integer("Linear", "period", period),
        )

    def _range(self, start: int, stop: int) -> np.ndarray:
        i = np.arange(start, stop, dtype=np.float64)
        ramp = self.init + (self.end - self.init) * i / self.period
        # Exactly `end` afterwards: init + (end - init) can be off by one ulp.
        return np.where(i >= self.period, float(self.end), ramp)


class OneCycle(Sequence):
    """The 1cycle policy (torch ``OneCycleLR`` learning rate, ``cycle_momentum=False``).

    Starts at ``max_value / div_factor``, rises to ``max_value`` over the first
    ``pct_start`` of ``total_steps``, then anneals to
    ``max_value / div_factor / final_div_factor`` (with ``three_phase``, first
    back to the start value, symmetrically).  Holds its final value after
    ``total_steps``.

    Args:
        max_value: peak value (torch ``max_lr``).
        total_steps: length of the cycle, a positive int.
        pct_start: fraction of the cycle spent rising, in (0, 1).
        anneal_strategy: "cos" or "linear".
        div_factor: ``max_value / initial value``, > 0.
        final_div_factor: ``initial value / final value``, > 0.
        three_phase: use the three-phase variant.

    Example:
        >>> s = OneCycle(1.0, 10, pct_start=0.5, anneal_strategy="linear", div_factor=2.0,
        ...              final_div_factor=1.0)
        >>> [round(s.value(i), 3) for i in (0, 4, 9, 20)]
        [0.5, 1.0, 0.5, 0.5]
    """

    def __init__(
        self,
        max_value: float,
        total_steps: int,
        pct_start: float = 0.3,
        anneal_strategy: str = "cos",
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        three_phase: bool = False,
    ) -> None:
        if not (_is_domain(anneal_strategy) or anneal_strategy in ("cos", "linear")):
            raise ValueError(f'OneCycle: anneal_strategy must be "cos" or "linear", got {anneal_strategy!r}')
        if not (_is_domain(three_phase) or isinstance(three_phase, (bool, np.bool_))):
            raise TypeError(
                f"OneCycle: three_phase must be a bool, got {three_phase!r} ({_type_name(three_phase)})"
            )
        self._setup(
            max_value=_number("OneCycle", "max_value", max_value),
            total_steps=_integer("OneCycle", "total_steps", total_steps),
            pct_start=_number("OneCycle", "pct_start", pct_start, " in (0, 1)", lambda x: 0 < x < 1),
            anneal_strategy=anneal_strategy,
            div_factor=_number("OneCycle", "div_factor", div_factor, " > 0", lambda x: x > 0),
            final_div_factor=_number(
                "OneCycle", "final_div_factor", final_div_factor, " > 0", lambda x: x > 0
            ),
            three_phase=_plain(three_phase),
        )

    def _prepare(self) -> str:
        # Phase boundaries exactly as torch computes them: (end_step, from value, to value).
        initial = self.max_value / self.div_factor
        final = initial / self.final_div_factor
        rise_end = float(self.pct_start * self.total_steps) - 1
        if self.three_phase:
            phases = [
                (rise_end, initial, self.max_value),
                (float(2 * self.pct_start * self.total_steps) - 2, self.max_value, initial),
                (self.total_steps - 1, initial, final),
            ]
        else:
            phases = [(rise_end, initial, self.max_value), (self.total_steps - 1, self.max_value, final)]
        starts = [0.0] + [end for end, _, _ in phases[:-1]]
        if any(end == begin for (end, _, _), begin in zip(phases, starts)):
            # torch divides by this phase length and fails with ZeroDivisionError.
            raise ValueError(
                f"OneCycle: pct_start={self.pct_start!r} with total_steps={self.total_steps!r} "
                "gives a phase of zero length; change pct_start or total_steps"
            )
        object.__setattr__(self, "_phases", tuple(zip(starts, phases)))
        return "float"

    def _range(self, start: int, stop: int) -> np.ndarray:
        step = np.minimum(np.arange(start, stop, dtype=np.float64), self.total_steps - 1)
        out = np.empty(stop - start, dtype=np.float64)
        pending = np.ones(stop - start, dtype=bool)
        for k, (begin, (end_step, first, last)) in enumerate(self._phases):
            # torch takes the first phase whose end_step >= step, else the last one.
            mine = pending if k == len(self._phases) - 1 else pending & (step <= end_step)
            pct = (step[mine] - begin) / (end_step - begin)
            if self.anneal_strategy == "cos":
                out[mine] = last + (first - last) / 2.0 * (np.cos(np.pi * pct) + 1)
            else:
                out[mine] = (last - first) * pct + first
            pending &= ~mine
        return out


class Polynomial(Sequence):
    """``(init - end) * (1 - min(i, T) / T)**power + end`` (torch ``PolynomialLR`` when ``end == 0``).

    Args:
        init: value at iteration 0.
        total_steps: ``T``, iterations to reach ``end``, a positive int.
        power: exponent, a finite number >= 0.
        end: value from iteration ``T`` on.

    Example:
        >>> [Polynomial(1.0, 4, power=2.0).value(i) for i in (0, 2, 4, 8)]
        [1.0, 0.25, 0.0, 0.0]
    """

    def __init__(self, init: float, total_steps: int, power: float = 1.0, end: float = 0.0) -> None:
        self._setup(
            init=_number("Polynomial", "init", init),
            total_steps=_integer("Polynomial", "total_steps", total_steps),
            power=_number("Polynomial", "power", power, " >= 0", lambda x: x >= 0),
            end=_number("Polynomial", "end", end),
        )

    def _range(self, start: int, stop: int) -> np.ndarray:
        i = np.minimum(np.arange(start, stop, dtype=np.float64), self.total_steps)
        return (self.init - self.end) * (1.0 - i / self.total_steps) ** self.power + self.end


class InverseSqrt(Sequence):
    """``init * sqrt(timescale / (i + timescale))``.

    ``Warmup(0, W, InverseSqrt(peak, W))`` is fairseq's ``inverse_sqrt``
    schedule: linear warm-up to ``peak``, then ``peak * sqrt(W / i)``.

    Args:
        init: value at iteration 0.
        timescale: a finite number > 0; the value halves at ``i = 3 * timescale``.

    Example:
        >>> InverseSqrt(1.0, 10).value(30)
        0.5
    """

    def __init__(self, init: float, timescale: float) -> None:
        self._setup(
            init=_number("InverseSqrt", "init", init),
            timescale=_number("InverseSqrt", "timescale", timescale, " > 0", lambda x: x > 0),
        )

    def _range(self, start: int, stop: int) -> np.ndarray:
        i = np.arange(start, stop, dtype=np.float64)
        return self.init * np.sqrt(self.timescale / (i + self.timescale))


class Values(Sequence):
    """An explicit list: ``values[i]``, and the last value after the list ends.

    Args:
        values: a non-empty list of scalars.

    Example:
        >>> [Values([1, 2, 3]).value(i) for i in range(5)]
        [1, 2, 3, 3, 3]
    """

    def __init__(self, values: list[Any] | tuple[Any, ...]) -> None:
        self._setup(values=_scalars("Values", "values", values))

    def _prepare(self) -> str:
        table = self._params["values"]
        kind = _combine_kinds([_scalar_kind(v) for v in table])
        object.__setattr__(self, "_table", np.array(table, dtype=_DTYPES[kind]))
        return kind

    def _range(self, start: int, stop: int) -> np.ndarray:
        last = len(self._table) - 1
        return self._table[np.minimum(np.arange(start, stop, dtype=np.int64), last)]


class Concat(Sequence):
    """Sequences one after another: ``parts[k]`` on ``[milestones[k-1], milestones[k])``.

    Each part restarts at its own iteration 0:
    ``value(i) = parts[k].value(i - milestones[k-1])`` (torch ``SequentialLR``).
    Usually built with :meth:`Sequence.then`.

    Args:
        parts: ``len(milestones) + 1`` sequences; plain values mean ``Constant``.
        milestones: strictly increasing positive ints.

    Example:
        >>> s = Concat([Linear(0.0, 1.0, 10), Exponential(1.0, 0.5)], [10])
        >>> [s.value(i) for i in (5, 10, 11)]
        [0.5, 1.0, 0.5]
    """

    def __init__(self, parts: list[Any] | tuple[Any, ...], milestones: list[int] | tuple[int, ...]) -> None:
        parts = _list("Concat", "parts", parts, "a list of sequences or values")
        if isinstance(parts, tuple):
            parts = tuple(_part("Concat", f"parts[{k}]", part) for k, part in enumerate(parts))
        milestones = _milestones("Concat", "milestones", milestones)
        _length_check("Concat", "parts", parts, milestones)
        self._setup(parts=parts, milestones=milestones)

    def _prepare(self) -> str:
        return _combine_kinds([part._kind for part in self.parts])

    def _pieces(self, until: int | None = None) -> tuple[tuple[Any, ...], tuple[int, ...]]:
        if _is_unresolved(self.milestones) or not isinstance(self.parts, tuple):
            return super()._pieces(until)
        keep = len(self.milestones) if until is None else bisect.bisect_left(self.milestones, until)
        return self.parts[: keep + 1], self.milestones[:keep]

    def _range(self, start: int, stop: int) -> np.ndarray:
        out = np.empty(stop - start, dtype=_DTYPES[self._kind])
        bounds = (0, *self.milestones)
        # Only the parts that overlap [start, stop), each filling one slice.
        k = bisect.bisect_right(self.milestones, start)
        while k < len(self.parts) and bounds[k] < stop:
            low = max(start, bounds[k])
            high = stop if k == len(self.milestones) else min(stop, self.milestones[k])
            out[low - start : high - start] = self.parts[k]._range(low - bounds[k], high - bounds[k])
            k += 1
        return out


# --------------------------------------------------------------------------
# Module-level helpers
# --------------------------------------------------------------------------


def is_sequence_spec(value: Any) -> bool:
    """True for a dict whose ``"family"`` names a known family (a JSON or spec form).

    Example:
        >>> is_sequence_spec({"family": "Constant", "init": 0.1}), is_sequence_spec({"lr": 0.1})
        (True, False)
    """
    return isinstance(value, dict) and isinstance(value.get("family"), str) and value["family"] in FAMILIES


def from_json(data: dict[str, Any] | str) -> Sequence:
    """Rebuild (and validate) a sequence from :meth:`Sequence.to_json` or :meth:`Sequence.to_spec` output.

    Args:
        data: the dict, or a JSON string of it.  Parameters with defaults may
            be omitted; nested sequences are nested dicts (or Sequence objects,
            as Tune leaves them after resolving a ``tune.choice`` of sequences).

    Raises:
        ValueError: invalid JSON, unknown family, missing or unknown keys, or
            invalid parameter values.

    Example:
        >>> from_json('{"family": "Exponential", "init": 0.1, "gamma": 0.9}')
        Exponential(init=0.1, gamma=0.9)
    """
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as error:
            raise ValueError(f"from_json: not valid JSON ({error})") from None
    if not isinstance(data, dict):
        raise TypeError(f"from_json: expected a dict or a JSON string of one, got {_type_name(data)}")
    if "family" not in data:
        raise ValueError(f'from_json: missing key "family" in {data!r}')
    family = data["family"]
    if not isinstance(family, str) or family not in FAMILIES:
        known = ", ".join(sorted(FAMILIES))
        raise ValueError(f"from_json: unknown family {family!r}; known families: {known}")
    cls = FAMILIES[family]
    params = {key: value for key, value in data.items() if key != "family"}
    allowed = ", ".join(cls._param_names)
    extra = sorted(set(params) - set(cls._param_names), key=str)
    if extra:
        unknown = ", ".join(map(str, extra))
        raise ValueError(f"from_json: {family} has no parameter(s) {unknown}; it takes {allowed}")
    missing = [name for name in cls._param_names if name not in params and name not in cls._defaults]
    if missing:
        absent = ", ".join(missing)
        raise ValueError(f"from_json: {family} is missing parameter(s) {absent}; it takes {allowed}")
    return cls(**params)


def as_sequence(value: Any) -> Sequence:
    """A Sequence as is, a sequence spec dict rebuilt, anything else as ``Constant(value)``.

    Example:
        >>> as_sequence(0.1), as_sequence("adam")
        (Constant(init=0.1), Constant(init='adam'))
    """
    if isinstance(value, Sequence):
        return value
    if isinstance(value, dict) and "family" in value:
        return from_json(value)
    return Constant(value)
