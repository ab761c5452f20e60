"""Which of a trial's checkpoints its folder keeps, as Tune's checkpoint
manager keeps them under a ``tune.CheckpointConfig``."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any


def save_frequency(config: Any) -> int:
    """Every how many iterations Tune saves a class trainable under ``config``
    (a ``tune.CheckpointConfig`` or None): 0 for never."""
    return getattr(config, "checkpoint_frequency", 0) or 0


def saves_at_end(config: Any) -> bool:
    """Whether Tune saves a class trainable where its trial ends under
    ``config``: its default, unless ``checkpoint_at_end=False``."""
    return getattr(config, "checkpoint_at_end", None) is not False


def kept_checkpoints(
    iterations: list[int], metrics: Callable[[int], dict[str, Any]], config: Any
) -> tuple[list[int], list[int]]:
    """Which of a trial's checkpoints (at ``iterations``, ascending) its folder
    keeps, as Tune's checkpoint manager keeps them under ``config`` (a
    ``tune.CheckpointConfig`` or None): the ``num_to_keep`` best by
    ``checkpoint_score_attribute`` in ``metrics(iteration)`` (else the most
    recent), and always the latest, which is ``Result.checkpoint``.

    Returns the kept iterations, ascending, and the best ones in Tune's order for
    ``Result.best_checkpoints``: worst first. A missing or NaN score ranks
    below every number; among equal scores the more recent ranks higher.

    Examples
    --------
    >>> from ray import tune
    >>> config = tune.CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="acc")
    >>> kept_checkpoints([1, 2, 3], lambda iteration: {"acc": [0.5, 0.9, 0.7][iteration - 1]}, config)
    ([2, 3], [2])
    """
    keep = config.num_to_keep if config is not None else None
    attribute = config.checkpoint_score_attribute if config is not None else None
    ranked = list(iterations)
    if attribute is not None:
        sign = 1.0 if config.checkpoint_score_order == "max" else -1.0

        def score(iteration: int) -> tuple[bool, float, int]:
            value = metrics(iteration).get(attribute)
            if not isinstance(value, (int, float)) or math.isnan(value):
                return (False, -math.inf, iteration)
            return (True, sign * value, iteration)

        ranked.sort(key=score)
    best = ranked if keep is None else ranked[max(0, len(ranked) - keep) :]
    kept = set(best) | set(iterations[-1:])
    return sorted(kept), best
