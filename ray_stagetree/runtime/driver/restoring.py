"""What `Tuner.restore` checks and resolves before a study continues, as
Tune's ``TunerInternal`` does: the trainable given again must be the one the
study ran (by Tune's identifier), the ``param_space`` given again must have
the original's keys (it may only refresh values, such as ``ray.put``
references)."""

from __future__ import annotations

from typing import Any

from ray_stagetree.runtime.driver.tune_compat import trainable_name

#: Keys of the Tuner's saved settings (`Tuner._save_settings`) these checks read.
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
