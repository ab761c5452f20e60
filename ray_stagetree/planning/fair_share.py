"""Fair shares of workers between the studies of one shared plan.

Several studies attached to a plan service (`runtime.service.actor`) put
their requests into one search plan; the execution policy orders all of
them. Left alone, a study with 1,000 trials would fill every worker and a
10-trial study would wait behind it. `FairShare` bounds each study's share:

* A study with work (an open request, or a batch running for it) is owed
  ``max(1, floor(capacity * weight / total weight))`` workers, where the
  total counts the weights of the studies with work.
* Batches are chosen in the policy's priority order, in two passes. The
  first admits a batch only if one of the studies it serves is below its
  share; a batch serving several studies (a shared stage) counts against
  each of them. The second fills workers still idle with whatever is ready,
  so a study alone, or one whose neighbours have nothing ready, uses every
  worker: the bound holds back a large study only while a smaller one has
  ready work waiting.

Pure Python: studies are told apart by ``study_of(trial_id)``. Which
studies have work is counted as trials start and stop waiting on open
requests (the plan tells its `OpenTrialsWatcher` watchers), not found by
walking every open request at each dispatch.
"""

from __future__ import annotations

import collections
import math
from collections.abc import Callable, Iterable, Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ray_stagetree.planning.plan import Request, SearchPlan
    from ray_stagetree.planning.policies import ExecutionPolicy, StageBatch


class FairShare:
    """An execution policy's batches, with each study's share of workers
    bounded; used where the policy is (``select(plan, idle_workers)``).

    Parameters
    ----------
    policy:
        The execution policy that orders batches (critical path, ...).
    study_of:
        The study a trial id belongs to (None: a trial of no attached study).
    capacity:
        The number of workers, asked at each selection.
    weights:
        Each study's weight (1.0 where absent), asked at each selection.
    """

    def __init__(
        self,
        policy: ExecutionPolicy,
        study_of: Callable[[str], str | None],
        capacity: Callable[[], int],
        weights: Callable[[], Mapping[str, float]],
    ) -> None:
        self.policy = policy
        self.study_of = study_of
        self.capacity = capacity
        self.weights = weights
        self._plan: SearchPlan | None = None
        # Trials waiting on an open request -> their study (kept: a trial
        # leaves the plan after its study detached, when study_of no longer knows it).
        self._open: dict[str, str | None] = {}
        self._open_per_study: collections.Counter[str] = collections.Counter()

    def __getattr__(self, name: str) -> Any:
        # Everything but `select` is the policy's own (its time-sharing hooks,
        # cost model, name): a fair share stands in for it wherever it is used.
        return getattr(self.policy, name)

    def watch(self, plan: SearchPlan) -> None:
        """Count ``plan``'s open trials per study from now on (a scan once,
        then the plan's notifications)."""
        if self._plan is not None:
            self._plan.watchers.remove(self)
        self._plan = plan
        self._open.clear()
        self._open_per_study.clear()
        self.opened(trial_id for request in plan.open_requests() for trial_id in request.trials)
        plan.watchers.append(self)

    def opened(self, trial_ids: Iterable[str]) -> None:
        for trial_id in trial_ids:
            study = self._open[trial_id] = self.study_of(trial_id)
            if study is not None:
                self._open_per_study[study] += 1

    def closed(self, trial_ids: Iterable[str]) -> None:
        for trial_id in trial_ids:
            study = self._open.pop(trial_id, None)
            if study is not None:
                self._open_per_study[study] -= 1
                if not self._open_per_study[study]:
                    del self._open_per_study[study]

    def shares(self, plan: SearchPlan) -> dict[str, int]:
        """Workers each study with work (an open request) is owed."""
        if plan is not self._plan:
            self.watch(plan)
        capacity, weights = max(1, self.capacity()), self.weights()
        busy = self._open_per_study
        total = sum(weights.get(study, 1.0) for study in busy)
        return {study: max(1, math.floor(capacity * weights.get(study, 1.0) / total)) for study in busy}

    def running(self, plan: SearchPlan) -> dict[str, int]:
        """Running batches per study (a batch serving several counts for each)."""
        counts: dict[str, int] = {}
        for batch_id in plan.running_batches:
            for study in self.studies(plan.scheduled_requests(batch_id)):
                counts[study] = counts.get(study, 0) + 1
        return counts

    def select(
        self, plan: SearchPlan, idle_workers: int, admit: Callable[[StageBatch], bool] | None = None
    ) -> list[StageBatch]:
        """Up to ``idle_workers`` ready batches, marked scheduled in ``plan``
        (as `ExecutionPolicy.select`, ``admit`` included), studies held to
        their shares first."""
        if idle_workers <= 0:
            return []
        shares = self.shares(plan)
        running = self.running(plan)

        def within_share(batch: StageBatch) -> bool:
            served = self.studies(request for stage in batch.stages for request in stage.requests)
            if not any(running.get(study, 0) < shares.get(study, 0) for study in served):
                return False
            if admit is not None and not admit(batch):
                return False
            for study in served:
                running[study] = running.get(study, 0) + 1
            return True

        chosen = self.policy.select(plan, idle_workers, admit=within_share)
        if len(chosen) < idle_workers:  # work-conserving: no worker idles while anything is ready
            chosen += self.policy.select(plan, idle_workers - len(chosen), admit=admit)
        return chosen

    def studies(self, requests: Iterable[Request]) -> set[str]:
        """The studies whose trials ``requests`` serve."""
        found = set()
        for request in requests:
            for trial_id in request.trials:
                study = self.study_of(trial_id)
                if study is not None:
                    found.add(study)
        return found
