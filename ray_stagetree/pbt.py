"""Population-based training on a search plan.

Ray's ``PopulationBasedTraining`` object supplies every parameter
(``perturbation_interval``, ``hyperparam_mutations``, ``quantile_fraction``,
``resample_probability``, ``perturbation_factors``, ``custom_explore_fn``,
``burn_in_period``) and Ray's own explore function perturbs the values. What
differs is exploitation: a weak trial does not copy a strong trial's
checkpoint into itself; it *becomes a new path of the plan* that follows the
strong trial's configuration up to the strong trial's last checkpoint and
the explored values after it. The fork starts from that checkpoint, and the
schedule PBT discovers is a sequence (``Concat``) that can be replayed.
Asynchronous PBT (Ray's default) is implemented. With
``time_attr="training_iteration"`` trials are requested up to their next
perturbation point, so the source of an exploit always has a checkpoint
there.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from ray_stagetree.config import unflatten


@dataclass(frozen=True)
class Exploit:
    """Replace the trial's future with ``source``'s path up to ``step``, then
    ``values`` (flattened hyper-parameter names -> explored values)."""

    source: str
    step: int
    values: dict[str, Any]


@dataclass
class _PopulationMember:
    last_score: float | None = None
    last_perturbation: int = 0
    checkpoint_step: int | None = None  # set while the trial is a top one, as in Ray
    finished: bool = False
    values: dict[str, Any] = field(default_factory=dict)


class PopulationBasedHost:
    """Asynchronous PBT decisions for the controller, from Ray's PBT object."""

    def __init__(self, pbt: Any, metric: str | None, mode: str | None, horizon: int) -> None:
        from ray.tune.utils import flatten_dict

        if metric is not None or mode is not None:
            pbt.set_search_properties(metric, mode)
        if getattr(pbt, "_synch", False):
            raise NotImplementedError("PopulationBasedTraining(synch=True) is not supported yet; use synch=False")
        self.pbt = pbt
        self.horizon = horizon
        self._members: dict[str, _PopulationMember] = {}
        self._mutated = sorted(flatten_dict(pbt._hyperparam_mutations, delimiter="/"))

    def on_add(self, trial_id: str) -> None:
        self._members[trial_id] = _PopulationMember()

    def on_complete(self, trial_id: str) -> None:
        self._members[trial_id].finished = True

    def next_decision(self, trial_id: str, step: int) -> int:
        """The next perturbation point. With a time attribute other than
        ``training_iteration`` (Ray's default is ``time_total_s``) perturbation
        points are not known in advance: the trial is requested to the
        horizon, and a fork starts from the source's latest checkpoint."""
        if self.pbt._time_attr != "training_iteration":
            return self.horizon
        interval = self.pbt._perturbation_interval
        start = max(step, self.pbt._burn_in_period - 1)
        return min(self.horizon, (int(start // interval) + 1) * interval)

    def on_result(self, trial_id: str, row: dict[str, Any], values: dict[str, Any]) -> Exploit | None:
        """``values``: the trial's hyper-parameters at this step (flattened)."""
        pbt, member = self.pbt, self._members[trial_id]
        step = row.get(pbt._time_attr)
        if step is None or pbt._metric not in row or step < pbt._burn_in_period:
            return None
        if step - member.last_perturbation < pbt._perturbation_interval:
            return None
        member.last_score = pbt._metric_op * row[pbt._metric]
        member.last_perturbation = step
        member.values = values
        lower, upper = self._quantiles()
        # Ray checkpoints a top trial at its perturbation; only those can be cloned.
        member.checkpoint_step = step if trial_id in upper else None
        if trial_id not in lower:
            return None
        source = self._members[random.choice(upper)]
        if source.checkpoint_step is None:
            return None
        exploit = self._explore(source)
        # As in Ray: the trial takes the source's config, explored, and its
        # last perturbation time.
        member.values = {**source.values, **exploit.values}
        member.last_perturbation = source.last_perturbation
        return exploit

    def _quantiles(self) -> tuple[list[str], list[str]]:
        """Ray's rule: bottom and top ``quantile_fraction`` of the scored,
        unfinished trials, at most half the population each."""
        scored = [
            trial_id
            for trial_id, member in self._members.items()
            if member.last_score is not None and not math.isnan(member.last_score) and not member.finished
        ]
        scored.sort(key=lambda trial_id: self._members[trial_id].last_score)
        if len(scored) <= 1:
            return [], []
        count = int(math.ceil(len(scored) * self.pbt._quantile_fraction))
        if count > len(scored) / 2:
            count = int(math.floor(len(scored) / 2))
        return scored[:count], scored[len(scored) - count :]

    def _explore(self, member: _PopulationMember) -> Exploit:
        from ray.tune.schedulers.pbt import _explore
        from ray.tune.utils import flatten_dict

        source = next(trial_id for trial_id, other in self._members.items() if other is member)
        pbt = self.pbt
        explored = _explore(
            unflatten(member.values),
            pbt._hyperparam_mutations,
            pbt._resample_probability,
            pbt._perturbation_factors,
            pbt._custom_explore_fn,
        )
        new_config = explored[0] if isinstance(explored, tuple) else explored
        flat = flatten_dict(new_config, delimiter="/")
        values = {name: flat[name] for name in self._mutated if name in flat}
        return Exploit(source, member.checkpoint_step, values)
