"""One study attached to a plan service: its Tune-side state on a shared plan.

An `AttachedStudy` is a `StudyController` without a loop of its own: its
trials, searcher, trial scheduler, stoppers and results are its own, while
the search plan, the checkpoint store and the workers belong to the
`SharedPlan` that hosts it, which dispatches batches for every attached
study and hands each study the results of its trials. It changes the
controller through its declared hooks only (`runtime.control.hooks.StudyHooks`).
"""

from __future__ import annotations

from typing import Any

from ray_stagetree.runtime.control.controller import StudyController
from ray_stagetree.runtime.control.hooks import hook
from ray_stagetree.runtime.control.messages import Progress
from ray_stagetree.runtime.control.snapshots import NoSnapshots
from ray_stagetree.runtime.control.spec import StudySpec
from ray_stagetree.runtime.service.unique_trial_ids import UniqueTrialIds


class _StudyFolderStore:
    """The shared checkpoint store, exporting a trial's checkpoints into
    its study's folder (trial folders are named relative to the study)."""

    def __init__(self, store: Any, folder: str) -> None:
        self._store = store
        self._folder = folder

    def export(self, plan: Any, node: Any, iteration: int, folder: str) -> Any:
        return self._store.export(plan, node, iteration, f"{self._folder}/{folder}")

    def remove_other_checkpoints(self, trial_dir: str, keep: list[str]) -> Any:
        return self._store.remove_other_checkpoints(f"{self._folder}/{trial_dir}", keep)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


class AttachedStudy(StudyController):
    """A study's trials on ``shared``'s plan (`SharedPlan.attach` makes it).

    Parameters
    ----------
    spec:
        The study's spec, as the Tuner builds it; its ``experiment_path`` is
        the study's folder inside the shared plan's directory.
    shared:
        The `runtime.service.shared_plan.SharedPlan` whose plan, store and workers it runs on.
    study_id:
        Its name in the service (progress, results and detach use it).
    weight:
        Its weight in the share of workers (`planning.fair_share`).
    """

    def __init__(self, spec: StudySpec, shared: Any, study_id: str, weight: float = 1.0) -> None:
        folder = spec.experiment_path[len(shared.spec.experiment_path) :].strip("/")
        super().__init__(spec, plan=shared.plan, store=_StudyFolderStore(shared.store, folder))
        self._node_configs = {}  # the shared plan's nodes are configured there
        self.plan_path = shared.plan_path
        self.shared = shared
        self.study_id = study_id
        self.weight = weight
        self.finalized = False
        # The service persists the shared plan; a study has no snapshot of its
        # own (a study whose driver is gone is detached, not restored).
        self.snapshots = NoSnapshots()
        # The lifecycle admits from it and tells it of every end: both see the renamed ids.
        self.trial_source = self.lifecycle.trial_source = UniqueTrialIds(self.trial_source, self._taken, study_id)

    def _taken(self, trial_id: str) -> bool:
        """In use on the shared plan: a live trial of the plan, or any trial,
        finished ones included, of an attached study (results are routed by id)."""
        return trial_id in self.shared.plan.trials or trial_id in self.shared.trials

    @hook
    def trial_share_key(self, trial_id: str) -> str:
        return self.shared.share_key if self.spec.stage_sharing else f"{self.study_id}/{trial_id}"

    def add_work(self, seconds: float, iterations: int) -> None:
        """Its part of a batch that served it (split between the studies served)."""
        self._worker_seconds += seconds
        self._iterations += iterations

    @hook
    def progress(self) -> Progress:
        progress = super().progress()
        progress.done = self.finalized
        return progress
