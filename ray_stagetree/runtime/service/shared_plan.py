"""A search plan shared by several studies, inside a plan service.

`SharedPlan` is the `StudyController` loop (dispatch, worker reports,
checkpoints, retries) run over one plan that holds the trials of every
attached study. What a controller does for its own trials it hands to the
study that owns them (`AttachedStudy`): results, stops, failures, trial
checkpoints. It changes the controller through its declared hooks only
(`runtime.control.hooks.StudyHooks`, each override marked ``@hook``). Batches are chosen by the execution policy over all studies'
requests with each study's share of workers bounded (`planning.fair_share`).

The plan lives in one directory per trainable identity (`share_key`):
``plan/`` and ``checkpoints/`` there, and each study's trial folders in a
sub-folder. A plan service started later on the same storage loads it, so
later studies get the metrics and checkpoints of earlier ones; a trial the
plan already answers is reported without training.
"""

from __future__ import annotations

import asyncio
import collections
import time
from typing import Any

from ray_stagetree.execution.batches import BatchOutcome
from ray_stagetree.execution.storage import CheckpointStorage
from ray_stagetree.planning.fair_share import FairShare
from ray_stagetree.runtime.control.controller import StudyController
from ray_stagetree.runtime.control.hooks import hook
from ray_stagetree.runtime.control.snapshots import NoSnapshots
from ray_stagetree.runtime.control.spec import StudySpec
from ray_stagetree.runtime.service.attached_study import AttachedStudy
from ray_stagetree.searchers.sources import VariantSource

#: Seconds between the loop's checks of attached drivers and study ends
#: when nothing else wakes it.
TICK_S = 0.5

#: Seconds between saves of the shared plan while it changes (it is also
#: saved whenever a study ends or detaches).
PLAN_SAVE_S = 10.0


class _PlanSaves(NoSnapshots):
    """A shared plan's snapshots: no study snapshot (the loop would wake for
    one), the plan instead, every `PLAN_SAVE_S` while it changes."""

    def __init__(self, shared: SharedPlan) -> None:
        super().__init__()
        self._shared = shared

    def save_soon(self) -> None:
        if self._shared._plan_changed and time.monotonic() - self._shared._plan_saved_at > PLAN_SAVE_S:
            self._shared.save_plan()

    async def save_now(self) -> None:
        self._shared.save_plan()


class SharedPlan(StudyController):
    """The plan, store and workers of one trainable identity in a plan service.

    Parameters
    ----------
    spec:
        The first attaching study's spec, for what the shared part needs: the
        trainable, the workers' resources, the storage and its key; its
        ``experiment_path`` is the plan's directory.
    share_key:
        `runtime.service.trainable_identity.share_key` of the studies it accepts.
    """

    def __init__(self, spec: StudySpec, share_key: str) -> None:
        storage = CheckpointStorage(spec.experiment_path, spec.storage_filesystem)
        plan_exists = storage.filesystem.isfile(storage.path("plan/nodes.parquet"))
        own = StudySpec(
            worker=spec.worker,
            trial_source=VariantSource([]),
            horizon=None,
            experiment_path=spec.experiment_path,
            storage_filesystem=spec.storage_filesystem,
            num_workers=spec.num_workers,
            policy=spec.policy,
            checkpoint_budget_bytes=spec.checkpoint_budget_bytes,
            parked_per_worker=spec.parked_per_worker,
            resume=plan_exists,
            payload_key=spec.payload_key,
            trust_storage=spec.trust_storage,
        )
        super().__init__(own)
        # Trials of earlier studies: their records go (they are nobody's now);
        # their nodes, metrics and checkpoints stay for the studies to come.
        for trial_id in list(self.plan.trials):
            self.plan.remove_trial(trial_id)
        self.share_key = share_key
        self.studies: dict[str, AttachedStudy] = {}
        self.trials = collections.ChainMap({})
        self._node_configs = collections.ChainMap(self._node_configs)
        self._node_plain = collections.ChainMap(self._node_plain)
        self.policy = FairShare(
            self.policy,
            self._study_of,
            lambda: self.pool.capacity,
            lambda: {i: s.weight for i, s in self.studies.items()},
        )
        self._closing = False
        self._plan_saved_at = time.monotonic()
        self._plan_changed = False
        self.snapshots = _PlanSaves(self)

    # -- studies ----------------------------------------------------------------------

    def attach(self, spec: StudySpec, study_id: str, weight: float) -> AttachedStudy:
        if spec.worker.options != self.spec.worker.options:
            raise ValueError(
                f"the studies sharing this plan run on workers with {self.spec.worker.options}, but this one asks "
                f"for {spec.worker.options} (tune.with_resources): give it another study_group, or the same resources"
            )
        study = AttachedStudy(spec, self, study_id, weight)
        self.studies[study_id] = study
        if spec.num_workers > self.pool.capacity:
            self.pool.grow(spec.num_workers)
            self.spec.num_workers = spec.num_workers
        self._relink()
        self._wake.set()
        return study

    def detach(self, study_id: str) -> None:
        """The study goes: its live trials stop and leave the plan (a batch
        no other study needs stops at its next report); what it trained
        stays in the plan."""
        study = self.studies.pop(study_id, None)
        if study is None:
            return
        study.halt()
        for trial_id in study.trials:
            if trial_id in self.plan.trials:
                self.plan.remove_trial(trial_id)
        self._relink()
        self._plan_changed = True
        self.save_plan()
        self._wake.set()

    def _relink(self) -> None:
        studies = list(self.studies.values())
        self.trials.maps[:] = [s.trials for s in studies] or [{}]
        self._node_configs.maps[1:] = [s._node_configs for s in studies]
        self._node_plain.maps[1:] = [s._node_plain for s in studies]
        self._keeps_decision_points = any(s._keeps_decision_points for s in studies)

    def _study_of(self, trial_id: str) -> str | None:
        for study_id, study in self.studies.items():
            if trial_id in study.trials:
                return study_id
        return None

    def _owner_of(self, trial_id: str) -> AttachedStudy:
        return self.studies[self._study_of(trial_id)]

    async def close(self) -> None:
        """End the loop (`run` returns once running batches end)."""
        self._closing = True
        self._wake.set()

    # -- the loop (StudyController's), over every study's trials ------------------------

    @hook
    def unfinished(self) -> bool:
        return not self._closing

    @hook
    def stuck(self) -> None:
        if any(r.trials for r in self.plan.open_requests()):
            super().stuck()

    @hook
    def wake_in(self) -> float | None:
        return TICK_S

    @hook
    def admit(self) -> bool:
        """Each study admits its next trials; True when one may admit more at once."""
        if self.feed.warnings:  # the loop's own (a missing checkpoint): every study sees them
            for study in self.studies.values():
                study.feed.warnings += self.feed.warnings
            self.feed.warnings.clear()
        more = False
        for study in list(self.studies.values()):
            study.enforce_budget()
            more = study.admit() or more
            if not study.finalized and not study.unfinished() and not self._serves(study):
                study.finalized = None  # being finalized
                asyncio.ensure_future(self._finalize_study(study))
        return more

    def _serves(self, study: AttachedStudy) -> bool:
        return any(
            t in study.trials
            for b in self.plan.running_batches
            for r in self.plan.scheduled_requests(b)
            for t in r.trials
        )

    async def _finalize_study(self, study: AttachedStudy) -> None:
        await study.finalize()
        study.finalized = True
        self._plan_changed = True

    @hook
    def ingest(self, outcome: BatchOutcome) -> None:
        for study in self.studies.values():
            served = sum(1 for node_id, at, _ in outcome.records if study._trials_through(self.plan.nodes[node_id], at))
            if served:
                study.add_work(0.0, served)
        super().ingest(outcome)
        if outcome.records:
            self._plan_changed = True

    @hook
    async def complete(self, ref: Any) -> None:
        batch = self.pool.running[ref].batch
        served = [self.studies[s] for s in self.policy.studies(self.plan.scheduled_requests(batch.batch_id))]
        before = self._worker_seconds
        await super().complete(ref)
        for study in served:
            study.add_work((self._worker_seconds - before) / len(served), 0)

    def save_plan(self) -> None:
        """Persist the plan (Parquet): a later service continues from it."""
        self._plan_changed = False
        self._plan_saved_at = time.monotonic()
        try:
            self.plan.save(self.plan_path, self.spec.storage_filesystem)
        except Exception as error:  # each fsspec backend raises its own errors
            self.feed.warn(f"the shared plan could not be written ({type(error).__name__}: {error})")

    @hook
    async def finalize(self) -> None:
        for study in list(self.studies.values()):
            if not study.finalized:
                await self._finalize_study(study)
        self.save_plan()

    # -- what a controller does for its own trials, done by their study -------------------

    @hook
    def add_result(self, state: Any, iteration: int, metrics: dict[str, Any]) -> None:
        self._owner_of(state.trial_id).add_result(state, iteration, metrics)

    @hook
    def fail(
        self,
        trial_ids: set[str],
        error: str,
        retry: bool = True,
        in_restore: bool = False,
        error_pickle: bytes | None = None,
    ) -> None:
        """Each study fails its own trials, as `StudyController.fail` says."""
        by_study: dict[str, set[str]] = {}
        for trial_id in trial_ids:
            by_study.setdefault(self._study_of(trial_id), set()).add(trial_id)
        for study_id, ids in by_study.items():
            if study_id is not None:
                self.studies[study_id].fail(ids, error, retry, in_restore, error_pickle)

    @hook
    def end_trial(self, trial_id: str) -> None:
        self._owner_of(trial_id).end_trial(trial_id)

    @hook
    def resume_paused(self) -> None:
        for study in self.studies.values():
            study.resume_paused()

    @hook
    def abort(self, error: str) -> None:
        for study in self.studies.values():
            study.abort(error)

    @hook
    def assign_node(self, state: Any, node: Any) -> None:
        self._owner_of(state.trial_id).assign_node(state, node)

    @hook
    def trial_context(self, node_id: int) -> dict[str, str]:
        for study in self.studies.values():
            if node_id in study._node_owner:
                return study.trial_context(node_id)
        return super().trial_context(node_id)

    @hook
    def configured_saves(self, batch_id: int, outcome: BatchOutcome | None = None) -> list[int]:
        return sorted({at for s in self.studies.values() for at in s.configured_saves(batch_id, outcome)})

    def workload(self) -> dict[str, Any]:
        """The shared plan's totals, for the service's status."""
        return {
            "studies": sorted(self.studies),
            "iterations": self._iterations,
            "worker_seconds": self._worker_seconds,
            "plan_nodes": len(self.plan.nodes),
            "workers": len(self.pool.workers),
            "capacity": self.pool.capacity,
        }
