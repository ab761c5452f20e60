"""A search plan shared by several studies, inside a plan service.

`SharedPlan` is the batch loop (`runtime.control.batch_loop.BatchLoop`:
dispatch, worker reports, checkpoints, retries) over one plan that holds the
trials of every attached study, each a `StudyTrials` that it attaches and
detaches; the loop hands each study its own trials' results, stops and
failures. Batches are chosen by the execution policy over all studies'
requests with each study's share of workers bounded (`planning.fair_share`).

The plan lives in one directory per trainable identity (`share_key`):
``plan/`` and ``checkpoints/`` there, and each study's trial folders in a
sub-folder. A plan service started later on the same storage loads it, so
later studies get the metrics and checkpoints of earlier ones; a trial the
plan already answers is reported without training.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from ray_stagetree.execution.storage import CheckpointStorage
from ray_stagetree.planning.fair_share import FairShare
from ray_stagetree.planning.plan import SearchPlan
from ray_stagetree.runtime.control.batch_loop import BatchLoop, policy_for
from ray_stagetree.runtime.control.checkpoint_store import CheckpointStore
from ray_stagetree.runtime.control.snapshots import NoSnapshots
from ray_stagetree.runtime.control.spec import LoopSpec, StudySpec
from ray_stagetree.runtime.control.study_trials import StudyTrials
from ray_stagetree.runtime.service.unique_trial_ids import UniqueTrialIds

#: Seconds between saves of the shared plan while it changes (it is also
#: saved whenever a study ends or detaches).
PLAN_SAVE_S = 10.0


class PlanSaves(NoSnapshots):
    """A shared plan's snapshots: no study snapshot (a study whose driver
    is gone is detached, not restored), the plan instead, every `PLAN_SAVE_S`
    while it changes."""

    def __init__(self, save: Callable[[], None]) -> None:
        super().__init__()
        self._save = save
        self._saved_at = time.monotonic()

    def save_soon(self) -> None:
        if self.changed and time.monotonic() - self._saved_at > PLAN_SAVE_S:
            self.changed = False
            self._saved_at = time.monotonic()
            self._save()


class StudyFolderStore:
    """The shared checkpoint store, exporting a trial's checkpoints into
    its study's folder (trial folders are named relative to the study)."""

    def __init__(self, store: CheckpointStore, folder: str) -> None:
        self._store = store
        self._folder = folder

    def export(self, plan: SearchPlan, node: Any, iteration: int, folder: str) -> Any:
        return self._store.export(plan, node, iteration, f"{self._folder}/{folder}")

    def remove_other_checkpoints(self, trial_dir: str, keep: list[str]) -> Any:
        return self._store.remove_other_checkpoints(f"{self._folder}/{trial_dir}", keep)

    def discard(self, plan: SearchPlan, node: Any, iteration: int) -> None:
        """Keep it: a plan service's checkpoints serve the studies to come,
        whatever one study's ``num_to_keep`` says."""


class SharedPlan(BatchLoop):
    """The plan, store and workers of one trainable identity in a plan service.

    Parameters
    ----------
    spec:
        The first attaching study's loop: the trainable, the workers'
        resources, the storage and its key; its ``experiment_path`` is the
        plan's directory.
    share_key:
        `runtime.service.trainable_identity.share_key` of the studies it accepts.
    """

    def __init__(self, spec: LoopSpec, share_key: str) -> None:
        storage = CheckpointStorage(spec.experiment_path, spec.storage_filesystem)
        if storage.filesystem.isfile(storage.path("plan/nodes.parquet")):
            plan = SearchPlan.load(f"{spec.experiment_path}/plan", spec.storage_filesystem)
        else:
            plan = SearchPlan()
        # Trials of earlier studies: their records go (they are nobody's now);
        # their nodes, metrics and checkpoints stay for the studies to come.
        for trial_id in list(plan.trials):
            plan.remove_trial(trial_id)
        store = CheckpointStore(
            storage, spec.checkpoint_budget_bytes, secret=spec.payload_key, trusted=spec.trust_storage
        )
        policy = FairShare(
            policy_for(spec, None),
            self._study_id_of,
            lambda: self.pool.capacity,
            lambda: {study_id: study.weight for study_id, study in self.studies.items()},
        )
        super().__init__(spec, plan, store, policy, PlanSaves(self._save_plan_or_warn), open_ended=True)
        self.share_key = share_key

    def _study_id_of(self, trial_id: str) -> str | None:
        study = self.studies.of(trial_id)
        return None if study is None else study.study_id

    # -- studies ----------------------------------------------------------------------

    def attach(self, spec: StudySpec, study_id: str, weight: float) -> StudyTrials:
        """A study joins the plan: its trials are admitted from the next turn
        (renamed where another study's trial ids collide, `UniqueTrialIds`)."""
        if spec.loop.worker.options != self.spec.worker.options:
            raise ValueError(
                f"the studies sharing this plan run on workers with {self.spec.worker.options}, but this one asks "
                f"for {spec.loop.worker.options} (tune.with_resources): give it another study_group, or the same "
                "resources"
            )
        folder = spec.loop.experiment_path[len(self.spec.experiment_path) :].strip("/")
        spec = dataclasses.replace(spec, trial_source=UniqueTrialIds(spec.trial_source, self._taken, study_id))
        study = StudyTrials(
            spec, self.plan, self, StudyFolderStore(self.store, folder), study_id, weight, share_key=self.share_key
        )
        if spec.loop.num_workers > self.pool.capacity:
            self.pool.grow(spec.loop.num_workers)
            self.spec.num_workers = spec.loop.num_workers
        self.add_study(study)
        return study

    def _taken(self, trial_id: str) -> bool:
        """In use on the shared plan: a live trial of the plan, or any trial,
        finished ones included, of an attached study (results are routed by id)."""
        return trial_id in self.plan.trials or self.studies.of(trial_id) is not None

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
        self.nodes.forget(study)
        self._save_plan_or_warn()
        self.wake()

    def _save_plan_or_warn(self) -> None:
        refused = self.end.save_plan()
        if refused is not None:
            self.warn(refused)

    def workload(self) -> dict[str, Any]:
        """The shared plan's totals, for the service's status."""
        return {
            "studies": sorted(self.studies),
            "iterations": self.iterations,
            "worker_seconds": self.worker_seconds,
            "plan_nodes": len(self.plan.nodes),
            "workers": len(self.pool.workers),
            "capacity": self.pool.capacity,
        }
