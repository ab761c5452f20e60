"""The driver's memory at many trials: what a study keeps there and when.

A driver that tunes a plain function must not load torch (about 185 MB of
its memory), and a study's end must not hold every trial's summary or
Tune's whole snapshot twice at once (serialised and built): at 10,000
trials those were the driver's peak (``release/bench_scale.py`` measures it).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import ray

from ray_stagetree.execution.storage import CheckpointStorage
from ray_stagetree.runtime.control import controller
from ray_stagetree.runtime.control.controller import fetch_summaries


def test_tuning_a_function_leaves_torch_unloaded_and_a_torch_trainer_still_recognised():
    code = (
        "import sys\n"
        "from ray import tune\n"
        "from ray_stagetree import Tuner\n"
        "from ray_stagetree.runtime.driver.tune_compat import is_ray_train_trainer, legacy_torch_trainer\n"
        "def train(config):\n"
        "    tune.report({'y': config['x']})\n"
        "Tuner(train, param_space={'x': tune.uniform(0, 1)})\n"
        "assert not is_ray_train_trainer(train) and not legacy_torch_trainer(train)\n"
        "assert 'torch' not in sys.modules, 'a Tuner of a function loaded torch'\n"
        "from ray.train import ScalingConfig\n"
        "from ray.train.torch import TorchTrainer\n"
        "trainer = TorchTrainer(lambda: None, scaling_config=ScalingConfig(num_workers=1))\n"
        "assert is_ray_train_trainer(trainer) and legacy_torch_trainer(trainer)\n"
    )
    environment = dict(os.environ, RAY_TRAIN_V2_ENABLED="0")
    finished = subprocess.run([sys.executable, "-c", code], env=environment, capture_output=True, text=True)
    assert finished.returncode == 0, finished.stderr[-2000:]


@pytest.mark.parametrize("trials", [0, 1, controller.SUMMARY_PAGE, 2 * controller.SUMMARY_PAGE + 7])
def test_summaries_come_a_page_at_a_time_all_of_them_in_order(ray_session, trials):
    summaries = [{"trial_id": str(index)} for index in range(trials)]
    pages = []

    def results(first: int, count: int) -> ray.ObjectRef:
        pages.append(count)
        return ray.put(summaries[first : first + count])

    assert fetch_summaries(results) == summaries
    assert set(pages) == {controller.SUMMARY_PAGE}
    assert len(pages) == trials // controller.SUMMARY_PAGE + 1


def test_a_file_written_in_chunks_is_whole_or_not_there(tmp_path):
    storage = CheckpointStorage(str(tmp_path))
    path = storage.write_chunks("state.json", (part.encode() for part in ['{"a": ', "[1, 2]", "}"]))
    assert json.loads(open(path).read()) == {"a": [1, 2]}

    def broken():
        yield b'{"a": '
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        storage.write_chunks("state.json", broken())
    assert json.loads(open(path).read()) == {"a": [1, 2]}, "the file written before is left as it was"
    assert sorted(os.listdir(tmp_path)) == ["state.json"], "no temporary file is left behind"
