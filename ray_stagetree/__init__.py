"""ray_stagetree: hyper-parameter optimization on Ray Tune where trials that
share a prefix of their hyper-parameter sequences train it once.

The planning core (sequences, search plan, stage trees, execution policies)
imports no Ray and starts nothing.
"""

from ray_stagetree.planning.config import TrialConfig
from ray_stagetree.planning.cost import CostModel
from ray_stagetree.planning.merge import kwise_merge_rate, merge_rate
from ray_stagetree.planning.plan import (
    CheckpointInfo,
    PlanNode,
    Request,
    RequestState,
    SearchPlan,
)
from ray_stagetree.planning.policies import (
    BreadthFirstPolicy,
    CriticalPathPolicy,
    ExecutionPolicy,
    StageBatch,
    ThroughputPolicy,
    get_policy,
)
from ray_stagetree.planning.stage_tree import Source, Stage, StageTree, build_stage_tree

# Importing the time-sharing policies registers their names with get_policy.
from ray_stagetree.planning.time_sharing import (
    FifoPolicy,
    HermesPolicy,
    RoundRobinPolicy,
    SlaqPolicy,
    TimeSharingPolicy,
)
from ray_stagetree.runtime.session import (
    get_checkpoint,
    get_hparams,
    get_iteration,
    report,
    should_checkpoint,
)
from ray_stagetree.sequences import FAMILIES, Sequence, as_sequence, from_json

# Every sequence family by its name (see `ray_stagetree.sequences`).
globals().update(FAMILIES)

__version__ = "0.1.0"

# The runtime imports Ray; load it on first use so the planning core stays light.
_RUNTIME = {"Tuner": "ray_stagetree.runtime.tuner", "ResultGrid": "ray_stagetree.runtime.results", "Study": "ray_stagetree.runtime.study", "init_ray": "ray_stagetree.runtime.cluster", "PlanServiceConfig": "ray_stagetree.runtime.service_client"}


def __getattr__(name: str):
    if name in _RUNTIME:
        import importlib

        return getattr(importlib.import_module(_RUNTIME[name]), name)
    raise AttributeError(f"module 'ray_stagetree' has no attribute {name!r}")

__all__ = [
    # runtime
    "Tuner",
    "ResultGrid",
    "Study",
    "init_ray",
    "PlanServiceConfig",
    "report",
    "get_checkpoint",
    "get_hparams",
    "get_iteration",
    "should_checkpoint",
    # sequences
    "Sequence",
    *sorted(FAMILIES),
    "as_sequence",
    "from_json",
    # planning
    "TrialConfig",
    "SearchPlan",
    "PlanNode",
    "Request",
    "RequestState",
    "CheckpointInfo",
    "build_stage_tree",
    "StageTree",
    "Stage",
    "Source",
    # execution policies
    "ExecutionPolicy",
    "CriticalPathPolicy",
    "ThroughputPolicy",
    "BreadthFirstPolicy",
    "TimeSharingPolicy",
    "HermesPolicy",
    "RoundRobinPolicy",
    "SlaqPolicy",
    "FifoPolicy",
    "StageBatch",
    "get_policy",
    "CostModel",
    # accounting
    "merge_rate",
    "kwise_merge_rate",
]
