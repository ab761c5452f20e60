"""The `Sequence` base class, the family registry, the two structural families
(`Constant`, the default for a plain value, and `Concat`, what `Sequence.then`
builds) and the declarative JSON form (`from_json`, `as_sequence`).
"""

from __future__ import annotations

import abc
import bisect
import inspect
import json
from types import MappingProxyType
from typing import Any, ClassVar

import numpy as np

from ray_stagetree.sequences._params import (
    _CACHE_LIMIT,
    _DTYPES,
    _EMPTY,
    _FIRST_CHUNK,
    _SCALAR_TYPES,
    _combine_kinds,
    _integer,
    _is_domain,
    _is_unresolved,
    _iteration,
    _length_check,
    _list,
    _milestones,
    _scalar,
    _scalar_kind,
    _to_python,
    _type_name,
)
from ray_stagetree.validation import did_you_mean

FAMILIES: dict[str, type[Sequence]] = {}
"""Family name -> class, filled as the families are defined."""


def _register(cls: type[Sequence]) -> None:
    """Register a family under its class name, the name its JSON form
    carries. An abstract base (a `Sequence` still missing `_range`) is no
    family; a second class of an existing family's name is refused, since
    plans written with one would load as the other."""
    if inspect.isabstract(cls):
        return
    known = FAMILIES.get(cls.family)
    if known is not None:
        raise TypeError(
            f"sequence family {cls.family!r} is already defined by {known.__module__}.{known.__qualname__}; "
            f"{cls.__module__}.{cls.__qualname__} needs another class name (a family's JSON form names it by "
            "class name alone)"
        )
    FAMILIES[cls.family] = cls


class Sequence(abc.ABC):
    """A hyper-parameter value per 0-based training iteration.

    Subclasses (the *families*) are immutable; their constructor parameters are
    in :attr:`params` and are also read-only attributes of the same name (except
    ``values``, which would hide the :meth:`values` method).  Defining one
    registers it in :data:`FAMILIES` under its class name (abstract bases
    are not families; a name already taken is refused).
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
        _register(cls)

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

        Examples:
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

        Examples:
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


class Constant(Sequence):
    """The same value at every iteration.

    Args:
        init: any scalar: a finite number, str, bool or None.

    Examples:
        >>> Constant(128).value(1000), Constant("adam").value(0)
        (128, 'adam')
    """

    def __init__(self, init: Any) -> None:
        self._setup(init=_scalar("Constant", "init", init))

    def _prepare(self) -> str:
        return _scalar_kind(self.init)

    def _range(self, start: int, stop: int) -> np.ndarray:
        return np.full(stop - start, self.init, dtype=_DTYPES[self._kind])

    def _cached_prefix(self, stop: int) -> np.ndarray:
        """Every prefix, as a read-only view of one value: each trial of a
        random search holds Constants of its own, and a 100,000-trial study
        must not hold 100,000 arrays of a value repeated."""
        cache = self._cache
        if not len(cache):
            self._require_resolved("compute values")
            cache = np.broadcast_to(np.full(1, self.init, dtype=_DTYPES[self._kind]), (_CACHE_LIMIT,))
            object.__setattr__(self, "_cache", cache)
        return cache


class Concat(Sequence):
    """Sequences one after another: ``parts[k]`` on ``[milestones[k-1], milestones[k])``.

    Each part restarts at its own iteration 0:
    ``value(i) = parts[k].value(i - milestones[k-1])`` (torch ``SequentialLR``).
    Usually built with :meth:`Sequence.then`.

    Args:
        parts: ``len(milestones) + 1`` sequences; plain values mean ``Constant``.
        milestones: strictly increasing positive ints.

    Examples:
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


#: `next_change`'s scan of a family without structure grows its chunks up to
#: this many values: memory stays bounded on any horizon.
_SCAN_CHUNK_LIMIT = 1 << 20


def next_change(sequence: Sequence, after: int, stop: int) -> int | None:
    """The first iteration in ``(after, stop)`` whose value differs (value or
    type, as `Sequence.first_difference` compares) from the iteration
    before it, else None.

    A `Constant` never changes and a `Concat` only at a milestone or inside a
    part, so the structural families answer without computing values: a
    horizon of 10**9 iterations is never expanded. Other families are
    scanned from ``after`` in chunks of bounded size.
    """
    if after + 1 >= stop:
        return None
    if isinstance(sequence, Constant):
        return None
    if isinstance(sequence, Concat) and not _is_unresolved(sequence.milestones):
        return _next_change_in_concat(sequence, after, stop)
    return _scanned_change(sequence, after, stop)


def changes_at(sequence: Sequence, iteration: int) -> bool:
    """Whether the value at ``iteration`` differs from the one before it."""
    return iteration > 0 and next_change(sequence, iteration - 1, iteration + 1) == iteration


def _next_change_in_concat(sequence: Concat, after: int, stop: int) -> int | None:
    bounds = (0, *sequence.milestones)
    k = bisect.bisect_right(sequence.milestones, after)
    while k < len(sequence.parts) and bounds[k] < stop:
        low = bounds[k]
        high = stop if k == len(sequence.milestones) else min(stop, sequence.milestones[k])
        inside = next_change(sequence.parts[k], max(after, low) - low, high - low)
        if inside is not None:
            return low + inside
        if high < stop and sequence.observed(high) != sequence.observed(high - 1):
            return high  # the next part starts with another value
        k += 1
    return None


def _scanned_change(sequence: Sequence, after: int, stop: int) -> int | None:
    start, chunk = after, _FIRST_CHUNK
    while start + 1 < stop:
        end = min(stop, start + chunk)
        values = sequence.values(start, end)  # iteration start is the value the first compared one follows
        differs = _differs(values[1:], sequence._kind, values[:-1], sequence._kind)
        if differs.any():
            return start + 1 + int(differs.argmax())
        start, chunk = end - 1, min(chunk * 4, _SCAN_CHUNK_LIMIT)
    return None


def is_sequence_spec(value: Any) -> bool:
    """True for a dict whose ``"family"`` names a known family (a JSON or spec form).

    Examples:
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

    Examples:
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
        raise ValueError(f"unknown family {family!r}{did_you_mean(family, FAMILIES)}; known families: {known}")
    cls = FAMILIES[family]
    params = {key: value for key, value in data.items() if key != "family"}
    allowed = ", ".join(cls._param_names)
    extra = sorted(set(params) - set(cls._param_names), key=str)
    if extra:
        unknown = ", ".join(f"{name!r}{did_you_mean(name, cls._param_names)}" for name in extra)
        raise ValueError(f"{family} has no parameter {unknown}; it takes {allowed}")
    missing = [name for name in cls._param_names if name not in params and name not in cls._defaults]
    if missing:
        absent = ", ".join(missing)
        raise ValueError(f"{family} is missing parameter(s) {absent}; it takes {allowed}")
    return cls(**params)


def as_sequence(value: Any) -> Sequence:
    """A Sequence as is, a sequence spec dict rebuilt, anything else as ``Constant(value)``.

    Examples:
        >>> as_sequence(0.1), as_sequence("adam")
        (Constant(init=0.1), Constant(init='adam'))
    """
    if isinstance(value, Sequence):
        return value
    if isinstance(value, dict) and "family" in value:
        return from_json(value)
    return Constant(value)
