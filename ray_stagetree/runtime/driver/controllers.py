"""A study's controller process, and the one a driver keeps for its next fit.

The controller is a Ray actor (`runtime.control.controller`) on the
driver's node. Its process takes more than a second of CPU to start (Python,
Ray, Tune's searchers and schedulers, the plan), as much as a short study's
work, and a study's start waits for it. A driver that fits again (a
notebook, a script running several studies, a test suite) starts its next
study in the process its last study ended cleanly in, much as Ray keeps idle
worker processes for its tasks. The kept process holds no resources
(``num_cpus=0``) and none of the ended study's state (its storage actor,
which holds none either, stays with it), and it ends with the driver's
connection to Ray.
"""

from __future__ import annotations

import threading
from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ray_stagetree.runtime.control.controller import StudyController
from ray_stagetree.runtime.control.spec import StudySpec
from ray_stagetree.runtime.workers.remote import remote_once

_lock = threading.Lock()
# The idle controller kept, with the (job id, node id) it runs for: a process has one connection to Ray at a time,
# and after ray.shutdown and ray.init its node id is another, so a handle of an earlier session is never used.
_kept: tuple[tuple[str, str], Any] | None = None


def here() -> tuple[str, str]:
    """The (job id, node id) of this driver's connection to Ray."""
    context = ray.get_runtime_context()
    return context.get_job_id(), context.get_node_id()


def start_controller(spec: StudySpec) -> Any:
    """The controller running ``spec``'s study: the one this driver kept
    when it can take it, else a new one. On the driver's node, as Tune's
    controller is in the driver: a study outlives any worker node, and so
    must what drives it."""
    global _kept
    with _lock:
        kept, _kept = _kept, None
    if kept is not None and kept[0] == here():
        try:
            if ray.get(kept[1].begin.remote(spec)):
                return kept[1]
        except ray.exceptions.RayActorError:
            pass  # it died while idle
        except ray.exceptions.RayTaskError:
            pass  # the study cannot start: a new controller fails as a new one always has (`StudyRun` says why)
        ray.kill(kept[1])
    on_this_node = NodeAffinitySchedulingStrategy(here()[1], soft=False)
    return (
        remote_once(StudyController)
        .options(num_cpus=0, max_concurrency=1000, scheduling_strategy=on_this_node)
        .remote(spec)
    )


def keep_controller(controller: Any) -> None:
    """Keep ``controller``, whose study ended cleanly, for this driver's
    next study, holding nothing of the ended one (one at a time: a
    controller kept before is ended)."""
    global _kept
    try:
        ray.get(controller.forget.remote())
    except ray.exceptions.RayError:
        ray.kill(controller)
        return
    with _lock:
        earlier, _kept = _kept, (here(), controller)
    if earlier is not None and earlier[0] == here():
        ray.kill(earlier[1])
