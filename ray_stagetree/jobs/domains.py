"""The declarative ``param_space`` of a job spec, turned into Tune's.

A spec holds only JSON. Three forms have a meaning there, wherever they
appear (at the top, nested in dicts and lists, as a sequence's parameter):

* a Tune domain, a dict with one key naming it: ``{"loguniform": [1e-4, 1e-1]}``,
  ``{"choice": [...]}``, ``{"grid_search": [...]}``, ``{"randint": {"lower": 1,
  "upper": 8}}``; the arguments are a list (positional, as ``tune.loguniform``
  takes them) or a dict (by name);
* a sequence, a dict with ``"family"`` (`Sequence.to_json`'s form, whose
  parameters may themselves be domains): ``{"family": "MultiStep", "init": 0.1,
  "milestones": [8], "gamma": {"grid_search": [0.1, 0.3]}}``;
* anything else, a constant.

`to_param_space` builds the Tune objects and checks them, naming the field of
every mistake; `to_declarative` is its inverse, so a Python ``param_space``
can be written out as a spec.
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Mapping
from typing import Any

from ray import tune
from ray.tune.search.sample import Categorical, Domain, Float, Integer, LogUniform, Normal, Quantized

from ray_stagetree.jobs.errors import field_path
from ray_stagetree.sequences import FAMILIES, Sequence, from_json
from ray_stagetree.validation import did_you_mean

#: Tune's domain constructors a spec may name (``tune.sample_from`` takes a
#: function, which JSON cannot hold).
DOMAINS = {
    name: getattr(tune, name)
    for name in (
        "uniform",
        "quniform",
        "loguniform",
        "qloguniform",
        "randn",
        "qrandn",
        "randint",
        "qrandint",
        "lograndint",
        "qlograndint",
        "choice",
        "grid_search",
    )
}


def to_param_space(space: Any, path: tuple = ("param_space",)) -> tuple[Any, list[str]]:
    """Tune's ``param_space`` for the declarative ``space``, and the problems
    found (each naming its field); the space is only usable when there are none."""
    problems: list[str] = []
    return _convert(space, path, problems), problems


def _convert(value: Any, path: tuple, problems: list[str]) -> Any:
    if isinstance(value, list):
        return [_convert(item, (*path, index), problems) for index, item in enumerate(value)]
    if not isinstance(value, Mapping):
        return value
    if "family" in value:
        return _sequence(value, path, problems)
    if len(value) == 1:
        ((name, arguments),) = value.items()
        if name in DOMAINS:
            return _domain(name, arguments, path, problems)
    return {key: _convert(item, (*path, key), problems) for key, item in value.items()}


def _sequence(value: Mapping, path: tuple, problems: list[str]) -> Any:
    # The parameters first: a misspelt family hides none of their own mistakes.
    parameters = {key: _convert(item, (*path, key), problems) for key, item in value.items() if key != "family"}
    family = value["family"]
    if family not in FAMILIES:
        problems.append(
            f"{field_path((*path, 'family'))}: unknown sequence family {family!r}{did_you_mean(family, FAMILIES)}; "
            f"allowed: {', '.join(sorted(FAMILIES))}"
        )
        return None
    try:
        return from_json({"family": family, **parameters})
    except (TypeError, ValueError) as error:
        problems.append(f"{field_path(path)}: {error}")
        return None


def _domain(name: str, arguments: Any, path: tuple, problems: list[str]) -> Any:
    where = field_path((*path, name))
    constructor = DOMAINS[name]
    if name in ("choice", "grid_search"):
        if not isinstance(arguments, list) or not arguments:
            problems.append(f"{where}: must be a non-empty list of values, got {arguments!r}")
            return None
        return constructor(_convert(arguments, (*path, name), problems))
    parameters = list(inspect.signature(constructor).parameters)
    if isinstance(arguments, list):
        if len(arguments) > len(parameters):
            problems.append(
                f"{where}: takes at most {len(parameters)} arguments ({', '.join(parameters)}), got {arguments!r}"
            )
            return None
        arguments = dict(zip(parameters, arguments))
    if not isinstance(arguments, Mapping):
        problems.append(
            f"{where}: arguments must be a list [{', '.join(parameters)}] or a dict of them, got {arguments!r}"
        )
        return None
    unknown = sorted(set(arguments) - set(parameters))
    if unknown:
        named = ", ".join(f"{key!r}{did_you_mean(key, parameters)}" for key in unknown)
        problems.append(f"{where}: unknown argument(s) {named}; allowed: {', '.join(parameters)}")
        return None
    for key, number in arguments.items():
        if isinstance(number, bool) or not isinstance(number, (int, float)) or not math.isfinite(number):
            problems.append(f"{where}.{key}: must be a finite number, got {number!r}")
            return None
    if "lower" in arguments and "upper" in arguments and not arguments["lower"] < arguments["upper"]:
        lower, upper = arguments["lower"], arguments["upper"]
        problems.append(f"{where}: lower must be < upper, got lower={lower!r}, upper={upper!r}")
        return None
    try:
        return constructor(**arguments)
    except (TypeError, ValueError) as error:
        problems.append(f"{where}: {error} (arguments {dict(arguments)!r})")
        return None


def to_declarative(space: Any) -> Any:
    """The spec form of a Python ``param_space``: sequences as their JSON
    (parameters that are domains included), Tune domains as one-key dicts.

    Raises ValueError for what JSON cannot hold (``tune.sample_from`` and
    other custom domains, objects)."""
    if isinstance(space, Sequence):
        return to_declarative(space.to_spec())
    if isinstance(space, Mapping):
        return {key: to_declarative(value) for key, value in space.items()}
    if isinstance(space, (list, tuple)):
        return [to_declarative(value) for value in space]
    if isinstance(space, Domain):
        return _domain_form(space)
    return space


def _domain_form(domain: Domain) -> dict[str, Any]:
    sampler = domain.get_sampler()
    quantum = sampler.q if isinstance(sampler, Quantized) else None
    inner = sampler.sampler if isinstance(sampler, Quantized) else sampler
    prefix = "q" if quantum is not None else ""
    if isinstance(domain, Categorical):
        return {"choice": to_declarative(list(domain.categories))}
    if isinstance(domain, (Float, Integer)):
        if isinstance(inner, Normal):
            return {f"{prefix}randn": [inner.mean, inner.sd] + ([quantum] if quantum is not None else [])}
        log = isinstance(inner, LogUniform)
        kind = "uniform" if isinstance(domain, Float) else "randint"
        name = {
            ("uniform", False): "uniform",
            ("uniform", True): "loguniform",
            ("randint", False): "randint",
            ("randint", True): "lograndint",
        }[kind, log]
        return {prefix + name: [domain.lower, domain.upper] + ([quantum] if quantum is not None else [])}
    raise ValueError(f"{domain!r} has no declarative form (tune.sample_from and custom domains take Python code)")
