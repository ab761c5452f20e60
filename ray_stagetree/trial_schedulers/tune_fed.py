"""Adapters that feed the user's own Ray scheduler object, as Tune does.

The scheduler (``FIFOScheduler``, ``MedianStoppingRule``, a custom
``TrialScheduler``; ASHA and HyperBand in
`ray_stagetree.trial_schedulers.hyperband`) makes every decision: it
receives each trial's results in order, exactly as Ray Tune's controller
feeds them, through `TrialProxy` objects and a `_ControllerFacade` standing
in for the few ``TuneController`` calls schedulers make. Its CONTINUE /
STOP / PAUSE answers are passed through; a trial it pauses is run again
when it picks it (``choose_trial_to_run``).
"""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ray_stagetree.planning.decisions import PAUSE, Decision, Exploit
from ray_stagetree.planning.lifecycle import ERROR, PAUSED, RUNNING, TERMINATED
from ray_stagetree.trial_schedulers.adapter import SchedulerAdapter


@dataclass(eq=False)
class TrialProxy:
    """What Tune's schedulers read from a ``Trial``."""

    trial_id: str
    config: dict[str, Any]
    status: str = RUNNING
    last_result: dict[str, Any] = field(default_factory=dict)
    is_saving: bool = False
    placement_group_factory: Any = None  # the trial's resources, a ``PlacementGroupFactory``

    def __hash__(self) -> int:
        return hash(self.trial_id)

    def __str__(self) -> str:
        return self.trial_id

    def update_resources(self, resources: Any) -> None:
        """A scheduler gives the trial other resources (``ResourceChangingScheduler``):
        its next stage runs on a worker that holds them."""
        from ray.tune.execution.placement_groups import resource_dict_to_pg_factory

        self.placement_group_factory = (
            resources if hasattr(resources, "required_resources") else resource_dict_to_pg_factory(resources)
        )

    def set_config(self, config: dict[str, Any]) -> None:
        """A scheduler replaces the trial's config (PBT replay's first one):
        in place, as the owner reads the dict it handed over."""
        replacement = copy.deepcopy(config)
        self.config.clear()
        self.config.update(replacement)


class _SearcherFacade:
    """``tune_controller.search_alg`` and its ``searcher``, as
    ``HyperBandForBOHB`` calls them: it tells the study's searcher when it
    pauses and resumes a trial (TuneBOHB and ConcurrencyLimiter count paused
    trials apart from running ones). A searcher without ``on_pause`` /
    ``on_unpause`` (Tune's base ``Searcher``, a grid search) is not told."""

    def __init__(self, searcher: Any = None) -> None:
        self._searcher = searcher

    @property
    def searcher(self) -> _SearcherFacade:
        return self

    def on_pause(self, trial_id: str) -> None:
        self._tell("on_pause", trial_id)

    def on_unpause(self, trial_id: str) -> None:
        self._tell("on_unpause", trial_id)

    def _tell(self, method: str, trial_id: str) -> None:
        call = getattr(self._searcher, method, None)
        if callable(call):
            call(trial_id)


class _ControllerFacade:
    """The few ``TuneController`` calls schedulers make."""

    def __init__(self, trials: dict[str, TrialProxy], on_stop: Callable[[str], None], searcher: Any = None) -> None:
        self._trials = trials
        self._on_stop = on_stop
        self.search_alg = _SearcherFacade(searcher)

    def stop_trial(self, trial: TrialProxy) -> None:
        self._on_stop(trial.trial_id)

    def get_live_trials(self) -> list[TrialProxy]:
        """Tune's live trials: those not ended (running or paused)."""
        return [trial for trial in self._trials.values() if trial.status in (RUNNING, PAUSED)]

    @property
    def _resource_updater(self) -> _ClusterResources:
        # Tune's controller field that resource allocation functions read
        # (Ray's DistributeResources, its xgboost_dynamic_resources_example).
        return _ClusterResources()

    def get_trials(self) -> list[TrialProxy]:
        return list(self._trials.values())


class _ClusterResources:
    """What Tune's ``_ResourceUpdater`` tells: the cluster's CPUs and GPUs in all."""

    def get_num_cpus(self) -> float:
        import ray

        return ray.cluster_resources().get("CPU", 0.0)

    def get_num_gpus(self) -> float:
        import ray

        return ray.cluster_resources().get("GPU", 0.0)


def _ignore_stop(trial_id: str) -> None:
    pass


class TuneFedAdapter(SchedulerAdapter):
    """A scheduler fed as Tune feeds it, deciding at any result: requests
    run to the horizon unless a subclass knows the decision points."""

    def __init__(self, scheduler: Any, horizon: float, exact: bool) -> None:
        super().__init__(scheduler, horizon, exact)
        self._trials: dict[str, TrialProxy] = {}
        self._paused: set[str] = set()
        self._facade = _ControllerFacade(self._trials, _ignore_stop)
        self.base_resources: Any = None  # the study's trial resources, a PlacementGroupFactory (`SchedulerHost`)

    def __getstate__(self) -> dict[str, Any]:
        # Pickled into a study's snapshot without the controller it reports
        # to, or the searcher (the trial source's); the restoring controller
        # reconnects both with `attach`.
        state = dict(self.__dict__)
        state["_facade"] = _ControllerFacade(self._trials, _ignore_stop)
        return state

    def attach(self, on_stop: Callable[[str], None], searcher: Any = None) -> None:
        self._facade._on_stop = on_stop
        self._facade.search_alg = _SearcherFacade(searcher)

    def on_add(self, trial_id: str, config: dict[str, Any]) -> None:
        proxy = self._trials[trial_id] = TrialProxy(trial_id, config, placement_group_factory=self.base_resources)
        self.scheduler.on_trial_add(self._facade, proxy)

    def trial_resources(self, trial_id: str) -> Any:
        proxy = self._trials.get(trial_id)
        if proxy is None or proxy.placement_group_factory == self.base_resources:
            return None
        return proxy.placement_group_factory

    def on_result(self, trial_id: str, row: dict[str, Any], values: dict[str, Any] | None) -> Decision:
        proxy = self._trials[trial_id]
        proxy.last_result = row
        decision = self.scheduler.on_trial_result(self._facade, proxy, row)
        if decision == PAUSE:
            proxy.status = PAUSED
            self._paused.add(trial_id)
        return decision

    def on_complete(self, trial_id: str, row: dict[str, Any] | None) -> None:
        """Tell the scheduler as Tune's controller does: ``on_trial_complete``
        for a running trial with a result, ``on_trial_remove`` otherwise."""
        proxy = self._trials[trial_id]
        status, proxy.status = proxy.status, TERMINATED
        self._paused.discard(trial_id)
        if row and status == RUNNING:
            self.scheduler.on_trial_complete(self._facade, proxy, row)
        else:
            self.scheduler.on_trial_remove(self._facade, proxy)

    def on_error(self, trial_id: str) -> None:
        proxy = self._trials[trial_id]
        proxy.status = ERROR
        self._paused.discard(trial_id)
        self.scheduler.on_trial_error(self._facade, proxy)

    def resumable(self) -> list[tuple[str, Exploit | None]]:
        chosen: list[tuple[str, Exploit | None]] = []
        # Tune's choose_trial_to_run scans every trial: asked only while one
        # is paused, it costs nothing per result in studies that never pause.
        while self._paused:
            proxy = self.scheduler.choose_trial_to_run(self._facade)
            if proxy is None or proxy.status != PAUSED:
                break
            proxy.status = RUNNING
            self._paused.discard(proxy.trial_id)
            chosen.append((proxy.trial_id, None))
        return chosen

    def next_decision(self, trial_id: str, iteration: int) -> float:
        return self.horizon


class FifoAdapter(TuneFedAdapter):
    """``FIFOScheduler``, and any custom ``TrialScheduler`` no other adapter
    claims. Ray's FIFO never stops a trial, so it decides only at the
    horizon; a custom scheduler may decide at any result."""

    @property
    def decides_at_milestones(self) -> bool:
        return self.exact

    @property
    def order_sensitive(self) -> bool:
        return not self.exact


class MedianStoppingAdapter(TuneFedAdapter):
    """``MedianStoppingRule``: it may stop a trial at any result past its
    grace period, not at points known in advance."""

    needs_metric = True
