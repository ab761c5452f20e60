"""Pausing Python's cyclic garbage collector around the planner's bulk work.

Planning allocates many small objects into a heap that already holds every
trial of a study; each automatic collector pass then walks that whole heap.
With 100k trials the passes cost 5-10x the planning itself. The planner's
bulk operations create no garbage cycles worth collecting mid-way, so they
run with the collector paused; it resumes (and catches up) afterwards.
"""

from __future__ import annotations

import contextlib
import functools
import gc
from collections.abc import Callable, Iterator
from typing import TypeVar

F = TypeVar("F", bound=Callable)


@contextlib.contextmanager
def gc_paused() -> Iterator[None]:
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def without_gc(function: F) -> F:
    """Decorator form of `gc_paused`."""

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        with gc_paused():
            return function(*args, **kwargs)

    return wrapper  # type: ignore[return-value]
