"""A trial's config as Tune shows it: ``result.config`` (``row["config"]``),
callbacks' ``trial.config``, ``ResultGrid``.

Tune shows the user's own objects (a ``Path``, an ``argparse.Namespace``, the
sequences as the objects given) and, under PBT, the values in force at that
result: a value the user gave plain and PBT explored is the value it had at
that iteration, not the schedule the plan records for it. The schedule
(PBT's discovered ``Concat``, replayable as a ``param_space``) is shown
beside it, under `messages.SCHEDULE_KEY`, on the rows of trials PBT changed.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from ray_stagetree.planning.config import TrialConfig, replaced, split_path
from ray_stagetree.sequences import Sequence


def _at(config: dict[str, Any], path: str) -> Any:
    for part in split_path(path):
        config = config[part]
    return config


def scheduled(config: dict[str, Any], plain: frozenset[str]) -> frozenset[str]:
    """The names the user gave plain that hold a sequence now (PBT explored them)."""
    return frozenset(name for name in plain if isinstance(_at(config, name), Sequence))


def shown_config(
    config: dict[str, Any], trial_config: TrialConfig | None, names: frozenset[str], iteration: int
) -> dict[str, Any]:
    """``config`` as Tune shows it after ``iteration`` iterations (0: before
    the first): each of ``names`` (`scheduled`) holds its value at the last
    iteration trained; everything else is the user's object, unchanged."""
    if trial_config is None or not names:
        return config
    values = trial_config.hparams_at(max(iteration - 1, 0))
    return replaced(config, {name: _python(values[name]) for name in names})


def _python(value: Any) -> Any:
    return value.item() if isinstance(value, np.generic) else value
