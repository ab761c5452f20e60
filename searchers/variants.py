"""Drawing trials from a search space that holds sequences.

Sequence parameters may be Ray Tune search-space domains
(``Exponential(init=tune.loguniform(1e-3, 1e-1), gamma=0.95)``) and a
sequence may itself be a grid value (``tune.grid_search([Constant(0.1),
Cosine(0.1, 0, 30)])``). Rather than re-implement Tune's resolution, each
sequence is flattened into its declarative spec (a nested dict Tune already
walks), Tune's own variant generator resolves grids and samples, and the
resolved specs are rebuilt and validated as sequences. Trials are therefore
drawn exactly as Tune draws them: grid axes in Tune's order, ``num_samples``
repeats of the grid, the same seeding.
"""

from __future__ import annotations

import collections
import json
import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np

from ray_stagetree.sequences import Sequence, from_json, is_sequence_spec
from ray_stagetree.validation import Int, check


def to_tune_space(space: Any) -> Any:
    """``space`` with every `Sequence` replaced by its spec, so Tune's
    variant generator resolves the domains inside it."""
    if isinstance(space, Sequence):
        return to_tune_space(space.to_spec())
    if isinstance(space, Mapping):
        return {key: to_tune_space(value) for key, value in space.items()}
    if isinstance(space, list):
        return [to_tune_space(value) for value in space]
    return space


def from_tune_config(config: Any) -> Any:
    """Inverse of `to_tune_space` on a resolved config: specs become sequences."""
    if isinstance(config, Mapping):
        if is_sequence_spec(config):
            return from_json(config)
        return {key: from_tune_config(value) for key, value in config.items()}
    if isinstance(config, list):
        return [from_tune_config(value) for value in config]
    return config


def tune_grid(param_space: Mapping[str, Any]) -> dict[str, Any]:
    """The trials of a full-grid ``param_space`` as a space ``ray.tune.Tuner``
    itself runs: a ``tune.grid_search`` over each parameter's resolved values,
    sequences in their JSON form (Tune cannot resolve a domain inside a
    sequence, and its placeholder resolution takes sequence objects apart).
    ``get_hparams()`` under ``ray.tune.Tuner`` reads them back as sequences.
    For running one script on both Tuners side by side."""
    from ray import tune

    trials = generate_trials(param_space)
    values: dict[str, dict[str, Any]] = {}
    for trial in trials:
        for name, value in trial.items():
            value = value.to_json() if isinstance(value, Sequence) else value
            values.setdefault(name, {}).setdefault(json.dumps(value, sort_keys=True, default=repr), value)
    if math.prod(len(choices) for choices in values.values()) != len(trials):
        raise ValueError(
            f"tune_grid takes a full grid (every parameter's values crossed with every other's); this param_space "
            f"gives {len(trials)} trials, not the {math.prod(len(c) for c in values.values())} of a full grid"
        )
    return {
        name: tune.grid_search(list(choices.values())) if len(choices) > 1 else next(iter(choices.values()))
        for name, choices in values.items()
    }


def generate_trials(
    param_space: Mapping[str, Any],
    num_samples: int = 1,
    *,
    seed: int | np.random.Generator | np.random.RandomState | None = None,
    filter: Callable[[dict[str, Any]], bool] | None = None,
    constant_grid_search: bool = False,
) -> list[dict[str, Any]]:
    """Resolved trial configs drawn from ``param_space``, as Tune would draw them.

    Parameters
    ----------
    param_space:
        A Tune ``param_space``; values may be sequences, sequences with Tune
        domains as parameters, grid searches over sequences, or anything Tune
        accepts.
    num_samples:
        Repeats of the grid (Tune's ``TuneConfig.num_samples``).
    seed:
        Seed (or NumPy generator) for the random domains; None draws from
        NumPy's global state, as Tune's ``BasicVariantGenerator`` does.
    filter:
        Keep only configs for which ``filter(config)`` is true (the thesis'
        grid-search filter, e.g. to drop combinations that make no sense).

    Examples
    --------
    >>> from ray import tune
    >>> from ray_stagetree import MultiStep
    >>> trials = generate_trials(
    ...     {"lr": MultiStep(0.1, tune.grid_search([[30], [60]]), 0.1)}, num_samples=2, seed=0)
    >>> len(trials)
    4
    """
    if filter is not None and not callable(filter):
        raise TypeError(f"filter must be callable(config) -> bool, got {filter!r}")
    _check_num_samples(num_samples)
    stream = sample_variants(param_space, num_samples, seed=seed, constant_grid_search=constant_grid_search)
    return [config for config in stream if filter is None or filter(config)]


def sample_variants(
    param_space: Mapping[str, Any],
    num_samples: int = 1,
    *,
    seed: int | np.random.Generator | np.random.RandomState | None = None,
    constant_grid_search: bool = False,
    points_to_evaluate: Iterable[Mapping[str, Any]] = (),
    each_draw: Callable[[list[dict[str, Any]]], list[dict[str, Any]]] | None = None,
) -> VariantStream:
    """`generate_trials`' configs as a `VariantStream`: the points and the
    grid's first repeat are drawn now, later repeats as they are asked for.

    Parameters
    ----------
    param_space, num_samples, seed, constant_grid_search:
        As `generate_trials`.
    points_to_evaluate:
        Configs (partial ones) drawn first, each the space's variants with
        those values (a grid the point leaves open gives all its values),
        each in place of one of the ``num_samples`` repeats, as Tune's
        ``BasicVariantGenerator(points_to_evaluate=...)`` draws them.
    each_draw:
        Applied to the configs of each draw (a point, one repeat of the
        grid): e.g. several trials per configuration.

    ``num_samples=-1`` repeats the grid without end, as Tune's generator
    does: the stream is open-ended (its ``remaining`` is infinite).
    """
    if not isinstance(param_space, Mapping):
        raise TypeError(f"param_space must be a dict, got {type(param_space).__name__}")
    if num_samples != -1:
        _check_num_samples(num_samples)
    sampler = _Sampler(param_space, seed, constant_grid_search, each_draw)
    points = list(points_to_evaluate)
    drawn = [config for point in points for config in sampler.draw(point)]
    # As in Tune, each point takes one of the samples.
    repeats = math.inf if num_samples == -1 else max(num_samples - len(points), 0)
    first = sampler.draw() if repeats else []
    sampler.per_repeat = len(first)
    return VariantStream(drawn + first, sampler, max(repeats - 1, 0))


def _check_num_samples(num_samples: Any) -> None:
    check("num_samples", num_samples, Int(low=1))


class VariantStream:
    """Trial configs, drawn as they are taken: a study of many samples starts
    training before it has drawn them all (Tune's variant generator is lazy
    too). Made by `sample_variants`; from a list, it yields the list.

    Between draws it pickles small (a study's snapshot holds it): the configs
    drawn and not yet taken (at most a repeat of the grid), the random state
    and the repeats left.
    """

    def __init__(self, drawn: Iterable[dict[str, Any]] = (), sampler: _Sampler | None = None, repeats: float = 0):
        self._drawn = collections.deque(drawn)
        self._sampler = sampler
        self._repeats_left = repeats if sampler is not None else 0

    def __iter__(self) -> VariantStream:
        return self

    def __next__(self) -> dict[str, Any]:
        if not self._drawn and self._repeats_left:
            self._repeats_left -= 1
            self._drawn.extend(self._sampler.draw())
        if not self._drawn:
            raise StopIteration
        return self._drawn.popleft()

    @property
    def remaining(self) -> float:
        """Configs still to take: every repeat of a grid holds as many
        (infinite for a stream without end)."""
        per_repeat = self._sampler.per_repeat if self._sampler is not None else 0
        return len(self._drawn) + self._repeats_left * per_repeat

    def drawn(self) -> list[dict[str, Any]]:
        """The configs drawn and not yet taken, next first."""
        return list(self._drawn)


class _Sampler:
    """Draws a space's variants with Tune's generator, from one random state."""

    def __init__(
        self, param_space: Mapping[str, Any], seed: Any, constant_grid_search: bool, each_draw: Callable | None
    ) -> None:
        self.param_space = param_space
        self.space = _tune_space(param_space)
        self.random_state = _random_state(seed)
        self.constant_grid_search = constant_grid_search
        self.each_draw = each_draw
        self.per_repeat = 0  # configs a repeat of the grid gives, once known

    def draw(self, point: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
        """One repeat of the grid; with ``point``, the variants of the space
        with the point's values."""
        from ray.tune.search.variant_generator import generate_variants

        space = self.space if point is None else _tune_space(_merged(self.param_space, point))
        variants = generate_variants(space, self.constant_grid_search, self.random_state)
        configs = [_resolve_nested(from_tune_config(resolved), self.random_state) for _, resolved in variants]
        return self.each_draw(configs) if self.each_draw is not None else configs


def _tune_space(param_space: Mapping[str, Any]) -> dict[str, Any]:
    space = to_tune_space(dict(param_space))
    _check_grids(space)
    return _share_grid_values(space)


class _GridValues(list):
    """A ``grid_search``'s values that a deep copy shares: Tune's generator
    deep-copies the whole space once per variant, the grid's own values
    included, so drawing an N-value grid cost O(N²) (20,000 values: minutes
    before the first trial). The values are only read: each variant's value
    is deep-copied on its own as Tune copies it."""

    def __deepcopy__(self, memo: dict[int, Any]) -> _GridValues:
        return self


def _share_grid_values(space: Any) -> Any:
    """``space`` with each ``grid_search``'s values a `_GridValues` (the
    values themselves untouched: a grid inside them is Tune's to copy)."""
    if isinstance(space, dict):
        if len(space) == 1 and isinstance(space.get("grid_search"), list):
            return {"grid_search": _GridValues(space["grid_search"])}
        return {key: _share_grid_values(value) for key, value in space.items()}
    if isinstance(space, list):
        return [_share_grid_values(value) for value in space]
    return space


def _random_state(seed: Any) -> Any:
    """A generator of its own for ``seed``. None (NumPy's global state, which
    Tune draws from) hands the global state over: the draws are those the
    global state would give, wherever the stream is taken, and the global
    state jumps ahead, so that later draws in this process do not repeat them."""
    if isinstance(seed, int):
        return np.random.default_rng(seed)
    if seed is not None:
        return seed
    state = np.random.get_state(legacy=False)
    own = np.random.RandomState()
    own.set_state(state)
    ahead = np.random.MT19937()
    ahead.state = {"bit_generator": state["bit_generator"], "state": state["state"]}
    np.random.set_state({**state, "state": ahead.jumped().state["state"], "has_gauss": 0, "gauss": 0.0})
    return own


def _merged(space: Mapping[str, Any], point: Mapping[str, Any]) -> dict[str, Any]:
    """``space`` with the values of ``point`` (nested dicts merged)."""
    out = dict(space)
    for key, value in point.items():
        nested = isinstance(value, Mapping) and isinstance(out.get(key), Mapping)
        out[key] = _merged(out[key], value) if nested else value
    return out


def _check_grids(space: Any, path: str = "") -> None:
    """Refuse an empty ``tune.grid_search([])``: Tune draws no trial from it
    (a study that runs nothing and reports success), which is never meant."""
    if isinstance(space, Mapping):
        grid = space.get("grid_search") if len(space) == 1 else None
        if hasattr(grid, "__len__") and len(grid) == 0:
            raise ValueError(
                f"param_space{path}: tune.grid_search({grid!r}) has no values, so no trial would run; "
                "give it at least one value"
            )
        for key, value in space.items():
            _check_grids(value, f"{path}[{key!r}]")
    elif isinstance(space, list):
        for index, value in enumerate(space):
            _check_grids(value, f"{path}[{index}]")


def _has_unresolved(config: Any) -> bool:
    if isinstance(config, Sequence):
        return not config.is_resolved
    if isinstance(config, Mapping):
        return any(_has_unresolved(value) for value in config.values())
    if isinstance(config, list):
        return any(_has_unresolved(value) for value in config)
    return False


def _resolve_nested(config: dict[str, Any], random_state: Any) -> dict[str, Any]:
    """Resolve domains inside a sampled value (``tune.choice([CyclicLR(0.001,
    tune.choice([0.05, 0.1]), 20), ...])``): Tune samples the outer choice
    without looking inside the sequence it picked."""
    from ray.tune.search.variant_generator import generate_variants

    while _has_unresolved(config):
        variants = list(generate_variants(to_tune_space(config), random_state=random_state))
        if len(variants) != 1:
            raise ValueError(
                "a tune.grid_search inside a sampled value (e.g. inside tune.choice) has no "
                "defined number of trials; move the grid_search to the top level of param_space"
            )
        config = from_tune_config(variants[0][1])
    return config


class SequenceGridSearch:
    """Tune's grid / random variant generation with the thesis' filter: pass
    as ``TuneConfig(search_alg=SequenceGridSearch(filter=...))``.

    Parameters
    ----------
    filter:
        Keep only drawn configs for which ``filter(config)`` is true, e.g.
        ``lambda c: not (c["optimizer"] == "adam" and c["momentum"] != 0.9)``.
    seed:
        Seed for random domains.
    """

    def __init__(self, filter: Callable[[dict[str, Any]], bool] | None = None, seed: int | None = None) -> None:
        if filter is not None and not callable(filter):
            raise TypeError(f"filter must be callable(config) -> bool, got {filter!r}")
        self.filter = filter
        self.seed = seed

    def generate(self, param_space: Mapping[str, Any], num_samples: int) -> list[dict[str, Any]]:
        return generate_trials(param_space, num_samples, seed=self.seed, filter=self.filter)


def tuned_paths(param_space: Mapping[str, Any]) -> frozenset[tuple[str, ...]]:
    """The config paths a search draws (a Tune domain or a grid search, also
    inside a sequence): the values Tune's experiment tag names. A
    ``tune.sample_from`` value is computed from others, and Tune's tag leaves it out."""
    from ray.tune.search.sample import Domain, Function

    def holds_search(value: Any) -> bool:
        if isinstance(value, Domain):
            return not isinstance(value, Function)
        if isinstance(value, Mapping):
            return "grid_search" in value or any(holds_search(item) for item in value.values())
        if isinstance(value, (list, tuple)):
            return any(holds_search(item) for item in value)
        return any(holds_search(item) for item in vars(value).values()) if hasattr(value, "__dict__") else False

    def walk(space: Mapping[str, Any], prefix: tuple[str, ...]) -> set[tuple[str, ...]]:
        paths: set[tuple[str, ...]] = set()
        for key, value in space.items():
            if isinstance(value, Mapping) and "grid_search" not in value:
                paths |= walk(value, (*prefix, key))
            elif holds_search(value):
                paths.add((*prefix, key))
        return paths

    return frozenset(walk(param_space, ()))
