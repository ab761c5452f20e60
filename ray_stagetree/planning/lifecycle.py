"""One trial lifecycle: the states of a study's trials, and how a trial
scheduler's decisions change the search plan.

The Ray controller (`runtime.control.controller`) and the simulated study
(`simulation.simulated_study`) both drive their trials through a
`TrialLifecycle`; what differs between them (where results come from, what
the driver is told) stays in those modules, behind two callbacks.

States (the status words, as Ray Tune spells them)
--------------------------------------------------
``PENDING``
    Admitted: its first request is in the plan, it has no result yet.
``RUNNING``
    It has a result; its request goes on to the next decision point.
``PAUSED``
    Its scheduler paused it at a decision point (synchronous HyperBand or
    PBT); its request ends there until the scheduler picks it again.
``TERMINATED``
    It ended: its horizon, a stop criterion, its scheduler's STOP, the
    trainable's end.
``ERROR``
    It failed, or its config was refused at admission.

``PENDING`` and ``RUNNING`` trials are *live* (they count against
``max_concurrent_trials``); ``TERMINATED`` and ``ERROR`` are final.

Transitions
-----------
========================  =======================  ==========================================
call                      status                   the plan
========================  =======================  ==========================================
`admit`                   -> PENDING               requested up to its first decision point
`record` (a result)       PENDING -> RUNNING
`decide`: CONTINUE        RUNNING                  once the result reaches the request, on
                                                   to the next decision point
`decide`: STOP            -> TERMINATED            as `stop`
`decide`: PAUSE           -> PAUSED                the request ends at the result's iteration
`decide`: an exploit      RUNNING                  PBT: the source's config up to the
                                                   exploit's iteration, then the explored values:
                                                   a new path forking from that checkpoint
`resume`                  PAUSED -> RUNNING        continue, or its pending exploit
`finish`                  -> TERMINATED            the request stays (it reached its end)
`stop`                    -> TERMINATED            back to the last result's iteration; a trial
                                                   that ends without a result leaves the plan
`fail`                    -> ERROR                 the trial leaves the plan
`refuse`                  (new) -> ERROR           never entered
`rerun`                   ERROR -> PENDING         requested again from its last result
========================  =======================  ==========================================

Every end tells the owner (``on_end``), then the trial scheduler, then the
searcher, in that order, as Tune's controller does. Every request that moves
tells the owner (``on_request``): the plan may already hold results beyond
it (another trial trained that path), which are the trial's results too.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from ray_stagetree.planning.config import TrialConfig, split_path
from ray_stagetree.planning.decisions import PAUSE, STOP, Exploit
from ray_stagetree.planning.plan import PlanNode, Request, SearchPlan

PENDING, RUNNING, PAUSED, TERMINATED, ERROR = "PENDING", "RUNNING", "PAUSED", "TERMINATED", "ERROR"
LIVE = frozenset({PENDING, RUNNING})
UNFINISHED = frozenset({PENDING, RUNNING, PAUSED})
ENDED = frozenset({TERMINATED, ERROR})


class HostedScheduler(Protocol):
    """What the lifecycle asks of a hosted trial scheduler (`trial_schedulers.host.SchedulerHost`)."""

    population: Any  # PBT's adapter, or None: only PBT reads a result's hyper-parameters and which trials wait

    def on_result(self, trial_id: str, row: dict[str, Any], values: dict[str, Any] | None = None) -> Any: ...

    def on_complete(self, trial_id: str, row: dict[str, Any] | None) -> None: ...

    def on_error(self, trial_id: str) -> None: ...

    def on_add(self, trial_id: str, config: dict[str, Any]) -> None: ...

    def resumable(self) -> list[tuple[str, Exploit | None]]: ...


#: What a trial source's `next_trial` answers when its searcher has nothing
#: to suggest right now (more may come after results).
WAIT = "WAIT"

#: Live trials a study holds at most: a grid or random search admits its
#: trials ahead of the workers so that the plan merges their prefixes, this
#: many at a time.
MAX_LIVE_TRIALS = 10_000


class TrialSource(Protocol):
    """Where a study's trials come from, its searcher (`searchers.sources`):
    what the lifecycle asks and tells it. (Not a `stage_tree.CheckpointSource`,
    the checkpoint a stage starts from.)"""

    def next_trial(self) -> tuple[str, dict[str, Any]] | str | None:
        """``(trial_id, config)``, `WAIT`, or None when no trial is left."""

    def on_complete(self, trial_id: str, result: dict[str, Any] | None, error: bool = False) -> None: ...


class Refused(Exception):
    """A proposed trial that cannot run: its config cannot be planned, or the
    owner could not make the trial (a user's naming hook raised)."""

    def __init__(self, trial_id: str, config: dict[str, Any], error: Exception) -> None:
        super().__init__(f"{type(error).__name__}: {error}")
        self.trial_id, self.config, self.error = trial_id, config, error


@dataclass(kw_only=True)
class Trial:
    """One trial as the lifecycle sees it; owners subclass it with what they
    add (the controller's `runtime.control.trials.TrialState`)."""

    trial_id: str
    config: dict[str, Any]  # as the trainable takes it: the user's objects
    # The planning form, parsed once at admission under the plan's sharing
    # key; None when the config was refused. After admission the only carrier.
    trial_config: TrialConfig | None = None
    status: str = PENDING
    rows: dict[int, dict[str, Any]] = field(default_factory=dict)  # results on its current path, by iteration
    node: PlanNode | None = None  # the plan node of its request
    #: (node, start, stop): before PBT exploits, the paths whose iterations
    #: (start, stop] its results and checkpoints come from, oldest first.
    earlier_paths: tuple[tuple[PlanNode, int, int], ...] = ()
    #: Its current path (``node``'s) is its own after this iteration (its last
    #: exploit's; before it, that path is the source's).
    forked_at: int = 0
    #: Its last exploit's `Exploit.perturbed` (Tune's tag of the config it went on with).
    perturbed: str = ""

    def configure(self, config: dict[str, Any], trial_config: TrialConfig) -> None:
        """Take ``config`` (and its parsed form) as the trial's config (at
        admission, and when PBT exploits another trial's)."""
        self.config, self.trial_config = config, trial_config

    @property
    def last_row(self) -> dict[str, Any] | None:
        return self.rows[max(self.rows)] if self.rows else None


class TrialLifecycle:
    """The trials of one study on a search plan, and their transitions (see
    the module docstring).

    Parameters
    ----------
    plan:
        The search plan (possibly shared with other studies).
    host:
        The study's hosted trial scheduler.
    trial_source:
        Where the study's trials come from, its searcher (told of every end).
    share_key:
        A trial's share key in the plan: trials share stages only under one key.
    next_request:
        The iteration a trial at an iteration is requested up to (its next decision point).
    on_request:
        ``(trial, request, iteration)``: the trial's request moved on from ``iteration``.
    on_end:
        ``(trial)``: the trial just ended (its status says how), before its
        scheduler and searcher hear.
    """

    def __init__(
        self,
        plan: SearchPlan,
        host: HostedScheduler,
        trial_source: TrialSource,
        share_key: Callable[[str], str],
        next_request: Callable[[str, int], int],
        on_request: Callable[[Trial, Request, int], None],
        on_end: Callable[[Trial], None],
    ) -> None:
        self.plan, self.host, self.trial_source = plan, host, trial_source
        self.share_key = share_key
        self._next_request = next_request
        self._on_request = on_request
        self._on_end = on_end
        self.trials: dict[str, Any] = {}  # trial id -> Trial (the owner's subclass)
        self._counts: Counter[str] = Counter()  # trials by status, kept by `add` and `set_status`
        self._pending: set[str] = set()  # ids of the PENDING trials, kept likewise
        self._changed: set[str] = set()  # trials added or whose status changed since `take_changed`
        self.source_waits = False  # the trial source's last answer was WAIT: it may propose later
        # PBT's members by their starting config (`_population_member`), and the share key of each that
        # starts where an earlier member did.
        self._population_starts: set[tuple] = set()
        self._member_keys: dict[str, str] = {}

    # -- states --------------------------------------------------------------------

    def add(self, trial: Trial) -> None:
        """Track ``trial`` in its status (a new one, or one restored as it stood)."""
        self.trials[trial.trial_id] = trial
        self._counts[trial.status] += 1
        self._changed.add(trial.trial_id)
        if trial.status == PENDING:
            self._pending.add(trial.trial_id)

    def set_status(self, trial: Trial, status: str) -> None:
        """Every status change goes through here, so the counts stay exact."""
        self._counts[trial.status] -= 1
        self._counts[status] += 1
        trial.status = status
        self._changed.add(trial.trial_id)
        if status == PENDING:
            self._pending.add(trial.trial_id)
        else:
            self._pending.discard(trial.trial_id)

    def live(self) -> int:
        """Trials pending or running: what ``max_concurrent_trials`` bounds."""
        return self._counts[PENDING] + self._counts[RUNNING]

    def full(self, max_concurrent_trials: int | None) -> bool:
        """Whether as many trials are live as may be: ``max_concurrent_trials``,
        and at most `MAX_LIVE_TRIALS` whatever the source (the plan merges the
        trials it holds, but a study of 100,000 does not hold them all)."""
        return self.live() >= min(max_concurrent_trials or math.inf, MAX_LIVE_TRIALS)

    def waiting(self) -> frozenset[str]:
        """The trials that wait for a worker: pending, and no running batch
        trains their path (Tune's pending trials, which wait for resources;
        a trial whose shared prefix another trial's batch trains waits for
        that batch instead)."""
        return frozenset(trial_id for trial_id in self._pending if not self.plan.in_progress(trial_id))

    def waiting_for_workers(self) -> frozenset[str]:
        """`waiting`, and the running trials whose request no running batch
        trains (one that PBT exploited, or whose batch ended, waits for a
        worker again). Under Tune a running trial holds its worker; here the
        trials share them, so PBT counts these with the pending ones when a
        trial at its perturbation point makes way: the population takes turns."""
        running = [trial_id for trial_id, trial in self.trials.items() if trial.status == RUNNING]
        return self.waiting() | frozenset(trial_id for trial_id in running if not self.plan.in_progress(trial_id))

    def pending_full(self, pending_limit: int | None, workers: int) -> bool:
        """Whether a source under a pending-trial limit (a searcher's, or
        variants drawn without end) must wait before its next trial: as many
        trials as the limit wait for a worker, or as many are live as the
        study's ``workers`` run plus the limit. A trial riding on a running
        batch's shared prefix does not wait for a worker yet but needs one
        once it forks: without the second bound an endless source of trials
        sharing a prefix is admitted without end while that prefix trains."""
        if pending_limit is None:
            return False
        if self.live() >= workers + pending_limit:
            return True
        # The waiting trials are pending ones: count them only when they may be as many.
        return self._counts[PENDING] >= pending_limit and len(self.waiting()) >= pending_limit

    def take_changed(self) -> set[str]:
        """The trials added, or whose status changed, since the last call."""
        changed, self._changed = self._changed, set()
        return changed

    def counts(self) -> dict[str, int]:
        """Trials by status, statuses without trials left out."""
        return {status: count for status, count in self._counts.items() if count}

    def parse(self, trial_id: str, config: dict[str, Any], copied_from: TrialConfig | None = None) -> TrialConfig:
        """``config``'s planning form under the trial's share key; raises
        what `TrialConfig.from_config` raises for a config that cannot be planned.
        ``copied_from``: the config whose static values ``config``'s are copies of."""
        return TrialConfig.from_config(config, self.share_key(trial_id), copied_from=copied_from)

    # -- admission -----------------------------------------------------------------------

    def admit_next(self, make: Callable[[str, dict[str, Any], TrialConfig], Trial]) -> Trial | None:
        """Admit the trial source's next trial; None when it has none now.

        Its scheduler hears of it first (`SchedulerHost.on_add` may add to
        its config), then the config is parsed under its share key, ``make``
        builds the owner's trial from ``(trial_id, config, trial_config)``,
        and the trial is requested up to its first decision point (a trial
        of a restored plan is extended). Raises `Refused` when the config
        cannot be planned or ``make`` raises: the owner ends it (`refuse`).
        """
        proposal = self.trial_source.next_trial()
        self.source_waits = proposal == WAIT
        if not isinstance(proposal, tuple):  # None or WAIT
            return None
        trial_id, config = proposal
        self.host.on_add(trial_id, config)
        try:
            trial_config = self._population_member(trial_id, config, self.parse(trial_id, config))
            trial = make(trial_id, config, trial_config)
        except Exception as error:
            raise Refused(trial_id, config, error) from error
        trial.configure(config, trial_config)
        self.add(trial)
        self._request_from(trial, 0)
        return trial

    def _population_member(self, trial_id: str, config: dict[str, Any], trial_config: TrialConfig) -> TrialConfig:
        """Under PBT (and PB2), a trial that starts with an earlier member's
        config is a member of its own, as under Tune, where the trainable's
        own randomness sets the two apart and the population is as large as
        ``num_samples`` (Ray's pb2_example starts every member from one
        config): its path trains under a share key of its own, as do the
        exploits that fork from it (`_exploit`)."""
        if self.host.population is None:
            return trial_config
        if trial_config.identity not in self._population_starts:
            self._population_starts.add(trial_config.identity)
            return trial_config
        self._member_keys[trial_id] = f"{self.share_key(trial_id)}/{trial_id}"
        return TrialConfig.from_config(config, self._member_keys[trial_id])

    def _key_of(self, trial_id: str) -> str:
        return self._member_keys.get(trial_id) or self.share_key(trial_id)

    def refuse(self, trial: Trial) -> None:
        """A trial whose config or names could not be made ends in ERROR at once."""
        trial.status = ERROR
        self.add(trial)
        self._end(trial, None)

    def rerun(self, trial: Trial, iteration: int) -> None:
        """A trial of a restored study runs again from ``iteration`` (its latest
        result, or 0 when its results start over)."""
        self.set_status(trial, PENDING)
        self.host.on_add(trial.trial_id, trial.config)
        self._request_from(trial, iteration)

    def _request_from(self, trial: Trial, iteration: int) -> None:
        target = self._next_request(trial.trial_id, iteration)
        if trial.trial_id in self.plan.trials:
            request = self.plan.extend_trial(trial.trial_id, target)
        else:
            assert trial.trial_config is not None  # configured when it was admitted
            share_key = self._key_of(trial.trial_id)
            request = self.plan.add_trial(trial.trial_id, trial.trial_config, target, share_key=share_key)
        trial.node = request.node
        self._on_request(trial, request, iteration)

    # -- results and decisions ---------------------------------------------------------------

    def record(self, trial: Trial, iteration: int, row: dict[str, Any]) -> None:
        """A result of the trial at ``iteration``: it runs."""
        trial.rows[iteration] = row
        if trial.status == PENDING:
            self.set_status(trial, RUNNING)

    def decide(self, trial: Trial, iteration: int, row: dict[str, Any], then: Callable[[], None] | None = None) -> None:
        """Ask the trial's scheduler about its result at ``iteration`` and apply
        the answer; ``then`` runs between the two unless the answer is STOP
        (the owner tells the searcher there: Tune's order, in which the
        searcher gets the row the scheduler may have written into, e.g.
        HyperBandForBOHB's budget for TuneBOHB). The owner calls `resume`
        after (a stop may free trials the scheduler held)."""
        # Only PBT reads the hyper-parameters (the values it explores from).
        assert trial.trial_config is not None  # it reported: it was admitted
        values = trial.trial_config.hparams_at(iteration - 1) if self.host.population is not None else None
        self._tell_queued(but=trial.trial_id)
        decision = self.host.on_result(trial.trial_id, row, values)
        if decision == STOP:
            row["done"] = True  # Tune's: the trial's last result, which its searcher hears of at its end only
        elif then is not None:
            then()
        if isinstance(decision, Exploit):
            self._exploit(trial, decision)
        elif decision == STOP:
            self.stop(trial)
        elif decision == PAUSE:
            self._pause(trial, iteration)
        elif iteration >= self.plan.trials[trial.trial_id].request.iteration:
            self._request_from(trial, iteration)  # CONTINUE, at the end of its request

    def _tell_queued(self, but: str | None = None) -> None:
        """PBT makes way for trials that wait for a worker (more trials than
        fit): it hears which (`waiting_for_workers`), ``but`` the one it decides for."""
        if self.host.population is not None:
            self.host.population.queued = self.waiting_for_workers() - {but}

    def resume(self) -> None:
        """Run again the paused trials the scheduler chooses."""
        for trial_id, exploit in self.host.resumable():
            resumed = self.trials[trial_id]
            self.set_status(resumed, RUNNING)
            if exploit is None:
                self._request_from(resumed, max(resumed.rows))
            else:
                self._exploit(resumed, exploit)

    def _pause(self, trial: Trial, iteration: int) -> None:
        """The scheduler resumes the trial later. Its request ends here (at a
        decision point it ends here anyway), so it keeps a checkpoint here."""
        self.set_status(trial, PAUSED)
        if self.plan.trials[trial.trial_id].request.iteration > iteration:
            trial.node = self.plan.extend_trial(trial.trial_id, iteration).node

    def _exploit(self, trial: Trial, exploit: Exploit) -> None:
        """PBT: the trial follows ``exploit.source``'s configuration up to the
        source's checkpoint at ``exploit.iteration`` and the explored values after,
        a new path of the plan that forks from that checkpoint."""
        source = self.trials[exploit.source]
        sequences = dict(zip(source.trial_config.names, source.trial_config.sequences))
        config = copy.deepcopy(source.config)
        for name, value in exploit.values.items():
            sequence = sequences[name].then(value, at=exploit.iteration) if exploit.iteration > 0 else value
            _set_path(config, name, sequence)
        assert trial.node is not None  # it reported on its path
        at = exploit.iteration
        trial.rows = {iteration: row for iteration, row in trial.rows.items() if iteration <= at}
        own = (trial.node, trial.forked_at, max(trial.rows, default=0))
        trial.earlier_paths = tuple(
            (node, start, min(stop, at)) for node, start, stop in (*trial.earlier_paths, own) if start < min(stop, at)
        )
        trial.forked_at = at
        trial.perturbed = exploit.perturbed
        self.plan.remove_trial(trial.trial_id)
        # Under the source's share key, so that the path forks from its
        # checkpoint; the static values are deep copies of the source's:
        # keyed as the source's, or a value without a fingerprint would not fork from it.
        record = self.plan.trials.get(source.trial_id)
        share_key = record.share_key if record is not None else self._key_of(source.trial_id)
        if share_key != self.share_key(trial.trial_id):
            self._member_keys[trial.trial_id] = share_key
        else:
            self._member_keys.pop(trial.trial_id, None)
        copied = TrialConfig.from_config(config, share_key, copied_from=source.trial_config)
        # Its own path from the fork on, even with its source's very values (PB2 explores none while it has
        # no data on the source): under Tune the two train on apart, set apart by their own randomness.
        copied = dataclasses.replace(copied, lineage=source.trial_config.lineage).branched(at, trial.trial_id)
        trial.configure(config, copied)
        self._request_from(trial, at)

    # -- ends ----------------------------------------------------------------------------

    def finish(self, trial: Trial) -> None:
        """The trial reached its end (its horizon, or its trainable said
        done): its request stays where it is."""
        self.set_status(trial, TERMINATED)
        self._end(trial, trial.last_row)

    def stop(self, trial: Trial) -> None:
        """End the trial now (a scheduler's STOP, a stop criterion, the
        study's end); nothing if it has ended already. Its request moves back
        to its last result, which the plan has answered: nothing more is
        requested, and the accounting keeps the iterations it did train.
        Without a result it leaves the plan (it ends without having started)."""
        if trial.status in ENDED:
            return
        self.finish(trial)
        if trial.rows:
            trial.node = self.plan.extend_trial(trial.trial_id, max(trial.rows)).node
        else:
            self.plan.remove_trial(trial.trial_id)

    def abort(self, trial: Trial) -> None:
        """The study stops on an error no trial caused (no worker can run the
        trainable): the unfinished trial ends in ERROR and leaves the plan;
        its scheduler and searcher are not told, the study is over."""
        self.set_status(trial, ERROR)
        self.plan.remove_trial(trial.trial_id)

    def close(self, trial: Trial) -> None:
        """The study ended with the trial paused (its scheduler never resumed
        it) or past the study's end: TERMINATED as it stands, nothing told."""
        self.set_status(trial, TERMINATED)

    def fail(self, trial: Trial) -> None:
        """The trial ends in error (no retry left): it leaves the plan."""
        self.set_status(trial, ERROR)
        self.plan.remove_trial(trial.trial_id)
        self._end(trial, None)

    def _end(self, trial: Trial, last: dict[str, Any] | None) -> None:
        self._on_end(trial)
        self._tell_queued()
        if trial.status == ERROR:
            self.host.on_error(trial.trial_id)
            self.trial_source.on_complete(trial.trial_id, None, error=True)
        else:
            self.host.on_complete(trial.trial_id, last)
            self.trial_source.on_complete(trial.trial_id, last)


def _set_path(config: dict[str, Any], path: str, value: Any) -> None:
    *parents, leaf = split_path(path)
    for part in parents:
        config = config[part]
    config[leaf] = value
