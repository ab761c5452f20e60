"""One study's trials on a search plan: admission, results, stops,
failures, the time budget, what the driver hears, restore and the study's
end. Ray-free.

A `StudyTrials` never runs a batch: the loop that does (`batch_loop.BatchLoop`,
with one study in a `StudyController`, with many in a plan service's
`SharedPlan`) hands it its trials' results and failures, and it reaches the
loop through the small port `LoopPort` declares, never through the loop's
attributes. The trials' states and what a trial scheduler's decisions do to
the plan are `planning.lifecycle`'s, shared with the simulator.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from typing import Any, Protocol

from ray_stagetree.execution.retention import save_frequency, saves_at_end
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
from ray_stagetree.planning.plan import PlanNode, Request, SearchPlan
from ray_stagetree.runtime.control.driver_feed import DriverFeed
from ray_stagetree.runtime.control.experiment_state import Restore, StudyState, trial_summary
from ray_stagetree.runtime.control.failures import Failures
from ray_stagetree.runtime.control.held_results import HeldResults
from ray_stagetree.runtime.control.messages import REPORTED_AGAIN, CallbackAnswer, Progress, TrialSummary
from ray_stagetree.runtime.control.result_rows import ResultRows, expected_metrics, metric_consumers
from ray_stagetree.runtime.control.spec import StudySpec
from ray_stagetree.runtime.control.time_budget import TimeBudget
from ray_stagetree.runtime.control.trial_checkpoints import TrialCheckpoints
from ray_stagetree.runtime.control.trials import FolderNames, TrialInfo, TrialState, returned_result, trial_name
from ray_stagetree.trial_schedulers.host import SchedulerHost

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


class LoopPort(Protocol):
    """What a study asks of the loop that runs its batches."""

    def wake(self) -> None:
        """Something changed: the loop dispatches again at its next turn."""

    def configure_node(self, node: PlanNode, state: TrialState, study: StudyTrials, restored: bool = False) -> None:
        """The trial's request is on ``node``: the first trial requesting a
        node gives it the config its batches run (`studies.NodeConfigs`);
        a restored trial gives its node the user's objects again."""

    def release_unneeded(self) -> None:
        """A trial ended: release the parked trainables no unfinished trial needs."""

    def held_trials(self) -> set[str]:
        """The trials of the batches running on workers now."""

    def stalled(self) -> list[tuple[int, set[str], float]]:
        """(batch id, its trials, seconds) of each running batch that has reported nothing for long."""

    def figures(self) -> dict[str, Any]:
        """The loop's figures the progress line shows (`Progress`'s
        ``unique_iterations``, ``total_iterations``, ``state_seconds``, ``restarts``)."""


class StudyTrials:
    """One study's trials on ``plan``: the searcher's trials admitted, their
    results checked, made Tune rows and decided on, their failures counted,
    the driver told (`progress`), and their summaries (`results`).

    Parameters
    ----------
    spec:
        The study, validated by the Tuner.
    plan:
        The search plan its trials are requested on (the loop's, maybe shared).
    port:
        The loop that runs its batches (`LoopPort`).
    store:
        Where its trials' kept checkpoints are exported at its end (the
        checkpoint store, or a plan service's view of it in the study's folder).
    study_id:
        Its name on a shared plan ("" for a study of its own).
    weight:
        Its weight in the share of a shared plan's workers (`planning.fair_share`).
    share_key:
        Its trials' share key in the plan (a shared plan's: its trainable identity).
    """

    def __init__(
        self,
        spec: StudySpec,
        plan: SearchPlan,
        port: LoopPort,
        store: Any,
        study_id: str = "",
        weight: float = 1.0,
        share_key: str = "study",
    ) -> None:
        self.spec = spec
        self.plan = plan
        self.port = port
        self.store = store
        self.study_id = study_id
        self.weight = weight
        self.share_key = share_key
        restore = spec.restore
        self.trial_source = spec.trial_source
        horizon = math.inf if spec.horizon is None else spec.horizon
        if restore is not None:
            self.trial_source, self.host = restore.state.source, restore.state.host
            self.host.attach(self.end_trial, self.searcher())
        else:
            # The searcher is told of pauses (HyperBandForBOHB).
            resources = spec.loop.worker.resources or None
            self.host = SchedulerHost(
                spec.scheduler, spec.metric, spec.mode, horizon, self.end_trial, self.searcher(), resources
            )
        self.lifecycle = TrialLifecycle(
            plan, self.host, self.trial_source, self.trial_share_key, self._next_request, self._requested, self._ended
        )
        self.trials: dict[str, TrialState] = self.lifecycle.trials
        self.folders = FolderNames(self.trials)
        # Stop criteria, and schedulers other than ASHA/HyperBand/PBT/FIFO, may
        # end a trial at any result: its request then runs one iteration ahead
        # (the batch continues live), so nothing trains past a stopping result.
        self.every_result = (
            spec.stopper is not None or bool(spec.stop_thresholds) or not self.host.decides_at_milestones
        )
        # A batch continuing live past a scheduler's decision point still
        # checkpoints there: PBT exploits fork from it, and a worker lost later
        # resumes from it. (Not at every iteration of a one-ahead request.)
        self.keeps_decision_points = self.host.population is not None or (
            not self.every_result and spec.horizon is not None
        )
        # The results the plan already holds where trials' requests move on (work shared with other trials).
        self.held = HeldResults(self._held_history, lambda trial_id: self.trials[trial_id].rows, self._take_result)
        # The time budget counts from here, as Tune's from its loop's first step: starting
        # the workers is in it, starting the loop's actor is not.
        self.budget = TimeBudget(spec.time_budget_s)
        self.failures = Failures(spec.max_failures, spec.restore_retries, spec.fail_fast)
        self.feed = DriverFeed()  # what the driver hears at its next poll (`progress`)
        # The trials' checkpoints in their folders, and the driver told of them.
        self.checkpoints = TrialCheckpoints(
            store, plan, self.feed, spec.export_each_checkpoint, spec.checkpoint_config, self.trials
        )
        self.rows = ResultRows(
            spec.metric,
            metric_consumers(self.searcher(), self.host.scheduler),
            spec.stop_thresholds,
            spec.stopper,
            self.feed.warn,
            expected_metrics(spec.metric, self.searcher(), self.host.scheduler),
            spec.strict_metrics,
        )
        self._shown: dict[str, str] = {}  # each trial's status as the driver was last told it
        self._held_before: set[str] = set()
        self.iterations, self.worker_seconds = 0, 0.0  # the iterations trained for it, their worker-seconds (`credit`)
        self.finalized: bool | None = False  # None while its end is being written

    @property
    def order_sensitive(self) -> bool:
        """Its trial scheduler compares trials, deciding on the order they reach it (issue 31)."""
        return self.host.order_sensitive

    def searcher(self) -> Any:
        """The study's searcher as it is now (None without one): the driver hands
        its state to the user's object (`tune_compat.adopt_searcher_state`)."""
        return getattr(self.trial_source, "searcher", None)

    def scheduler(self) -> Any:
        """The study's trial scheduler as it is now: the driver hands its state to the user's object."""
        return self.host.scheduler

    def trial_share_key(self, trial_id: str) -> str:
        """A trial's share key in the plan: trials share stages only under one key.
        (The default "study" is in the plans studies saved: it stays, so that a
        restored or resumed study's new trials share with its old ones.)"""
        if self.spec.stage_sharing:
            return self.share_key
        return f"{self.study_id}/{trial_id}" if self.study_id else trial_id

    def credit(self, iterations: int, seconds: float) -> None:
        """Work trained for it: its part of a batch that served it."""
        self.iterations += iterations
        self.worker_seconds += seconds

    # -- restore ---------------------------------------------------------------

    def restore(self, restore: Restore) -> None:
        """Continue a snapshot: trials come back as they stood, then Tune's
        restore options apply to each (`Restore.action`)."""
        state = restore.state
        self.iterations, self.worker_seconds = state.iterations, state.worker_seconds
        self.budget.restored(state.elapsed)
        for trial in state.trials:
            self.lifecycle.add(trial)
            record = self.plan.trials.get(trial.trial_id)
            if record is not None:
                trial.node = record.request.node
                self.port.configure_node(trial.node, trial, self, restored=True)
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

    def state(self) -> StudyState:
        """The study's snapshot, for Tuner.restore."""
        return StudyState(
            plan=self.plan.records(),
            objects=self.plan.objects(),
            trials=[dataclasses.replace(trial, node=None) for trial in self.trials.values()],
            source=self.trial_source,
            host=self.host,
            iterations=self.iterations,
            worker_seconds=self.worker_seconds,
            elapsed=self.budget.elapsed,
        )

    # -- admission -------------------------------------------------------------

    def admit(self) -> bool:
        """Admit the trial source's next trials, up to `ADMIT_PER_TURN`; True when
        more may come at once: it stopped there, or at the pending-trial limit
        after admitting some (dispatched, they wait no more)."""
        for admitted in range(ADMIT_PER_TURN):
            if self.lifecycle.full(self.spec.max_concurrent_trials) or self.budget.over() or self.failures.halted:
                return False
            if self.lifecycle.pending_full(self.spec.max_pending_trials, self.spec.loop.num_workers):
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
        info = TrialInfo.tagged(trial_id, config, self.spec.trainable_name, self.spec.tuned_paths)
        name = trial_name(self.spec.trial_name_creator, info, "trial_name_creator", folder=False)
        if self.spec.trial_name_creator is not None:  # Tune's default folder name starts with it
            info.custom_name = name
        return TrialState(
            trial_id=trial_id,
            config=config,
            plain=frozenset(trial_config.names) - trial_config.declared,
            name=name,
            dirname=self.folders.named(self.spec.trial_dirname_creator, info),
            experiment_tag=info.experiment_tag,
            tune_saves=frozenset() if self.spec.class_trainable else None,
            resources=None if self.spec.trial_request is None else self.spec.trial_request(config),
        )

    # -- results and decisions -------------------------------------------------

    def result_checkpointed(self, checkpointed: bool) -> None:
        """Whether the results that follow came with a checkpoint: as in Ray,
        PBT clones only a result that did."""
        if self.host.population is not None:
            self.host.population.checkpointed = checkpointed

    def _report_again(self, state: TrialState, iteration: int, metrics: dict[str, Any]) -> None:
        """An iteration the trial reported before, trained again: a failed
        trial's retry shows it again (`Result.metrics_dataframe`, the
        loggers, ``on_trial_restore`` where it restored from a checkpoint),
        as Tune's retry reports it again; its scheduler and searcher heard it
        once. Iterations retrained for other reasons (an evicted checkpoint,
        a stage another trial needed) are not shown."""
        if iteration > state.retrying_until:
            return
        row = self.rows.row(state, iteration, metrics, self.host.horizon)
        state.reported.append(row)
        self.feed.row({**row, REPORTED_AGAIN: True})
        if iteration == state.retrying_until:
            state.retrying_until = 0

    def add_result(self, state: TrialState, iteration: int, metrics: dict[str, Any]) -> None:
        """The trial's result at ``iteration``: checked, made a Tune row,
        decided on by its scheduler and told to its searcher."""
        # An iteration trained again (a retry, an evicted checkpoint) was
        # already reported: searchers and schedulers see each iteration once.
        state.restore_failures = 0  # it trains: its checkpoint loaded (Tune resets the count on restore)
        self.held.reported()
        if state.status in ENDED:
            return
        if iteration in state.rows:
            self._report_again(state, iteration, metrics)
            return
        missing = self.rows.missing_metric(state, iteration, metrics)
        if missing is not None:  # Tune's run fails: so does the study (the Tuner raises it)
            self.abort(missing)
            return
        invalid = self.rows.invalid(state, iteration, metrics)
        if invalid is not None:
            self.fail({state.trial_id}, invalid, retry=False)  # a retry would report the same value
            return
        row = self.rows.row(state, iteration, metrics, self.host.horizon)
        ended = bool(metrics.get("done", False))
        # A PBT exploit took it back to an earlier checkpoint: Tune logs the iterations after it again.
        again = bool(state.reported) and state.reported[-1]["training_iteration"] >= iteration
        self.lifecycle.record(state, iteration, row)
        state.reported.append(row)
        self.feed.announce(state)
        self.feed.row({**row, REPORTED_AGAIN: True} if again else row)
        if not row["done"] and self.rows.stop_met(state.trial_id, row):
            row["done"] = ended = True  # Tune's stop criteria end a trial without asking its scheduler
        elif row["done"] and not ended and self.spec.horizon_is_max_t and not self.rows.stop_met(state.trial_id, row):
            self._ask_at_max_t(state, row)
        halt = self.rows.stop_all()
        if halt:
            row["done"] = ended = True
        if row["done"]:  # Tune tells the searcher of a done result at the trial's end only (on_trial_complete)
            if halt:
                self.halt(at_once=True)
            # The horizon, or the trainable reported done (Tune ends the trial).
            self.end_trial(state.trial_id) if ended else self.lifecycle.finish(state)
        else:
            # Tune's order: the scheduler sees a result before the searcher does.
            tell_searcher = functools.partial(self.trial_source.on_result, state.trial_id, row)
            self.lifecycle.decide(state, iteration, row, then=tell_searcher)
        self.checkpoints.decided(state, iteration, row, self.host.population)
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
        """The lifecycle moved the trial's request on from ``iteration``: the
        results the plan already holds beyond it (work shared with other
        trials) are the trial's too (`held_results`)."""
        self.port.configure_node(request.node, state, self)
        self.port.wake()
        self.held.moved(state.trial_id, iteration)

    def _held_history(self, trial_id: str) -> dict[int, dict[str, Any]] | None:
        if trial_id not in self.plan.trials or self.trials[trial_id].status in ENDED:
            return None
        return self.plan.history(trial_id)

    def _take_result(self, trial_id: str, iteration: int, metrics: dict[str, Any]) -> None:
        self.add_result(self.trials[trial_id], iteration, metrics)

    def _next_request(self, trial_id: str, iteration: int) -> int:
        """The iteration a trial at ``iteration`` is requested to: its scheduler's next
        decision point, or the next iteration where any result may end it."""
        decision = self.host.next_decision(trial_id, iteration)
        return iteration + 1 if self.every_result or math.isinf(decision) else decision

    # -- ends ------------------------------------------------------------------

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

    def trainable_returned(self, trial_id: str, facts: dict[str, Any] | None = None) -> None:
        """The function returned instead of training the trial's next
        iteration: the trial ends at its last result, as Tune ends a trial
        whose function returns; with ``facts`` where it reported nothing (`returned_result`)."""
        state = self.trials[trial_id]
        if state.status not in ENDED:
            if state.reported:
                state.reported[-1]["done"] = True
            elif facts is not None:
                state.returned_result = returned_result(state, facts)
            self.end_trial(trial_id)

    def _ended(self, state: TrialState) -> None:
        """The lifecycle ended a trial: the driver hears of it, and the loop
        wakes (batches no live trial needs are pre-empted)."""
        if state.status == ERROR:
            self.feed.announce(state)  # every errored trial has its folder, as each trial Tune ran has
            self.feed.event("error", state, error=state.error, iterations=max(state.rows, default=0))
        else:
            self.feed.event("complete", state)
            self.checkpoints.ended(state)
        self.port.release_unneeded()
        self.port.wake()

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
        end in error. ``retry`` False: a retry would fail the same way.
        ``error_pickle``: the trainable's exception as `Result.error` gives it.
        A retried trial goes to the end of the trials, as Tune requeues it
        (the order of ``ResultGrid``, in which ``get_best_result`` breaks ties)."""
        for trial_id in [trial_id for trial_id in self.trials if trial_id in trial_ids]:
            state = self.trials[trial_id]
            if state.status in ENDED:
                continue
            if self.failures.retried(state, retry, in_restore):
                self.trials[trial_id] = self.trials.pop(trial_id)
                state.retrying_until = max(state.rows, default=0)
                self.feed.event("recover", state, error=error, iterations=state.retrying_until)
            else:
                state.error, state.error_pickle = error, error_pickle
                self.lifecycle.fail(state)
                self._after_error()
                self.resume_paused()

    def abort(self, error: str) -> None:
        """The study cannot go on (no worker can run the trainable, a result
        lacks a metric Tune's strict check asks for): every live trial ends
        in error and the study stops (the Tuner raises ``error``)."""
        self.failures.abort(error)
        for state in self.trials.values():
            if state.status in UNFINISHED:
                self.lifecycle.abort(state)
                state.error = error
                self.feed.announce(state)
                self.feed.event("error", state, error=error)

    def _after_error(self) -> None:
        """With ``fail_fast``, the first errored trial ends the study."""
        if self.failures.ends_study():
            self.halt(at_once=True)

    def halt(self, at_once: bool = False) -> None:
        """End the study: no new trial, the others stop where they are (fail_fast, a stopper's ``stop_all``,
        a driver interrupted); ``at_once``: as past the time budget, Tune's stop of the first two."""
        if at_once:
            self.budget.end_now()
        self.feed.release()  # a trainable waiting for the driver's callbacks stops at its next report
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

    def enforce_budget(self) -> bool:
        """At each turn of the loop (Tune's step): a stopper's ``stop_all`` ends the study; past the time
        budget its trials stop (running batches at their next report); True when it is past (the loop
        kills batches that do not stop, `TimeBudget.to_kill`)."""
        if not self.failures.halted and self.rows.stop_all():
            self.halt(at_once=True)
        if not self.budget.over():
            return False
        for state in list(self.trials.values()):
            if state.status in LIVE:
                self.stop_trial(state.trial_id)
        return True

    def wake_in(self, running: list[int]) -> float | None:
        """Seconds until the loop must wake for it: its time budget (over the
        ``running`` batch ids), its stopper to ask, a searcher that suggested nothing to ask again."""
        stopper = None if self.failures.halted else self.rows.poll_in()
        searcher = SEARCHER_POLL_S if self.lifecycle.source_waits else None
        return min((due for due in (self.budget.wake_in(running), stopper, searcher) if due is not None), default=None)

    def status_of(self, trial_id: str) -> str | None:
        state = self.trials.get(trial_id)
        return None if state is None else state.status

    def output(self, trial_id: str, chunks: list[tuple[str, str]]) -> None:
        """What a batch serving the trial printed, ``(stream, text)``, into its
        folder's files (``RunConfig(log_to_file=...)``), by the driver."""
        if self.spec.log_files is not None and trial_id in self.trials:
            files = dict(zip(("stdout", "stderr"), self.spec.log_files))
            self.feed.output(trial_id, [(files[stream], text) for stream, text in chunks if files[stream]])

    def saved(self, state: TrialState, node: Any, iteration: int) -> None:
        """A checkpoint on the trial's path was registered at ``iteration`` (`TrialCheckpoints.saved`)."""
        self.checkpoints.saved(state, node, iteration)

    async def finalize(self) -> list[str]:
        """The study's end: paused trials close, and kept checkpoints go into
        the trials' folders (`study_end`); what storage refused, as messages."""
        self.feed.release()
        for state in self.trials.values():
            if state.status == PAUSED:  # its scheduler never resumed it
                self.lifecycle.close(state)
                self.feed.event("complete", state)
        return await self.checkpoints.at_end(self.trials.values())

    def warn_unwritten(self, unwritten: list[str]) -> None:
        """Tell the driver what storage refused at the study's end."""
        if unwritten:
            self.feed.warn(
                f"storage under {self.spec.loop.experiment_path!r} refused part of the study's end, which is kept in "
                f"the returned results only: {'; '.join(unwritten[:3])}"
                + (f" (and {len(unwritten) - 3} more)" if len(unwritten) > 3 else "")
            )

    # -- what a batch of its trials runs ---------------------------------------

    def trial_context(self, trial_id: str) -> dict[str, Any]:
        """The batch fields that name the trial a node was configured for (`StudySpec.batch_trial`)."""
        return self.spec.batch_trial(self.trials.get(trial_id))

    def configured_saves(self, segments: list[tuple[Any, int, int]], last: tuple[int, int] | None) -> list[int]:
        """CheckpointConfig's saves on a batch of ``segments`` (class
        trainables; the Tuner refuses them for functions): every
        ``checkpoint_frequency``-th iteration from the last reported
        (``last``: node id and iteration, or None before any report), and
        with ``checkpoint_at_end`` (a class trainable's default) that iteration if a trial
        of this study through there just ended there (saved after this reply)."""
        config = self.spec.checkpoint_config
        at_end = self.spec.class_trainable and saves_at_end(config)
        start, stop = segments[0][1], segments[-1][2]
        # From the iteration last reported: at the batch's end the worker decides on its save after this reply.
        low = last[1] if last is not None else start + 1
        every = save_frequency(config)
        iterations = _multiples(every, low, stop, SAVES_AHEAD) if every > 0 else []
        if at_end and last is not None:
            node_id, iteration = last
            through = self.plan.trials_through(self.plan.nodes[node_id], iteration)
            done = [self.trials[t] for t in through if t in self.trials and self.trials[t].status == TERMINATED]
            if any(state.rows and max(state.rows) == iteration for state in done):
                iterations.append(iteration)
        return iterations

    # -- the driver's --------------------------------------------------------------

    def progress(self) -> Progress:
        """What happened since the last call, for the driver's reporter and
        callbacks: the study's figures, and `DriverFeed.take`'s ``rows``
        (the new results), ``events`` (the trials' lifecycle) and ``warnings``."""
        news = self.feed.take()
        held = self.port.held_trials() & self.trials.keys()
        return Progress(
            status=self._shown_counts(held),
            statuses=self._status_changes(held),
            iterations=self.iterations,
            worker_seconds=self.worker_seconds,
            **self.port.figures(),
            rows=news["rows"],
            events=news["events"],
            rows_through=news["rows_through"],
            elapsed=self.budget.elapsed,
            study_error=self.failures.study_error,
            warnings=news["warnings"],
            scheduler_log=self.host.population.take_log() if self.host.population is not None else (),
            pbt_policy=self._pbt_policy(),
            output=news["output"],
            stalled=self._stalled(),
            done=bool(self.finalized),
        )

    async def answered_progress(self, answer: CallbackAnswer | None, wait_s: float) -> Progress:
        """`progress`, after the driver's ``answer`` to the last poll, once a
        trainable waits for the driver's callbacks or ``wait_s`` passed."""
        if answer is not None:
            self.feed.answer(*answer)
        if wait_s > 0:
            await self.feed.driver_needed(wait_s)
        return self.progress()

    def _pbt_policy(self) -> tuple[tuple[str, str, list[Any]], ...]:
        """PBT's exploits since the last poll, each trial named by its experiment tag as Ray's rows name them."""
        if self.host.population is None:
            return ()
        trials = self.trials
        return tuple(
            (
                step.trial_id,
                step.source_id,
                step.row(trials[step.trial_id].experiment_tag, trials[step.source_id].experiment_tag),
            )
            for step in self.host.population.take_policy()
        )

    def _shown_counts(self, held: set[str]) -> dict[str, int]:
        """Trials by status as the progress line shows them: RUNNING (to the
        trial scheduler, a trial admitted and not ended) only while a worker
        holds the trial (``held``), else PENDING, waiting for one, as Tune
        says of a trial without an actor."""
        counts = self.lifecycle.counts()
        waiting = counts.get(RUNNING, 0) - sum(1 for t in held if self.status_of(t) == RUNNING)
        if waiting:
            counts[RUNNING] -= waiting
            counts[PENDING] = counts.get(PENDING, 0) + waiting
        return {status: count for status, count in counts.items() if count}

    def _status_changes(self, held: set[str]) -> dict[str, tuple[str, str]]:
        """The trials whose status as shown (`_shown_counts`' words) changed
        since the last poll, (folder, status) by id: those the lifecycle
        changed, and those a worker took up or let go."""
        touched = self.lifecycle.take_changed() | (held ^ self._held_before)
        self._held_before = held
        changes = {}
        for trial_id in touched:
            state = self.trials.get(trial_id)
            if state is None:
                continue
            shown = PENDING if state.status == RUNNING and trial_id not in held else state.status
            if self._shown.get(trial_id) != shown:
                self._shown[trial_id] = shown
                changes[trial_id] = (state.dirname, shown)
        return changes

    def _stalled(self) -> list[tuple[str, float]]:
        """(its trials, seconds) of each running batch that has reported
        nothing for long, and serves its trials or no trial at all (a trainable stuck, or slower than expected)."""
        stalled = []
        for batch_id, trial_ids, silent in self.port.stalled():
            names = [self.trials[t].name or t for t in sorted(trial_ids) if t in self.trials]
            if names or not trial_ids:
                stalled.append((", ".join(names) or f"batch {batch_id}", silent))
        return stalled

    def results(self, first: int = 0, count: int | None = None) -> list[TrialSummary]:
        """The summaries of trials ``first`` to ``first + count`` (all from ``first`` when ``count`` is None)."""
        stop = None if count is None else first + count
        return [trial_summary(state) for state in itertools.islice(self.trials.values(), first, stop)]


def _multiples(every: int, low: int, high: int, count: int) -> list[int]:
    """The first ``count`` multiples of ``every`` in ``[low, high]``."""
    first = -(-low // every) * every
    return list(range(first, min(high, first + every * (count - 1)) + 1, every))
