"""Reproducible studies: seeded stages, optional deterministic algorithms, and
repeats of each configuration under several seeds.

Without seeding, a batch that starts from scratch draws a fresh stream
(`worker.StageWorker._train` seeds the global generators from the operating
system's entropy), so the metrics vary from run to run. With
``Tuner(reproducible=True)`` every batch seeds Python's, NumPy's and torch's
generators before the trainable runs, from the trial's seed and the
iteration the batch starts at. The seed depends only on what the trials
through a stage share (their ``seed`` entry, or the study's seed), never on
a trial's id, so a shared stage and the same trial trained alone draw the
same numbers; a batch resuming from a checkpoint is then set to the exact
generator state the checkpoint carries (`execution.rng`) when the trainable
calls ``get_checkpoint()``.

Repeats put the seed into the configuration (``config["seed"]``): an int is
a hyper-parameter like any other, so the planner's sharing rule keeps
repeats of one configuration apart from iteration 0 (the seed is in play from
the model's initialisation), while different configurations with the same
seed still share their common prefix.
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import sys
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ray.tune.search import Repeater, Searcher

from ray_stagetree.execution.rng import seed_everything
from ray_stagetree.planning.config import tabular
from ray_stagetree.validation import BOOL, Int, check

#: The config entry that holds a trial's seed (set per repeat, or by the user).
SEED_KEY = "seed"
#: Tune's ``Repeater`` puts the repeat's index under this key.
_TUNE_TRIAL_INDEX = "__trial_index__"
#: cuBLAS needs a fixed workspace to be deterministic (NVIDIA's documented setting).
_CUBLAS_WORKSPACE = ":4096:8"


@dataclass(frozen=True)
class Reproducibility:
    """How a reproducible study seeds its stages.

    Parameters
    ----------
    seed:
        The study's seed: the trial seed of trials without a ``seed`` entry,
        and the first repeat's seed.
    deterministic_algorithms:
        Also call ``torch.use_deterministic_algorithms(True)`` on the workers
        (and turn off cuDNN's benchmark mode): bit-identical on GPUs too,
        at some speed; operations without a deterministic version then raise.
    """

    seed: int = 0
    deterministic_algorithms: bool = False


def check_seed(name: str, value: Any) -> int:
    """``value`` as a seed, or a ValueError naming ``name``."""
    return int(check(name, value, Int(low=0)))


def trial_seed(config: dict[str, Any], reproducibility: Reproducibility) -> int:
    """The seed a trial's stages derive theirs from: its ``seed`` entry, or the study's."""
    if SEED_KEY not in config:
        return reproducibility.seed
    return check_seed(f"config[{SEED_KEY!r}] (the trial's seed in a reproducible study)", config[SEED_KEY])


def stage_seed(seed: int, start: int) -> int:
    """The seed of a stage batch that starts at iteration ``start``: a hash,
    so nearby seeds and start iterations give unrelated streams (63 bits,
    which Python, NumPy (mod 2**32) and torch all take)."""
    digest = hashlib.sha256(f"ray_stagetree:{seed}:{start}".encode()).digest()
    return int.from_bytes(digest[:8], "big") >> 1


def seed_stage(reproducibility: Reproducibility, config: dict[str, Any], start: int) -> None:
    """Seed this worker's generators for a batch of ``config`` starting at
    ``start``, before the trainable runs. torch is imported when installed,
    so a trainable that imports it inside its body is seeded too."""
    if reproducibility.deterministic_algorithms:
        # Read when CUDA initialises: set it before the trainable touches the GPU.
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", _CUBLAS_WORKSPACE)
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is not None:
        importlib.import_module("torch")
    seed_everything(stage_seed(trial_seed(config, reproducibility), start))
    torch = sys.modules.get("torch")
    if torch is not None and reproducibility.deterministic_algorithms:
        torch.use_deterministic_algorithms(True)
        torch.backends.cudnn.benchmark = False


def repeat_configs(configs: Iterable[dict[str, Any]], repeats: int, seed: int) -> list[dict[str, Any]]:
    """Each config ``repeats`` times in a row, the k-th with ``seed + k`` as its ``seed`` entry."""
    return [{**config, SEED_KEY: seed + k} for config in configs for k in range(repeats)]


def check_reproducibility_arguments(
    reproducible: Any, seed: Any, repeats: Any, deterministic_algorithms: Any, param_space: dict[str, Any]
) -> None:
    """The Tuner's ``reproducible``, ``seed``, ``repeats`` and
    ``deterministic_algorithms``; a clear error for each bad value."""
    check("reproducible", reproducible, BOOL)
    check_seed("seed", seed)
    check("repeats", repeats, Int(low=1), meaning=" (trainings of each configuration)")
    check("deterministic_algorithms", deterministic_algorithms, BOOL)
    if deterministic_algorithms and not reproducible:
        raise ValueError(
            "deterministic_algorithms=True needs reproducible=True: deterministic kernels give the same "
            "results only from the same seeds"
        )
    if repeats > 1 and SEED_KEY in param_space:
        raise ValueError(
            f"repeats={repeats} sets each repeat's config[{SEED_KEY!r}], but param_space already has "
            f"{SEED_KEY!r}: {param_space[SEED_KEY]!r}; remove it (repeats get seeds seed, seed + 1, ...), "
            "or use repeats=1 and search over the seed yourself"
        )


class SeededRepeater(Repeater):
    """Tune's ``Repeater``: suggests each configuration of ``searcher``
    ``repeat`` times and reports their mean metric back to it; the k-th
    repeat gets ``seed + k`` as its ``seed`` entry."""

    def __init__(self, searcher: Searcher, repeat: int, seed: int) -> None:
        super().__init__(searcher, repeat=repeat, set_index=True)
        self.seed = seed

    def suggest(self, trial_id: str) -> dict[str, Any] | str | None:
        config = super().suggest(trial_id)
        if isinstance(config, dict):
            config = dict(config)
            config[SEED_KEY] = self.seed + config.pop(_TUNE_TRIAL_INDEX)
        return config


def configuration_key(config: dict[str, Any]) -> str:
    """A configuration without its seed, as a canonical string: repeats of
    one configuration have equal keys."""
    return json.dumps({k: v for k, v in config.items() if k != SEED_KEY}, sort_keys=True, default=repr)


def repeat_statistics(results: Iterable[Any], metric: str):
    """One row per configuration: its config (flattened, ``config/...``),
    ``num_repeats``, ``seeds``, and the mean and sample standard deviation
    (ddof=1; NaN for a single repeat) of each repeat's last ``metric``.
    Errored repeats and repeats that never reported ``metric`` are left out
    of the statistics and counted in ``num_errors``."""
    import numpy as np
    import pandas as pd
    from ray.tune.utils import flatten_dict

    groups: dict[str, dict[str, Any]] = {}
    for result in results:
        config = dict(result.config or {})
        group = groups.setdefault(
            configuration_key(config),
            {"config": {k: v for k, v in config.items() if k != SEED_KEY}, "seeds": [], "values": [], "errors": 0},
        )
        group["seeds"].append(config.get(SEED_KEY))
        value = (result.metrics or {}).get(metric)
        if result.error is not None or value is None:
            group["errors"] += 1
        else:
            group["values"].append(float(value))
    rows = []
    for group in groups.values():
        values = np.asarray(group["values"], dtype=float)
        row = {f"config/{key}": value for key, value in flatten_dict(tabular(group["config"])).items()}
        row.update(
            {
                "num_repeats": len(group["seeds"]),
                "seeds": group["seeds"],
                "num_errors": group["errors"],
                f"{metric}_mean": float(values.mean()) if len(values) else float("nan"),
                f"{metric}_std": float(values.std(ddof=1)) if len(values) > 1 else float("nan"),
            }
        )
        rows.append(row)
    return pd.DataFrame(rows)
