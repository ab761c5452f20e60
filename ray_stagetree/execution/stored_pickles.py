"""Unpickling what an earlier version stored: study snapshots and checkpoint
payloads name their classes by module, and the runtime's modules moved into
rooms (``runtime.controller`` is ``runtime.control.controller``, the Ray-free
pieces went down to ``execution``). Reading through `loads` finds each class
where it is now, so an experiment written before the move still restores.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

#: Where each module whose classes a stored pickle may name is now.
MOVED_MODULES = {
    "ray_stagetree.runtime.batches": "ray_stagetree.execution.batches",
    "ray_stagetree.runtime.payload": "ray_stagetree.execution.payload",
    "ray_stagetree.runtime.payload_auth": "ray_stagetree.execution.payload_auth",
    "ray_stagetree.runtime.storage": "ray_stagetree.execution.storage",
    "ray_stagetree.runtime.rng": "ray_stagetree.execution.rng",
    "ray_stagetree.runtime.parking": "ray_stagetree.execution.parking",
    "ray_stagetree.runtime.worker": "ray_stagetree.runtime.workers.worker",
    "ray_stagetree.runtime.context": "ray_stagetree.runtime.workers.context",
    "ray_stagetree.runtime.session": "ray_stagetree.runtime.workers.session",
    "ray_stagetree.runtime.class_trainables": "ray_stagetree.runtime.workers.class_trainables",
    "ray_stagetree.runtime.visible_config": "ray_stagetree.runtime.workers.visible_config",
    "ray_stagetree.runtime.reproducibility": "ray_stagetree.runtime.workers.reproducibility",
    "ray_stagetree.runtime.controller": "ray_stagetree.runtime.control.controller",
    "ray_stagetree.runtime.checkpoint_store": "ray_stagetree.runtime.control.checkpoint_store",
    "ray_stagetree.runtime.experiment_state": "ray_stagetree.runtime.control.experiment_state",
    "ray_stagetree.runtime.trials": "ray_stagetree.runtime.control.trials",
    "ray_stagetree.runtime.plan_service": "ray_stagetree.runtime.service.actor",
    "ray_stagetree.runtime.shared_plan": "ray_stagetree.runtime.service.shared_plan",
    "ray_stagetree.runtime.service_client": "ray_stagetree.runtime.service.service_client",
    "ray_stagetree.runtime.unique_trial_ids": "ray_stagetree.runtime.service.unique_trial_ids",
    "ray_stagetree.runtime.trainable_identity": "ray_stagetree.runtime.service.trainable_identity",
    "ray_stagetree.runtime.tuner": "ray_stagetree.runtime.driver.tuner",
    "ray_stagetree.runtime.results": "ray_stagetree.runtime.driver.results",
    "ray_stagetree.runtime.callbacks": "ray_stagetree.runtime.driver.callbacks",
    "ray_stagetree.runtime.progress": "ray_stagetree.runtime.driver.progress",
    "ray_stagetree.runtime.cluster": "ray_stagetree.runtime.driver.cluster",
    "ray_stagetree.runtime.study": "ray_stagetree.runtime.driver.study",
}


class _Unpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return super().find_class(MOVED_MODULES.get(module, module), name)


def loads(data: bytes | memoryview) -> Any:
    """``pickle.loads`` that finds moved classes under their new modules."""
    try:
        return pickle.loads(data)
    except ModuleNotFoundError as error:
        if error.name not in MOVED_MODULES:
            raise
    # Only old pickles get here; the file object costs a copy of the bytes.
    return _Unpickler(io.BytesIO(data)).load()
