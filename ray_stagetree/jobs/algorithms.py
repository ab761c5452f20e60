"""Tune's trial schedulers and searchers, and execution policies, by the
names a job spec gives them.

Names map to Ray Tune's own classes, through Tune's own registries
(``ray.tune.schedulers.SCHEDULER_IMPORT``, ``ray.tune.search.SEARCH_ALG_IMPORT``)
where they have them; the one the runtime cannot host (resource changing)
is not offered. An argument ``{import: "module:function"}`` is
that Python object (a grid search's ``filter``). A searcher may also be named by import path
(``my_module:MySearcher``): a ``ray.tune.search.Searcher`` subclass, or an
`AskTellAlgorithm` subclass, which runs through `AskTellSearcher`. An
execution policy is one of `POLICIES` by name, or, with keyword arguments
(``{name: round_robin, quantum_s: 30}``) or by import path (an
`ExecutionPolicy` subclass), the instance they describe.

Keyword arguments are checked against the class's signature before it is
built, so a misspelt one is named with the ones allowed.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

from ray.tune.schedulers import SCHEDULER_IMPORT
from ray.tune.search import SEARCH_ALG_IMPORT, BasicVariantGenerator, Searcher

from ray_stagetree.jobs.domains import to_param_space
from ray_stagetree.jobs.errors import field_path
from ray_stagetree.jobs.imports import load_object
from ray_stagetree.planning.policies import POLICIES, ExecutionPolicy
from ray_stagetree.searchers import AskTellAlgorithm, AskTellSearcher, SequenceGridSearch
from ray_stagetree.validation import did_you_mean, is_number


def _tune_scheduler(name: str) -> Callable[[], type]:
    return lambda: SCHEDULER_IMPORT[name]


def _tune_searcher(name: str) -> Callable[[], type]:
    return SEARCH_ALG_IMPORT[name]


def _promoting_asha() -> type:
    from ray_stagetree.trial_schedulers.promoting_asha import PromotingASHAScheduler

    return PromotingASHAScheduler


SCHEDULERS: dict[str, Callable[[], type]] = {
    "fifo": _tune_scheduler("fifo"),
    "asha": _tune_scheduler("async_hyperband"),
    "async_hyperband": _tune_scheduler("async_hyperband"),
    "hyperband": _tune_scheduler("hyperband"),
    "hb_bohb": _tune_scheduler("hb_bohb"),  # HyperBandForBOHB, with the "bohb" searcher (TuneBOHB)
    "median_stopping": _tune_scheduler("median_stopping_rule"),
    "median_stopping_rule": _tune_scheduler("median_stopping_rule"),
    "pbt": _tune_scheduler("pbt"),
    "pb2": SCHEDULER_IMPORT["pb2"],  # a function: PB2 imports scikit-learn when named
    "pbt_replay": _tune_scheduler("pbt_replay"),
    "promoting_asha": _promoting_asha,
}

SEARCHERS: dict[str, Callable[[], type]] = {
    "random": lambda: BasicVariantGenerator,
    "grid": lambda: SequenceGridSearch,
    **{
        name: _tune_searcher(name)
        for name in ("optuna", "hyperopt", "ax", "bayesopt", "nevergrad", "zoopt", "hebo", "bohb")
    },
}


def build_scheduler(entry: str | dict[str, Any], base_dir: str, path: tuple) -> tuple[Any, list[str]]:
    """A Tune trial scheduler from the spec's ``tune_config.scheduler``; (None, problems) when it cannot be."""
    return _build(entry, SCHEDULERS, "scheduler", base_dir, path, importable=())


def build_searcher(entry: str | dict[str, Any], base_dir: str, path: tuple) -> tuple[Any, list[str]]:
    """A searcher from the spec's ``tune_config.search_alg``; (None, problems) when it cannot be."""
    return _build(entry, SEARCHERS, "searcher", base_dir, path, importable=(Searcher, AskTellAlgorithm))


def build_policy(entry: str | dict[str, Any], base_dir: str, path: tuple) -> tuple[Any, list[str]]:
    """The spec's ``stagetree.execution_policy``: a name of `POLICIES` as it
    is (the `Tuner` takes names), else the `ExecutionPolicy` instance it
    describes; (None, problems) when it cannot be built."""
    if isinstance(entry, str) and entry in POLICIES:
        return entry, []
    return _build(entry, _classes(POLICIES), "execution policy", base_dir, path, importable=(ExecutionPolicy,))


def _classes(registry: Mapping[str, type]) -> dict[str, Callable[[], type]]:
    """A registry of classes in the table form `_build` reads (classes
    found when asked, for the optional packages of Tune's searchers)."""
    return {name: (lambda cls=cls: cls) for name, cls in registry.items()}


def _build(
    entry: str | dict[str, Any],
    table: Mapping[str, Callable[[], type]],
    what: str,
    base_dir: str,
    path: tuple,
    importable: tuple[type, ...],
) -> tuple[Any, list[str]]:
    """The object ``entry`` names: a name of ``table``, or an import path
    ``module:Class`` of a subclass of one of ``importable``, built with the
    entry's keyword arguments."""
    entry = {"name": entry} if isinstance(entry, str) else dict(entry)
    name = entry.pop("name")
    where = field_path((*path, "name"))
    allowed = ", ".join(sorted(table)) + (", or an import path 'module:Class'" if importable else "")
    if name in table:
        try:
            cls = table[name]()
        except ImportError as error:
            return None, [f"{where}: {what} {name!r} needs a package that is not installed ({error})"]
    elif importable and ":" in name:
        try:
            cls = load_object(name, base_dir)
        except ImportError as error:
            return None, [f"{where}: {error}"]
        if not (isinstance(cls, type) and issubclass(cls, importable)):
            kinds = " or ".join(_qualified(base) for base in importable)
            return None, [f"{where}: {name!r} must be {kinds} subclass, got {cls!r}"]
    else:
        return None, [f"{where}: unknown {what} {name!r}{did_you_mean(name, table)}; allowed: {allowed}"]
    batch_size = entry.pop("batch_size", None) if issubclass(cls, AskTellAlgorithm) else None
    problems: list[str] = []
    entry = {key: _imported(value, base_dir, (*path, key), problems) for key, value in entry.items()}
    arguments, found = to_param_space(entry, path)
    problems += found
    problems += _check_arguments(cls, arguments, path)
    mistyped = _mistyped_arguments(cls, arguments, path)
    if problems or mistyped:
        # The well-typed arguments' own problems too: every problem of the item at once.
        rest = {key: value for key, value in arguments.items() if key not in mistyped}
        return None, problems + list(mistyped.values()) + ([] if problems else _refused_arguments(cls, rest, path))
    try:
        built = cls(**arguments)
        if isinstance(built, AskTellAlgorithm):
            built = AskTellSearcher(built, **({} if batch_size is None else {"batch_size": batch_size}))
    except Exception as error:  # each Tune class raises its own kinds for bad arguments
        return None, _refused_arguments(cls, arguments, path) or [
            f"{field_path(path)}: {cls.__name__}({_arguments_text(arguments)}) failed: {error}"
        ]
    return built, []


def _imported(value: Any, base_dir: str, path: tuple, problems: list[str]) -> Any:
    """An argument ``{import: "module:function"}`` is that object (a grid
    search's ``filter``, PBT's ``custom_explore_fn``): code, which JSON cannot hold."""
    if not (isinstance(value, dict) and set(value) == {"import"}):
        return value
    try:
        return load_object(str(value["import"]), base_dir)
    except ImportError as error:
        problems.append(f"{field_path(path)}.import: {error}")
        return None


def _check_arguments(cls: type, arguments: dict[str, Any], path: tuple) -> list[str]:
    parameters = inspect.signature(cls).parameters
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters.values()):
        return []
    allowed = [name for name, parameter in parameters.items() if parameter.kind is not inspect.Parameter.VAR_POSITIONAL]
    return [
        f"{field_path((*path, key))}: {cls.__name__} has no argument {key!r}{did_you_mean(key, allowed)}; "
        f"allowed: {', '.join(allowed)}"
        for key in arguments
        if key not in allowed
    ]


def _mistyped_arguments(cls: type, arguments: dict[str, Any], path: tuple) -> dict[str, str]:
    """The arguments whose default says their type (a number, or true/false)
    given a value of another, with a message naming the field and what is
    allowed (the class would raise Python's own error for the first)."""
    parameters = inspect.signature(cls).parameters
    problems = {}
    for key, value in arguments.items():
        parameter = parameters.get(key)
        default = None if parameter is None else parameter.default
        if isinstance(default, bool):
            expected, fits = "true or false", isinstance(value, bool)
        elif isinstance(default, int | float):
            expected, fits = "a number", is_number(value)
        else:
            continue
        if value is not None and not fits:
            problems[key] = (
                f"{field_path((*path, key))}: {value!r} is not allowed; expected {expected} "
                f"({cls.__name__}'s {key}, default {default!r})"
            )
    return problems


def _refused_arguments(cls: type, arguments: dict[str, Any], path: tuple) -> list[str]:
    """Why ``cls`` refused ``arguments``, argument by argument: each built
    alone (the others at their defaults), so that every argument it refuses
    is named at once, not one per attempt; [] when none fails alone (the
    arguments conflict: the caller says so with them all)."""
    problems = []
    for key, value in arguments.items():
        try:
            cls(**{key: value})
        except TypeError as error:
            if "required" in str(error):  # the class cannot be built from one argument
                return []
            problems.append(f"{field_path((*path, key))}: {value!r} is not allowed: {error}")
        except Exception as error:  # each Tune class raises its own kinds for bad arguments
            problems.append(f"{field_path((*path, key))}: {value!r} is not allowed: {error}")
    return problems


def _qualified(cls: type) -> str:
    """How messages name a base class, article first: Tune's by their public path."""
    name = f"ray.tune.search.{cls.__name__}" if cls is Searcher else cls.__name__
    return f"{'an' if name[0] in 'AEIOU' else 'a'} {name}"


def _arguments_text(arguments: dict[str, Any]) -> str:
    return ", ".join(f"{key}={value!r}" for key, value in arguments.items())
