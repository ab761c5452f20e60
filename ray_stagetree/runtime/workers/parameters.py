"""Objects passed with ``tune.with_parameters``, loaded once per stage worker.

Tune's wrapper gets each of its objects from the object store whenever the
trainable is called: once per trial under Tune, but here once per stage
batch, and a trial's path is trained as several batches (each fork starts
one). A dataset is the usual such object, and one of torch tensors is copied
out of the object store, not mapped as numpy arrays are: 500 MB of images
take seconds to get, every batch. A stage worker therefore keeps the objects
it got, keyed by their object ref (the data's identity: one object per
``with_parameters`` call), the `MAX_RESIDENT` it used last, and hands every
batch the same object, as every iteration of a Tune trial uses the one it
got. So a trainable must not change these objects in place (Ray's numpy
arrays are read-only for the same reason): a change would reach the next
batch, which under Tune would be another trial. Each get a batch does is its
``parameters`` phase (`runtime.workers.phases`).
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable
from typing import Any

#: How many ``with_parameters`` objects a stage worker keeps (the ones it used last).
MAX_RESIDENT = 8
PHASE = "parameters"


class ResidentObjects:
    """The objects a worker got by ref, the `MAX_RESIDENT` used last."""

    def __init__(self, get: Callable[[Any], Any], size: int = MAX_RESIDENT) -> None:
        self._get = get
        self._size = size
        self._kept: collections.OrderedDict[Any, Any] = collections.OrderedDict()
        self._lock = threading.Lock()  # batches run in threads of their own (parked ones too)

    def get(self, ref: Any) -> Any:
        with self._lock:
            if ref in self._kept:
                self._kept.move_to_end(ref)
                return self._kept[ref]
        value = self._get(ref)  # outside the lock: another batch's object need not wait for this one
        with self._lock:
            self._kept[ref] = value
            self._kept.move_to_end(ref)
            while len(self._kept) > self._size:
                self._kept.popitem(last=False)
        return value

    def clear(self) -> None:
        with self._lock:
            self._kept.clear()


#: This process's, once `keep_resident` made Tune's registry use it.
_resident: ResidentObjects | None = None


def drop_resident() -> None:
    """Let go of the objects kept so far: the study they were passed to ended
    (the process may run another, `StageWorker.serve`, whose are others)."""
    if _resident is not None:
        _resident.clear()


def keep_resident(stage_context: Callable[[], Any]) -> None:
    """Make Tune's parameter registry get its objects through one
    `ResidentObjects` in this process, inside a stage batch
    (``stage_context()`` not None); elsewhere, as Tune does."""
    import ray
    import ray.tune.registry as tune_registry

    global _resident
    registry = tune_registry._ParameterRegistry
    tune_get = registry.get
    resident = _resident = ResidentObjects(ray.get)

    def get(self: Any, key: str) -> Any:
        context = stage_context()
        if context is None or not ray.is_initialized():
            return tune_get(self, key)
        with context.phases.phase(PHASE):
            return resident.get(self.references[key])

    registry.get = get
