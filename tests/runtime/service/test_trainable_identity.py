"""Which studies may share a plan: the trainable's identity, and the plan
service settings a Tuner accepts (no Ray started)."""

import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from ray import tune
from trainables_for_tests import NoisyDescent, noisy_descent, sum_of_lr

from ray_stagetree import Tuner
from ray_stagetree.runtime.service.service_client import SERVICE_ENV, PlanServiceConfig
from ray_stagetree.runtime.service.trainable_identity import share_key


def train(config, data=None):
    return data


def train_edited(config, data=None):
    return data if data is not None else 0


def test_the_same_trainable_has_the_same_key_in_every_process():
    # A tensor's pickle differs between processes: its contents are what count.
    code = (
        "import torch; from ray import tune; from trainables_for_tests import sum_of_lr;"
        "from ray_stagetree.runtime.service.trainable_identity import share_key;"
        "print(share_key('g', sum_of_lr), share_key('g', tune.with_parameters(sum_of_lr, data=torch.arange(6.0))))"
    )
    tests = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")])}
    other_process = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, env=environment
    ).stdout
    here = [share_key("g", sum_of_lr), share_key("g", tune.with_parameters(sum_of_lr, data=torch.arange(6.0)))]
    assert other_process.split() == here
    assert share_key("g", tune.with_resources(sum_of_lr, {"cpu": 1})) == share_key("g", sum_of_lr)


def test_other_code_data_or_group_is_another_identity():
    keys = {
        share_key("g", train),
        share_key("g", train_edited),  # other code
        share_key("other", train),  # other study group
        share_key("g", tune.with_parameters(train, data=np.zeros(3))),
        share_key("g", tune.with_parameters(train, data=np.ones(3))),  # other with_parameters data
        share_key("g", noisy_descent),
        share_key("g", NoisyDescent),
    }
    assert len(keys) == 7
    assert share_key("g", tune.with_parameters(train, data=np.ones(3))) == share_key(
        "g", tune.with_parameters(train, data=np.ones(3))
    )


@pytest.mark.parametrize(
    "options, message",
    [
        ({"name": "a/b"}, "PlanServiceConfig.name must be letters"),
        ({"name": "svc", "study_group": ""}, "PlanServiceConfig.study_group"),
        ({"name": "svc", "weight": 0}, r"PlanServiceConfig.weight must be a number > 0, got 0"),
        ({"name": "svc", "idle_timeout_s": -1}, "PlanServiceConfig.idle_timeout_s"),
        ({"name": "svc", "detach_after_s": True}, "PlanServiceConfig.detach_after_s"),
    ],
)
def test_bad_plan_service_settings_are_refused_naming_them(options, message):
    with pytest.raises(ValueError, match=message):
        PlanServiceConfig(**options)


def test_the_tuner_takes_a_name_a_config_or_the_environment(monkeypatch):
    assert Tuner(sum_of_lr, plan_service="team").plan_service == PlanServiceConfig("team")
    assert Tuner(sum_of_lr, plan_service=PlanServiceConfig("team", weight=2)).plan_service.weight == 2
    with pytest.raises(TypeError, match="plan_service must be a service name"):
        Tuner(sum_of_lr, plan_service=3)
    monkeypatch.setenv(SERVICE_ENV, "from_env")
    assert Tuner(sum_of_lr).plan_service == PlanServiceConfig("from_env")
    monkeypatch.delenv(SERVICE_ENV)
    assert Tuner(sum_of_lr).plan_service is None
