"""Which adapter hosts a scheduler, chosen by the scheduler's type.

The nearest of the scheduler's classes (its own, then its bases) listed in
`_families` decides: a user's subclass of ``ASHAScheduler`` is fed as ASHA
is, and a ``TrialScheduler`` of the user's own as FIFO is.
``HyperBandForBOHB`` (BOHB's synchronous HyperBand) is hosted as HyperBand
is; it tells the study's searcher of its pauses, and TuneBOHB reads the
bracket's budget it writes into each result, which the searcher gets after
the scheduler, as in Tune. PB2 runs PBT's rule with its own GP-bandit
explore (`pb2`), and ``PopulationBasedTrainingReplay`` replays its policy as
the trial's sequences (`replay`); ``ResourceChangingScheduler`` changes a
trial's resources where its stage ends (`resource_changing`). A subclass of
a family whose adapter runs the family's rule itself (PBT, PB2, replay) is
refused with a clear error.
`PromotingASHAScheduler` (ray_stagetree's
own, ASHA as its paper defines it) is hosted beside Ray's ASHA.
"""

from __future__ import annotations

import sys
from typing import Any

from ray_stagetree.trial_schedulers.adapter import SchedulerAdapter
from ray_stagetree.trial_schedulers.hyperband import AsyncHyperBandAdapter, HyperBandAdapter, PromotingASHAAdapter
from ray_stagetree.trial_schedulers.pb2 import PB2Adapter
from ray_stagetree.trial_schedulers.pbt import PopulationBasedAdapter
from ray_stagetree.trial_schedulers.replay import ReplayAdapter
from ray_stagetree.trial_schedulers.resource_changing import ResourceChangingAdapter
from ray_stagetree.trial_schedulers.tune_fed import FifoAdapter, MedianStoppingAdapter, TuneFedAdapter


def _families() -> dict[type, type[SchedulerAdapter] | str]:
    """Ray's scheduler classes -> their adapter, or what a refused one does.
    Built when asked: importing this module does not import Ray."""
    from ray.tune.schedulers import (
        AsyncHyperBandScheduler,
        FIFOScheduler,
        HyperBandForBOHB,
        HyperBandScheduler,
        MedianStoppingRule,
        PopulationBasedTraining,
        PopulationBasedTrainingReplay,
        ResourceChangingScheduler,
    )

    from ray_stagetree.trial_schedulers.promoting_asha import PromotingASHAScheduler

    families: dict[type, type[SchedulerAdapter] | str] = {
        PromotingASHAScheduler: PromotingASHAAdapter,
        FIFOScheduler: FifoAdapter,
        AsyncHyperBandScheduler: AsyncHyperBandAdapter,
        HyperBandScheduler: HyperBandAdapter,
        MedianStoppingRule: MedianStoppingAdapter,
        PopulationBasedTraining: PopulationBasedAdapter,
        HyperBandForBOHB: HyperBandAdapter,  # its own class: Ray's BOHB variant decides at the same milestones
        PopulationBasedTrainingReplay: ReplayAdapter,
        ResourceChangingScheduler: ResourceChangingAdapter,
    }
    pb2 = sys.modules.get("ray.tune.schedulers.pb2")  # imports scikit-learn: loaded only by those who use it
    if pb2 is not None:
        families[pb2.PB2] = PB2Adapter  # a subclass of PBT's with its own explore
    return families


def adapter_for(scheduler: Any) -> tuple[type[SchedulerAdapter], bool]:
    """The adapter class hosting ``scheduler`` (a ``ray.tune``
    ``TrialScheduler``) and whether it is the family's own class; a clear
    error for one that cannot be hosted."""
    from ray.tune.schedulers import TrialScheduler

    if not isinstance(scheduler, TrialScheduler):
        raise TypeError(f"TuneConfig.scheduler must be a ray.tune TrialScheduler, got {type(scheduler).__name__}")
    families = _families()
    family = next((cls for cls in type(scheduler).__mro__ if cls in families), None)
    if family is None:
        return FifoAdapter, False
    adapter = families[family]
    exact = family is type(scheduler)
    if not isinstance(adapter, str) and (exact or adapter.hosts_subclasses):
        return adapter, exact
    name = type(scheduler).__name__
    if isinstance(adapter, str):  # a refused class, or one of its subclasses
        why = f"{name} {adapter}, which ray_stagetree does not host yet"
    else:  # a subclass of a family whose adapter runs the family's rule itself
        why = (
            f"{name} is a subclass of {family.__name__}, whose rule ray_stagetree runs itself (as it forks "
            f"trials from shared stages), so {name}'s own decisions would not be the ones made"
        )
    hosted = ", ".join(cls.__name__ for cls, hosts in families.items() if not isinstance(hosts, str))
    raise NotImplementedError(f"{why}; supported: {hosted} and custom TrialSchedulers; ray.tune.Tuner runs {name}")


def check_scheduler(scheduler: Any, metric: str | None = None, mode: str | None = None) -> None:
    """Raise a clear error for schedulers that cannot be hosted yet, or that
    would fail at their first trial for want of a metric and mode."""
    if scheduler is None:
        return
    adapter, exact = adapter_for(scheduler)
    adapter.check(scheduler, metric, mode, exact)
    base = adapter.wrapped(scheduler)
    if base is not None:
        base_adapter, _ = adapter_for(base)
        if not (issubclass(base_adapter, TuneFedAdapter) and base_adapter.hosts_subclasses) or base_adapter.wrapped(
            base
        ):
            raise NotImplementedError(
                f"{type(scheduler).__name__}(base_scheduler={type(base).__name__}(...)) is not hosted: "
                f"ray_stagetree runs {type(base).__name__}'s rule itself, which changes no resources; use a "
                "base scheduler Tune feeds (FIFO, ASHA, HyperBand, median stopping, your own), or run this "
                "scheduler with ray.tune.Tuner"
            )
        check_scheduler(base, metric, mode)


def check_metric_conflict(scheduler: Any, metric: str | None, mode: str | None) -> None:
    """Tune's rule: a scheduler made with its own ``metric`` or ``mode`` takes
    neither from ``TuneConfig`` (its ``set_search_properties`` refuses them,
    and Tune raises); checked without setting anything on the scheduler."""
    own_metric, own_mode = getattr(scheduler, "_metric", None), getattr(scheduler, "_mode", None)
    if (metric and own_metric) or (mode and own_mode):
        raise ValueError(
            f"You passed a `metric` or `mode` argument to `tune.TuneConfig()` (metric={metric!r}, mode={mode!r}), "
            f"but the scheduler you are using was already instantiated with their own `metric` and `mode` "
            f"parameters ({type(scheduler).__name__}(metric={own_metric!r}, mode={own_mode!r})). Either remove "
            "the arguments from your scheduler or from `tune.TuneConfig()` args."
        )


def scheduler_max_t(scheduler: Any) -> float | None:
    """The most a trial runs under ``scheduler`` (ASHA's and HyperBand's
    ``max_t``), or None: a study's horizon when ``RunConfig.stop`` sets none."""
    if scheduler is None:
        return None
    adapter, _ = adapter_for(scheduler)
    return adapter.max_t(scheduler)
