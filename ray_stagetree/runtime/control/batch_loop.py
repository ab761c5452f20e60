"""The Ray loop over one search plan and the studies whose trials it holds:
dispatch stage batches to stage workers as the execution policy chooses,
fold what workers report into the plan and hand each trial's results and
failures to its study (`study_trials.StudyTrials`), and handle what only a
Ray loop meets: batches that end or fail, workers and nodes that die, time
budgets, checkpoints in the object store, snapshots, the end.

A `StudyController` runs it with one study; a plan service's `SharedPlan`
with the studies that attach to it. The studies reach the loop through
`study_trials.LoopPort`, which it implements, and it calls them through
their public methods only. What is neither the loop nor a study's trials is
a manager beside it, each tested without Ray (as Tune's controller composes
its managers): `worker_pool.WorkerPool` (workers, running batches, lost
nodes), `snapshots.Snapshots`, `preemption.Preemption` (time-sharing),
`execution.parking.Parking`, `checkpoint_store.CheckpointStore`, and
`NodeConfigs` below.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from typing import Any

import ray

from ray_stagetree.execution.batches import BatchOutcome, BatchSpec, FlushReply, reported_checkpoint_key
from ray_stagetree.execution.parking import Parking
from ray_stagetree.execution.storage import CheckpointUnavailableError
from ray_stagetree.planning.lifecycle import ENDED, PAUSED, UNFINISHED
from ray_stagetree.planning.plan import PlanNode, RequestState, SearchPlan
from ray_stagetree.planning.policies import ExecutionPolicy, StageBatch, get_policy
from ray_stagetree.runtime.control.checkpoint_store import CheckpointStore
from ray_stagetree.runtime.control.failures import SharedStageRetries, as_tune_raises
from ray_stagetree.runtime.control.handovers import Handovers
from ray_stagetree.runtime.control.notices import WorkerNotices
from ray_stagetree.runtime.control.preemption import Preemption
from ray_stagetree.runtime.control.resources import cluster_totals, workers_that_fit
from ray_stagetree.runtime.control.run_records import RunRecords, SharingFigures
from ray_stagetree.runtime.control.snapshots import NoSnapshots
from ray_stagetree.runtime.control.spec import LoopSpec
from ray_stagetree.runtime.control.studies import NodeConfigs, Studies
from ray_stagetree.runtime.control.study_end import LoopEnd
from ray_stagetree.runtime.control.study_trials import StudyTrials
from ray_stagetree.runtime.control.trials import TrialState
from ray_stagetree.runtime.control.worker_pool import WorkerPool
from ray_stagetree.runtime.control.worker_shapes import Shape, fits
from ray_stagetree.runtime.workers.trial_errors import pack_exception

logger = logging.getLogger(__name__)

#: Seconds between an open-ended loop's checks of its studies' ends (and,
#: in a plan service, of attached drivers) when nothing else wakes it.
TICK_S = 0.5


def policy_for(spec: LoopSpec, horizon: int | None) -> ExecutionPolicy:
    """The spec's execution policy, bound to its workers and ``horizon``."""
    policy = get_policy(spec.policy)
    policy.bind(spec.num_workers)
    policy.set_horizon(horizon)
    return policy


class BatchLoop:
    """The loop over ``plan`` for the studies in ``studies``.

    Parameters
    ----------
    spec:
        What the loop runs on: the workers (``worker``, ``num_workers``),
        the storage (``experiment_path``, ``storage_filesystem``), ``stall_warning_s``.
    plan, store, policy:
        The search plan, the checkpoint store and the execution policy.
    snapshots:
        When and how the loop's state is saved (`snapshots.Snapshots`).
    open_ended:
        The loop goes on with no study unfinished, until `close` (a plan
        service); otherwise it ends with its studies.
    """

    def __init__(
        self,
        spec: LoopSpec,
        plan: SearchPlan,
        store: CheckpointStore,
        policy: ExecutionPolicy,
        snapshots: NoSnapshots,
        open_ended: bool = False,
    ) -> None:
        self.spec = spec
        self.plan = plan
        self.store = store
        self.policy = policy
        self.snapshots = snapshots
        self.open_ended = open_ended
        self.studies = Studies()
        self.nodes = NodeConfigs(plan)
        self.end = LoopEnd(
            plan, store, snapshots, self.studies, self.nodes, f"{spec.experiment_path}/plan", spec.storage_filesystem
        )
        self.parking = Parking(plan, spec.parked_per_worker)
        self.handovers = Handovers(spec.worker.stop)
        self.pool = worker_pool(spec, stop=self._retire_worker)
        self._adopted: list[Any] = []  # the workers the driver started (`run`)
        self.preemption = Preemption(plan, self.warn)
        self.shared_retries = SharedStageRetries()
        self._wake = asyncio.Event()
        self._error: Exception | None = None  # raised while a worker reported: the loop stops with it
        self.iterations = 0
        self.worker_seconds = 0.0  # batches' dispatch-to-completion time, summed
        self.runs = RunRecords(plan)  # the plan's runs (the monitor's timeline)
        self.notices = WorkerNotices(self.warn)
        self.sharing = SharingFigures(plan)
        self._closing = False

    # -- studies -----------------------------------------------------------------------

    def add_study(self, study: StudyTrials) -> None:
        self.studies.add(study)
        self.wake()

    def _through(self, node: PlanNode, iteration: int) -> list[tuple[str, StudyTrials]]:
        """The studies' trials whose path passes through ``(node, iteration)``,
        by trial id. (A plan continued by `Study` also holds the trials of
        earlier runs, and a shared plan those of studies gone: they share
        its nodes, but nothing here reports to them.)"""
        return self.studies.owning(self.plan.trials_through(node, iteration))

    def warn(self, warning: str) -> None:
        """The loop's own warning: every study's driver hears it."""
        self.studies.warn(warning)

    # -- the port its studies reach it through (study_trials.LoopPort) ------------------

    def wake(self) -> None:
        self._wake.set()

    def configure_node(self, node: PlanNode, state: TrialState, study: StudyTrials, restored: bool = False) -> None:
        self.nodes.configure(node, state, study, restored)

    def release_unneeded(self) -> None:
        """Release the parked trainables that no unfinished trial needs."""
        self._release(self.parking.unneeded(lambda trial_id: self.studies.status_of(trial_id) in UNFINISHED))

    def held_trials(self, batch_id: int | None = None) -> set[str]:
        """The trials of the batches running on workers (of ``batch_id`` alone, if given, running or just ended)."""
        batch_ids = [batch_id] if batch_id is not None else [r.batch.batch_id for r in self.pool.running.values()]
        return {t for b in batch_ids for request in self.plan.scheduled_requests(b) for t in request.trials}

    def stalled(self) -> list[tuple[int, set[str], float]]:
        """(batch id, trials, seconds) of each running batch that has reported
        nothing for ``stall_warning_s``: a trainable stuck, or slower than expected."""
        return [
            (batch.batch_id, self.held_trials(batch.batch_id), silent)
            for batch, silent in self.pool.stalled(self.spec.stall_warning_s)
        ]

    def figures(self) -> dict[str, Any]:
        """The plan's sharing, the snapshots' seconds, the workers' seconds by phase, the restarts at changed values."""
        figures = {"state_seconds": self.snapshots.seconds, "phase_seconds": dict(self.runs.phase_seconds)}
        return {**self.sharing.now(exact=not self.pool.running), **figures, "restarts": dict(self.notices.restarts)}

    # -- the loop ------------------------------------------------------------------------

    async def run(self, workers: list[Any]) -> None:
        """Run the loop on ``workers`` (from `WorkerSpec.start`, started by the
        driver with this actor so that both start up at once)."""
        self._adopted = list(workers)
        self.pool.adopt(workers)
        admitting = self.admit()
        # The future awaiting each ref outlives a turn: one resolving during a turn is seen by the
        # next, even by a turn that does not wait (admitting); a future made each turn never is.
        awaited: dict[Any, asyncio.Future] = {}
        while not self.snapshots.frozen:
            if self._error is not None:
                raise self._error
            self.enforce_budgets()
            for study in list(self.studies.values()):
                study.held.next_turn(idle=not self.pool.running)
            if await self._dispatch():
                continue
            if any(study.spec.max_pending_trials is not None for study in self.studies.values()):
                # The trials just dispatched wait no more: the searcher proposes
                # the next before their results come (Tune creates a trial as
                # the one before it starts, so a scheduler counts it in).
                admitting = self.admit() or admitting
            # While storage refuses the snapshot the study waits for it, even at its end: the final
            # checkpoints are only in memory.
            storage_down = self.snapshots.paused()
            if not self.pool.running and not self.store.pending_writes and not storage_down:
                if not self.unfinished():
                    if await self.end.may_end():
                        break
                    continue  # final checkpoints to train again, or storage refusing the snapshot
                # (Without a placed worker the study waits for Ray to place one, as Tune's pending trials.)
                if not self.plan.running_batches and not admitting and self.pool.idle and not self.pool.reshaping():
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
                await self._resolved(futures.get(future), awaited)
            if not self.snapshots.frozen:
                admitting = self.admit()
        for future in awaited.values():
            future.cancel()
        if not self.snapshots.frozen:
            await self.end.finalize()

    async def _resolved(self, ref: Any, awaited: dict[Any, asyncio.Future]) -> None:
        """What the loop waited on came: a worker placed, the snapshot
        written, a batch ended, a checkpoint stored (``ref`` None: woken)."""
        awaited.pop(ref, None)
        if ref in self.pool.starting:
            self.pool.placed(ref)  # it takes batches from the next turn
            return
        if ref is not None and ref is self.snapshots.in_flight:
            await self.snapshots.written()
            if self.store.unstored and self.snapshots.refused_since is None:
                self.store.rewrite_unstored(self.plan)
            return
        if ref is None or ref in self.pool.running:
            self.snapshots.changed = True  # woken (results, stops) or a batch ended
            if ref is not None:
                await self.complete(ref)
        elif await self.store.finish_write(self.plan, ref):
            # A copy refused again changes nothing: no snapshot (whose
            # success would retry the copy at once, a busy loop).
            self.snapshots.changed = True

    def admit(self) -> bool:
        """Each study admits its next trials; True when one may admit more at
        once (the loop does not wait for a report). An open-ended loop ends
        each study whose trials are all done as soon as none of its batches runs."""
        more = False
        for study in list(self.studies.values()):
            more = study.admit() or more
            if self.open_ended and not study.unfinished() and not self._serves(study):
                self.end.finalize_soon(study)
        return more

    def _serves(self, study: StudyTrials) -> bool:
        """Whether a batch on a worker serves a trial of ``study``, or was
        dispatched for one: a trial that ended at the batch's end gets its
        final checkpoint after its last result."""
        dispatched_for = (t for running in self.pool.running.values() for t in running.trials)
        return any(t in study.trials for t in self.held_trials()) or any(t in study.trials for t in dispatched_for)

    def unfinished(self) -> bool:
        """Whether the loop goes on once nothing runs."""
        if self.open_ended:
            return not self._closing
        return any(study.unfinished() for study in self.studies.values())

    def wake_in(self) -> float | None:
        """Seconds until the loop must wake without a report (a time budget,
        a searcher to ask again), None when nothing is due."""
        running = list(self.pool.running_workers())
        due = [due for study in self.studies.values() if (due := study.wake_in(running)) is not None]
        if self.open_ended:
            due.append(TICK_S)
        return min(due, default=None)

    def stuck(self) -> None:
        """Nothing runs or can be dispatched, yet a study is unfinished: a
        bug, unless a searcher suggests nothing yet (asked again in
        `study_trials.SEARCHER_POLL_S`, as Tune waits for it) or an
        open-ended loop has nothing to do."""
        if any(study.lifecycle.source_waits for study in self.studies.values()):
            return
        open_requests = [r for r in self.plan.open_requests() if r.trials]
        if open_requests or not self.open_ended:
            raise RuntimeError(
                f"no batch can be dispatched but {len(open_requests)} requests are open: {open_requests}"
            )

    def enforce_budgets(self) -> None:
        """Past a study's time budget its trials stop (running batches stop
        at their next report); a batch of its trials alone still running
        `time_budget.GRACE_S` later is killed with its worker: it cannot be
        stopped cooperatively."""
        over = [study for study in self.studies.values() if study.enforce_budget()]
        if not over:
            return
        running = self.pool.running_workers()
        for study in over:
            alone = [b for b in running if all(t in study.trials for t in self.held_trials(b))]
            for batch_id in study.budget.to_kill(alone):
                self.spec.worker.stop(running[batch_id])

    async def close(self) -> None:
        """End an open-ended loop (`run` returns once running batches end)."""
        self._closing = True
        self._wake.set()

    # -- dispatch ------------------------------------------------------------------------

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
            shape = self.studies.shape_of(batch, self.pool.shape)
            worker = self.pool.take_parked(parked.worker) if parked is not None else self.pool.take(shape)
            if worker is None:  # its trials' resources changed (ResourceChangingScheduler): it waits for a worker
                self.pool.want(shape)
                self.plan.release_batch(batch.batch_id)
                continue
            try:
                spec = await self._batch_spec(batch, parked)
            except CheckpointUnavailableError as error:
                logger.warning("%s; retraining it", error)
                self.plan.release_batch(batch.batch_id)
                self.pool.returned(worker)
                lost = True
                continue
            if parked is not None:
                self.parking.take(parked)
            ref = worker.run_batch.remote(spec)
            self.pool.dispatched(ref, worker, batch, spec)
            self.runs.began(batch.batch_id, self.pool.workers.index(worker) + 1)
            self.policy.started(batch, time.monotonic())
            for request in batch.requests:
                for trial_id in request.trials:
                    study = self.studies.of(trial_id)
                    if study is not None:
                        study.feed.announce(study.trials[trial_id])
        return lost

    async def _batch_spec(self, batch: StageBatch, parked: Any = None) -> BatchSpec:
        leaf = batch.stages[-1].node
        node = self.nodes[leaf.node_id]
        source = batch.source
        handle = None
        if parked is None and source is not None and not source.is_initialization:
            handle = await self.store.handle(self.plan, source.node, source.iteration)
        owners = [node.study] if node.study is not None else list(self.studies.values())
        # Named after the trial that configured its deepest node (none for a stored plan's node).
        named = {"experiment_name": self.spec.experiment_name}
        if node.study is not None:
            named = node.study.trial_context(node.trial_id)
        return BatchSpec(
            batch_id=batch.batch_id,
            config=node.config,
            trial_config=leaf.config,
            segments=[(segment.node_id, start, stop) for segment, start, stop in batch.segments],
            save_iterations={iteration for _, iteration in self.plan.checkpoints_needed(batch.batch_id)}
            | set(self.studies.configured_saves(self.plan, batch.batch_id)),
            source=handle,
            plain=node.plain,
            reproducibility=self.spec.worker.reproducibility,
            resumes=None if parked is None else parked.batch_id,
            reported_storage=self.store.sealed,
            source_point=None if source is None or source.node is None else (source.node.node_id, source.iteration),
            **batch_flags(owners, reproducible=self.spec.worker.reproducibility is not None),
            **named,
        )

    # -- reports from workers ------------------------------------------------------------

    def worker_report(self, outcome: BatchOutcome) -> FlushReply:
        """Fold a worker's records into the plan (trials' schedulers decide on
        them here); reply with the batch's checkpoint iterations, the iteration
        it may stop at, its end, later than before where it continues live,
        and whether its trainable parks there (`execution.parking`).

        An error raised here (a scheduler's or searcher's own, as Tune's
        ``fit()`` raises it) stops the loop with it: the batch ends, and
        `run` raises the error. (Raised at the worker, it failed the batch's
        trials and the study ended in a baffling "no batch can be
        dispatched".)"""
        if self.snapshots.frozen or self._error is not None:
            return FlushReply([], 0, 0)  # stop: the study was saved as it stood, or is over
        try:
            return self._fold(outcome)
        except Exception as error:
            self._error = as_tune_raises(error, any(s.spec.fail_fast == "raise" for s in self.studies.values()))
            self._wake.set()
            return FlushReply([], 0, 0)

    async def report_and_ask(self, outcome: BatchOutcome, node_id: int, iteration: int) -> tuple[FlushReply, bool]:
        """`worker_report` of a class trainable's result at ``iteration`` of ``node_id``, answered once
        the drivers of the studies it serves had it: did a callback ask to checkpoint it (``SHOULD_CHECKPOINT``)?"""
        reply = self.worker_report(outcome)
        through = self._through(self.plan.nodes[node_id], iteration)
        feeds = {id(study): study.feed for _, study in through if study.spec.callbacks_ask_checkpoints}
        await asyncio.gather(*(feed.had_all() for feed in feeds.values()))
        return reply, any([study.checkpoints.asked(study.trials[trial_id], iteration) for trial_id, study in through])

    def _fold(self, outcome: BatchOutcome) -> FlushReply:
        self.ingest(outcome)
        batch_id = outcome.batch_id
        self.pool.heard(batch_id)
        self.enforce_budgets()  # this batch stops here, not at its next report
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
        if at_end and self._continue_live(batch_id, node, stop, outcome.can_checkpoint):
            extended = self.plan.extend_batch(batch_id)
            # (A trainable that reported no checkpoint here gets no request
            # for one: it has nothing to save, and nothing forks here.)
            if extended is not None and self.studies.keep_decision_points() and outcome.can_checkpoint:
                save_iterations.append(stop)
        park = (
            at_end
            and extended is None
            and not outcome.can_checkpoint
            and self.parking.wanted(node, stop, lambda trial_id: self.studies.status_of(trial_id) == PAUSED)
        )
        save_iterations += [iteration for _, iteration in self.plan.checkpoints_needed(batch_id)]
        save_iterations += self.studies.configured_saves(self.plan, batch_id, outcome)
        needed = self.plan.needed_until(batch_id)
        return FlushReply(save_iterations, needed[1] if needed is not None else 0, extended or stop, park)

    def _continue_live(self, batch_id: int, node: PlanNode, stop: int, can_checkpoint: bool) -> bool:
        """Should a batch at a scheduler's decision point go on live? Yes,
        unless its trials need a worker its own does not cover (their
        resources changed), or the policy should choose again: every worker
        is busy, other work waits for one, and the trainable checkpoints (so
        stopping here costs a checkpoint, not a retrained prefix)."""
        if can_checkpoint and self.studies.change_resources():
            needed = self.studies.shape_of_trials([t for t, _ in self._through(node, stop)], self.pool.shape)
            if not self.pool.runs_on(batch_id, needed):
                return False
        if not self.studies.keep_decision_points() or not can_checkpoint or self.pool.idle_count() > 0:
            return True
        serving = {t for t, study in self._through(node, stop) if study.status_of(t) in UNFINISHED}
        waiting = (
            request
            for request in self.plan.open_requests()
            if request.trials
            and request.state is RequestState.NOT_SCHED
            and not (request.node is node and request.iteration > stop)
        )
        return not self.policy.yields(self.plan, serving, waiting)

    def ingest(self, outcome: BatchOutcome) -> None:
        """Fold a worker's records into the plan and its trials' studies, and take its checkpoints into the store."""
        self.notices.heard(outcome)
        self.runs.spent(outcome.batch_id, outcome.phases)
        for node_id, iteration, chunks in outcome.output:  # log_to_file: for each trial through where it printed
            self.studies.output(self.plan.trials_through(self.plan.nodes[node_id], iteration), chunks)
        for index, (node_id, iteration, metrics) in enumerate(outcome.records):
            checkpointed = iteration not in outcome.missing_checkpoints and (
                index < len(outcome.records) - 1 or outcome.can_checkpoint
            )
            for study in self.studies.values():
                study.result_checkpointed(checkpointed)
            node = self.plan.nodes[node_id]
            self.runs.reached(outcome.batch_id, node_id, iteration)
            self.iterations += 1
            self.plan.record_metrics(node_id, iteration, metrics)
            self.plan.record_progress(outcome.batch_id, node_id, iteration)
            through = self._through(node, iteration)
            for study in self.studies.served_by(through):
                study.credit(1, 0.0)
            for trial_id, study in through:
                study.add_result(study.trials[trial_id], iteration, metrics)
        if outcome.batch_id in self.plan.running_batches:  # the cost model's input
            self.plan.record_batch_timings(
                outcome.batch_id, [(node_id, at, row.get("time_this_iter_s")) for node_id, at, row in outcome.records]
            )
        worker = self.pool.worker_of(outcome.batch_id)
        for node_id, iteration, key, size in outcome.checkpoints:
            ref = self.handovers.take(worker, key)
            node = self.plan.nodes[node_id]
            self.store.add(self.plan, node, iteration, ref, size)
            self._saved(node, iteration)
        for node_id, iteration, info in outcome.stored_checkpoints:
            node = self.plan.nodes[node_id]
            if self.store.add_stored(self.plan, node, iteration, info):
                self._saved(node, iteration)
        if outcome.records or outcome.checkpoints:
            self._wake.set()

    def _saved(self, node: PlanNode, iteration: int) -> None:
        """A checkpoint at ``iteration`` of ``node`` is in: each trial through there hears of it."""
        for trial_id, study in self._through(node, iteration):
            study.saved(study.trials[trial_id], node, iteration)

    # -- batches that end ----------------------------------------------------------------

    async def complete(self, ref: Any) -> None:
        """The batch behind ``ref`` ended, failed, or its worker died."""
        running = self.pool.finished(ref)
        worker, batch, spec = running.worker, running.batch, running.spec
        if self.snapshots.frozen:
            return
        served = self.studies.served(self.held_trials(batch.batch_id))
        try:
            outcome: BatchOutcome = await ref
        except ray.exceptions.RayActorError as error:
            self._credit_seconds(served, running.dispatched)
            self.runs.ended(spec, None)
            self.pool.folded(batch.batch_id)
            # Its node may be gone: start no more workers than the cluster now holds.
            self.pool.lost(worker, workers_that_fit(self.spec.worker), self.spec.num_workers)
            self.handovers.stop(worker)  # a group's other ranks and its placement group
            self.parking.forget_worker(worker)
            # Result.error is Ray's RayActorError, as in Tune.
            died = f"the worker running batch {batch.batch_id} died: {error}"
            self.studies.fail(self.held_trials(batch.batch_id), died, True, False, pack_exception(error))
            self.plan.release_batch(batch.batch_id)
            return
        except ray.exceptions.RayError as error:  # its outcome could not come back (it failed to serialize)
            self._credit_seconds(served, running.dispatched)
            self.runs.ended(spec, None)
            self.pool.folded(batch.batch_id)
            unread = f"batch {batch.batch_id}'s outcome could not be read from its worker: {error}"
            self.studies.fail(self.held_trials(batch.batch_id), unread)
            self.plan.release_batch(batch.batch_id)
            self.pool.returned(worker)
            return
        self._credit_seconds(served, running.dispatched)
        if outcome.source_lost is not None or outcome.trainable_unloadable:
            self.runs.ended(spec, outcome)
            self.pool.folded(batch.batch_id)
            if outcome.source_lost is not None:
                # The starting checkpoint's only copy was on a node that is gone:
                # the batch starts again from its durable copy, or retrains.
                logger.warning("%s; starting the batch again", outcome.source_lost)
                if spec.resumes is None:
                    self.store.forget_copy(self.plan, batch.source.node, batch.source.iteration)
                self.plan.release_batch(batch.batch_id)
                self.pool.returned(worker)
                self._wake.set()
            else:
                for study in list(self.studies.values()):
                    study.abort(outcome.error)
                self.plan.release_batch(batch.batch_id)
            return
        shared_retry = outcome.error is not None and self.shared_retries.retry_batch(
            outcome, set(self._affected(outcome))
        )
        if shared_retry and outcome.error_checkpoint is not None:
            self._forget_error_checkpoint(worker, outcome)
        self.ingest(outcome)
        self.runs.ended(spec, outcome)
        self.pool.folded(batch.batch_id)
        if outcome.error is not None and not shared_retry:
            self._batch_failed(outcome)
        if outcome.returned_at is not None:
            self._trainable_returned(batch.batch_id, outcome.returned_at, outcome.returned_facts)
        last = outcome.records[-1] if outcome.records else None
        self.policy.ended(self.plan, batch.batch_id, time.monotonic(), last and (self.plan.nodes[last[0]], last[1]))
        self.preemption.ended(batch.batch_id)
        if outcome.parked:
            node, _, stop = self.plan.batch_segments(batch.batch_id)[-1]
            self._release(self.parking.park(worker, batch.batch_id, node, stop))
        self.plan.release_batch(batch.batch_id)
        self.release_unneeded()
        if outcome.worker_broken:
            self.pool.retire(worker)
            self.handovers.stop(worker)
        else:
            self.pool.returned(worker)

    def _credit_seconds(self, served: list[StudyTrials], dispatched: float) -> None:
        """A batch's dispatch-to-completion time, split between the studies it served (`Studies.served`)."""
        seconds = time.monotonic() - dispatched
        self.worker_seconds += seconds
        for study in served:
            study.credit(0, seconds / len(served))

    def _release(self, parked: list[Any]) -> None:
        for trainable in parked:
            trainable.worker.release.remote(trainable.batch_id)

    def _trainable_returned(self, batch_id: int, iteration: int, facts: dict[str, Any] | None) -> None:
        """The function returned after ``iteration`` iterations instead of training
        the next one (a finite loop): every trial that needs that next
        iteration on this path observes what the function saw, so it ends
        here, as Tune ends a trial whose function returns (``facts``: its
        process's, where it reported nothing)."""
        after = [node for node, start, stop in self.plan.batch_segments(batch_id) if start <= iteration < stop]
        if not after:
            return
        for trial_id, study in self._through(after[0], iteration + 1):
            study.trainable_returned(trial_id, facts)
        self.studies.resume_paused()

    def _affected(self, outcome: BatchOutcome) -> dict[str, StudyTrials]:
        """The live trials through the point where the trainable raised, with their studies."""
        node = self.plan.nodes[outcome.error_node]
        return {
            t: study for t, study in self._through(node, outcome.error_iteration) if study.status_of(t) not in ENDED
        }

    def _forget_error_checkpoint(self, worker: Any, outcome: BatchOutcome) -> None:
        """A shared stage's retry trains again from where the failed attempt
        started, as each of the sharing trials would in Tune, not from the
        checkpoint the trainable reported just before it raised: that one
        goes, from the worker's outbox or, where the worker stored it, from
        the plan."""
        point = outcome.error_checkpoint
        if outcome.checkpoints and outcome.checkpoints[-1][:2] == point:
            _, _, key, _ = outcome.checkpoints.pop()
            worker.take_checkpoint.remote(key)
            return
        outcome.stored_checkpoints = [stored for stored in outcome.stored_checkpoints if stored[:2] != point]
        recorded = self.plan.nodes[point[0]].checkpoints.get(point[1])
        if recorded is not None and recorded.path == reported_checkpoint_key(*point, outcome.batch_id):
            self.plan.drop_checkpoint(*point)

    def _batch_failed(self, outcome: BatchOutcome) -> None:
        """The trainable raised, and it counts against the trials it served."""
        affected = self._affected(outcome)
        if outcome.error_checkpoint is not None:
            for trial_id, study in affected.items():
                study.trials[trial_id].error_checkpoint = outcome.error_checkpoint
        self.studies.fail(
            set(affected), outcome.error, outcome.error_retryable, outcome.error_in_restore, outcome.error_pickle
        )

    def _retire_worker(self, worker: Any) -> None:
        """Stop a worker the pool retired to make room for one of another shape."""
        self.parking.forget_worker(worker)
        self.handovers.stop(worker)

    def shutdown_workers(self, spare: bool = False) -> list[int]:
        """Close the workers and stop them, but for, with ``spare``, those
        the driver started (`run`) that closed and are idle lone workers of
        the study's shape: their places in `run`'s list (`runtime.driver.kept_workers`)."""
        spare = spare and self.spec.worker.scaling is None
        for study in self.studies.values():  # no driver answers a trainable waiting for its callbacks any more
            study.feed.release()
        # One Ray has not placed holds nothing to close: it is waited for only to be kept (up to `close`'s wait).
        placed = [worker for worker in self.pool.workers if spare or worker not in self.pool.starting.values()]
        closed = self.spec.worker.close(placed)
        keep = [worker for worker in self._adopted if worker in closed] if spare else []
        spared = self.pool.shut_down(lambda worker: self.spec.worker.stop(worker, closed=True), keep)
        return [index for index, worker in enumerate(self._adopted) if worker in spared]


def batch_flags(owners: list[StudyTrials], reproducible: bool) -> dict[str, bool]:
    """What a batch's trainable does for the studies it serves: keep its output
    (``log_to_file``), wait for their callbacks' checkpoint requests, keep its
    object for the next batch (``reuse_actors``; not in a reproducible study,
    whose results must not depend on which batch a worker ran before)."""
    return {
        "log_to_file": any(study.spec.log_files is not None for study in owners),
        "ask_callbacks": any(study.spec.callbacks_ask_checkpoints for study in owners),
        "reuse_object": not reproducible and all(study.spec.reuse_objects for study in owners),
    }


def worker_pool(spec: LoopSpec, stop: Callable[[Any], None]) -> WorkerPool:
    """The loop's stage workers, of the study's shape and, as a scheduler
    changes trials' resources, of others; ``stop`` stops one it retires."""
    return WorkerPool(
        lambda shape: spec.worker.start(ray.get_runtime_context().current_actor, shape),
        spec.num_workers,
        placement=lambda worker: worker.pid.remote(),  # answered once the actor runs
        shape=Shape.from_options(spec.worker.options),
        room=lambda shapes: fits(shapes, cluster_totals()),
        stop=stop,
    )


async def _as_future(ref: Any) -> Any:
    try:  # shielded: a snapshot's write (`CheckpointStore.write_state`) goes on when the loop stops waiting for it
        return await asyncio.shield(ref)
    except Exception:  # surfaced by ray.get in complete / finish_write
        return None
