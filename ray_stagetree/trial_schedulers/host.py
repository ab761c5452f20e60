"""Ray Tune trial schedulers, hosted on stage trees.

`SchedulerHost` is what the controller and the simulator talk to: it takes
the user's scheduler object (any of Tune's ``TrialScheduler`` objects it
hosts, or a custom one), hands it to the adapter of its family
(`ray_stagetree.trial_schedulers.registry`), and answers with the words of
`ray_stagetree.planning.decisions` and the iteration each trial is
requested up to. What changes against Tune is what gets trained: a trial is
requested only up to its next decision point (its next ASHA rung, HyperBand
milestone or PBT perturbation), so no iteration past a rung is spent on a
trial that will be stopped there, and trials that share a prefix train it
once.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ray_stagetree.planning.decisions import Decision, Exploit
from ray_stagetree.trial_schedulers.pbt import PopulationBasedAdapter
from ray_stagetree.trial_schedulers.registry import adapter_for, check_scheduler
from ray_stagetree.trial_schedulers.tune_fed import TuneFedAdapter


class SchedulerHost:
    """Feeds a Tune scheduler and tells the controller what to request.

    Parameters
    ----------
    scheduler:
        A ``ray.tune`` ``TrialScheduler`` instance (None means FIFO).
    metric, mode:
        From ``TuneConfig``, given to the scheduler if it has none.
    horizon:
        The most iterations a trial runs (``math.inf`` when trials are open-ended).
    on_stop:
        Called with a trial id when the scheduler stops a trial other than
        the one whose result it is processing (a paused one).
    searcher:
        The study's Tune searcher, if any: ``HyperBandForBOHB`` tells it
        when it pauses and resumes trials (``on_pause`` / ``on_unpause``).
    resources:
        One trial's resources by Ray's names (``{"CPU": 1}``), what a
        scheduler reads as each trial's ``placement_group_factory``.
    """

    def __init__(
        self,
        scheduler: Any,
        metric: str | None,
        mode: str | None,
        horizon: float,
        on_stop: Callable[[str], None] | None = None,
        searcher: Any = None,
        resources: dict[str, float] | None = None,
    ) -> None:
        from ray.tune.schedulers import FIFOScheduler

        check_scheduler(scheduler, metric, mode)
        self.scheduler = scheduler or FIFOScheduler()
        self.horizon = horizon
        if metric is not None or mode is not None:
            self.scheduler.set_search_properties(metric, mode)
        adapter, exact = adapter_for(self.scheduler)
        self._adapter = adapter(self.scheduler, horizon, exact)
        if resources is not None and isinstance(self._adapter, TuneFedAdapter):
            from ray.tune.execution.placement_groups import PlacementGroupFactory

            self._adapter.base_resources = PlacementGroupFactory([resources])
        if on_stop is not None:
            self._adapter.attach(on_stop, searcher)

    @property
    def decides_at_milestones(self) -> bool:
        """Whether the scheduler decides only at points known in advance
        (rungs, milestones, perturbations); any other may stop a trial at
        any result."""
        return self._adapter.decides_at_milestones

    @property
    def order_sensitive(self) -> bool:
        """Whether the scheduler's decisions depend on the order trials run
        in: the study then dispatches its trials in admission order, as Tune
        does (`ExecutionPolicy.trial_order`)."""
        return self._adapter.order_sensitive

    @property
    def population(self) -> PopulationBasedAdapter | None:
        """The PBT adapter, whose decisions read each trial's hyper-parameter
        values and need checkpoints; None under any other scheduler."""
        return self._adapter if isinstance(self._adapter, PopulationBasedAdapter) else None

    def attach(self, on_stop: Callable[[str], None], searcher: Any = None) -> None:
        """Report the scheduler's stops of paused trials to ``on_stop``, and
        its pauses to ``searcher`` (a restored host: its snapshot kept no
        controller or searcher to report to)."""
        self._adapter.attach(on_stop, searcher)

    def on_add(self, trial_id: str, config: dict[str, Any]) -> None:
        """A new trial; PBT samples the hyper-parameters it mutates that
        ``config`` lacks into it, as Ray's does."""
        self._adapter.on_add(trial_id, config)

    def on_result(self, trial_id: str, row: dict[str, Any], values: dict[str, Any] | None = None) -> Decision:
        """The scheduler's decision; with PBT, an `Exploit`, PAUSE (synchronous
        PBT) or CONTINUE.
        ``values`` are the trial's hyper-parameters at this iteration (for PBT)."""
        return self._adapter.on_result(trial_id, row, values)

    def on_complete(self, trial_id: str, row: dict[str, Any] | None) -> None:
        """The trial ended (finished, or stopped): tell the scheduler as Tune's
        controller does, ``on_trial_complete`` for a running trial with a
        result, ``on_trial_remove`` otherwise."""
        self._adapter.on_complete(trial_id, row)

    def resumable(self) -> list[tuple[str, Exploit | None]]:
        """Paused trials the scheduler wants to run again, now marked running,
        each with the `Exploit` it resumes with (synchronous PBT) or None."""
        return self._adapter.resumable()

    def on_error(self, trial_id: str) -> None:
        """The trial failed."""
        self._adapter.on_error(trial_id)

    @property
    def changes_resources(self) -> bool:
        """Whether the scheduler may give trials other resources (``ResourceChangingScheduler``)."""
        return self._adapter.changes_resources

    def trial_resources(self, trial_id: str) -> Any:
        """The resources the scheduler gave the trial in place of the study's
        (``ResourceChangingScheduler``, a ``PlacementGroupFactory``), or None."""
        return self._adapter.trial_resources(trial_id)

    def next_decision(self, trial_id: str, iteration: int) -> float:
        """The next iteration after ``iteration`` at which the scheduler decides about
        the trial: its next ASHA rung or PBT perturbation, else the horizon."""
        return self._adapter.next_decision(trial_id, iteration)
