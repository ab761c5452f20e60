"""The stage workers a driver keeps for its next fit, while nothing else
waits for what they hold.

A stage worker's process takes seconds of CPU to start (Python, Ray, the
trainable's modules: torch, Lightning; on a GPU, CUDA), and a study starts
one per trial it runs at once. A driver that fits again (a notebook, a
script running several studies, a test suite) runs its next study on the
workers its last one ended with, as it does in the controller
(`controllers`). Unlike the controller, a worker holds its trial's
resources, which Tune frees when ``fit()`` returns, so the driver gives
them back:

* as soon as anything in the cluster waits for resources (a task, an actor,
  a placement group: a Tune run, another job), seen within `POLL_S`;
* `arguments.keep_workers_seconds` after the fit
  (``RAY_STAGETREE_KEEP_WORKERS_S``, 10 by default; 0 keeps none);
* when the next study cannot run on them: other resources per trial, a
  worker group, deterministic algorithms on in one study only, or a
  process whose imported modules changed on disk since it started
  (`StageWorker.serve`).
"""

from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass
from typing import Any

import ray

from ray_stagetree.runtime.control.spec import WorkerSpec
from ray_stagetree.runtime.driver.controllers import here

#: How often the driver looks whether anything waits for resources while it keeps workers.
POLL_S = 0.25
#: How long a kept worker may take to load the next study's trainable (its modules' imports).
SERVE_WAIT_S = 120.0


@dataclass
class _Kept:
    place: tuple[str, str]  # the (job id, node id) of the driver's connection they were kept in
    runs: tuple[Any, ...]  # `_runs` of the study they ran
    workers: list[Any]
    until: float  # time.monotonic() when they go back


_lock = threading.Lock()
_kept: _Kept | None = None
_watching = False  # a thread runs `_watch`


def keep_workers(spec: WorkerSpec, workers: list[Any], seconds: float) -> None:
    """Keep ``workers``, closed at the end of a study of ``spec`` that
    ended cleanly (`BatchLoop.shutdown_workers` spares lone workers only),
    for this driver's next study, ``seconds`` at most
    (`arguments.keep_workers_seconds`); workers kept before are stopped."""
    global _kept, _watching
    kept = _Kept(here(), _runs(spec), list(workers), time.monotonic() + seconds) if workers else None
    with _lock:
        earlier, _kept = _kept, kept
        watch = kept is not None and not _watching
        _watching = _watching or watch
    if watch:
        threading.Thread(target=_watch, name="stagetree-kept-workers", daemon=True).start()
    _stop(earlier)


def take_workers(spec: WorkerSpec, controller: Any, count: int) -> list[Any]:
    """Up to ``count`` kept workers, now running ``spec``'s trainable for
    ``controller``; those it cannot take are stopped."""
    global _kept
    with _lock:
        kept, _kept = _kept, None
    if kept is None:
        return []
    if kept.place != here() or kept.runs != _runs(spec):
        _stop(kept)
        return []
    offered = kept.workers[:count]
    _stop(dataclasses.replace(kept, workers=kept.workers[count:]))
    answers = {worker.serve.remote(spec.trainable, controller): worker for worker in offered}
    ready, _ = ray.wait(list(answers), num_returns=len(answers), timeout=SERVE_WAIT_S)
    taken = []
    for ref, worker in answers.items():
        try:
            served = ref in ready and ray.get(ref)
        except ray.exceptions.RayError:
            served = False  # it died while kept
        if served:
            taken.append(worker)
        else:
            _kill(worker)
    return taken


def _runs(spec: WorkerSpec) -> tuple[Any, ...]:
    """What a worker of ``spec`` holds and keeps: its Ray actor options (one
    trial's resources), its group's shape (kept workers are lone: none),
    and whether its torch runs deterministic algorithms (a process-wide
    setting `seed_stage` turns on and nothing turns off)."""
    reproducibility = spec.reproducibility
    deterministic = reproducibility is not None and reproducibility.deterministic_algorithms
    return dict(spec.options), spec.scaling, deterministic


def _watch() -> None:
    """Give the kept workers back once their time is up or anything waits for resources."""
    global _kept, _watching
    while True:
        time.sleep(POLL_S)
        with _lock:
            kept = _kept
            if kept is None:
                _watching = False
                return
            if time.monotonic() < kept.until and ray.is_initialized() and kept.place == here() and not _others_wait():
                continue
            _kept = None
        _stop(kept)


def _others_wait() -> bool:
    """Whether the cluster has resource requests it has not placed (or whether that cannot be told)."""
    from ray.autoscaler.v2.sdk import get_cluster_status

    try:
        demands = get_cluster_status(ray.get_runtime_context().gcs_address).resource_demands
    except Exception:
        return True
    return bool(demands.ray_task_actor_demand or demands.placement_group_demand or demands.cluster_constraint_demand)


def _stop(kept: _Kept | None) -> None:
    """Stop ``kept``'s workers, if the connection they were kept in is this one (else they are gone with it)."""
    if kept is not None and ray.is_initialized() and kept.place == here():
        for worker in kept.workers:
            _kill(worker)


def _kill(worker: Any) -> None:
    try:
        ray.kill(worker)
    except Exception:
        pass  # gone already
