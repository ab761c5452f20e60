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
    total = ray.cluster_resources()
    fits = [math.floor(total.get(key, 0.0) / amount) for key, amount in request.items() if amount]
    return min(fits) if fits else math.inf
