"""ray_stagetree: hyper-parameter optimization on Ray Tune where trials that
share a prefix of their hyper-parameter sequences train it once.

The names here are the user's API. The planning core (the search plan,
stage trees, the cost model: `ray_stagetree.planning`) imports no Ray and
starts nothing.
"""

from ray_stagetree import planning
from ray_stagetree._version import __version__ as __version__
from ray_stagetree.planning._deprecated import moved_names
from ray_stagetree.runtime.workers.session import (
    for_ray_tune,
    get_checkpoint,
    get_hparams,
    get_iteration,
    report,
    should_checkpoint,
    timed,
)
from ray_stagetree.sequences import FAMILIES, Sequence, as_sequence, from_json, from_torch

# Every sequence family by its name (see `ray_stagetree.sequences`), and the
# execution policies and merge rates (`ray_stagetree.planning.USER_API`).
globals().update(FAMILIES)
globals().update((name, getattr(planning, name)) for name in planning.USER_API)


# Planning internals were exported here before the vocabulary rename; they live in
# `ray_stagetree.planning`, and work here for one more release, with a warning.
# The runtime imports Ray: it loads on first use, so the planning core stays light.
__getattr__ = moved_names(
    __name__,
    moves={
        **{name: f"ray_stagetree.planning.{name}" for name in planning.FORMERLY_TOP_LEVEL},
        "Source": "ray_stagetree.planning.CheckpointSource",
    },
    lazy={
        "Tuner": "ray_stagetree.runtime.driver.tuner.Tuner",
        "run": "ray_stagetree.runtime.driver.tune_run.run",
        "run_experiments": "ray_stagetree.runtime.driver.tune_run.run_experiments",
        "ResultGrid": "ray_stagetree.runtime.driver.results.ResultGrid",
        "Study": "ray_stagetree.runtime.driver.study.Study",
        "init_ray": "ray_stagetree.runtime.driver.cluster.init_ray",
        "PlanServiceConfig": "ray_stagetree.runtime.service.service_client.PlanServiceConfig",
        "PromotingASHAScheduler": "ray_stagetree.trial_schedulers.promoting_asha.PromotingASHAScheduler",
    },
)

__all__ = [
    # runtime
    "Tuner",
    "run",
    "run_experiments",
    "ResultGrid",
    "Study",
    "init_ray",
    "PlanServiceConfig",
    "PromotingASHAScheduler",
    "report",
    "get_checkpoint",
    "timed",
    "get_hparams",
    "get_iteration",
    "should_checkpoint",
    "for_ray_tune",
    # sequences
    "Sequence",
    *sorted(FAMILIES),
    "as_sequence",
    "from_json",
    "from_torch",
    # execution policies, merge rates
    *planning.USER_API,
]
