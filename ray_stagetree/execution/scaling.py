"""Data-parallel stages: a trial trained by a group of ranks, and how many
such groups a cluster holds.

A study given ``scaling_config=ScalingConfig(num_workers=N, ...)`` runs each
stage batch on a worker group of ``N`` processes (`runtime.workers.group`)
placed in one placement group of ``N`` bundles, one rank's resources each.
`Scaling` is that request as plain data: it travels to the controller, it is
part of what trials must have in common to share a stage (`Scaling.key`), and
`groups_that_fit` is the admission arithmetic: the controller never runs
more groups than the cluster's live nodes can place whole (a group placed in
part would hold its resources and wait forever, Ray #47439's failure).

Pure Python: no Ray, no torch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ray_stagetree.validation import Int, Options, check

#: Ray's actor options for the resources Ray names otherwise (the rest go under ``resources``).
OPTION_NAMES = {"CPU": "num_cpus", "GPU": "num_gpus", "memory": "memory"}

#: Ray's placement strategies (``ScalingConfig.placement_strategy``).
STRATEGIES = ("PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD")

# Amounts are floats (fractional CPUs): a hair of slack so that 3 x 1/3 fits in 1.
_SLACK = 1e-9


@dataclass(frozen=True)
class Scaling:
    """One trial's worker group.

    Parameters
    ----------
    num_workers:
        Ranks in the group (``ScalingConfig.num_workers``).
    per_worker:
        One rank's resources, as sorted ``(name, amount)`` pairs (``CPU``,
        ``GPU``, custom resources).
    use_gpu:
        NCCL on GPUs; else gloo on CPUs.
    placement_strategy:
        How the group's bundles are placed on nodes, as Ray Train places them.
    """

    num_workers: int
    per_worker: tuple[tuple[str, float], ...]
    use_gpu: bool = False
    placement_strategy: str = "PACK"

    def __post_init__(self) -> None:
        check("ScalingConfig.num_workers", self.num_workers, Int(low=1))
        check("ScalingConfig.placement_strategy", self.placement_strategy, Options(STRATEGIES))
        if not any(amount > 0 for _, amount in self.per_worker):
            raise ValueError(
                f"ScalingConfig.resources_per_worker must ask for some resource, got {dict(self.per_worker)!r}: "
                'e.g. {"CPU": 1}, or fractional amounts such as {"CPU": 0.5}'
            )
        for name, amount in self.per_worker:
            if not isinstance(amount, (int, float)) or isinstance(amount, bool) or amount < 0:
                raise ValueError(f"ScalingConfig.resources_per_worker[{name!r}] must be a number >= 0, got {amount!r}")

    @classmethod
    def of(
        cls, num_workers: int, per_worker: Mapping[str, float], use_gpu: bool = False, placement_strategy: str = "PACK"
    ) -> Scaling:
        return cls(
            num_workers,
            tuple(sorted((str(name), float(amount)) for name, amount in per_worker.items() if amount)),
            bool(use_gpu),
            placement_strategy,
        )

    @property
    def resources(self) -> dict[str, float]:
        """One rank's resources."""
        return dict(self.per_worker)

    @property
    def backend(self) -> str:
        """The torch.distributed backend the ranks use."""
        return "nccl" if self.use_gpu else "gloo"

    def bundles(self) -> list[dict[str, float]]:
        """The placement group's bundles: one per rank, rank 0's first."""
        return [self.resources for _ in range(self.num_workers)]

    def total(self) -> dict[str, float]:
        """What one group holds in all."""
        return {name: amount * self.num_workers for name, amount in self.per_worker}

    def key(self) -> str:
        """What trials must share to share stages: a stage trained by 2 ranks
        is not the stage 4 ranks train (the global batch is split
        differently, reductions sum in another order), so the scaling is part
        of the trial's static share key."""
        resources = ",".join(f"{name}={amount:g}" for name, amount in self.per_worker)
        return f"{self.num_workers}x[{resources}]{'/gpu' if self.use_gpu else ''}"


def actor_options(resources: Mapping[str, float]) -> dict[str, Any]:
    """The Ray actor options that reserve ``resources`` (by Ray's resource names)."""
    amounts = dict(resources)
    options: dict[str, Any] = {"num_cpus": amounts.pop("CPU", 0.0), "num_gpus": amounts.pop("GPU", 0.0)}
    if "memory" in amounts:
        options["memory"] = amounts.pop("memory")
    if amounts:
        options["resources"] = amounts
    return options


def bundles_on_node(node: Mapping[str, float], bundle: Mapping[str, float]) -> int:
    """How many copies of ``bundle`` a node with ``node``'s resources holds."""
    counts = [math.floor(node.get(name, 0.0) / amount + _SLACK) for name, amount in bundle.items() if amount > 0]
    return max(0, min(counts)) if counts else 0


def groups_that_fit(nodes: Iterable[Mapping[str, float]], scaling: Scaling) -> int:
    """How many whole worker groups the nodes (each a resource dict) hold at
    once, under the group's placement strategy: ``STRICT_PACK`` puts a group
    on one node; ``STRICT_SPREAD`` puts each rank on a node of its own;
    ``PACK`` and ``SPREAD`` place bundles wherever they fit."""
    per_node = [bundles_on_node(node, scaling.resources) for node in nodes]
    size = scaling.num_workers
    if scaling.placement_strategy == "STRICT_PACK":
        return sum(count // size for count in per_node)
    if scaling.placement_strategy == "STRICT_SPREAD":
        return _spread_groups(per_node, size)
    return sum(per_node) // size


def _spread_groups(per_node: list[int], size: int) -> int:
    """Groups of ``size`` bundles on ``size`` distinct nodes: each group
    takes one bundle from each of the ``size`` nodes with the most left."""
    left = sorted((count for count in per_node if count > 0), reverse=True)
    groups = 0
    while len(left) >= size:
        left = sorted((count - 1 for count in left[:size] if count > 1), reverse=True) + left[size:]
        left.sort(reverse=True)
        groups += 1
    return groups


def shard(indices: list[int], rank: int, world_size: int) -> list[int]:
    """Rank ``rank``'s part of one global batch: every ``world_size``-th
    index from its own (the split `torch.utils.data.DistributedSampler`
    makes), so the ranks' parts together are the batch, each index once."""
    return indices[rank::world_size]


def describe(scaling: Any) -> str:
    """A scaling for messages."""
    if not isinstance(scaling, Scaling):
        return repr(scaling)
    return f"{scaling.num_workers} workers x {scaling.resources} ({scaling.placement_strategy}, {scaling.backend})"
