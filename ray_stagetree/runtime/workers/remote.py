"""Ray's wrapper of a class or function, made once per process.

``ray.remote(cls)`` makes a new actor class at each call, and Ray exports
each one anew when its first actor starts: it pickles the class and
fingerprints the bytecode of every method (``dis``), about 0.2 s per class
on one core. A driver starting 16 stage workers through fresh wrappers spent
seconds on it before Ray started the first worker process; one wrapper per
class is exported once per Ray job.
"""

from __future__ import annotations

import functools
from typing import Any

import ray


@functools.cache
def remote_once(target: Any) -> Any:
    """``ray.remote(target)``, the same object at every call in this process."""
    return ray.remote(target)
