"""The searched leaves of a Tune search space, for searchers that make
their own candidates: draw a config, move one a little, turn leaf values
into a resolved config (sequences rebuilt) for planning.

Sequences are flattened into their declarative specs first (`to_tune_space`),
so a Tune domain inside a sequence (``MultiStep(tune.loguniform(0.01, 1),
[tune.randint(5, 25)], 0.1)``) is a leaf like any other.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Mapping
from typing import Any

import numpy as np

from ray_stagetree.searchers.sources import from_searchable
from ray_stagetree.searchers.variants import from_tune_config, to_tune_space


class LeafSpace:
    """The Tune domains of a search space, each mapped to [0, 1].

    Parameters
    ----------
    space:
        A Tune ``param_space`` (sequences allowed), or that space as a hosted
        Tune searcher receives it from the Tuner (`searchable_space`: lists
        holding domains as marked dicts, turned back into lists). Its domains must be
        ``Float`` (uniform, loguniform, quantized), ``Integer`` (randint,
        lograndint) or ``Categorical`` (tune.choice) at fixed places; grid
        searches, ``tune.sample_from`` and domains inside a choice's
        categories have no place in a model of the space and are refused.
    owner:
        Name used in error messages (the searcher's class).

    Examples
    --------
    >>> from ray import tune
    >>> from ray_stagetree import MultiStep
    >>> space = LeafSpace({"lr": MultiStep(tune.loguniform(0.01, 1.0), [10], 0.1)})
    >>> [leaves] = space.sample(np.random.default_rng(0))
    >>> config = space.config(leaves)
    >>> config["lr"].value(0) == leaves[0]
    True
    """

    def __init__(self, space: Mapping[str, Any], owner: str = "searcher") -> None:
        from ray.tune.search.sample import Categorical, Float, Integer
        from ray.tune.search.variant_generator import parse_spec_vars

        if not isinstance(space, Mapping):
            raise TypeError(f"{owner}: the search space must be a dict, got {type(space).__name__}")
        self.spec = from_searchable(to_tune_space(dict(space)))
        _, domains, grids = parse_spec_vars(self.spec)
        if grids:
            raise ValueError(
                f"{owner}: tune.grid_search at {'/'.join(map(str, grids[0][0]))} is not supported: "
                "use tune.choice([...]) so the searcher can model it"
            )
        if not domains:
            raise ValueError(f"{owner}: the search space has no Tune domain to search: {space!r}")
        for path, domain in domains:
            where = "/".join(map(str, path))
            if not isinstance(domain, (Float, Integer, Categorical)):
                raise ValueError(
                    f"{owner}: {where} is a {type(domain).__name__}; allowed are tune.uniform, "
                    "loguniform, quniform, randint, lograndint and choice"
                )
            nested = isinstance(domain, Categorical) and any(
                parse_spec_vars(to_tune_space({"category": category}))[1] for category in domain.categories
            )
            if nested:
                raise ValueError(
                    f"{owner}: a category of the tune.choice at {where} holds Tune domains; "
                    "put them at the top level of the search space"
                )
        self.paths = [path for path, _ in domains]
        self.domains = [domain for _, domain in domains]

    def __len__(self) -> int:
        return len(self.domains)

    def sample(self, rng: np.random.Generator, count: int = 1) -> list[list[Any]]:
        """``count`` lists of leaf values drawn as Tune draws them."""
        columns = [domain.sample(size=count, random_state=rng) for domain in self.domains]
        columns = [column if count > 1 else [column] for column in columns]
        return [[_python(column[index]) for column in columns] for index in range(count)]

    def neighbour(self, leaves: list[Any], rng: np.random.Generator, scale: float = 0.15) -> list[Any]:
        """``leaves`` with each leaf moved with probability ``1 / len(leaves)``
        (at least one): a numeric one by
        a Gaussian step of ``scale`` of its range (log range for log domains),
        a categorical one to another category. Leaves left alone keep the
        prefix they decide, so neighbours often share stages."""
        moved = list(leaves)
        chosen = rng.random(len(leaves)) < 1.0 / len(leaves)
        if not chosen.any():
            chosen[rng.integers(len(leaves))] = True
        for index in np.flatnonzero(chosen):
            moved[index] = self._move(index, leaves[index], rng, scale)
        return moved

    def _move(self, index: int, value: Any, rng: np.random.Generator, scale: float) -> Any:
        from ray.tune.search.sample import Categorical, Integer

        domain = self.domains[index]
        if isinstance(domain, Categorical):
            others = [c for c in domain.categories if c != value] or list(domain.categories)
            return copy.deepcopy(others[rng.integers(len(others))])
        low, high = domain.lower, domain.upper - (1 if isinstance(domain, Integer) else 0)
        sampler = domain.get_sampler()
        quantum = getattr(sampler, "q", None)
        inner = getattr(sampler, "sampler", sampler)
        log = type(inner).__name__ == "LogUniform"
        forward, back = (math.log, math.exp) if log else (float, float)
        unit = (forward(value) - forward(low)) / (forward(high) - forward(low) or 1.0)
        unit = min(max(unit + scale * rng.standard_normal(), 0.0), 1.0)
        moved = back(forward(low) + unit * (forward(high) - forward(low)))
        if quantum is not None:
            moved = float(np.round(moved / quantum) * quantum)
        if isinstance(domain, Integer):
            moved = int(round(moved))
        return min(max(moved, low), high)

    def resolved(self, leaves: list[Any]) -> dict[str, Any]:
        """The search space with ``leaves`` in place: what a Tune searcher
        suggests (sequences as their specs)."""
        from ray.tune.search.variant_generator import assign_value

        spec = _copy_structure(self.spec)
        for path, value in zip(self.paths, leaves):
            assign_value(spec, path, value)
        return spec

    def config(self, leaves: list[Any]) -> dict[str, Any]:
        """The trial config ``leaves`` give, sequences rebuilt (and checked)."""
        return from_tune_config(self.resolved(leaves))


def _copy_structure(spec: Any) -> Any:
    """A copy of the spec's dicts and lists, sharing everything else: the
    domains are replaced, not changed, and copying them is most of the time."""
    if isinstance(spec, Mapping):
        return {key: _copy_structure(value) for key, value in spec.items()}
    if isinstance(spec, (list, tuple)):
        return type(spec)(_copy_structure(value) for value in spec)
    return spec


def _python(value: Any) -> Any:
    """NumPy scalars as Python ones (configs are stored as JSON)."""
    return value.item() if isinstance(value, np.generic) else value
