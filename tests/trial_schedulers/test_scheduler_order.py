"""Which hosted schedulers make a study dispatch its trials in admission order (issue 31)."""

import math

import pytest
from ray.tune.schedulers import ASHAScheduler, FIFOScheduler, HyperBandScheduler, MedianStoppingRule

from ray_stagetree.trial_schedulers.host import SchedulerHost


@pytest.mark.parametrize(
    "scheduler, sensitive",
    [
        (None, False),
        (FIFOScheduler(), False),
        (ASHAScheduler(max_t=16, grace_period=1, reduction_factor=2), True),
        (HyperBandScheduler(max_t=16), True),
        (MedianStoppingRule(), True),
    ],
)
def test_schedulers_that_compare_trials_are_order_sensitive(scheduler, sensitive):
    host = SchedulerHost(scheduler, "score", "max", 16 if scheduler is not None else math.inf)
    assert host.order_sensitive is sensitive
