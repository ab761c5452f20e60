"""What a study's run reads of its Tuner (`StudySettings`): the public
attributes every `tuner.Tuner` has once its arguments are checked. The run
(`run.StudyRun`), the trials' source (`trial_sources`) and the saved settings
(`restoring.save_settings`) read these and nothing else of it."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypeAlias

from ray_stagetree.searchers.sources import SearcherSource, VariantSource

if TYPE_CHECKING:
    from ray import tune

    from ray_stagetree.execution.scaling import Scaling
    from ray_stagetree.planning.policies import ExecutionPolicy
    from ray_stagetree.runtime.service.service_client import PlanServiceConfig

#: Where a study's trials come from.
TrialSource: TypeAlias = VariantSource | SearcherSource


class StudySettings(Protocol):
    """A checked Tuner's settings, as its study runs them."""

    trainable: Any
    trainable_name: str  # Tune's identifier of the trainable, which restore checks
    param_space: dict[str, Any]
    tune_config: tune.TuneConfig
    run_config: tune.RunConfig
    experiment_path: str  # storage_path/name, or the study's folder on a plan service
    storage_path: str
    horizon: int | None
    horizon_is_max_t: bool  # the horizon is the scheduler's max_t, not a stop criterion
    stop_thresholds: dict[str, float]
    stopper: Any
    stage_sharing: bool
    execution_policy: Any  # as given (restore gives it again)
    policy: str | ExecutionPolicy  # as the study runs it
    checkpoint_budget_bytes: int
    parked_trainables_per_worker: int
    reproducible: bool
    seed: int
    repeats: int
    deterministic_algorithms: bool
    monitor: bool
    plan_service: PlanServiceConfig | None
    share_key: str | None  # on a plan service: the trainable identity whose plan it shares
    scaling_config: Any  # as given (restore gives it again)
    scaling: Scaling | None  # each trial's worker group
