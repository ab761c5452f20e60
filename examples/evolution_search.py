"""Regularized evolution (Real et al., 2019) written against the ask/tell interface.

An example of bringing your own HPO algorithm (Ultron-AutoML's interface):
`RegularizedEvolution` only implements ``ask(n)`` and ``tell(results)``;
`ray_stagetree.searchers.AskTellSearcher` runs it as a Tune searcher, so its
trials share stages like any others.

The population holds the last ``population_size`` scored configurations
(the oldest dies, not the worst: the "regularized" part). Until it is full,
configurations are drawn at random from the search space; after, each
child copies the best of ``sample_size`` random members and redraws one of
its searched values (one gene).

Use it from Python::

    Tuner(train, param_space=space,
          tune_config=tune.TuneConfig(metric="loss", mode="min", num_samples=32,
                                      search_alg=AskTellSearcher(RegularizedEvolution(seed=0), batch_size=8)))

or in a job spec (``search_alg: {name: "evolution_search:RegularizedEvolution", batch_size: 8, seed: 0}``).
"""

from __future__ import annotations

import collections
import copy
from typing import Any

import numpy as np
from ray.tune.search.variant_generator import parse_spec_vars

from ray_stagetree.searchers import AskTellAlgorithm


class RegularizedEvolution(AskTellAlgorithm):
    """Aging evolution over the space's Tune domains (``tune.loguniform``,
    ``tune.choice``, ..., inside sequences too).

    Parameters
    ----------
    population_size:
        Scored configurations kept; the oldest is dropped for each new one.
    sample_size:
        Members compared to pick a parent (tournament size).
    seed:
        Seed of the draws.
    """

    def __init__(self, population_size: int = 8, sample_size: int = 3, seed: int | None = None) -> None:
        for name, value in (("population_size", population_size), ("sample_size", sample_size)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an int >= 1, got {value!r}")
        self.population_size = population_size
        self.sample_size = sample_size
        self.rng = np.random.default_rng(seed)
        self.population: collections.deque = collections.deque(maxlen=population_size)
        self.domains: list[tuple[tuple, Any]] = []

    def setup(self, space: dict[str, Any], metric: str | None, mode: str | None) -> None:
        super().setup(space, metric, mode)
        _, self.domains, grids = parse_spec_vars(space)
        if grids:
            raise ValueError(
                f"RegularizedEvolution searches Tune domains; use tune.choice instead of grid_search at "
                f"{', '.join('/'.join(map(str, path)) for path, _ in grids)}"
            )
        if not self.domains:
            raise ValueError("RegularizedEvolution needs at least one Tune domain in param_space to search")

    def ask(self, n: int) -> list[dict[str, Any]]:
        return [self._child() if len(self.population) >= self.population_size else self._random() for _ in range(n)]

    def tell(self, results: list[tuple[dict[str, Any], float | None]]) -> None:
        for config, score in results:
            if score is not None:  # a failed trial leaves no offspring
                self.population.append((config, score))

    def _random(self) -> dict[str, Any]:
        config: dict[str, Any] = {}
        for path, domain in self.domains:
            _assign(config, path, self._draw(domain))
        return config

    def _child(self) -> dict[str, Any]:
        members = self.rng.choice(len(self.population), size=min(self.sample_size, len(self.population)), replace=False)
        sign = 1.0 if self.mode == "max" else -1.0
        parent = max((self.population[i] for i in members), key=lambda member: sign * member[1])[0]
        child = copy.deepcopy(parent)
        path, domain = self.domains[self.rng.integers(len(self.domains))]
        _assign(child, path, self._draw(domain))
        return child

    def _draw(self, domain: Any) -> Any:
        value = domain.sample(random_state=self.rng)
        return value.item() if isinstance(value, np.generic) else value


def _assign(config: dict[str, Any], path: tuple, value: Any) -> None:
    """``config[path[0]][path[1]]... = value``, making the dicts on the way."""
    for key in path[:-1]:
        config = config.setdefault(key, {})
    config[path[-1]] = value
