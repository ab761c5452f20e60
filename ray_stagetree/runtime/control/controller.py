"""The study controller: one Ray actor that owns the search plan, the
execution policy and the checkpoints of a study, and drives the workers.

It is the actor shell of a `batch_loop.BatchLoop` with one study
(`study_trials.StudyTrials`): it builds both from the Tuner's `StudySpec`
(a new plan, a resumed one, or a restored snapshot), snapshots the study
for ``Tuner.restore``, and answers the driver: `progress` at each poll,
`results` at the end, `searcher`, `interrupt`, `monitor_view`. A plan
service runs the same loop over many studies (`runtime.service.shared_plan`).

Its process may run several studies, one after the other: a driver that
fits again starts its next study in it (`begin`, see
`runtime.driver.controllers`) rather than paying another process's start.
"""

from __future__ import annotations

import asyncio
import gc
import time
from collections.abc import Callable
from typing import Any

import ray

from ray_stagetree.execution.storage import CheckpointStorage
from ray_stagetree.planning.plan import SearchPlan
from ray_stagetree.runtime.control.batch_loop import BatchLoop, policy_for
from ray_stagetree.runtime.control.checkpoint_store import CheckpointStore, storage_io
from ray_stagetree.runtime.control.experiment_state import STATE_FILE, dumps
from ray_stagetree.runtime.control.messages import CallbackAnswer, Progress, TrialSummary
from ray_stagetree.runtime.control.snapshots import Snapshots
from ray_stagetree.runtime.control.spec import StudySpec
from ray_stagetree.runtime.control.study_trials import StudyTrials

# (`TrialState` is importable from here for the snapshots written before it
# moved to trials.py: they name it here.)
from ray_stagetree.runtime.control.trials import TrialState
from ray_stagetree.runtime.workers.kept_process import modules_changed_since


class StudyController(BatchLoop):
    """One study's Ray actor: the loop (`BatchLoop`) over the study's own
    plan with its one `StudyTrials` (``self.study``).

    Parameters
    ----------
    spec:
        The study, validated by the Tuner.
    """

    def __init__(self, spec: StudySpec) -> None:
        self._storage_io = storage_io()  # this process's, for every study it runs (`forget`)
        self._process_started = time.time()
        self._start(spec)

    async def begin(self, spec: StudySpec) -> bool:
        """Run ``spec``'s study in this process, as a new controller would:
        False (and nothing changed) while anything of the last one still
        runs here, or where a module it imported changed on disk since
        (a user's scheduler or searcher, edited in a notebook)."""
        current = asyncio.current_task()
        if any(not task.done() for task in asyncio.all_tasks() if task is not current):
            return False
        if modules_changed_since(self._process_started):
            return False
        self.forget()
        self._start(spec)
        return True

    def forget(self) -> None:
        """Drop the study ended here (its plan, trials and checkpoints'
        references): the process waits for the driver's next study holding
        nothing of this one but the storage actor, which every call tells
        whose storage it writes (`StorageIO`), kept so that the next study
        does not pay another process's start."""
        io, started = self._storage_io, self._process_started
        vars(self).clear()
        gc.collect()
        self._storage_io, self._process_started = io, started

    def _start(self, spec: StudySpec) -> None:
        restore, loop = spec.restore, spec.loop
        if restore is not None:
            plan = SearchPlan.from_records(restore.state.plan, restore.state.objects)
        elif spec.resume:
            # Without its side file of objects (nothing here unpickles a plan): a node whose values JSON
            # cannot hold are fingerprints only is configured by the first trial requesting it.
            plan = SearchPlan.load(f"{loop.experiment_path}/plan", loop.storage_filesystem)
        else:
            plan = SearchPlan()
        store = CheckpointStore(
            CheckpointStorage(loop.experiment_path, loop.storage_filesystem),
            loop.checkpoint_budget_bytes,
            secret=loop.payload_key,
            trusted=loop.trust_storage,
            io=self._storage_io,
        )
        snapshots = Snapshots(
            lambda: dumps(self.study.state()),
            lambda data: store.write_state(STATE_FILE, data),
            loop.state_period_s,
            self.warn,
            wait_s=loop.storage_wait_s,
        )
        super().__init__(loop, plan, store, policy_for(loop, spec.horizon), snapshots)
        self.study = StudyTrials(spec, plan, self, store)
        if self.study.order_sensitive:
            # A scheduler comparing trials decides on the order they reach it:
            # run them in admission order, as Tune runs them (issue 31).
            self.policy.admission_order()
        self.add_study(self.study)
        self._restored = restore is not None
        if restore is not None:
            self.study.restore(restore)
            self.iterations, self.worker_seconds = self.study.iterations, self.study.worker_seconds
            self.snapshots.restored()

    async def run(self, workers: list[Any]) -> None:
        """`BatchLoop.run`, the study's time budget counted from here: in a
        kept controller (`begin`) the study is built before its workers are
        even asked for, and their start is in the budget as in Tune's, not
        more."""
        if self._restored:  # before anything of this run is stored
            await self.store.remove_unreferenced(self.plan)
        self.study.budget.start()
        await super().run(workers)

    @property
    def trials(self) -> dict[str, TrialState]:
        return self.study.trials

    # -- the driver's ------------------------------------------------------------------

    async def progress(self, answer: CallbackAnswer | None = None, wait_s: float = 0.0) -> Progress:
        """What happened since the last poll (`StudyTrials.progress`), after
        the driver's ``answer`` to the last, and once a trainable waits for
        the next or ``wait_s`` passed (`DriverFeed.driver_needed`)."""
        return await self.study.answered_progress(answer, wait_s)

    def results(self, first: int = 0, count: int | None = None) -> list[TrialSummary]:
        """The summaries of trials ``first`` to ``first + count`` (all from ``first`` when ``count`` is None)."""
        return self.study.results(first, count)

    def searcher(self) -> Any:
        """The study's searcher as it is now (`StudyTrials.searcher`)."""
        return self.study.searcher()

    def scheduler(self) -> Any:
        """The study's trial scheduler as it is now (`StudyTrials.scheduler`)."""
        return self.study.scheduler()

    async def save_state(self) -> None:
        """Write a snapshot now (the driver asks before it stops)."""
        await self.snapshots.save_now()

    async def interrupt(self) -> str | None:
        """The driver stops (Ctrl-C): save the study as it stands and change
        it no more (later reports are dropped, batches told to stop), so that
        what a restore continues is exactly what the driver last heard.
        None when storage took it, else what a restore would continue."""
        self.snapshots.freeze()
        self.study.feed.release()
        self.wake()
        for write in self.store.pending_writes:  # checkpoints already reported are in what it continues
            await self.store.finish_write(self.plan, write)
        await self.snapshots.save_now()
        return self.snapshots.not_saved()

    def monitor_view(self) -> dict[str, Any]:
        """Read-only, for the web monitor (`ray_stagetree.monitor`): the plan
        as records, each worker's running batch (its segments ``[node,
        start, stop]`` and trials), each trial's status by folder, and the
        iterations executed."""
        now = time.monotonic()
        batches = {}
        for running in self.pool.running.values():
            batch_id = running.batch.batch_id
            trials = [self.trials[t] for t in sorted(self.held_trials(batch_id)) if t in self.trials]
            batches[id(running.worker)] = {
                "batch": batch_id,
                "segments": [list(segment) for segment in running.spec.segments],
                "trials": [state.dirname for state in trials],
                "seconds": round(now - running.dispatched, 1),
                "began": self.runs.began_at(batch_id),
            }
        return {
            "plan": self.plan.records(),
            "running": list(batches.values()),
            "workers": [
                {"worker": index + 1, **batches.get(id(worker), {})} for index, worker in enumerate(self.pool.workers)
            ],
            "trials": {state.dirname: state.status for state in self.trials.values()},
            "iterations": self.iterations,
        }


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
