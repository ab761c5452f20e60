"""Search spaces of the Hippo paper's evaluation, as Tune ``param_space`` dicts.

Used by the examples, the release benchmarks and the tests, so that every
figure we quote is measured on the same space. Draw trials with
`ray_stagetree.searchers.generate_trials` (or pass the space to the Tuner).
"""

from __future__ import annotations

from typing import Any

from ray_stagetree.sequences import Cosine, CyclicLR, Exponential, MultiStep, Warmup

#: Max training iterations (epochs) of the ResNet56 studies (Table 1).
RESNET56_HORIZON = 120

# The paper gives warm-ups as (duration, target); it does not give the start,
# so warm-ups start at a tenth of the target, as in Goyal et al.'s recipe.
_WARMUP_START = 0.01


def resnet56_space() -> dict[str, Any]:
    """Table 2 of the Hippo paper: 5 x 2 x 2 x 2 x 3 = 120 grid trials.

    Example
    -------
    >>> from ray_stagetree.searchers import generate_trials
    >>> len(generate_trials(resnet56_space()))
    120
    """
    from ray import tune

    step_decay = MultiStep(0.1, [90, 135], 0.1)
    return {
        "lr": tune.grid_search(
            [
                step_decay,
                Warmup(_WARMUP_START, 5, step_decay),
                Warmup(_WARMUP_START, 5, Exponential(0.1, 0.95)),
                Warmup(_WARMUP_START, 10, Cosine(0.1, 0.0, 20)),
                CyclicLR(0.001, 0.1, 20),
            ]
        ),
        "batch_size": tune.grid_search([128, MultiStep(values=(128, 256), milestones=[70])]),
        "momentum": tune.grid_search([0.9, MultiStep(values=(0.7, 0.8, 0.9), milestones=[40, 80])]),
        "weight_decay": tune.grid_search([1e-4, 1e-3]),
        "optimizer": tune.grid_search(["adam", "sgd", "sgd_momentum"]),
    }

