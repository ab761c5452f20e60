"""Each scheduler type gets its family's adapter; those that cannot be
hosted are refused clearly, before a study starts."""

import pytest
from ray import tune
from ray.tune.schedulers import (
    ASHAScheduler,
    FIFOScheduler,
    HyperBandForBOHB,
    HyperBandScheduler,
    MedianStoppingRule,
    PopulationBasedTraining,
    PopulationBasedTrainingReplay,
    ResourceChangingScheduler,
    TrialScheduler,
)
from ray.tune.schedulers.pb2 import PB2

from ray_stagetree.simulation.paper_spaces import SuccessiveHalving
from ray_stagetree.trial_schedulers.hyperband import AsyncHyperBandAdapter, HyperBandAdapter
from ray_stagetree.trial_schedulers.pb2 import PB2Adapter
from ray_stagetree.trial_schedulers.pbt import PopulationBasedAdapter
from ray_stagetree.trial_schedulers.registry import adapter_for, check_scheduler, scheduler_max_t
from ray_stagetree.trial_schedulers.replay import ReplayAdapter
from ray_stagetree.trial_schedulers.resource_changing import ResourceChangingAdapter
from ray_stagetree.trial_schedulers.tune_fed import FifoAdapter, MedianStoppingAdapter


class StopEverything(TrialScheduler):
    """A custom scheduler of the user's own, on no family of Ray's."""

    def on_trial_add(self, tune_controller, trial):
        pass

    def on_trial_result(self, tune_controller, trial, result):
        return TrialScheduler.STOP


class LoudASHA(ASHAScheduler):
    """A user's subclass: fed as ASHA is, but its overrides may decide elsewhere."""


class OwnPBT(PopulationBasedTraining):
    """A PBT subclass: its overrides would never run, since PBT runs on the plan."""


class OwnPB2(PB2):
    """A PB2 subclass: PBT's rule runs on the plan, so its overrides would not run either."""


def pbt():
    return PopulationBasedTraining(time_attr="training_iteration", hyperparam_mutations={"lr": tune.uniform(0, 1)})


@pytest.mark.parametrize(
    "scheduler, adapter, exact",
    [
        (FIFOScheduler(), FifoAdapter, True),
        (ASHAScheduler(max_t=8), AsyncHyperBandAdapter, True),
        (HyperBandScheduler(max_t=8), HyperBandAdapter, True),
        (MedianStoppingRule(), MedianStoppingAdapter, True),
        (pbt(), PopulationBasedAdapter, True),
        (StopEverything(), FifoAdapter, False),
        (LoudASHA(max_t=8), AsyncHyperBandAdapter, False),
        (SuccessiveHalving(9, grace_period=1, max_t=8), HyperBandAdapter, False),
        (HyperBandForBOHB(max_t=9), HyperBandAdapter, True),  # BOHB's HyperBand: its own milestones
        (PB2(hyperparam_bounds={"lr": [0.0, 1.0]}), PB2Adapter, True),
    ],
    ids=["fifo", "asha", "hyperband", "median", "pbt", "custom", "asha-subclass", "hyperband-subclass", "bohb", "pb2"],
)
def test_each_scheduler_type_gets_its_familys_adapter(scheduler, adapter, exact):
    assert adapter_for(scheduler) == (adapter, exact)


def test_a_pbt_replay_is_hosted(tmp_path):
    policy = tmp_path / "pbt_policy_a.txt"
    policy.write_text('["0", "1", 2, 2, {"lr": 0.1}, {"lr": 0.05}]\n')
    assert adapter_for(PopulationBasedTrainingReplay(str(policy))) == (ReplayAdapter, True)


@pytest.mark.parametrize(
    "make",
    [
        lambda: OwnPB2(hyperparam_bounds={"lr": [0.0, 1.0]}),
        lambda: OwnPBT(hyperparam_mutations={"lr": [0.1]}),
    ],
    ids=["pb2-subclass", "pbt-subclass"],
)
def test_schedulers_not_hosted_are_refused_clearly(make):
    scheduler = make()
    name = type(scheduler).__name__
    why = f"{name} is a subclass of {type(scheduler).__mro__[1].__name__}, whose rule ray_stagetree runs itself"
    with pytest.raises(NotImplementedError, match=f"^{why}.*ray.tune.Tuner runs {name}$"):
        check_scheduler(scheduler, "loss", "min")


def test_resource_changes_over_a_base_tune_feeds_are_hosted_over_pbt_refused():
    assert adapter_for(ResourceChangingScheduler()) == (ResourceChangingAdapter, True)
    check_scheduler(ResourceChangingScheduler(ASHAScheduler()), "loss", "min")
    over_pbt = ResourceChangingScheduler(PopulationBasedTraining(hyperparam_mutations={"lr": [0.1]}))
    with pytest.raises(NotImplementedError, match=r"base_scheduler=PopulationBasedTraining\(...\)\) is not hosted"):
        check_scheduler(over_pbt, "loss", "min")
    with pytest.raises(ValueError, match="AsyncHyperBandScheduler needs a metric"):
        check_scheduler(ResourceChangingScheduler(ASHAScheduler()))


def test_a_scheduler_must_be_a_tune_trial_scheduler():
    with pytest.raises(TypeError, match="TuneConfig.scheduler must be a ray.tune TrialScheduler, got str"):
        check_scheduler("asha")


def test_only_a_familys_own_class_needs_a_metric_up_front():
    with pytest.raises(ValueError, match="MedianStoppingRule needs a metric"):
        check_scheduler(MedianStoppingRule())
    check_scheduler(LoudASHA())
    check_scheduler(None)


def test_max_t_is_the_families_own_limit():
    assert scheduler_max_t(ASHAScheduler(max_t=7)) == 7
    assert scheduler_max_t(HyperBandScheduler(max_t=9)) == 9
    assert scheduler_max_t(SuccessiveHalving(9, grace_period=1, max_t=5)) == 5
    assert scheduler_max_t(MedianStoppingRule()) is None
    assert scheduler_max_t(pbt()) is None
    assert scheduler_max_t(None) is None
