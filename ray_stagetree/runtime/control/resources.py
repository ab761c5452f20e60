"""What the cluster's live nodes hold, in stage workers."""

from __future__ import annotations

import math
from typing import Any

import ray


def workers_that_fit(worker_options: dict[str, Any]) -> float:
    """How many stage workers with these actor options (``num_cpus``,
    ``num_gpus``, ``resources``, ``memory``) the cluster's live nodes hold
    in all."""
    request = {"CPU": worker_options.get("num_cpus", 0), "GPU": worker_options.get("num_gpus", 0)}
    request.update(worker_options.get("resources", {}))
    if worker_options.get("memory"):
        request["memory"] = worker_options["memory"]
    fits = [math.floor(live_total(key) / amount) for key, amount in request.items() if amount]
    return min(fits) if fits else math.inf


def live_total(resource: str) -> float:
    """How much of ``resource`` the nodes Ray's control store holds alive
    have: ``ray.cluster_resources()`` goes on counting a lost node's for tens
    of seconds after that verdict."""
    return sum(node["Resources"].get(resource, 0.0) for node in ray.nodes() if node["Alive"])
