"""`TrialInfo`: what Tune's user hooks (``trial_name_creator``,
``trial_dirname_creator``) read from a trial, built on the controller."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class TrialInfo:
    """The attributes of a ``ray.tune.experiment.Trial`` that user hooks use."""

    trial_id: str
    config: dict[str, Any]
    trainable_name: str

    @property
    def experiment_tag(self) -> str:
        return self.trial_id

    def __str__(self) -> str:
        return f"{self.trainable_name}_{self.trial_id}"


def trial_name(creator: Callable[[Any], Any] | None, trial: TrialInfo, hook: str, folder: bool) -> str:
    """``creator(trial)`` checked to be a usable name (a folder name when
    ``folder``), or the trial id without a creator."""
    if creator is None:
        return trial.trial_id
    name = creator(trial)
    usable = isinstance(name, str) and name.strip() != ""
    if folder:
        usable = usable and name not in (".", "..") and "/" not in name and "\\" not in name
    if not usable:
        allowed = "a non-empty str usable as a folder name (no '/')" if folder else "a non-empty str"
        raise ValueError(f"TuneConfig.{hook} must return {allowed}, got {name!r} for trial {trial.trial_id}")
    return name
