"""Ray on one machine or on a cluster: joining the cluster a script was
started on, and checking that a multi-node study's storage is shared.

A script that calls ``ray.init(num_cpus=...)`` works on a laptop and fails
under ``ray job submit`` (Ray refuses resource arguments when it connects to
a running cluster); `init_ray` does the right thing in both places.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import ray

from ray_stagetree.runtime.workers.remote import remote_once
from ray_stagetree.trial_schedulers.ray_fields import bootstrap_address
from ray_stagetree.validation import Int, check

logger = logging.getLogger("ray_stagetree")

#: Tune's name for the file its driver writes and each trial's node must see.
VALIDATE_STORAGE_MARKER = ".validate_storage_marker"

# ray.init refuses these when it connects to a running cluster: they describe
# a node to start, and the cluster's nodes are already started.
_LOCAL_ONLY = ("num_cpus", "num_gpus", "resources", "labels", "object_store_memory", "_system_config")


def running_cluster_address() -> str | None:
    """The cluster ``ray.init()`` would join: ``RAY_ADDRESS`` (set by ``ray
    job submit``), else the latest ``ray start`` on this machine; None when
    there is none and a local Ray would start."""
    return bootstrap_address()


def init_ray(num_cpus: int | None = None, num_gpus: int | None = None, **kwargs: Any) -> bool:
    """Connect to the running Ray cluster, or start a local Ray with
    ``num_cpus`` / ``num_gpus`` (None: Ray's default, every core).

    The cluster is the one ``ray job submit`` runs the script on
    (``RAY_ADDRESS``) or the latest ``ray start --head`` on this machine; there
    the cluster's own resources count, so ``num_cpus``, ``num_gpus`` and the
    other node-sizing arguments (``resources``, ``object_store_memory``, ...)
    apply to a local start only. Other keyword arguments go to ``ray.init``
    either way. Does nothing when Ray is already initialized.

    Returns True when it joined a running cluster.

    Examples
    --------
    >>> import ray_stagetree
    >>> ray_stagetree.init_ray(num_cpus=2)   # doctest: +SKIP
    """
    for name, value in (("num_cpus", num_cpus), ("num_gpus", num_gpus)):
        check(name, value, Int(low=0), None)
    if "address" in kwargs:
        raise ValueError(
            f"init_ray finds the cluster itself (RAY_ADDRESS, else the latest `ray start`), got "
            f"address={kwargs['address']!r}: call ray.init(address=...) to choose one"
        )
    if ray.is_initialized():
        return False
    address = running_cluster_address()
    if address is None:
        ray.init(address="local", num_cpus=num_cpus, num_gpus=num_gpus, **kwargs)
        return False
    ignored = sorted(name for name in _LOCAL_ONLY if kwargs.get(name) is not None)
    ignored += [name for name, value in (("num_cpus", num_cpus), ("num_gpus", num_gpus)) if value is not None]
    if ignored:
        logger.info("joining the Ray cluster at %s: its own resources count, not %s", address, ", ".join(ignored))
    # "auto" finds the cluster again, as `address` was found; an address of its own would join it without
    # the token a local `ray start` keeps (Ray 2.60 turns token authentication on, and reads the token
    # only for a cluster it found itself).
    ray.init(address="auto", **{name: value for name, value in kwargs.items() if name not in _LOCAL_ONLY})
    return True


def check_shared_storage(experiment_path: str, storage_filesystem: Any = None) -> None:
    """On a cluster of several nodes, raise before anything trains unless
    every node sees the experiment directory: workers and the study's
    storage actor run on any node, and a checkpoint written on one is read
    on another. Checked as Tune checks it: the driver writes a marker file
    there and every node looks for it. One node: nothing to check."""
    nodes = [node for node in ray.nodes() if node["Alive"]]
    if len(nodes) < 2:
        return
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from ray_stagetree.execution.storage import CheckpointStorage

    storage = CheckpointStorage(experiment_path, storage_filesystem)
    token = uuid.uuid4().hex
    storage.write_text(VALIDATE_STORAGE_MARKER, token)
    look = remote_once(_sees_marker)
    checks = [
        look.options(
            num_cpus=0, max_retries=0, scheduling_strategy=NodeAffinitySchedulingStrategy(node["NodeID"], soft=False)
        ).remote(storage, token)
        for node in nodes
    ]
    blind = [
        f"{node['NodeManagerAddress']} (node {node['NodeID'][:8]})"
        for node, sees in zip(nodes, ray.get(checks))
        if not sees
    ]
    if blind:
        raise RuntimeError(
            f"the experiment directory {experiment_path!r} is not shared storage: {len(blind)} of the "
            f"{len(nodes)} nodes of this Ray cluster cannot see the marker file the driver wrote there "
            f"({', '.join(blind)}). Workers and checkpoints move between nodes, so every node needs "
            "read/write access to it: set RunConfig(storage_path=...) to a cloud storage URI or a shared "
            "filesystem path mounted on every node ('s3://bucket/path', '/mnt/nfs/...'). A local path on the "
            "head node is not accessible by worker nodes."
        )


def _sees_marker(storage: Any, token: str) -> bool:
    try:
        return storage.filesystem.cat_file(storage.path(VALIDATE_STORAGE_MARKER)) == token.encode()
    except (FileNotFoundError, OSError):
        return False
