"""A study on a plan service, run by the plan-service tests in driver
subprocesses (``python service_study.py <json arguments>``) and in the test
process itself: `sum_of_lr` over learning rates that step down at the given
milestones, so that studies with overlapping milestones share prefixes."""

from __future__ import annotations

import json
import sys

import numpy as np
from ray import tune
from trainables_for_tests import sum_of_lr

from ray_stagetree import MultiStep, Tuner
from ray_stagetree.runtime.service.service_client import PlanServiceConfig

HORIZON = 6


def sum_of_lr_with_data(config, data):
    """`sum_of_lr` through ``tune.with_parameters`` (``data`` unused): its
    objects live as long as whoever put them."""
    return sum_of_lr(config)


def tuner(storage, name, milestones, service, counter=None, sleep=0.0, trainable=sum_of_lr, **service_options):
    if trainable == "with_data":  # from a driver process's arguments
        trainable = tune.with_parameters(sum_of_lr_with_data, data=np.arange(3.0))
    space = {"lr": tune.grid_search([MultiStep(1.0, [m], 0.5) for m in milestones]), "sleep": sleep}
    if counter:
        space["counter"] = counter
    return Tuner(
        trainable,
        param_space=space,
        tune_config=tune.TuneConfig(metric="total", mode="max"),
        run_config=tune.RunConfig(stop={"training_iteration": HORIZON}, storage_path=storage, name=name, verbose=0),
        plan_service=PlanServiceConfig(service, **service_options),
    )


def expected_total(milestone):
    """sum_of_lr's total after HORIZON iterations of MultiStep(1.0, [milestone], 0.5)."""
    return min(milestone, HORIZON) + 0.5 * max(0, HORIZON - milestone)


def summary(results):
    """{milestone: total} of a ResultGrid of `tuner`'s study."""
    return {r.config["lr"].milestones[0]: r.metrics["total"] for r in results}


def same_trial_ids(set_attribute=setattr):
    """Every study of this process draws the same trial ids (a test of
    colliding ids between studies on one service); ``set_attribute``: a
    test's ``monkeypatch.setattr``."""
    import uuid

    from ray_stagetree.searchers import sources

    set_attribute(sources, "uuid", type("FixedUUID", (), {"uuid4": staticmethod(lambda: uuid.UUID(int=0))}))


def main(arguments):
    import ray

    if arguments.pop("same_trial_ids", False):
        same_trial_ids()
    # No address: the cluster of RAY_ADDRESS, as `ray job submit` sets it.
    ray.init(address=arguments.pop("address", None), namespace=arguments.pop("namespace"), configure_logging=False)
    out, service_out = arguments.pop("out"), arguments.pop("service_out", None)
    results = tuner(**arguments).fit()
    with open(out, "w") as file:
        json.dump({str(k): v for k, v in summary(results).items()}, file)
    if service_out:  # which actor served the study (drivers of one namespace find the same)
        with open(service_out, "w") as file:
            file.write(ray.get_actor(arguments["service"])._actor_id.hex())


if __name__ == "__main__":
    main(json.loads(sys.argv[1]))
