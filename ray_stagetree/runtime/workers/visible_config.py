"""What a trainable may see of its config: nothing that could differ between
the trials that share the stage it is training.

Trials share iterations [0, k) exactly when their static config entries and
their hyper-parameters' names are equal and every hyper-parameter has the
same value (and type) at every iteration before k. A sequence object holds
more than that: its values after k and its parameters (milestones, gamma),
which differ between the trials through a shared stage. So the config a
trainable gets holds each sequence's value at the iteration the trainable
starts at, a plain number or string as in a Tune config (``SGD(lr=config["lr"])``,
``torch.save``, JSON all work), and nothing else of it. What the trainable
computes at iteration i can then depend only on what every trial through
that iteration shares, whichever trial's config the batch was started with,
and an error it raises there is every such trial's error.

A value in ``config`` stays as it was while the trainable runs: where it
changes, the stage worker restarts the trainable from the checkpoint it
reported there (`ray_stagetree.runtime.workers.context`), unless the
trainable follows its values through ``get_hparams()``.
"""

from __future__ import annotations

from typing import Any

import numpy as np


def values_at(config: dict[str, Any], flat: Any, plain: frozenset[str], iteration: int) -> dict[str, Any]:
    """``config`` with every sequence the user gave as a sequence (``flat``'s
    declared names not in ``plain``) replaced by its value at ``iteration``
    (a Python scalar), copying only the dicts on those paths."""
    from ray_stagetree.planning.config import replaced

    values = {
        name: sequence.value(iteration)
        for name, sequence in zip(flat.names, flat.sequences)
        if name in flat.declared and name not in plain
    }
    return replaced(config, {name: v.item() if isinstance(v, np.generic) else v for name, v in values.items()})
