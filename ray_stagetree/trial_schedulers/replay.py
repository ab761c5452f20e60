"""``PopulationBasedTrainingReplay`` on a search plan: a replay is a schedule.

Ray's replay trains one trial from the first config of a PBT policy file
and, at each iteration where the recorded trial was exploited, checkpoints,
pauses and restarts it with the next config. A sequence says exactly that:
here the trial's config is the policy's first, with every value the policy
changes turned into a `Concat` of constants that switches at the recorded
iterations, and the replay never pauses. Ray's own object still takes the
trial (one trial only, its config overwritten, with Ray's errors and
warnings); its decisions are not asked for, since they would pause the trial
only to change its values. As a sequence, the replayed trial shares its
prefix with any trial of the plan that trains the same values up to a change
(the PBT study's own trials, replayed in a `Study` of that experiment or on
a plan service it shares).
"""

from __future__ import annotations

from typing import Any

from ray_stagetree.planning.config import unflatten
from ray_stagetree.planning.decisions import CONTINUE, Decision
from ray_stagetree.sequences.base import Constant
from ray_stagetree.trial_schedulers.tune_fed import TuneFedAdapter


class ReplayAdapter(TuneFedAdapter):
    """Ray's ``PopulationBasedTrainingReplay``: its policy as the trial's sequences."""

    hosts_subclasses = False

    @property
    def decides_at_milestones(self) -> bool:
        return True

    @property
    def order_sensitive(self) -> bool:
        return False

    def on_add(self, trial_id: str, config: dict[str, Any]) -> None:
        super().on_add(trial_id, config)  # Ray's: one trial only, the policy's first config set into it
        schedule = replayed(config, self._ray_field(self.scheduler, "_policy"))
        config.clear()
        config.update(schedule)

    def on_result(self, trial_id: str, row: dict[str, Any], values: dict[str, Any] | None) -> Decision:
        self._trials[trial_id].last_result = row
        return CONTINUE


def replayed(config: dict[str, Any], policy: list[tuple[int, dict[str, Any]]]) -> dict[str, Any]:
    """``config`` (the policy's first) with each value that ``policy``'s
    ``(iteration, config)`` changes made a sequence: the recorded value
    until the iteration, the new one after (Ray's replay changes the config
    once the trial reported that iteration)."""
    from ray.tune.utils import flatten_dict

    flat = flatten_dict(config, delimiter="/")
    changes = [(iteration, flatten_dict(new, delimiter="/")) for iteration, new in policy]
    schedule: dict[str, Any] = {}
    for name, first in flat.items():
        sequence, current = None, first
        for iteration, new in changes:
            if name in new and new[name] != current:
                sequence = (sequence or Constant(first)).then(new[name], at=iteration)
                current = new[name]
        schedule[name] = first if sequence is None else sequence
    return unflatten(schedule)
