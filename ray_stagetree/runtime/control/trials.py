"""`TrialInfo`: what Tune's user hooks (``trial_name_creator``,
``trial_dirname_creator``) read from a trial, built on the controller, and
Tune's default trial names and folder names when there is no hook."""

from __future__ import annotations

import os
import re
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass
class TrialInfo:
    """The attributes of a ``ray.tune.experiment.Trial`` that user hooks use."""

    trial_id: str
    config: dict[str, Any]
    trainable_name: str
    #: Tune's experiment tag: the trial's index, then its tuned values ("3_lr=0.0100,units=64").
    experiment_tag: str = ""

    def __str__(self) -> str:
        """Tune's ``Trial.__str__``: ``<trainable>[_<env>]_<trial id>``, "/" replaced."""
        identifier = self.trainable_name
        env = self.config.get("env") if isinstance(self.config, Mapping) else None
        if env is not None:
            identifier += f"_{env.__name__ if isinstance(env, type) else env}"
        return f"{identifier}_{self.trial_id}".replace("/", "_")


def experiment_tag(trial_id: str, config: Mapping[str, Any], paths: frozenset[tuple[str, ...]] | None) -> str:
    """Tune's experiment tag: the trial's counter (its id's number) and
    ``format_vars`` of its tuned values (``paths``: `searchers.variants.tuned_paths`;
    every value for a searcher's trial, ``paths`` None, as Tune's search
    generator tags them)."""
    from ray.tune.search.variant_generator import format_vars
    from ray.tune.utils import flatten_dict

    counter = trial_id.rsplit("_", 1)[-1]
    counter = str(int(counter)) if counter.isdigit() else trial_id
    if paths is None:
        resolved = {tuple(key.split("/")): value for key, value in flatten_dict(dict(config)).items()}
    else:
        resolved = {path: _at(config, path) for path in paths}
    return f"{counter}_{format_vars(resolved)}" if resolved else counter


def _at(config: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        config = config[key]
    return config


def default_dirname(trial: TrialInfo) -> str:
    """Tune's ``Trial._generate_dirname``: ``<str(trial)>_<experiment tag>``
    cut to ``TUNE_MAX_LEN_IDENTIFIER`` (130), then the date; characters
    that are not portable in a folder name become ``_``."""
    limit = int(os.environ.get("TUNE_MAX_LEN_IDENTIFIER", "130"))
    name = f"{trial}_{trial.experiment_tag}"[:limit] + time.strftime("_%Y-%m-%d_%H-%M-%S")  # local time, as Tune's
    return re.sub(r'[/()<>:"\\|?*]', "_", name)


def trial_name(creator: Callable[[Any], Any] | None, trial: TrialInfo, hook: str, folder: bool) -> str:
    """``creator(trial)`` checked to be a usable name (a folder name when
    ``folder``), or Tune's default without a creator."""
    if creator is None:
        return default_dirname(trial) if folder else str(trial)
    name = creator(trial)
    usable = isinstance(name, str) and name.strip() != ""
    if folder:
        usable = usable and name not in (".", "..") and "/" not in name and "\\" not in name
    if not usable:
        allowed = "a non-empty str usable as a folder name (no '/')" if folder else "a non-empty str"
        raise ValueError(f"TuneConfig.{hook} must return {allowed}, got {name!r} for trial {trial.trial_id}")
    return name
