"""What the cluster's live nodes hold, in stage workers."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from ray_stagetree.execution.scaling import groups_that_fit
from ray_stagetree.runtime.control.spec import live_nodes

if TYPE_CHECKING:
    from ray_stagetree.runtime.control.spec import WorkerSpec


def workers_that_fit(worker: WorkerSpec) -> float:
    """How many stage workers (with ``worker.options``: ``num_cpus``,
    ``num_gpus``, ``resources``, ``memory``) the cluster's live nodes hold in
    all; with ``worker.scaling``, how many whole worker groups they place."""
    if worker.scaling is not None:
        return groups_that_fit(live_nodes(), worker.scaling)
    request = {"CPU": worker.options.get("num_cpus", 0), "GPU": worker.options.get("num_gpus", 0)}
    request.update(worker.options.get("resources", {}))
    if worker.options.get("memory"):
        request["memory"] = worker.options["memory"]
    fits = [math.floor(live_total(key) / amount) for key, amount in request.items() if amount]
    return min(fits) if fits else math.inf


def live_total(resource: str) -> float:
    """How much of ``resource`` the nodes Ray's control store holds alive
    have: ``ray.cluster_resources()`` goes on counting a lost node's for tens
    of seconds after that verdict."""
    return cluster_totals().get(resource, 0.0)


def cluster_totals() -> dict[str, float]:
    """The resources of the live nodes (see `live_total`), summed by name."""
    totals: dict[str, float] = {}
    for node in live_nodes():
        for name, amount in node.items():
            totals[name] = totals.get(name, 0.0) + amount
    return totals
