"""Ray PBT's policy files in the experiment folder (``log_config=True``,
the default): each exploit as a row of ``pbt_global.txt``, and the
exploited trial's ``pbt_policy_<trial id>.txt``, its source's history
copied in, then the row. ``PopulationBasedTrainingReplay`` replays such a
file, under Tune or here."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterable
from typing import Any

GLOBAL_FILE = "pbt_global.txt"
TRIAL_FILE = "pbt_policy_{}.txt"


def write_policy(steps: Iterable[tuple[str, str, list[Any]]], folder: str) -> list[str]:
    """Append ``steps`` (trial id, source id, Ray's row) to the policy files
    in ``folder`` as Ray's ``_log_config_on_step`` does; the names of the
    files written."""
    from ray.tune.utils.util import SafeFallbackEncoder

    written: set[str] = set()
    for trial_id, source_id, row in steps:
        line = json.dumps(row, cls=SafeFallbackEncoder) + "\n"
        trial_file, source_file = TRIAL_FILE.format(trial_id), TRIAL_FILE.format(source_id)
        with open(os.path.join(folder, GLOBAL_FILE), "a") as file:
            file.write(line)
        if os.path.exists(os.path.join(folder, source_file)):  # the trial's history becomes its source's
            shutil.copyfile(os.path.join(folder, source_file), os.path.join(folder, trial_file))
        with open(os.path.join(folder, trial_file), "a") as file:
            file.write(line)
        written.update((GLOBAL_FILE, trial_file))
    return sorted(written)
