"""What `Tuner.restore` checks and resolves before a study continues, as
Tune's ``TunerInternal`` does: the trainable given again must be the one the
study ran (by Tune's identifier), the ``param_space`` given again must have
the original's keys (it may only refresh values, such as ``ray.put``
references)."""

from __future__ import annotations

import logging
from typing import Any

from ray_stagetree.execution.storage import CheckpointStorage
from ray_stagetree.execution.study_file import STUDY_FILE, study_record
from ray_stagetree.runtime.control.experiment_state import write_tuner_settings
from ray_stagetree.runtime.driver.settings import StudySettings
from ray_stagetree.runtime.driver.tune_compat import trainable_name

logger = logging.getLogger("ray_stagetree")

#: Keys of the Tuner's saved settings (`save_settings`) these checks read.
TRAINABLE_NAME = "trainable_name"
PARAM_SPACE_KEYS = "param_space_keys"


def param_space_keys(param_space: dict[str, Any]) -> list[str]:
    """The sorted flattened keys of a ``param_space`` (``"b/c"`` for
    ``{"b": {"c": ...}}``), which restore compares."""
    from ray.tune.utils import flatten_dict

    return sorted(flatten_dict(param_space).keys())


def check_restored_trainable(trainable: Any, expected: str | None) -> None:
    """Tune's check (and message) on the trainable given to `Tuner.restore`.
    ``expected`` None: a study saved before the identifier was; not checked."""
    if expected is None:
        return
    identifier = trainable_name(trainable)
    if identifier != expected:
        raise ValueError(
            "Invalid `trainable` input to `Tuner.restore()`. To fix this error, pass in the same trainable that "
            f"was used to initialize the Tuner. Got a trainable with identifier '{identifier}' but expected "
            f"'{expected}'."
        )


def check_restored_param_space(param_space: dict[str, Any], expected: list[str] | None) -> None:
    """Tune's check (and message) on a ``param_space`` given to
    `Tuner.restore`: the same keys as the original, so that it only
    refreshes values. ``expected`` None: not checked (an older study)."""
    if expected is None:
        return
    keys = param_space_keys(param_space)
    if keys != expected:
        raise ValueError(
            "Invalid `param_space` input to `Tuner.restore()`. To fix this error, pass in the same `param_space` "
            "that was used to initialize the Tuner. Only re-specify the `param_space` to refresh Ray object "
            "references that no longer exist due to restoring from a new Ray cluster session. It should not be "
            f"used to introduce new hyperparameters to tune.\n\nGot: {keys}\nExpected: {expected}"
        )


def save_settings(tuner: StudySettings, experiment_path: str) -> None:
    """What `Tuner.restore` rebuilds ``tuner`` from, at the experiment root
    (and the study's metric and mode, which the monitor and ``stagetree
    status`` rank trials by, readable without unpickling)."""
    settings = {
        TRAINABLE_NAME: tuner.trainable_name,
        PARAM_SPACE_KEYS: param_space_keys(tuner.param_space),
        "param_space": tuner.param_space,
        "tune_config": tuner.tune_config,
        "run_config": tuner.run_config,
        "options": {
            "stage_sharing": tuner.stage_sharing,
            "execution_policy": tuner.execution_policy,
            "checkpoint_budget_bytes": tuner.checkpoint_budget_bytes,
            "parked_trainables_per_worker": tuner.parked_trainables_per_worker,
            "reproducible": tuner.reproducible,
            "seed": tuner.seed,
            "repeats": tuner.repeats,
            "deterministic_algorithms": tuner.deterministic_algorithms,
            "plan_service": tuner.plan_service,
            "scaling_config": tuner.scaling_config,
        },
    }
    storage = CheckpointStorage(experiment_path, tuner.run_config.storage_filesystem)
    storage.write_text(STUDY_FILE, study_record(tuner.tune_config.metric, tuner.tune_config.mode))
    if not write_tuner_settings(storage, settings):
        logger.warning(
            "the Tuner's param_space, TuneConfig or RunConfig cannot be pickled: the study runs, but "
            "Tuner.restore will not be able to continue it"
        )
