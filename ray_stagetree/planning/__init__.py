"""The planning core: trial configurations, the search plan, stage trees,
execution policies, the cost model and merge rates.

Pure Python: nothing here imports Ray, so planning can be tested and
benchmarked without starting it. The user's API (the Tuner, the execution
policies a study is given, merge rates) is `ray_stagetree`'s; the names
here are for code that plans, simulates or inspects a study.
"""

from ray_stagetree.planning.config import TrialConfig
from ray_stagetree.planning.cost import CostModel
from ray_stagetree.planning.lifecycle import TrialSource
from ray_stagetree.planning.merge import kwise_merge_rate, merge_rate
from ray_stagetree.planning.plan import CheckpointInfo, PlanNode, Request, RequestState, SearchPlan
from ray_stagetree.planning.policies import (
    BreadthFirstPolicy,
    CriticalPathPolicy,
    ExecutionPolicy,
    StageBatch,
    ThroughputPolicy,
    get_policy,
)
from ray_stagetree.planning.stage_tree import CheckpointSource, Stage, StageTree, build_stage_tree

# Importing the time-sharing policies registers their names with get_policy.
from ray_stagetree.planning.time_sharing import (
    FifoPolicy,
    HermesPolicy,
    RoundRobinPolicy,
    SlaqPolicy,
    TimeSharingPolicy,
)

#: What a user passes a study (its execution policy) or computes (merge
#: rates): the user's API, which `ray_stagetree` exports too.
USER_API = [
    "ExecutionPolicy",
    "CriticalPathPolicy",
    "ThroughputPolicy",
    "BreadthFirstPolicy",
    "TimeSharingPolicy",
    "HermesPolicy",
    "RoundRobinPolicy",
    "SlaqPolicy",
    "FifoPolicy",
    "get_policy",
    "merge_rate",
    "kwise_merge_rate",
]

#: Planning internals `ray_stagetree` exported before the vocabulary rename (it still
#: does for one release, with a DeprecationWarning).
FORMERLY_TOP_LEVEL = [
    "TrialConfig",
    "SearchPlan",
    "PlanNode",
    "Request",
    "RequestState",
    "CheckpointInfo",
    "build_stage_tree",
    "StageTree",
    "Stage",
    "StageBatch",
    "CostModel",
]

__all__ = [*FORMERLY_TOP_LEVEL, "TrialSource", "CheckpointSource", *USER_API]
