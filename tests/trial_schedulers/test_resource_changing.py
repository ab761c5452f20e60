"""ResourceChangingScheduler hosted on the plan, written from Ray's docs.

Ray's scheduler asks its ``resources_allocation_function`` at each result
the base scheduler lets go on; new resources pause the trial, which Tune
restarts from its checkpoint with them, and the trainable reads them from
``tune.get_context().get_trial_resources()``. Here the stage ends at that
result and the next runs on a worker holding the new resources.
"""

import json
import os
import tempfile
import time

import pytest
from ray import tune
from ray.tune.schedulers import ASHAScheduler, PopulationBasedTraining, ResourceChangingScheduler
from ray.tune.schedulers.resource_changing_scheduler import DistributeResources

from ray_stagetree import Tuner

ITERATIONS = 4


def gpu_counting(config):
    """Reports the GPUs it holds, by Tune's context and by what CUDA would
    see, and how many iterations it trained since its checkpoint."""
    step = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder, open(os.path.join(folder, "step.json")) as file:
            step = json.load(file)
    resources = tune.get_context().get_trial_resources()
    while True:
        step += 1
        time.sleep(config.get("seconds", 0))
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "step.json"), "w") as file:
                json.dump(step, file)
            with open(os.path.join(folder, "ballast"), "wb") as file:  # a checkpoint that takes a while to hand over
                file.write(os.urandom(config.get("ballast_mb", 0) * 2**20))
            metrics = {
                "score": config["x"] * step,
                "gpus": resources.required_resources.get("GPU", 0),
                "visible": len(os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",")),
                "step": step,
            }
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))


@pytest.mark.timeout(240)
def test_trials_get_the_gpus_distribute_resources_frees_for_them(ray_session, tmp_path):
    """4 GPUs, 2 trials asking 1 each: Ray's DistributeResources gives each
    more after its first result (what is free then), and the last one running
    the GPUs the other freed; each goes on from its checkpoint on a worker
    holding them, as under Tune."""
    results = Tuner(
        tune.with_resources(lambda config: gpu_counting(config), {"cpu": 0.5, "gpu": 1}),
        param_space={"x": tune.grid_search([1, 2])},
        tune_config=tune.TuneConfig(
            scheduler=ResourceChangingScheduler(resources_allocation_function=DistributeResources()),
            metric="score",
            mode="max",
        ),
        run_config=tune.RunConfig(storage_path=str(tmp_path), stop={"training_iteration": ITERATIONS}, verbose=0),
    ).fit()
    assert not results.errors
    for result in results:
        rows = result.metrics_dataframe
        assert list(rows["training_iteration"]) == list(range(1, ITERATIONS + 1))
        assert list(rows["step"]) == list(range(1, ITERATIONS + 1)), "restored from its checkpoint, not restarted"
        gpus = list(rows["gpus"])
        assert gpus[0] == 1 and min(gpus[1:]) > 1 and gpus == sorted(gpus), "more GPUs from its first result on"
        assert list(rows["visible"]) == gpus, "the worker holds what the trial was given"
    # A worker retired to make room for a larger one hands its checkpoints over first: none is lost and retrained.
    assert results.iterations_executed == 2 * ITERATIONS


def test_a_resource_change_over_pbt_is_refused_before_the_study_starts(tmp_path):
    scheduler = ResourceChangingScheduler(PopulationBasedTraining(hyperparam_mutations={"x": [1, 2]}))
    with pytest.raises(NotImplementedError, match="runs PopulationBasedTraining's rule itself"):
        Tuner(gpu_counting, tune_config=tune.TuneConfig(scheduler=scheduler, metric="score", mode="max"))


def test_asha_under_a_resource_change_still_stops_trials(ray_session, tmp_path):
    """The base scheduler decides: ASHA stops the worse trials at its rungs
    while the trials running get the GPUs left free."""
    asha = ASHAScheduler(max_t=ITERATIONS, grace_period=1, reduction_factor=2)
    results = Tuner(
        tune.with_resources(lambda config: gpu_counting(config), {"cpu": 0.5, "gpu": 1}),
        # Two at a time, the best two first: the worse two reach the first rung
        # after one of those, whichever of its workers started first, and are
        # stopped there (with all four at once, the order the workers started
        # in decided whether any reached a rung after a better one).
        param_space={"x": tune.grid_search([4, 3, 2, 1]), "seconds": 0.5},
        tune_config=tune.TuneConfig(
            scheduler=ResourceChangingScheduler(asha), metric="score", mode="max", max_concurrent_trials=2
        ),
        run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0),
    ).fit()
    assert not results.errors
    lengths = sorted(result.metrics["training_iteration"] for result in results)
    assert lengths[0] < ITERATIONS == lengths[-1], "ASHA stopped some trials early and let the best finish"
    assert results.get_best_result().config["x"] == 4
    assert any(max(result.metrics_dataframe["gpus"]) > 1 for result in results), "GPUs the stopped ones freed"


def all_gpus_after_the_first_result(tune_controller, trial, result, scheduler):
    """A resources_allocation_function: the trial gets every GPU once it reported."""
    if result["training_iteration"] < 1:
        return None
    return tune.PlacementGroupFactory([{"CPU": 0.5, "GPU": 4}])


def test_a_worker_retired_for_a_larger_one_hands_over_its_checkpoint_first(ray_session, tmp_path):
    """The trial's own worker is the one that must go to make room for the
    worker its new resources need: it goes once its checkpoint is taken, so
    the trial goes on from it instead of training again from the start."""
    results = Tuner(
        tune.with_resources(lambda config: gpu_counting(config), {"cpu": 0.5, "gpu": 2}),
        param_space={"x": 1, "ballast_mb": 64},
        tune_config=tune.TuneConfig(
            scheduler=ResourceChangingScheduler(resources_allocation_function=all_gpus_after_the_first_result),
            metric="score",
            mode="max",
        ),
        run_config=tune.RunConfig(storage_path=str(tmp_path), stop={"training_iteration": ITERATIONS}, verbose=0),
    ).fit()
    assert not results.errors
    assert list(results[0].metrics_dataframe["gpus"]) == [2] + [4] * (ITERATIONS - 1)
    assert results.iterations_executed == ITERATIONS, "no iteration trained twice"
