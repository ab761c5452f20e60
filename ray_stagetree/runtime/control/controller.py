"""The study controller: one Ray actor that owns the search plan, the
execution policy and the checkpoints of a study, and drives the workers.

It is a thin loop over the pure planning core: admit trials into the plan,
ask the policy for batches for idle workers, turn each batch into a
`BatchSpec`, and fold what workers report back into the plan (metrics fan
out to every trial whose path passes the reported point). All scheduling
decisions live in `plan`, `stage_tree` and `policy`; trial states and what a
trial scheduler's decisions do to the plan live in `planning.lifecycle`,
shared with the simulator.

What is neither the loop nor the trials' handling is a manager beside it,
each in its own module and tested without Ray (as Tune's controller
composes its managers): `worker_pool.WorkerPool` (workers, running
batches, lost nodes), `snapshots.Snapshots` (the study's snapshot),
`failures.Failures` (FailureConfig, the study's halt),
`result_rows.ResultRows` (what Tune adds to a result, RunConfig.stop),
`driver_feed.DriverFeed` (what the driver hears at each poll),
`preemption.Preemption` (time-sharing), `time_budget.TimeBudget`, and
`study_end` (final checkpoints verified and exported). A plan service
extends the controller through the hooks `hooks.StudyHooks` declares, and
nothing else (``tests/runtime/test_hooks.py``).

(Over 600 lines: the Ray loop (dispatch, worker reports, completion, worker
death) and a study's handling of its trials (admission, results, stops,
failures, restore, end) share the plan and the trials. A plan service splits
the class along that line through the hooks: `SharedPlan` runs the loop over
many studies, `AttachedStudy` is a study without a loop. Two classes, a loop
over studies, would end the overriding; that is the next step.)
"""

from __future__ import annotations

import asyncio
import collections
import dataclasses
import functools
import itertools
import logging
import math
import time
from collections.abc import Callable
from typing import Any

import ray

from ray_stagetree.execution.batches import BatchOutcome, BatchSpec, FlushReply
from ray_stagetree.execution.parking import Parking
from ray_stagetree.execution.retention import keeps_reported
from ray_stagetree.execution.storage import CheckpointStorage, CheckpointUnavailableError
from ray_stagetree.planning.config import TrialConfig
from ray_stagetree.planning.lifecycle import (
    ENDED,
    ERROR,
    LIVE,
    PAUSED,
    PENDING,
    RUNNING,
    TERMINATED,
    UNFINISHED,
    Refused,
    TrialLifecycle,
)
from ray_stagetree.planning.plan import Request, RequestState, SearchPlan
from ray_stagetree.planning.policies import StageBatch, get_policy
from ray_stagetree.runtime.control.checkpoint_store import CheckpointStore
from ray_stagetree.runtime.control.driver_feed import DriverFeed
from ray_stagetree.runtime.control.experiment_state import (
    STATE_COST_FACTOR,
    STATE_FILE,
    Restore,
    StudyState,
    dumps,
    trial_summary,
)
from ray_stagetree.runtime.control.failures import Failures
from ray_stagetree.runtime.control.messages import Progress, TrialSummary
from ray_stagetree.runtime.control.preemption import Preemption
from ray_stagetree.runtime.control.resources import workers_that_fit
from ray_stagetree.runtime.control.result_rows import ResultRows, metric_consumers
from ray_stagetree.runtime.control.snapshots import NoSnapshots, Snapshots
from ray_stagetree.runtime.control.spec import StudySpec
from ray_stagetree.runtime.control.study_end import export_kept_checkpoints, retrain_lost_finals
from ray_stagetree.runtime.control.time_budget import TimeBudget
from ray_stagetree.runtime.control.trials import TrialInfo, TrialState, experiment_tag, trial_name
from ray_stagetree.runtime.control.worker_pool import WorkerPool
from ray_stagetree.runtime.workers.trial_errors import pack_exception
from ray_stagetree.trial_schedulers.host import SchedulerHost

logger = logging.getLogger(__name__)

# (`TrialState` is imported above also for the snapshots written before it
# moved to trials.py: they name it here.)

# Trials admitted per turn of the loop: a study of many trials dispatches its
# first batches after this many, not after drawing them all, and admits the
# rest between the turns that serve its workers (whose reports wait for a
# turn to end: 1,000 a turn left the workers of a 100,000-trial study idle
# for most of its admission on a loaded machine).
ADMIT_PER_TURN = 100

# Seconds after which a searcher that suggested nothing (its suggest returned
# None) is asked again when nothing else wakes the loop: Tune asks it again
# every second while no trial runs.
SEARCHER_POLL_S = 1.0

# CheckpointConfig(checkpoint_frequency)'s saves sent to a worker at a time.
# It flushes at each save and hears the next ones in the reply: a horizon of
# 10**9 iterations is never listed (it held the study up for minutes, with
# no result, before the first iteration).
SAVES_AHEAD = 64


class StudyController:
    """One study's Ray actor: admits the searcher's trials into the search
    plan, dispatches stage batches to stage workers as the execution policy
    chooses, folds the workers' reports into the plan and the trials'
    results, and handles what only a Ray loop meets: batches that end or
    fail, workers and nodes that die, the time budget, checkpoints kept in
    the object store, the study's snapshot and its end.

    The trials' states and what their scheduler's decisions do to the plan
    are `planning.lifecycle`'s (``self.lifecycle``); the driver polls
    `progress` and reads `results` at the end. A subclass overrides its
    hooks only (`hooks.StudyHooks`, each marked ``@hook``).

    Parameters
    ----------
    spec:
        The study, validated by the Tuner.
    plan, store:
        A plan service's, shared with other studies (`runtime.service.shared_plan`);
        by default the study's own.
    """

    def __init__(self, spec: StudySpec, plan: SearchPlan | None = None, store: CheckpointStore | None = None) -> None:
        self.spec = spec
        self.plan_path = f"{spec.experiment_path}/plan"  # where the plan is saved (Parquet) at the end
        restore = spec.restore
        if plan is not None:
            self.plan = plan
        elif restore is not None:
            self.plan = SearchPlan.from_records(restore.state.plan, restore.state.objects)
        elif spec.resume:
            # Without its side file of objects (nothing here unpickles a plan): a node whose values JSON
            # cannot hold are fingerprints only is configured by the first trial requesting it (below).
            self.plan = SearchPlan.load(self.plan_path, spec.storage_filesystem)
        else:
            self.plan = SearchPlan()
        self.policy = get_policy(spec.policy)
        self.policy.bind(spec.num_workers)
        self.policy.set_horizon(spec.horizon)
        self.parking = Parking(self.plan, spec.parked_per_worker)
        self.store = store or CheckpointStore(
            CheckpointStorage(spec.experiment_path, spec.storage_filesystem),
            spec.checkpoint_budget_bytes,
            secret=spec.payload_key,
            trusted=spec.trust_storage,
        )
        self.trial_source = spec.trial_source
        horizon = math.inf if spec.horizon is None else spec.horizon
        if restore is not None:
            self.trial_source, self.host = restore.state.source, restore.state.host
            self.host.attach(self.end_trial, getattr(self.trial_source, "searcher", None))
        else:
            searcher = getattr(self.trial_source, "searcher", None)  # told of pauses (HyperBandForBOHB)
            self.host = SchedulerHost(spec.scheduler, spec.metric, spec.mode, horizon, self.end_trial, searcher)
        if self.host.order_sensitive:
            # A scheduler comparing trials decides on the order they reach it:
            # run them in admission order, as Tune runs them (issue 31).
            self.policy.admission_order()
        self.lifecycle = TrialLifecycle(
            self.plan,
            self.host,
            self.trial_source,
            self.trial_share_key,
            self._next_request,
            self._requested,
            self._ended,
        )
        self.trials: dict[str, TrialState] = self.lifecycle.trials
        # Stop criteria, and schedulers other than ASHA/HyperBand/PBT/FIFO, may
        # end a trial at any result: its request then runs one iteration ahead
        # (the batch continues live), so nothing trains past a stopping result.
        self._every_result = (
            spec.stopper is not None or bool(spec.stop_thresholds) or not self.host.decides_at_milestones
        )
        # A batch continuing live past a scheduler's decision point still
        # checkpoints there: PBT exploits fork from it, and a worker lost later
        # resumes from it. (Not at every iteration of a one-ahead request.)
        self._keeps_decision_points = self.host.population is not None or (
            not self._every_result and spec.horizon is not None
        )
        # Configs as the trainable takes them (sequences as objects), per node.
        # A node whose objects were not stored (see planning.persistence) gets
        # the config of the first trial requesting it: its fingerprints are equal.
        self._node_configs: dict[int, dict[str, Any]] = {
            node.node_id: node.config.to_config() for node in self.plan.nodes if node.config.complete
        }
        self._node_plain: dict[int, frozenset[str]] = {}  # TrialState.plain of the config above
        self._node_owner: dict[int, str] = {}  # the trial a node was made for
        # Trials taking results the plan holds beyond their request (`_requested`), with the iteration they take from.
        self._taking_from: dict[str, int] = {}
        self._error: Exception | None = None  # raised while a worker reported: the study stops with it
        self.pool = WorkerPool(
            lambda: self.spec.worker.start(ray.get_runtime_context().current_actor),
            spec.num_workers,
            placement=lambda worker: worker.pid.remote(),  # answered once the actor runs
        )
        self._wake = asyncio.Event()
        self._iterations = 0
        self._worker_seconds = 0.0  # batches' dispatch-to-completion time, summed
        # Batch id -> (worker number, wall-clock dispatch time): the plan's runs (the monitor's timeline).
        self._run_began: dict[int, tuple[int, float]] = {}
        self._run_reached: dict[int, dict[int, int]] = {}  # batch id -> node id -> last iteration trained
        # The time budget counts from here, as Tune's from its loop's first step: starting
        # the workers is in it, starting this actor is not.
        self.budget = TimeBudget(spec.time_budget_s)
        self.failures = Failures(spec.max_failures, spec.restore_retries, spec.fail_fast)
        self._warned_missing_checkpoint = False
        # Restarts where a config value the trainable holds fixed changed, by key (the progress line's mode).
        self._restarts: collections.Counter[str] = collections.Counter()
        self._population_starts: dict[tuple, str] | None = {} if self.host.population is not None else None
        self.feed = DriverFeed()  # what the driver hears at its next poll (`progress`)
        self.preemption = Preemption(self.plan, self.feed.warn)
        self.rows = ResultRows(
            spec.metric,
            metric_consumers(getattr(self.trial_source, "searcher", None), self.host.scheduler),
            spec.stop_thresholds,
            spec.stopper,
            self.feed.warn,
        )
        self.snapshots: NoSnapshots = Snapshots(
            lambda: dumps(self._state()),
            lambda data: self.store.io.write_state.remote(STATE_FILE, data),
            spec.state_period_s,
            self.feed.warn,
            wait_s=spec.storage_wait_s,
        )
        self._sharing: dict[str, int] = {}  # the plan's iteration counts, as `progress` last computed them
        self._sharing_due = 0.0  # time.monotonic() after which `progress` computes them again
        if restore is not None:
            self._restore(restore)
            self.snapshots.restored()

    # -- restore ---------------------------------------------------------------

    def _restore(self, restore: Restore) -> None:
        """Continue a snapshot: trials come back as they stood, then Tune's
        restore options apply to each (`Restore.action`)."""
        state = restore.state
        self._iterations, self._worker_seconds = state.iterations, state.worker_seconds
        self.budget.restored(state.elapsed)
        for trial in state.trials:
            self.lifecycle.add(trial)
            record = self.plan.trials.get(trial.trial_id)
            if record is not None:
                trial.node = record.request.node
                # The trainable gets the user's config objects, not their JSON round trip.
                self._node_configs[trial.node.node_id] = trial.config
                self._node_plain[trial.node.node_id] = trial.plain
                self._node_owner[trial.node.node_id] = trial.trial_id
        for trial in list(self.trials.values()):
            trial.restored_at = max(trial.rows, default=0)
            action = restore.action(trial.status)
            if trial.announced and (trial.status in UNFINISHED or action in ("resume", "restart")):
                self.feed.event("start", trial, config=trial.shown_config())  # the new driver's loggers find its folder
            if action == "end":
                self.end_trial(trial.trial_id)
            elif action in ("resume", "restart") and trial.trial_config is not None:
                self._rerun(trial, restart=action == "restart")

    def _rerun(self, state: TrialState, restart: bool) -> None:
        """An errored trial runs again: from its latest checkpoint, or with
        its results starting over (the plan still answers what it stored:
        retraining would give the same values)."""
        state.error, state.error_pickle, state.failures = None, None, 0
        if restart:
            state.rows, state.reported = {}, []
            if state.error_checkpoint is not None:  # Tune's restart loads none of the failed run's checkpoints
                self.plan.drop_checkpoint(*state.error_checkpoint)
        state.restored_at = max(state.rows, default=0)
        self.lifecycle.rerun(state, state.restored_at)

    # -- trials ----------------------------------------------------------------

    def trial_share_key(self, trial_id: str) -> str:
        """A trial's share key in the plan: trials share stages only under one key.
        (Its value "study" is in the plans studies saved: it stays, so that a
        restored or resumed study's new trials share with its old ones.)"""
        return "study" if self.spec.stage_sharing else trial_id

    def admit(self) -> bool:
        """Admit the trial source's next trials, up to `ADMIT_PER_TURN`; True when
        more may come at once: it stopped there, or at the pending-trial limit
        after admitting some (dispatched, they wait no more)."""
        pending_limit = self.spec.max_pending_trials
        for admitted in range(ADMIT_PER_TURN):
            if self.lifecycle.full(self.spec.max_concurrent_trials) or self.budget.over() or self.failures.halted:
                return False
            if self.lifecycle.pending_full(pending_limit, self.spec.num_workers):
                return admitted > 0
            try:
                if self.lifecycle.admit_next(self._new_trial) is None:
                    return False
            except Refused as refused:  # a bad config, or a user hook that raised
                failed = TrialState(
                    trial_id=refused.trial_id, config=refused.config, error=str(refused), dirname=refused.trial_id
                )
                self.lifecycle.refuse(failed)
                self._after_error()
        return True

    def _new_trial(self, trial_id: str, config: dict[str, Any], trial_config: TrialConfig) -> TrialState:
        """A trial being admitted, named by the user's hooks."""
        self._warn_of_a_twin(trial_id, trial_config)
        info = TrialInfo(
            trial_id, config, self.spec.trainable_name, experiment_tag(trial_id, config, self.spec.tuned_paths)
        )
        name = trial_name(self.spec.trial_name_creator, info, "trial_name_creator", folder=False)
        if self.spec.trial_name_creator is not None:  # Tune's default folder name starts with it
            info.custom_name = name
        return TrialState(
            trial_id=trial_id,
            config=config,
            plain=frozenset(trial_config.names) - trial_config.declared,
            name=name,
            dirname=trial_name(self.spec.trial_dirname_creator, info, "trial_dirname_creator", folder=True),
            experiment_tag=info.experiment_tag,
        )

    def _warn_of_a_twin(self, trial_id: str, trial_config: TrialConfig) -> None:
        """PBT's population starts with a member that has another's config
        (a constant ``param_space``): warn, once per study, that the two are
        one member here."""
        if self._population_starts is None:
            return
        twin = self._population_starts.setdefault(trial_config.identity, trial_id)
        if twin == trial_id:
            return
        self._population_starts = None
        self.feed.warn(
            f"PBT trials {twin} and {trial_id} start with identical configs: they share one trajectory until PBT "
            "explores them apart, so the population has fewer distinct members than under Tune (where the "
            "trainable's own randomness sets them apart). Give each trial a value of its own, e.g. "
            "param_space={..., 'seed': tune.randint(0, 2**31)} (this warning is shown once per study)"
        )

    def add_result(self, state: TrialState, iteration: int, metrics: dict[str, Any]) -> None:
        """The trial's result at ``iteration``: checked, made a Tune row,
        decided on by its scheduler and told to its searcher."""
        # An iteration trained again (a retry, an evicted checkpoint) was
        # already reported: searchers and schedulers see each iteration once.
        state.restore_failures = 0  # it trains: its checkpoint loaded (Tune resets the count on restore)
        if state.status in ENDED or iteration in state.rows:
            return
        invalid = self.rows.invalid(state, iteration, metrics)
        if invalid is not None:
            self.fail({state.trial_id}, invalid, retry=False)  # a retry would report the same value
            return
        row = self.rows.row(state, iteration, metrics, self.host.horizon)
        ended = bool(metrics.get("done", False))
        self.lifecycle.record(state, iteration, row)
        state.reported.append(row)
        self.feed.announce(state)
        self.feed.row(row)
        if not row["done"] and self.rows.stop_met(state.trial_id, row):
            row["done"] = ended = True  # Tune's stop criteria end a trial without asking its scheduler
        elif row["done"] and not ended and self.spec.horizon_is_max_t and not self.rows.stop_met(state.trial_id, row):
            self._ask_at_max_t(state, row)
        halt = self.rows.stop_all()
        if halt:
            row["done"] = ended = True
        if row["done"]:  # Tune tells the searcher of a done result at the trial's end only (on_trial_complete)
            if halt:
                self.halt()
            # The horizon, or the trainable reported done (Tune ends the trial).
            self.end_trial(state.trial_id) if ended else self.lifecycle.finish(state)
        else:
            # Tune's order: the scheduler sees a result before the searcher does.
            tell_searcher = functools.partial(self.trial_source.on_result, state.trial_id, row)
            self.lifecycle.decide(state, iteration, row, then=tell_searcher)
        self.resume_paused()

    def _ask_at_max_t(self, state: TrialState, row: dict[str, Any]) -> None:
        """The trial reached its scheduler's ``max_t``: Tune still asks the
        scheduler about this result (ASHA answers STOP, HyperBand may PAUSE
        the trial until its bracket ends, which then removes it), then ends
        the trial. It ends here whatever the answer: its requests went no
        further."""
        row["done"] = False  # as the scheduler sees it under Tune, before its STOP marks it done
        self.host.on_result(state.trial_id, row)
        row["done"] = True

    def resume_paused(self) -> None:
        """Run again the paused trials the scheduler chooses."""
        self.lifecycle.resume()

    def _requested(self, state: TrialState, request: Request, iteration: int) -> None:
        """The lifecycle moved the trial's request on from ``iteration``: take what
        the plan already holds beyond it (work shared with other trials).

        A result taken may move the request on again (its scheduler decides
        on it): that call only sets where to take from, and the loop reads
        the moved request's history. (Recursing went a level deeper per
        decision point, past Python's limit on a long shared trajectory, as
        PBT twins have, and after an exploit went on with the results of the
        path the trial had left.)"""
        self.assign_node(state, request.node)
        self._wake.set()
        trial_id = state.trial_id
        taking = trial_id in self._taking_from
        self._taking_from[trial_id] = iteration
        if taking:
            return
        try:
            while trial_id in self.plan.trials and state.status not in ENDED:
                request = self.plan.trials[trial_id].request
                held = [
                    (later, metrics)
                    for later, metrics in self.plan.history(trial_id).items()
                    if later > self._taking_from[trial_id] and later not in state.rows
                ]
                for later, metrics in held:
                    self.add_result(state, later, metrics)
                    if trial_id not in self.plan.trials or self.plan.trials[trial_id].request is not request:
                        break  # the request moved: read its history again
                else:
                    return
        finally:
            del self._taking_from[trial_id]

    def assign_node(self, state: TrialState, node: Any) -> None:
        """The trial's request is on ``node`` now; the first trial requesting a node configures it."""
        state.node = node
        if node.node_id not in self._node_configs:
            self._node_configs[node.node_id] = state.config
            self._node_plain[node.node_id] = state.plain
            self._node_owner[node.node_id] = state.trial_id

    def _next_request(self, trial_id: str, iteration: int) -> int:
        """The iteration a trial at ``iteration`` is requested to: its scheduler's next
        decision point, or the next iteration where any result may end it."""
        decision = self.host.next_decision(trial_id, iteration)
        return iteration + 1 if self._every_result or math.isinf(decision) else decision

    def stop_trial(self, trial_id: str) -> None:
        """End a trial now (a stop criterion or a trial scheduler decided so).
        Its requests are cancelled; a batch no other trial needs is
        pre-empted when its worker next reports."""
        self.end_trial(trial_id)
        self.resume_paused()  # trials a scheduler held for this one may go on

    def end_trial(self, trial_id: str) -> None:
        """`stop_trial`, leaving paused trials paused: what a scheduler calls
        while it decides, before it is asked what to resume (`resume_paused`)."""
        self.lifecycle.stop(self.trials[trial_id])

    def _ended(self, state: TrialState) -> None:
        """The lifecycle ended a trial: the driver hears of it, and the loop
        wakes (batches no live trial needs are pre-empted)."""
        if state.status == ERROR:
            self.feed.event("error", state, error=state.error, iterations=max(state.rows, default=0))
        else:
            self.feed.event("complete", state)
        self._release_unneeded()
        self._wake.set()

    def _release(self, parked: list[Any]) -> None:
        for trainable in parked:
            trainable.worker.release.remote(trainable.batch_id)

    def _release_unneeded(self) -> None:
        """Release the parked trainables that no unfinished trial needs."""
        self._release(self.parking.unneeded(lambda trial_id: self._status(trial_id) in UNFINISHED))

    # -- reports from workers ---------------------------------------------------

    def worker_report(self, outcome: BatchOutcome) -> FlushReply:
        """Fold a worker's records into the plan (trials' schedulers decide on
        them here); reply with the batch's checkpoint iterations, the iteration
        it may stop at, its end, later than before where it continues live,
        and whether its trainable parks there (`execution.parking`).

        An error raised here (a scheduler's or searcher's own, as Tune's
        ``fit()`` raises it) stops the study with it: the batch ends, and
        `run` raises the error. (Raised at the worker, it failed the batch's
        trials and the study ended in a baffling "no batch can be
        dispatched".)"""
        if self.snapshots.frozen or self._error is not None:
            return FlushReply([], 0, 0)  # stop: the study was saved as it stood, or is over
        try:
            return self._fold(outcome)
        except Exception as error:
            self._error = error
            self._wake.set()
            return FlushReply([], 0, 0)

    def _fold(self, outcome: BatchOutcome) -> FlushReply:
        self.ingest(outcome)
        batch_id = outcome.batch_id
        self.pool.heard(batch_id)
        self.enforce_budget()  # this batch stops here, not at its next report
        if batch_id not in self.plan.running_batches:
            return FlushReply([], 0, 0)
        if outcome.records:
            yielding = self.preemption.reply(self.policy, batch_id, *outcome.records[-1][:2], outcome.can_checkpoint)
            if yielding is not None:
                return yielding
        node, _, stop = self.plan.batch_segments(batch_id)[-1]
        save_iterations = []
        at_end = bool(outcome.records) and outcome.records[-1][1] == stop
        extended = None
        if at_end and self._continue_live(node, stop, outcome.can_checkpoint):
            extended = self.plan.extend_batch(batch_id)
            # (A trainable that reported no checkpoint here gets no request
            # for one: it has nothing to save, and nothing forks here.)
            if extended is not None and self._keeps_decision_points and outcome.can_checkpoint:
                save_iterations.append(stop)
        park = (
            at_end
            and extended is None
            and not outcome.can_checkpoint
            and self.parking.wanted(node, stop, lambda trial_id: self._status(trial_id) == PAUSED)
        )
        save_iterations += [iteration for _, iteration in self.plan.checkpoints_needed(batch_id)]
        save_iterations += self.configured_saves(batch_id, outcome)
        needed = self.plan.needed_until(batch_id)
        return FlushReply(save_iterations, needed[1] if needed is not None else 0, extended or stop, park)

    def _status(self, trial_id: str) -> str | None:
        state = self.trials.get(trial_id)
        return None if state is None else state.status

    def configured_saves(self, batch_id: int, outcome: BatchOutcome | None = None) -> list[int]:
        """CheckpointConfig's saves on a batch (class trainables; the Tuner
        refuses them for functions): every ``checkpoint_frequency``-th
        iteration, and with ``checkpoint_at_end`` the last iteration of a
        trial that just ended (the worker saves the batch's current iteration after
        this reply)."""
        config = self.spec.checkpoint_config
        if config is None:
            return []
        segments = self.plan.batch_segments(batch_id)
        start, stop = segments[0][1], segments[-1][2]
        # From the iteration last reported: at the batch's end the worker decides on its save after this reply.
        low = outcome.records[-1][1] if outcome is not None and outcome.records else start + 1
        every = config.checkpoint_frequency or 0
        iterations = _multiples(every, low, stop, SAVES_AHEAD) if every > 0 else []
        if config.checkpoint_at_end and outcome is not None and outcome.records:
            node_id, iteration, _ = outcome.records[-1]
            through = self._trials_through(self.plan.nodes[node_id], iteration)
            ended = [self.trials[t] for t in through if t in self.trials and self.trials[t].status == TERMINATED]
            if any(state.rows and max(state.rows) == iteration for state in ended):
                iterations.append(iteration)
        return iterations

    def _continue_live(self, node: Any, stop: int, can_checkpoint: bool) -> bool:
        """Should a batch at a scheduler's decision point go on live? Yes,
        unless the policy should choose again: every worker is busy, other
        work waits for one, and the trainable checkpoints (so stopping here
        costs a checkpoint, not a retrained prefix)."""
        if not self._keeps_decision_points or not can_checkpoint or self.pool.idle_count() > 0:
            return True
        serving = {trial_id for trial_id in self._trials_through(node, stop) if self._status(trial_id) in UNFINISHED}
        waiting = (
            request
            for request in self.plan.open_requests()
            if request.trials
            and request.state is RequestState.NOT_SCHED
            and not (request.node is node and request.iteration > stop)
        )
        return not self.policy.yields(self.plan, serving, waiting)

    def ingest(self, outcome: BatchOutcome) -> None:
        """Fold a worker's records into the plan and the trials, and take its checkpoints into the store."""
        if outcome.missing_checkpoints and not self._warned_missing_checkpoint:
            self._warned_missing_checkpoint = True
            self.feed.warn(
                f"iteration {outcome.missing_checkpoints[0]} needs a checkpoint (should_checkpoint() was True) but "
                "report() got none. Trials that branch off a shared prefix will train it again, and a paused "
                "trial holds its worker's memory until resumed (its trainable waits, parked): pass "
                "checkpoint=tune.Checkpoint.from_directory(...) to report() where should_checkpoint() is True "
                "(this warning is shown once per study)"
            )
        self._count_restarts(outcome.restarts)
        reached = self._run_reached.setdefault(outcome.batch_id, {}) if outcome.batch_id in self._run_began else {}
        for index, (node_id, iteration, metrics) in enumerate(outcome.records):
            if self.host.population is not None:  # as in Ray, PBT clones only a result that came with a checkpoint
                self.host.population.checkpointed = iteration not in outcome.missing_checkpoints and (
                    index < len(outcome.records) - 1 or outcome.can_checkpoint
                )
            node = self.plan.nodes[node_id]
            reached[node_id] = max(reached.get(node_id, 0), iteration)
            self._iterations += 1
            self.plan.record_metrics(node_id, iteration, metrics)
            self.plan.record_progress(outcome.batch_id, node_id, iteration)
            for trial_id in sorted(self._trials_through(node, iteration)):
                self.add_result(self.trials[trial_id], iteration, metrics)
        if outcome.batch_id in self.plan.running_batches:  # the cost model's input
            self.plan.record_batch_timings(
                outcome.batch_id, [(node_id, at, row.get("time_this_iter_s")) for node_id, at, row in outcome.records]
            )
        worker = self.pool.worker_of(outcome.batch_id)
        for node_id, iteration, key, size in outcome.checkpoints:
            # The call's return value is the payload: an object this actor owns.
            ref = worker.take_checkpoint.remote(key)
            self.store.add(self.plan, self.plan.nodes[node_id], iteration, ref, size)
        if outcome.records or outcome.checkpoints:
            self._wake.set()

    def _count_restarts(self, restarts: list[tuple[int, tuple[str, ...]]]) -> None:
        """Count the trainables' restarts at changed values; say once why they happen."""
        keys = [key for _, changed in restarts for key in changed]
        if keys and not self._restarts:
            iteration, changed = restarts[0]
            names = ", ".join(f"config[{key!r}]" for key in changed)
            self.feed.warn(
                f"the trainable reads {names} from its config, where it stays as it was when the trainable started, "
                f"so trials restart from the checkpoint they report where it changes (first at iteration "
                f"{iteration}), as Tune's PBT restarts a trial; stages are still shared. A trainable that reads "
                "get_hparams() each iteration continues live instead (this message is shown once per study)"
            )
        self._restarts.update(keys)

    # -- the loop ------------------------------------------------------------------

    async def _dispatch(self) -> bool:
        """Start batches on idle workers; True when a checkpoint some batch
        was to start from turned out lost (the plan dropped it: select again)."""
        lost = False
        if self.store.writes_behind() or self.snapshots.paused():
            return lost
        chosen = self.policy.select(self.plan, self.pool.idle_count(), admit=self.parking.admit(self.pool.idle))
        # Batches that continue a parked trainable take its worker before the others take any.
        chosen.sort(key=lambda batch: self.parking.source_of(batch) is None)
        for batch in chosen:
            parked = self.parking.source_of(batch)
            try:
                spec = await self._batch_spec(batch, parked)
            except CheckpointUnavailableError as error:
                logger.warning("%s; retraining it", error)
                self.plan.release_batch(batch.batch_id)
                lost = True
                continue
            if parked is not None:
                self.parking.take(parked)
                worker = self.pool.take_parked(parked.worker)
            else:
                worker = self.pool.take()
            ref = worker.run_batch.remote(spec)
            self.pool.dispatched(ref, worker, batch, spec)
            self._run_began[batch.batch_id] = (self.pool.workers.index(worker) + 1, time.time())
            self.policy.started(batch, time.monotonic())
            for request in batch.requests:
                for trial_id in request.trials & self.trials.keys():
                    self.feed.announce(self.trials[trial_id])
        return lost

    async def _batch_spec(self, batch: StageBatch, parked: Any = None) -> BatchSpec:
        leaf = batch.stages[-1].node
        config = self._node_configs[leaf.node_id]
        source = batch.source
        handle = None
        if parked is None and source is not None and not source.is_initialization:
            handle = await self.store.handle(self.plan, source.node, source.iteration)
        return BatchSpec(
            batch_id=batch.batch_id,
            config=config,
            trial_config=leaf.config,
            segments=[(node.node_id, start, stop) for node, start, stop in batch.segments],
            save_iterations={iteration for _, iteration in self.plan.checkpoints_needed(batch.batch_id)}
            | set(self.configured_saves(batch.batch_id)),
            source=handle,
            plain=self._node_plain.get(leaf.node_id, frozenset()),
            reproducibility=self.spec.worker.reproducibility,
            resumes=None if parked is None else parked.batch_id,
            keep_reported=keeps_reported(self.spec.checkpoint_config),
            **self.trial_context(leaf.node_id),
        )

    def trial_context(self, node_id: int) -> dict[str, str]:
        """The trial a class trainable's ``trial_id`` / ``trial_name`` name."""
        owner = self.trials.get(self._node_owner.get(node_id, ""))
        experiment_name = self.spec.experiment_path.rstrip("/").rsplit("/", 1)[-1]
        if owner is None:  # a node of a restored plan
            return {"experiment_name": experiment_name}
        local = "://" not in self.spec.experiment_path and self.spec.storage_filesystem is None
        return {
            "trial_id": owner.trial_id,
            "trial_name": owner.name,
            "experiment_name": experiment_name,
            "trial_dir": f"{self.spec.experiment_path}/{owner.dirname}" if local else "",
        }

    async def complete(self, ref: Any) -> None:
        """The batch behind ``ref`` ended, failed, or its worker died."""
        running = self.pool.finished(ref)
        worker, batch, spec, dispatched = running.worker, running.batch, running.spec, running.dispatched
        if self.snapshots.frozen:
            return
        try:
            outcome: BatchOutcome = await ref
        except ray.exceptions.RayActorError as error:
            self._record_run(spec, None)
            self._worker_seconds += time.monotonic() - dispatched
            self.pool.folded(batch.batch_id)
            # Its node may be gone: start no more workers than the cluster now holds.
            self.pool.lost(worker, workers_that_fit(self.spec.worker), self.spec.num_workers)
            self.spec.worker.stop(worker)  # a group's other ranks and its placement group
            self.parking.forget_worker(worker)
            affected = {t for r in self.plan.scheduled_requests(batch.batch_id) for t in r.trials}
            # Result.error is Ray's RayActorError, as in Tune.
            died = f"the worker running batch {batch.batch_id} died: {error}"
            self.fail(affected, died, error_pickle=pack_exception(error))
            self.plan.release_batch(batch.batch_id)
            return
        except ray.exceptions.RayError as error:  # its outcome could not come back (it failed to serialize)
            self._record_run(spec, None)
            self._worker_seconds += time.monotonic() - dispatched
            self.pool.folded(batch.batch_id)
            affected = {t for r in self.plan.scheduled_requests(batch.batch_id) for t in r.trials}
            self.fail(affected, f"batch {batch.batch_id}'s outcome could not be read from its worker: {error}")
            self.plan.release_batch(batch.batch_id)
            self.pool.returned(worker)
            return
        self._worker_seconds += time.monotonic() - dispatched
        if outcome.source_lost is not None or outcome.trainable_unloadable:
            self._record_run(spec, outcome)
        if outcome.source_lost is not None:
            # The starting checkpoint's only copy was on a node that is gone:
            # the batch starts again from its durable copy, or retrains.
            logger.warning("%s; starting the batch again", outcome.source_lost)
            if spec.resumes is None:
                self.store.forget_copy(self.plan, batch.source.node, batch.source.iteration)
            self.plan.release_batch(batch.batch_id)
            self.pool.folded(batch.batch_id)
            self.pool.returned(worker)
            self._wake.set()
            return
        if outcome.trainable_unloadable:
            self.abort(outcome.error)
            self.plan.release_batch(batch.batch_id)
            self.pool.folded(batch.batch_id)
            return
        shared_retry = outcome.error is not None and self._shared_retry(outcome)
        if shared_retry and outcome.error_checkpoint:
            # The retry trains again from where this attempt started, as each of
            # the sharing trials would in Tune, not from what the failed attempt left.
            _, _, key, _ = outcome.checkpoints.pop()
            worker.take_checkpoint.remote(key)  # dropped from the worker's outbox
        self.ingest(outcome)
        self._record_run(spec, outcome)
        self.pool.folded(batch.batch_id)
        if outcome.error is not None and not shared_retry:
            self._batch_failed(outcome)
        if outcome.returned_at is not None:
            self._trainable_returned(batch.batch_id, outcome.returned_at)
        last = outcome.records[-1] if outcome.records else None
        self.policy.ended(self.plan, batch.batch_id, time.monotonic(), last and (self.plan.nodes[last[0]], last[1]))
        self.preemption.ended(batch.batch_id)
        if outcome.parked:
            node, _, stop = self.plan.batch_segments(batch.batch_id)[-1]
            self._release(self.parking.park(worker, batch.batch_id, node, stop))
        self.plan.release_batch(batch.batch_id)
        self._release_unneeded()
        if outcome.worker_broken:
            self.pool.retire(worker)
            self.spec.worker.stop(worker)
        else:
            self.pool.returned(worker)

    def _record_run(self, spec: BatchSpec, outcome: BatchOutcome | None) -> None:
        """The batch's run into the plan (`SearchPlan.record_run`): the
        segments it trained, as far as it trained them."""
        began = self._run_began.pop(spec.batch_id, None)
        if began is None:
            return
        worker, start_time = began
        reached = self._run_reached.pop(spec.batch_id, {})
        if outcome is None or outcome.source_lost is not None or outcome.trainable_unloadable:
            label = "released" if outcome is not None and outcome.source_lost is not None else "failed"
        else:
            label = "failed" if outcome.error is not None else "done"
        segments = [
            (node_id, start, min(stop, reached[node_id]))
            for node_id, start, stop in spec.segments
            if reached.get(node_id, 0) > start
        ]
        if segments or label != "done":
            self.plan.record_run(spec.batch_id, worker, segments, start_time, max(time.time(), start_time), label)

    def _trials_through(self, node: Any, iteration: int) -> set[str]:
        """This run's trials whose path passes through ``(node, iteration)``. A
        plan continued by `Study` also holds the trials of earlier runs: they
        share its nodes, but nothing here reports to them."""
        return {trial_id for trial_id in self.plan.trials_through(node, iteration) if trial_id in self.trials}

    def _trainable_returned(self, batch_id: int, iteration: int) -> None:
        """The function returned after ``iteration`` iterations instead of training
        the next one (a finite loop): every trial that needs that next
        iteration on this path observes what the function saw, so it ends
        here, as Tune ends a trial whose function returns."""
        after = [node for node, start, stop in self.plan.batch_segments(batch_id) if start <= iteration < stop]
        if not after:
            return
        node = after[0]
        for trial_id in sorted(self._trials_through(node, iteration + 1)):
            state = self.trials[trial_id]
            if state.status not in ENDED:
                if state.reported:
                    state.reported[-1]["done"] = True
                self.end_trial(trial_id)
        self.resume_paused()

    def _affected(self, outcome: BatchOutcome) -> set[str]:
        """The live trials through the point where the trainable raised."""
        node = self.plan.nodes[outcome.error_node]
        return {
            trial_id
            for trial_id in self._trials_through(node, outcome.error_iteration)
            if self.trials[trial_id].status not in ENDED
        }

    def _shared_retry(self, outcome: BatchOutcome) -> bool:
        """Whether the error is retried once as a shared stage's (`Failures.retry_shared`)."""
        if not outcome.error_retryable:  # the trainable reported something it must not: a retry repeats it
            return False
        affected = self._affected(outcome)
        if not self.failures.retry_shared(outcome.error_node, affected):
            return False
        logger.warning(
            "iteration %d, shared by %d trials, failed; retrying it once before it counts as their failure:\n%s",
            outcome.error_iteration,
            len(affected),
            outcome.error,
        )
        return True

    def _batch_failed(self, outcome: BatchOutcome) -> None:
        """The trainable raised, and it counts against the trials it served."""
        affected = self._affected(outcome)
        if outcome.error_checkpoint:
            for trial_id in affected:
                self.trials[trial_id].error_checkpoint = outcome.checkpoints[-1][:2]
        self.fail(affected, outcome.error, outcome.error_retryable, outcome.error_in_restore, outcome.error_pickle)

    def fail(
        self,
        trial_ids: set[str],
        error: str,
        retry: bool = True,
        in_restore: bool = False,
        error_pickle: bytes | None = None,
    ) -> None:
        """The trials failed (``in_restore``: loading their starting
        checkpoint raised): retried while `Failures.retried` says, else they
        end in error. ``error_pickle``: the trainable's exception as
        `Result.error` gives it."""
        for trial_id in trial_ids:
            state = self.trials[trial_id]
            if state.status in ENDED:
                continue
            if self.failures.retried(state, retry, in_restore):
                self.feed.event("recover", state, error=error, iterations=max(state.rows, default=0))
            else:
                state.error, state.error_pickle = error, error_pickle
                self.lifecycle.fail(state)
                self._after_error()
                self.resume_paused()

    def abort(self, error: str) -> None:
        """No worker can run the trainable: every live trial ends in error
        and the study stops (the Tuner raises ``error``)."""
        self.failures.abort(error)
        for state in self.trials.values():
            if state.status in UNFINISHED:
                self.lifecycle.abort(state)
                state.error = error
                self.feed.event("error", state, error=error)

    def _after_error(self) -> None:
        """With ``fail_fast``, the first errored trial ends the study."""
        if self.failures.ends_study():
            self.halt()

    def halt(self) -> None:
        """End the study: no new trial, and the others stop where they are,
        as Tune stops them (fail_fast, a stopper's ``stop_all``)."""
        if not self.failures.halt():
            return
        for state in list(self.trials.values()):
            if state.status in UNFINISHED:
                self.end_trial(state.trial_id)

    def unfinished(self) -> bool:
        """Live trials, or trials to come (within the budget, the study not halted)."""
        return self.lifecycle.live() > 0 or (
            self.trial_source.remaining != 0 and not self.budget.over() and not self.failures.halted
        )

    def enforce_budget(self) -> None:
        """Past the time budget, trials stop (running batches stop at their
        next report); a batch still running `time_budget.GRACE_S` later is
        killed with its worker: it cannot be stopped cooperatively."""
        if not self.budget.over():
            return
        for state in list(self.trials.values()):
            if state.status in LIVE:
                self.stop_trial(state.trial_id)
        running = self.pool.running_workers()
        for batch_id in self.budget.to_kill(running):
            self.spec.worker.stop(running[batch_id])

    def wake_in(self) -> float | None:
        """Seconds until the loop must wake: for the time budget, or to ask a
        searcher that suggested nothing again."""
        budget = self.budget.wake_in(self.pool.running_workers())
        if not self.lifecycle.source_waits:
            return budget
        return SEARCHER_POLL_S if budget is None else min(budget, SEARCHER_POLL_S)

    async def run(self, workers: list[Any]) -> None:
        """Run the study on ``workers`` (from `WorkerSpec.start`, started by the
        driver with this actor so that both start up at once)."""
        self.pool.adopt(workers)
        admitting = self.admit()
        # The future awaiting each ref outlives a turn: one that resolves
        # during a turn is seen by the next, even by a turn that does not wait
        # (while admitting), which a future made afresh each turn never is.
        awaited: dict[Any, asyncio.Future] = {}
        while not self.snapshots.frozen:
            if self._error is not None:
                raise self._error
            self.enforce_budget()
            if await self._dispatch():
                continue
            if self.spec.max_pending_trials is not None:
                # The trials just dispatched wait no more: the searcher proposes
                # the next before their results come (Tune creates a trial as
                # the one before it starts, so a scheduler counts it in).
                admitting = self.admit() or admitting
            # While storage refuses the snapshot the study waits for it, even at its end: the final
            # checkpoints are only in memory.
            storage_down = self.snapshots.paused()
            if not self.pool.running and not self.store.pending_writes and not storage_down:
                if not self.unfinished():
                    if await self._final_checkpoints_lost():
                        continue  # train them again
                    break
                # (Without a placed worker the study waits for Ray to place one, as Tune's pending trials.)
                if not self.plan.running_batches and not admitting and self.pool.idle:
                    self.stuck()
            self.snapshots.save_soon()
            waiting = list(self.pool.running) + list(self.pool.starting) + self.store.pending_writes
            if self.snapshots.in_flight is not None:
                waiting.append(self.snapshots.in_flight)
            self._wake.clear()
            wake = asyncio.ensure_future(self._wake.wait())
            for ref in awaited.keys() - set(waiting):
                awaited.pop(ref).cancel()
            for ref in waiting:
                if ref not in awaited:
                    awaited[ref] = asyncio.ensure_future(_as_future(ref))
            futures = {awaited[ref]: ref for ref in waiting}
            timeout = 0.0 if admitting else self.wake_in()
            due = self.snapshots.due_in()
            if due is not None:
                timeout = due if timeout is None else min(timeout, due)
            done, _ = await asyncio.wait([wake, *futures], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
            wake.cancel()
            for future in done:
                ref = futures.get(future)
                awaited.pop(ref, None)
                if ref in self.pool.starting:
                    self.pool.placed(ref)  # it takes batches from the next turn
                    continue
                if ref is not None and ref is self.snapshots.in_flight:
                    await self.snapshots.written()
                    if self.store.unstored and self.snapshots.refused_since is None:
                        self.store.rewrite_unstored(self.plan)
                    continue
                if ref is None or ref in self.pool.running:
                    self.snapshots.changed = True  # woken (results, stops) or a batch ended
                    if ref is not None:
                        await self.complete(ref)
                elif await self.store.finish_write(self.plan, ref):
                    # A copy refused again changes nothing: no snapshot (whose
                    # success would retry the copy at once, a busy loop).
                    self.snapshots.changed = True
            if not self.snapshots.frozen:
                admitting = self.admit()
        for future in awaited.values():
            future.cancel()
        if not self.snapshots.frozen:
            await self.finalize()

    async def _final_checkpoints_lost(self) -> bool:
        """Reopen the finished trials whose final checkpoint was lost or
        found corrupt, so that it is trained again; True if any."""
        return await retrain_lost_finals(
            self.trials.values(),
            lambda node_id, iteration: self.store.verify(self.plan, self.plan.nodes[node_id], iteration),
            lambda state: self.assign_node(state, self.plan.reopen(state.trial_id).node),
            self.feed.warn,
        )

    # -- study state ---------------------------------------------------------------

    def _state(self) -> StudyState:
        return StudyState(
            plan=self.plan.records(),
            objects=self.plan.objects(),
            trials=[dataclasses.replace(trial, node=None) for trial in self.trials.values()],
            source=self.trial_source,
            host=self.host,
            iterations=self._iterations,
            worker_seconds=self._worker_seconds,
            elapsed=self.budget.elapsed,
        )

    async def save_state(self) -> None:
        """Write a snapshot now (the driver asks before it stops)."""
        await self.snapshots.save_now()

    async def interrupt(self) -> str | None:
        """The driver stops (Ctrl-C): save the study as it stands and change
        it no more (later reports are dropped, batches told to stop), so that
        what a restore continues is exactly what the driver last heard.
        None when storage took it, else what a restore would continue."""
        self.snapshots.freeze()
        self._wake.set()
        for write in self.store.pending_writes:  # checkpoints already reported are in what it continues
            await self.store.finish_write(self.plan, write)
        await self.save_state()
        return self.snapshots.not_saved()

    def stuck(self) -> None:
        """Nothing runs or can be dispatched, yet the study is unfinished: a
        bug, unless the searcher suggests nothing yet (asked again in
        `SEARCHER_POLL_S`, as Tune waits for it)."""
        if self.lifecycle.source_waits:
            return
        open_requests = [r for r in self.plan.open_requests() if r.trials]
        raise RuntimeError(f"no batch can be dispatched but {len(open_requests)} requests are open: {open_requests}")

    async def finalize(self) -> None:
        """The study's end: paused trials close, kept checkpoints go into the
        trials' folders (`study_end`), the plan and a last snapshot are saved."""
        for state in self.trials.values():
            if state.status == PAUSED:  # its scheduler never resumed it
                self.lifecycle.close(state)
                self.feed.event("complete", state)
        export = functools.partial(self.store.export, self.plan)
        unwritten = await export_kept_checkpoints(
            self.trials.values(), export, self.store.remove_other_checkpoints, self.spec.checkpoint_config
        )
        for state in self.trials.values():
            if state.checkpoints:
                self.feed.event("checkpoint", state, path=state.checkpoints[-1][0])
        try:
            self.plan.save(self.plan_path, self.spec.storage_filesystem)
        except Exception as error:  # each fsspec backend raises its own errors
            unwritten.append(f"the search plan could not be written ({type(error).__name__}: {error})")
        await self.save_state()
        if unwritten:
            self.feed.warn(
                f"storage under {self.spec.experiment_path!r} refused part of the study's end, which is kept in "
                f"the returned results only: {'; '.join(unwritten[:3])}"
                + (f" (and {len(unwritten) - 3} more)" if len(unwritten) > 3 else "")
            )

    # -- driver queries --------------------------------------------------------------

    def progress(self) -> Progress:
        """What happened since the last call, for the driver's reporter and
        callbacks: the study's figures, and `DriverFeed.take`'s ``rows``
        (the new results), ``events`` (the trials' lifecycle) and ``warnings``."""
        news = self.feed.take()
        return Progress(
            status=self._shown_counts(),
            iterations=self._iterations,
            worker_seconds=self._worker_seconds,
            state_seconds=self.snapshots.seconds,
            **self._sharing_figures(),
            rows=news["rows"],
            events=news["events"],
            elapsed=self.budget.elapsed,
            study_error=self.failures.study_error,
            warnings=news["warnings"],
            scheduler_log=self.host.population.take_log() if self.host.population is not None else (),
            stalled=self._stalled(),
            restarts=dict(self._restarts),
        )

    def _shown_counts(self) -> dict[str, int]:
        """Trials by status as the progress line shows them: RUNNING (to the
        trial scheduler, a trial admitted and not ended) only while a worker
        holds the trial, else PENDING, waiting for one, as Tune says of a
        trial without an actor."""
        counts = self.lifecycle.counts()
        waiting = counts.get(RUNNING, 0) - len(
            {t for t in self._held_trials() if t in self.trials and self.trials[t].status == RUNNING}
        )
        if waiting:
            counts[RUNNING] -= waiting
            counts[PENDING] = counts.get(PENDING, 0) + waiting
        return {status: count for status, count in counts.items() if count}

    def _held_trials(self, batch_id: int | None = None) -> set[str]:
        """The trials of the batches running on workers (of ``batch_id`` alone, if given)."""
        batch_ids = [batch_id] if batch_id is not None else [r.batch.batch_id for r in self.pool.running.values()]
        return {t for b in batch_ids for request in self.plan.scheduled_requests(b) for t in request.trials}

    def _sharing_figures(self) -> dict[str, int]:
        """The plan's unique and trial-by-trial iterations: each walks every
        trial, so with many trials they are recomputed at most as often as
        keeps them under 5% of the controller's time (exact once the study
        is over)."""
        now = time.monotonic()
        if now >= self._sharing_due or not self.pool.running:
            self._sharing = {
                "unique_iterations": self.plan.unique_iterations(),
                "total_iterations": self.plan.total_iterations(),
            }
            self._sharing_due = now + STATE_COST_FACTOR * (time.monotonic() - now)
        return self._sharing

    def _stalled(self) -> list[tuple[str, float]]:
        """(trials, seconds) of each running batch that has reported nothing
        for ``stall_warning_s``: a trainable stuck, or slower than expected."""
        stalled = []
        for batch, silent in self.pool.stalled(self.spec.stall_warning_s):
            trial_ids = sorted({t for r in self.plan.scheduled_requests(batch.batch_id) for t in r.trials})
            names = [self.trials[t].name or t for t in trial_ids if t in self.trials]
            stalled.append((", ".join(names) or f"batch {batch.batch_id}", silent))
        return stalled

    def searcher(self) -> Any:
        """The study's searcher as it is now (None without one): the driver
        hands its state to the user's object (`tune_compat.adopt_searcher_state`)."""
        return getattr(self.trial_source, "searcher", None)

    def results(self, first: int = 0, count: int | None = None) -> list[TrialSummary]:
        """The summaries of trials ``first`` to ``first + count`` (all from ``first`` when ``count`` is None)."""
        stop = None if count is None else first + count
        return [trial_summary(state) for state in itertools.islice(self.trials.values(), first, stop)]

    def monitor_view(self) -> dict[str, Any]:
        """Read-only, for the web monitor (`ray_stagetree.monitor`): the plan
        as records, each worker's running batch (its segments ``[node,
        start, stop]`` and trials), each trial's status by folder, and the
        iterations executed."""
        now = time.monotonic()
        batches = {}
        for running in self.pool.running.values():
            batch_id = running.batch.batch_id
            trial_ids = sorted(self._held_trials(batch_id))
            batches[id(running.worker)] = {
                "batch": batch_id,
                "segments": [list(segment) for segment in running.spec.segments],
                "trials": [self.trials[t].dirname for t in trial_ids if t in self.trials],
                "seconds": round(now - running.dispatched, 1),
                "began": self._run_began.get(batch_id, (0, time.time()))[1],
            }
        return {
            "plan": self.plan.records(),
            "running": list(batches.values()),
            "workers": [
                {"worker": index + 1, **batches.get(id(worker), {})} for index, worker in enumerate(self.pool.workers)
            ],
            "trials": {state.dirname: state.status for state in self.trials.values()},
            "iterations": self._iterations,
        }

    def shutdown_workers(self) -> None:
        self.spec.worker.close(self.pool.workers)
        self.pool.shut_down(self.spec.worker.stop)


#: Trial summaries per call of `fetch_summaries`.
SUMMARY_PAGE = 1000


def fetch_summaries(results: Callable[[int, int], Any]) -> list[TrialSummary]:
    """Every trial's summary from a study's ``results`` actor method (its
    ``.remote``, called with ``first`` and ``count``), a page at a time.

    All of them in one object would sit in the driver twice at the study's
    end, serialised and built: its memory peak (about 175 MB more at
    10,000 trials)."""
    summaries: list[TrialSummary] = []
    while True:
        page = ray.get(results(len(summaries), SUMMARY_PAGE))
        summaries.extend(page)
        if len(page) < SUMMARY_PAGE:
            return summaries


def _multiples(every: int, low: int, high: int, count: int) -> list[int]:
    """The first ``count`` multiples of ``every`` in ``[low, high]``."""
    first = -(-low // every) * every
    return list(range(first, min(high, first + every * (count - 1)) + 1, every))


async def _as_future(ref: Any) -> Any:
    try:
        return await ref
    except Exception:  # surfaced by ray.get in complete / finish_write
        return None
