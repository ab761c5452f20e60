"""Old names of the planning API, kept for one release.

The vocabulary rename gave the planning core one vocabulary: ``iteration`` where it said
``step`` (one training iteration of a trial), ``share_key`` where it said
``study`` for the group of trials that may share stages, `CheckpointSource`
for the checkpoint a stage starts from, and the planning internals moved
from the top-level package to `ray_stagetree.planning`. Every old name
still works and emits a `DeprecationWarning` naming the new one; all of
them are declared through the three helpers here, so removing them next
release is removing their uses.
"""

from __future__ import annotations

import functools
import importlib
import warnings
from collections.abc import Callable, Mapping
from typing import Any, TypeVar

Function = TypeVar("Function", bound=Callable[..., Any])
Class = TypeVar("Class", bound=type)


def _warn(old: str, new: str) -> None:
    # Level 3: the user's line (level 2 is the alias that calls this).
    warnings.warn(f"{old} is deprecated: use {new}", DeprecationWarning, stacklevel=3)


def renamed_arguments(**renames: str) -> Callable[[Function], Function]:
    """Decorator: keyword arguments given under an old name (``step=...``)
    are passed under the new one (``renames = {"step": "iteration"}``)."""

    def decorate(function: Function) -> Function:
        name = function.__qualname__

        @functools.wraps(function)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            if kwargs and not renames.keys().isdisjoint(kwargs):  # the common call pays one set test
                for old, new in renames.items():
                    if old in kwargs:
                        if new in kwargs:
                            raise TypeError(f"{name}() got both {old!r} (its deprecated name) and {new!r}")
                        _warn(f"{name}({old}=...)", f"{new}=...")
                        kwargs[new] = kwargs.pop(old)
            return function(*args, **kwargs)

        return wrapper  # type: ignore[return-value]

    return decorate


def renamed_attributes(**renames: str) -> Callable[[Class], Class]:
    """Class decorator: each old attribute name reads and writes the new one
    with a warning, and an instance pickled under the old names (a study
    snapshot written before the rename) loads under the new ones, silently:
    the user did nothing wrong by restoring it."""

    def decorate(cls: Class) -> Class:
        for old, new in renames.items():
            setattr(cls, old, _alias(cls.__name__, old, new))

        def __setstate__(self: Any, state: Any) -> None:
            # Pickle's default state: a __dict__, or (__dict__ or None, slot values).
            parts = state if isinstance(state, tuple) else (state, None)
            for part in parts:
                for attribute, value in (part or {}).items():
                    object.__setattr__(self, renames.get(attribute, attribute), value)

        setattr(cls, "__setstate__", __setstate__)  # noqa: B010 (a class's own attribute, set from outside)
        return cls

    return decorate


def _alias(owner: str, old: str, new: str) -> property:
    def get(self: Any) -> Any:
        _warn(f"{owner}.{old}", f"{owner}.{new}")
        return getattr(self, new)

    def set_(self: Any, value: Any) -> None:
        _warn(f"{owner}.{old}", f"{owner}.{new}")
        setattr(self, new, value)

    return property(get, set_, doc=f"Deprecated name of `{new}`.")


def moved_names(module: str, moves: Mapping[str, str], lazy: Mapping[str, str] | None = None) -> Callable[[str], Any]:
    """A module ``__getattr__`` for names that moved or were renamed:
    ``moves`` maps each old name to where it is now (``"package.module.Name"``),
    imported when first asked for. ``lazy`` names are current ones imported
    on first use, without a warning (the runtime, which imports Ray)."""
    lazy = lazy or {}

    def __getattr__(name: str) -> Any:
        target = lazy.get(name)
        if target is None:
            target = moves.get(name)
            if target is None:
                raise AttributeError(f"module {module!r} has no attribute {name!r}")
            _warn(f"{module}.{name}", target)
        where, _, attribute = target.rpartition(".")
        return getattr(importlib.import_module(where), attribute)

    return __getattr__
