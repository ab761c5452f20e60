"""What a stage worker holds: its `Shape`, by Ray's resource names.

A study's workers all start with one trial's resources
(``tune.with_resources``); a ``ResourceChangingScheduler`` gives trials
other resources as they run, so a stage batch then needs a worker of its
trials' shape (`batch_shape`), and the pool starts one where the cluster has
room (`fits`). Ray-free.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from ray_stagetree.execution.scaling import OPTION_NAMES, actor_options


@dataclass(frozen=True)
class Shape:
    """Resources by Ray's names (``CPU``, ``GPU``, ``memory``, custom ones), zeros left out."""

    amounts: tuple[tuple[str, float], ...] = ()

    @classmethod
    def of(cls, resources: Mapping[str, float]) -> Shape:
        return cls(tuple(sorted((name, float(amount)) for name, amount in resources.items() if amount)))

    @classmethod
    def from_options(cls, options: Mapping[str, Any]) -> Shape:
        """The shape of a worker started with Ray actor ``options`` (`spec.WorkerSpec.options`)."""
        resources = dict(options.get("resources") or {})
        for name, option in OPTION_NAMES.items():
            resources[name] = options.get(option) or 0
        return cls.of(resources)

    @classmethod
    def of_trial_resources(cls, resources: Any) -> Shape:
        """A ``PlacementGroupFactory`` or a resources dict, as a scheduler
        gives a trial: its bundles reserved as one worker of their sum."""
        required = getattr(resources, "required_resources", resources)
        return cls.of({str(name): float(amount) for name, amount in dict(required).items()})

    def options(self) -> dict[str, Any]:
        """The Ray actor options of a worker of this shape."""
        return actor_options(dict(self.amounts))

    def covers(self, other: Shape) -> bool:
        """Whether a worker of this shape holds all ``other`` asks for."""
        mine = dict(self.amounts)
        return all(mine.get(name, 0.0) >= amount for name, amount in other.amounts)

    def __or__(self, other: Shape) -> Shape:
        """The least shape that covers both."""
        merged = dict(self.amounts)
        for name, amount in other.amounts:
            merged[name] = max(merged.get(name, 0.0), amount)
        return Shape.of(merged)

    def __str__(self) -> str:
        return ", ".join(f"{name}={amount:g}" for name, amount in self.amounts) or "no resources"


def fits(shapes: Iterable[Shape], totals: Mapping[str, float]) -> bool:
    """Whether workers of ``shapes`` together fit in ``totals`` (the
    cluster's resources, summed over its live nodes)."""
    held: dict[str, float] = {}
    for shape in shapes:
        for name, amount in shape.amounts:
            held[name] = held.get(name, 0.0) + amount
    return all(amount <= totals.get(name, 0.0) + 1e-9 for name, amount in held.items())
