"""PB2 (Population Based Bandits) on a search plan.

``PB2`` is Ray's ``PopulationBasedTraining`` with another explore: where
PBT perturbs the source's values, PB2 fits a time-varying GP to the reward
each trial gained per interval under its values and picks the next values by
a bandit's upper confidence bound. Everything else is PBT's rule, which runs
here as `PopulationBasedAdapter` runs it (an exploit is a fork of the plan).
The GP-bandit is Ray's own code: the user's ``PB2`` object keeps the data
(``data``, ``current``, ``last_exploration_time``) as under Tune, fed by its
``_save_trial_state`` at each perturbation point, and its
``_get_new_config`` picks the values, so the object holds the study's state
after ``fit()`` as Tune's does.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from ray_stagetree.trial_schedulers.pbt import PopulationBasedAdapter
from ray_stagetree.trial_schedulers.ray_fields import ray_field


@dataclass(eq=False)
class _TrialShim:
    """What PB2's methods read of a Ray ``Trial``: its config and its name
    (``str(trial)`` keys its rows in ``PB2.data``)."""

    trial_id: str
    config: dict[str, Any]

    def __str__(self) -> str:
        return self.trial_id


class PB2Adapter(PopulationBasedAdapter):
    """PBT's rule on the plan with PB2's GP-bandit explore (Ray's ``PB2``)."""

    def _fill(self, config: dict[str, Any]) -> None:
        # Ray's PB2 samples a missing value uniformly within its bounds.
        from ray.tune.schedulers import pb2

        fill_config = ray_field(pb2, "_fill_config", self.scheduler, self.tested_with)
        fill_config(config, self._private("_hyperparam_bounds"))

    def _record(self, trial_id: str, time: float, row: dict[str, Any]) -> None:
        # Ray's `_save_trial_state` appends the trial's values and score to `PB2.data`.
        self._private("_save_trial_state")(SimpleNamespace(), time, row, self._shim(trial_id))

    def _explored_values(self, trial_id: str, source_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
        new_config, operations = self._private("_get_new_config")(self._shim(trial_id), self._shim(source_id))
        return self._mutated_values(new_config), operations

    def _private(self, name: str) -> Any:
        """A private field or method of the user's ``PB2`` object."""
        return ray_field(self.scheduler, name, self.scheduler, self.tested_with)

    def _shim(self, trial_id: str) -> _TrialShim:
        return _TrialShim(trial_id, self.config_of(trial_id))
