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
through `PopulationBasedAdapter.resumable`, in Ray's order. With
``time_attr="training_iteration"`` trials are requested up to their next
perturbation point, so the source of an exploit always has a checkpoint
there.

The settings are Ray's private fields, all read once, in `_PBTSettings.read`.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any

from ray_stagetree.planning.config import unflatten
from ray_stagetree.planning.decisions import CONTINUE, PAUSE, Decision, Exploit
from ray_stagetree.trial_schedulers.adapter import SchedulerAdapter
from ray_stagetree.trial_schedulers.ray_fields import ray_field

# The functions of Ray's pbt module the settings carry (without their "_").
_RAY_FUNCTIONS = ("fill_config", "explore", "make_experiment_tag")


@dataclass(frozen=True)
class _PBTSettings:
    """Everything PBT's rule reads of Ray's object: each field is the private
    attribute of ``PopulationBasedTraining`` of the same name with a leading
    "_", except the module functions in `_RAY_FUNCTIONS`."""

    time_attr: str
    metric: str
    metric_op: float
    perturbation_interval: float
    burn_in_period: float
    hyperparam_mutations: dict[str, Any]
    quantile_fraction: float
    resample_probability: float
    perturbation_factors: tuple[float, float]
    custom_explore_fn: Callable[[dict[str, Any]], dict[str, Any]] | None
    synch: bool
    log_config: bool  # Ray's PBT writes each exploit to pbt_global.txt and the trial's pbt_policy_<id>.txt
    fill_config: Callable[..., None]  # ray.tune.schedulers.pbt._fill_config: samples a missing mutated value
    explore: Callable[..., Any]  # ray.tune.schedulers.pbt._explore: perturbs or resamples the values
    make_experiment_tag: Callable[..., str]  # ray.tune.schedulers.pbt._make_experiment_tag: an exploited trial's tag

    @classmethod
    def read(cls, pbt: Any, tested_with: tuple[str, ...]) -> _PBTSettings:
        """The settings of Ray's ``pbt`` object, its metric and mode set: the
        one place the PBT adapter reads Ray's private fields."""
        from ray.tune.schedulers import pbt as ray_pbt

        def private(setting: str) -> Any:
            owner = ray_pbt if setting in _RAY_FUNCTIONS else pbt
            return ray_field(owner, f"_{setting}", pbt, tested_with)

        return cls(**{setting.name: private(setting.name) for setting in fields(cls)})


@dataclass
class _PopulationMember:
    # Times are in the scheduler's time attribute; `iteration` is the
    # training iteration of the last perturbation point, where forks start.
    last_score: float | None = None
    last_perturbation: float = 0
    last_train_time: float = 0
    iteration: int = 0
    saved_at_iteration: bool = True  # the result at `iteration` came with a checkpoint
    # The iteration of its checkpoint, set while the trial is a top one, as in
    # Ray ("step": the name study snapshots pickled).
    checkpoint_step: int | None = None
    finished: bool = False
    started: bool = False  # it reported a result (Ray's trial is no longer PENDING)
    paused: bool = False
    chosen: bool = False  # asynchronous mode: paused, and chosen to run next (Ray's `choose_trial_to_run`)
    paused_turn: int = 0  # asynchronous mode: when it paused, the first to wait goes first among equals
    pending: Exploit | None = None  # applied when it resumes
    values: dict[str, Any] = field(default_factory=dict)
    # Its config as Ray's trial holds it: the one it was added with (or its
    # exploit source's), under `values`; and its latest result's iteration.
    config: dict[str, Any] = field(default_factory=dict)
    last_iteration: int = 0


@dataclass(frozen=True)
class PolicyStep:
    """One exploit as Ray's PBT logs it (``log_config=True``): the row of
    ``pbt_global.txt`` and of the exploited trial's ``pbt_policy_<id>.txt``,
    which ``PopulationBasedTrainingReplay`` replays. Ray's row is `row` of
    the two trials' experiment tags, which the owner knows."""

    trial_id: str
    source_id: str
    trial_iteration: int
    source_iteration: int
    source_config: dict[str, Any]
    new_config: dict[str, Any]

    def row(self, trial_tag: str, source_tag: str) -> list[Any]:
        """Ray's ``[trial tag, source tag, trial iteration, source iteration, source config, new config]``."""
        return [
            trial_tag,
            source_tag,
            self.trial_iteration,
            self.source_iteration,
            self.source_config,
            self.new_config,
        ]


class PopulationBasedAdapter(SchedulerAdapter):
    """PBT decisions for the controller, from Ray's PBT object's settings.

    Ray's decision methods are never called (the rule runs here, on the
    plan), so a subclass's overrides would not run: only
    ``PopulationBasedTraining`` itself is hosted."""

    needs_metric = True
    hosts_subclasses = False
    # Whether the result decided on next came with a checkpoint (the runtime
    # sets it per result): as in Ray, a trial whose trainable saved nothing
    # at its perturbation point is never cloned.
    checkpointed = True
    # The trials that wait for a worker, not started (Ray's PENDING), as the
    # owner of the plan sets them before each call; None: those that have
    # not reported yet.
    queued: frozenset[str] | None = None
    # Ray's "[Exploit]" and "[Explore]" log lines since the owner last took them (`take_log`).
    _log: tuple[str, ...] = ()
    # The exploits to log as Ray's policy files, since the owner last took them (`take_policy`).
    _policy: tuple[PolicyStep, ...] = ()

    def __init__(self, scheduler: Any, horizon: float, exact: bool) -> None:
        from ray.tune.utils import flatten_dict

        super().__init__(scheduler, horizon, exact)
        self.settings = _PBTSettings.read(scheduler, self.tested_with)
        self._members: dict[str, _PopulationMember] = {}
        self._mutated = sorted(flatten_dict(self.settings.hyperparam_mutations, delimiter="/"))
        self._next_sync = max(self.settings.perturbation_interval, self.settings.burn_in_period)
        self._turns = 0

    @property
    def decides_at_milestones(self) -> bool:
        # Perturbation points in other units (seconds) are not known in advance.
        return self.settings.time_attr == "training_iteration"

    def on_add(self, trial_id: str, config: dict[str, Any]) -> None:
        """Samples the hyper-parameters PBT mutates that ``config`` lacks
        into it, as Ray's does."""
        self._fill(config)
        self._members[trial_id] = _PopulationMember(config=config)

    def _fill(self, config: dict[str, Any]) -> None:
        for name, space in self.settings.hyperparam_mutations.items():
            if name not in config:
                self.settings.fill_config(config, name, space)

    def on_error(self, trial_id: str) -> None:
        self.on_complete(trial_id, None)

    def on_complete(self, trial_id: str, row: dict[str, Any] | None) -> None:
        self._members[trial_id].finished = True
        if not self.settings.synch:
            self._choose_next()  # its place is free
            return
        live = [member for member in self._members.values() if not member.finished]
        if live and all(m.paused and m.last_train_time >= self._next_sync for m in live):
            # The trials were waiting for this one, which will never report
            # again (Ray waits forever here): rank them now.
            self._perturb_all(max(member.last_train_time for member in live))

    def next_decision(self, trial_id: str, iteration: int) -> float:
        """The first iteration after ``iteration`` at which Ray's rule perturbs the
        trial (past the burn-in, an interval after its last perturbation).
        With a time attribute other than ``training_iteration`` (Ray's default
        is ``time_total_s``) perturbation points are not known in advance:
        the trial is requested to the horizon, and a fork starts from the
        source's latest checkpoint."""
        settings = self.settings
        if settings.time_attr != "training_iteration":
            return self.horizon
        due = max(settings.burn_in_period, self._members[trial_id].last_perturbation + settings.perturbation_interval)
        return min(self.horizon, max(iteration + 1, math.ceil(due)))

    def on_result(self, trial_id: str, row: dict[str, Any], values: dict[str, Any] | None) -> Decision:
        """An `Exploit` of this trial, `PAUSE` (synchronous mode) or CONTINUE.
        ``values``: the trial's hyper-parameters at this iteration (flattened)."""
        settings, member = self.settings, self._members[trial_id]
        member.started = True
        member.last_iteration = row.get("training_iteration", member.last_iteration)
        time = row.get(settings.time_attr)
        if time is None or settings.metric not in row or time < settings.burn_in_period:
            return CONTINUE
        if time - member.last_perturbation < settings.perturbation_interval:
            return CONTINUE
        member.last_score = settings.metric_op * row[settings.metric]
        member.last_train_time = time
        member.iteration = row["training_iteration"]
        member.saved_at_iteration = self.checkpointed
        member.values = values or {}
        self._record(trial_id, time, row)
        if not settings.synch:
            member.last_perturbation = time
            lower, upper = self._quantiles()
            exploit = self._checkpoint_or_exploit(trial_id, lower, upper)
            if not any(self._waits(other_id) for other_id in self._live(but=trial_id)):
                return exploit or CONTINUE
            # As in Ray, a trial at a perturbation point makes way for trials
            # that wait (more trials than fit): the population shares the
            # workers, the least trained first.
            member.paused, member.pending = True, exploit
            self._turns += 1
            member.paused_turn = self._turns
            self._choose_next()
            return PAUSE
        member.paused = True
        if all(
            other.last_train_time >= self._next_sync
            for other_id, other in self._members.items()
            if other_id != trial_id and not other.finished
        ):
            self._perturb_all(time)
        return PAUSE

    def _record(self, trial_id: str, time: float, row: dict[str, Any]) -> None:
        """The trial reached a perturbation point with ``row`` (Ray's
        ``_save_trial_state``), for families that learn from these."""

    def _perturb_all(self, time: float) -> None:
        """Synchronous mode, every live trial at the perturbation point:
        top trials keep checkpoints before weak ones clone them, as in Ray."""
        lower, upper = self._quantiles()
        middle = [trial_id for trial_id in self._members if trial_id not in lower and trial_id not in upper]
        for trial_id in upper + middle + lower:
            self._members[trial_id].last_perturbation = time
            self._members[trial_id].pending = self._checkpoint_or_exploit(trial_id, lower, upper)
        latest = max(member.last_train_time for member in self._members.values())
        self._next_sync = max(self._next_sync + self.settings.perturbation_interval, latest)

    def _live(self, but: str) -> list[str]:
        return [trial_id for trial_id, member in self._members.items() if trial_id != but and not member.finished]

    def _queued(self, trial_id: str) -> bool:
        """Whether the trial waits for a worker with its request (a paused one waits to be chosen instead)."""
        member = self._members[trial_id]
        if member.paused:
            return False
        return not member.started if self.queued is None else trial_id in self.queued

    def _waits(self, trial_id: str) -> bool:
        member = self._members[trial_id]
        return (member.paused and not member.chosen) or self._queued(trial_id)

    def _choose_next(self) -> None:
        """Asynchronous mode, a place is free: Ray's `choose_trial_to_run`
        takes the least trained of the trials that wait. A queued trial is
        the least trained and takes the place by itself (it is requested
        already); else the least trained paused one is chosen."""
        waiting = [trial_id for trial_id in self._live(but="") if self._waits(trial_id)]
        if not waiting or any(self._queued(trial_id) for trial_id in waiting):
            return
        # Ray breaks ties by trial order. Here, where a fork restores the
        # source's random state, that would livelock: a trial exploited at
        # its perturbation point, equal in train time to those that wait,
        # would run first again, retrain the same iterations to the same
        # result and be exploited again, forever.
        least = min(
            waiting, key=lambda trial_id: (self._members[trial_id].last_train_time, self._members[trial_id].paused_turn)
        )
        self._members[least].chosen = True

    def resumable(self) -> list[tuple[str, Exploit | None]]:
        """Paused trials to run again, each with the exploit it resumes with:
        in synchronous mode those behind the next perturbation point, least
        trained first; in asynchronous mode those chosen when a place freed."""
        if not self.settings.synch:
            resumed = [(trial_id, member.pending) for trial_id, member in self._members.items() if member.chosen]
            for trial_id, _ in resumed:
                member = self._members[trial_id]
                member.paused, member.chosen, member.pending = False, False, None
            return resumed
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

    def top_checkpoint(self, trial_id: str) -> int | None:
        """The iteration Ray checkpointed the trial at as a top one at its last perturbation; None if it was not."""
        member = self._members.get(trial_id)
        return None if member is None else member.checkpoint_step

    def exploits(self, trial_id: str) -> bool:
        """Whether the trial is paused to take an exploit: Ray pauses such a trial without saving it."""
        member = self._members.get(trial_id)
        return member is not None and member.pending is not None

    def _checkpoint_or_exploit(self, trial_id: str, lower: list[str], upper: list[str]) -> Exploit | None:
        member = self._members[trial_id]
        # Ray checkpoints a top trial at its perturbation; only those can be cloned.
        member.checkpoint_step = member.iteration if trial_id in upper and member.saved_at_iteration else None
        if trial_id not in lower:
            return None
        source_id = random.choice(upper)
        source = self._members[source_id]
        if source.checkpoint_step is None:
            return None
        values, operations = self._explored_values(trial_id, source_id)
        explored = _overlaid(source.config, {**source.values, **values})  # Ray's new config of the trial
        exploit = Exploit(source_id, source.checkpoint_step, values, self._perturbed(explored))
        self._log_exploit(trial_id, exploit, operations)
        # As in Ray: the trial takes the source's config, explored, and its
        # perturbation and train times.
        if self.settings.log_config:
            self._policy += (self._policy_step(trial_id, source_id, exploit, explored),)
        member.config = source.config
        member.values = {**source.values, **exploit.values}
        member.last_perturbation = source.last_perturbation
        member.last_train_time = source.last_train_time
        return exploit

    def _perturbed(self, config: dict[str, Any]) -> str:
        """Ray's ``@perturbed[...]`` after the exploited trial's original tag:
        the top-level mutated entries of its new ``config``."""
        mutated = {name: space for name, space in self.settings.hyperparam_mutations.items() if name in config}
        return self.settings.make_experiment_tag("", config, mutated)

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
        count = int(math.ceil(len(scored) * self.settings.quantile_fraction))
        if count > len(scored) / 2:
            count = int(math.floor(len(scored) / 2))
        return scored[:count], scored[len(scored) - count :]

    def _log_exploit(self, trial_id: str, exploit: Exploit, operations: dict[str, Any]) -> None:
        """Ray's log lines of an exploit, as its ``_exploit`` writes them."""
        source, member = self._members[exploit.source], self._members[trial_id]
        name = type(self.scheduler).__name__
        old = unflatten({key: source.values[key] for key in exploit.values if key in source.values})
        new = unflatten({key: exploit.values[key] for key in exploit.values if key in source.values})
        summary = ray_field(self.scheduler, "_summarize_hyperparam_changes", self.scheduler, self.tested_with)
        self._log += (
            f"\n\n[{name}] [Exploit] Cloning trial {exploit.source} (score = {source.last_score:4f}) into trial "
            f"{trial_id} (score = {member.last_score:4f})\n",
            f"\n\n[{name}] [Explore] Perturbed the hyperparameter config of trial{trial_id}:\n"
            + (summary(old, new, operations) or "No hyperparameters mutated."),
        )

    def take_log(self) -> tuple[str, ...]:
        """The log lines since the last call (the driver logs them)."""
        lines, self._log = self._log, ()
        return lines

    def _policy_step(self, trial_id: str, source_id: str, exploit: Exploit, explored: dict[str, Any]) -> PolicyStep:
        """The exploit as Ray's ``_log_config_on_step`` logs it. The source's
        iteration is that of the checkpoint the trial forks from (Ray writes
        the source's latest result's, which may be later: the replay would
        change the values later than the exploited trial did)."""
        return PolicyStep(
            trial_id,
            source_id,
            trial_iteration=self._members[trial_id].last_iteration,
            source_iteration=exploit.iteration,
            source_config=self.config_of(source_id),
            new_config=explored,
        )

    def config_of(self, trial_id: str) -> dict[str, Any]:
        """The trial's config as Ray's trial would hold it now."""
        member = self._members[trial_id]
        return _overlaid(member.config, member.values)

    def take_policy(self) -> tuple[PolicyStep, ...]:
        """The exploits to log since the last call (the driver writes Ray's policy files)."""
        steps, self._policy = self._policy, ()
        return steps

    def _explored_values(self, trial_id: str, source_id: str) -> tuple[dict[str, Any], dict[str, Any]]:
        """The values ``trial_id`` continues with from ``source_id``'s
        checkpoint, flattened, and Ray's words for what was done to each."""
        settings, source = self.settings, self._members[source_id]
        explored = settings.explore(
            unflatten(source.values),
            settings.hyperparam_mutations,
            settings.resample_probability,
            settings.perturbation_factors,
            settings.custom_explore_fn,
        )
        new_config, operations = explored if isinstance(explored, tuple) else (explored, {})
        return self._mutated_values(new_config), operations

    def _mutated_values(self, config: dict[str, Any]) -> dict[str, Any]:
        """The values PBT mutates of ``config``, flattened."""
        from ray.tune.utils import flatten_dict

        flat = flatten_dict(config, delimiter="/")
        return {name: flat[name] for name in self._mutated if name in flat}


def _overlaid(config: dict[str, Any], values: dict[str, Any]) -> dict[str, Any]:
    """``config`` with the flattened ``values`` set in it (a copy)."""
    from ray.tune.utils import flatten_dict

    return unflatten({**flatten_dict(config, delimiter="/"), **values})
