"""Population-based training on a search plan.

Ray's ``PopulationBasedTraining`` object supplies every parameter
(``perturbation_interval``, ``hyperparam_mutations``, ``quantile_fraction``,
``resample_probability``, ``perturbation_factors``, ``custom_explore_fn``,
``burn_in_period``, ``synch``) and Ray's own explore function perturbs the
values. What differs is exploitation: a weak trial does not copy a strong
trial's checkpoint into itself; it *becomes a new path of the plan* that
follows the strong trial's configuration up to the strong trial's last
checkpoint and the explored values after it. The fork starts from that
checkpoint, and the schedule PBT discovers is a sequence (``Concat``) that
can be replayed.

Both of Ray's variants are hosted. Asynchronous PBT (the default) decides
for a trial as soon as it reaches a perturbation point. Synchronous PBT
(``synch=True``) pauses each trial at the point until every live trial is
there, then ranks them all at once; paused trials resume (exploited or not)
through `PopulationBasedHost.resumable`, in Ray's order. With
``time_attr="training_iteration"`` trials are requested up to their next
perturbation point, so the source of an exploit always has a checkpoint
there.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

from ray_stagetree.planning.config import unflatten
from ray_stagetree.planning.lifecycle import PAUSE, Exploit


@dataclass
class _PopulationMember:
    # Times are in the scheduler's time attribute; `iteration` is the
    # training iteration of the last perturbation point, where forks start.
    last_score: float | None = None
    last_perturbation: float = 0
    last_train_time: float = 0
    iteration: int = 0
    checkpoint_step: int | None = None  # set while the trial is a top one, as in Ray
    finished: bool = False
    paused: bool = False
    pending: Exploit | None = None  # synchronous mode: applied when it resumes
    values: dict[str, Any] = field(default_factory=dict)


class PopulationBasedHost:
    """PBT decisions for the controller, from Ray's PBT object."""

    def __init__(self, pbt: Any, metric: str | None, mode: str | None, horizon: int) -> None:
        from ray.tune.utils import flatten_dict

        if metric is not None or mode is not None:
            pbt.set_search_properties(metric, mode)
        self.pbt = pbt
        self.horizon = horizon
        self._members: dict[str, _PopulationMember] = {}
        self._mutated = sorted(flatten_dict(pbt._hyperparam_mutations, delimiter="/"))
        self._next_sync = max(pbt._perturbation_interval, pbt._burn_in_period)
        # False once the trainable reports no checkpoint where PBT needs one:
        # as in Ray, a trial with no checkpoint is never cloned.
        self.trainable_checkpoints = True

    def on_add(self, trial_id: str, config: dict[str, Any]) -> None:
        from ray.tune.schedulers.pbt import _fill_config

        for name, space in self.pbt._hyperparam_mutations.items():
            if name not in config:
                _fill_config(config, name, space)
        self._members[trial_id] = _PopulationMember()

    def on_complete(self, trial_id: str) -> None:
        self._members[trial_id].finished = True
        live = [member for member in self._members.values() if not member.finished]
        if self.pbt._synch and live and all(m.paused and m.last_train_time >= self._next_sync for m in live):
            # The trials were waiting for this one, which will never report
            # again (Ray waits forever here): rank them now.
            self._perturb_all(max(member.last_train_time for member in live))

    def next_decision(self, trial_id: str, step: int) -> int:
        """The first iteration after ``step`` at which Ray's rule perturbs the
        trial (past the burn-in, an interval after its last perturbation).
        With a time attribute other than ``training_iteration`` (Ray's default
        is ``time_total_s``) perturbation points are not known in advance:
        the trial is requested to the horizon, and a fork starts from the
        source's latest checkpoint."""
        pbt = self.pbt
        if pbt._time_attr != "training_iteration":
            return self.horizon
        due = max(pbt._burn_in_period, self._members[trial_id].last_perturbation + pbt._perturbation_interval)
        return min(self.horizon, max(step + 1, math.ceil(due)))

    def on_result(self, trial_id: str, row: dict[str, Any], values: dict[str, Any]) -> Exploit | str | None:
        """An `Exploit` of this trial, `PAUSE` (synchronous mode) or None to
        continue. ``values``: the trial's hyper-parameters at this step (flattened)."""
        pbt, member = self.pbt, self._members[trial_id]
        time = row.get(pbt._time_attr)
        if time is None or pbt._metric not in row or time < pbt._burn_in_period:
            return None
        if time - member.last_perturbation < pbt._perturbation_interval:
            return None
        member.last_score = pbt._metric_op * row[pbt._metric]
        member.last_train_time = time
        member.iteration = row["training_iteration"]
        member.values = values
        if not pbt._synch:
            member.last_perturbation = time
            lower, upper = self._quantiles()
            return self._checkpoint_or_exploit(trial_id, lower, upper)
        member.paused = True
        if all(
            other.last_train_time >= self._next_sync
            for other_id, other in self._members.items()
            if other_id != trial_id and not other.finished
        ):
            self._perturb_all(time)
        return PAUSE

    def _perturb_all(self, time: float) -> None:
        """Synchronous mode, every live trial at the perturbation point:
        top trials keep checkpoints before weak ones clone them, as in Ray."""
        lower, upper = self._quantiles()
        middle = [trial_id for trial_id in self._members if trial_id not in lower and trial_id not in upper]
        for trial_id in upper + middle + lower:
            self._members[trial_id].last_perturbation = time
            self._members[trial_id].pending = self._checkpoint_or_exploit(trial_id, lower, upper)
        latest = max(member.last_train_time for member in self._members.values())
        self._next_sync = max(self._next_sync + self.pbt._perturbation_interval, latest)

    def resumable(self) -> list[tuple[str, Exploit | None]]:
        """Synchronous mode: paused trials behind the next perturbation point,
        least trained first, each with the exploit it resumes with."""
        waiting = [
            (trial_id, member)
            for trial_id, member in self._members.items()
            if member.paused and not member.finished and member.last_train_time < self._next_sync
        ]
        waiting.sort(key=lambda item: item[1].last_train_time)
        resumed = []
        for trial_id, member in waiting:
            resumed.append((trial_id, member.pending))
            member.paused, member.pending = False, None
        return resumed

    def _checkpoint_or_exploit(self, trial_id: str, lower: list[str], upper: list[str]) -> Exploit | None:
        member = self._members[trial_id]
        # Ray checkpoints a top trial at its perturbation; only those can be cloned.
        member.checkpoint_step = member.iteration if trial_id in upper and self.trainable_checkpoints else None
        if trial_id not in lower:
            return None
        source_id = random.choice(upper)
        source = self._members[source_id]
        if source.checkpoint_step is None:
            return None
        exploit = self._explore(source_id)
        # As in Ray: the trial takes the source's config, explored, and its
        # perturbation and train times.
        member.values = {**source.values, **exploit.values}
        member.last_perturbation = source.last_perturbation
        member.last_train_time = source.last_train_time
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

    def _explore(self, source_id: str) -> Exploit:
        from ray.tune.schedulers.pbt import _explore
        from ray.tune.utils import flatten_dict

        pbt, source = self.pbt, self._members[source_id]
        explored = _explore(
            unflatten(source.values),
            pbt._hyperparam_mutations,
            pbt._resample_probability,
            pbt._perturbation_factors,
            pbt._custom_explore_fn,
        )
        new_config = explored[0] if isinstance(explored, tuple) else explored
        flat = flatten_dict(new_config, delimiter="/")
        values = {name: flat[name] for name in self._mutated if name in flat}
        return Exploit(source_id, source.checkpoint_step, values)
