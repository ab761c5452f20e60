"""Merge rate: how much compute stage sharing can save (Hippo section 6).

``merge rate = total iterations / unique iterations``: the iterations running
every trial to its horizon separately would take, over those left when shared
prefixes run once. N identical trials have merge rate N. The k-wise form
merges the trials of several studies into one plan.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from collections.abc import Sequence as SequenceType
from typing import Any

from ray_stagetree.planning.plan import SearchPlan


def _horizons(horizon: int | SequenceType[int], count: int, what: str) -> list[int]:
    if isinstance(horizon, bool):
        raise ValueError(f"{what}: horizon must be an int or one int per trial, got {horizon!r}")
    if isinstance(horizon, int):
        return [horizon] * count
    horizons = list(horizon)
    if len(horizons) != count:
        raise ValueError(f"{what}: got {len(horizons)} horizons for {count} trials; give one int or one per trial")
    return horizons


def _fill(plan: SearchPlan, configs: Iterable[Mapping[str, Any]], horizon: Any, prefix: str) -> None:
    configs = list(configs)
    for index, (config, iterations) in enumerate(zip(configs, _horizons(horizon, len(configs), "horizon"))):
        plan.add_trial(f"{prefix}{index}", config, iterations)


def _rate(plan: SearchPlan) -> float:
    unique = plan.unique_iterations()
    if unique == 0:
        raise ValueError("merge rate needs at least one trial")
    return plan.total_iterations() / unique


def merge_rate(configs: Iterable[Mapping[str, Any]], horizon: int | SequenceType[int]) -> float:
    """Total iterations / unique iterations of ``configs`` trained to ``horizon``.

    Parameters
    ----------
    configs:
        Resolved trial configurations (dicts of sequences and plain values).
    horizon:
        Iterations per trial: one int, or one per config.

    Examples
    --------
    >>> from ray_stagetree import MultiStep, merge_rate
    >>> merge_rate([{"lr": MultiStep(0.1, [m], 0.1)} for m in (100, 150)], 200)
    1.3333333333333333
    """
    plan = SearchPlan()
    _fill(plan, configs, horizon, "trial_")
    return _rate(plan)


def kwise_merge_rate(studies: Iterable[Iterable[Mapping[str, Any]]], horizon: int | SequenceType[Any]) -> float:
    """Merge rate of several studies planned together (Hippo's k-wise merge rate).

    ``horizon`` is one int for every trial, or one entry per study (an int or
    one int per trial of that study).
    """
    studies = [list(study) for study in studies]
    plan = SearchPlan()
    for index, (study, iterations) in enumerate(zip(studies, _horizons(horizon, len(studies), "horizon per study"))):
        _fill(plan, study, iterations, f"study_{index}/trial_")
    return _rate(plan)
