"""Ray Train v2's Tune pattern, written from Ray 2.60's docs ("Hyperparameter
tuning with Ray Tune" under Train v2): a Tune function trainable builds a
``TorchTrainer`` and calls ``fit()``; ``TuneReportCallback`` passes the
workers' reports on to Tune. Under ray_stagetree the trainer's loop runs on
the stage when the shapes match, sharing stages, and as a Ray Train run of
its own otherwise, as under Tune."""

import pytest
import ray
from data_parallel_trainables import v2_driver_function
from ray import tune

from ray_stagetree import MultiStep, Tuner
from ray_stagetree.runtime.workers.group import GROWN_NAME

EPOCHS = 4
#: Equal for epochs [0, 2): the trials' loops share them.
LRS = [MultiStep(0.5, [2], 0.5), MultiStep(0.5, [2], 0.1)]


def driver_on_one_worker(config):
    """The driver function under a name of its own (tune.with_resources marks the function it is given)."""
    v2_driver_function(config)


def _fit(tmp_path, trainable=v2_driver_function, **config):
    return Tuner(
        trainable,
        param_space={"epochs": EPOCHS, "train_storage": str(tmp_path / "train"), **config},
        run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0),
    ).fit()


def test_a_trainer_of_the_stages_shape_runs_its_loop_on_the_stage_and_shares(ray_session, tmp_path):
    # One stage worker (both CPUs): the second trial waits for the shared prefix, never retrains it on another.
    results = _fit(tmp_path, tune.with_resources(driver_on_one_worker, {"cpu": 2}), lr=tune.grid_search(LRS))
    assert [result.error for result in results] == [None, None]
    weights = []
    for result in results:
        frame = result.metrics_dataframe
        assert frame["training_iteration"].tolist() == [1, 2, 3, 4]
        assert frame["world_size"].tolist() == [1] * EPOCHS
        weights.append(frame["loss"].tolist())
    # The loop read config["lr"] as a number: 0.5 for two epochs, then the trial's own value.
    assert weights[0] == pytest.approx([0.5, 0.25, 0.25 * 0.75, 0.25 * 0.75**2])
    assert weights[1] == pytest.approx([0.5, 0.25, 0.25 * 0.95, 0.25 * 0.95**2])
    assert results.iterations_executed == 2 + 2 + 2, "the two shared epochs trained once"


def driver_beside_its_trainers_rank(config):
    v2_driver_function(config)


@pytest.mark.long
def test_trainers_asking_for_more_workers_grow_the_stage_worker_into_groups_of_their_size_and_share(
    ray_session, tmp_path
):
    """ray.tune.Tuner(driver_function) as Ray's docs write it, tuning the
    trainer's num_workers too: the stage worker becomes a group of as many
    ranks as each trainer asks for at the first fit() it meets (a group of
    2, then one of 3 in its place), and the loops of one size share stages
    on it. One stage worker (1.5 CPUs, as in the test above); the grown
    ranks, a quarter of a CPU each, fit beside it one group at a time."""
    results = _fit(
        tmp_path,
        tune.with_resources(driver_beside_its_trainers_rank, {"cpu": 1.5}),
        lr=tune.grid_search(LRS),
        workers=tune.grid_search([2, 3]),
    )
    assert [result.error for result in results] == [None] * 4
    losses = {}
    for result in results:
        frame = result.metrics_dataframe
        assert frame["training_iteration"].tolist() == [1, 2, 3, 4]
        workers = result.config["workers"]
        assert frame["world_size"].tolist() == [workers] * EPOCHS, "the loop ran on every rank of its group"
        losses[repr(result.config["lr"]), workers] = frame["loss"].tolist()
    for workers in (2, 3):
        assert losses[repr(LRS[0]), workers] == pytest.approx([0.5, 0.25, 0.25 * 0.75, 0.25 * 0.75**2])
        assert losses[repr(LRS[1]), workers] == pytest.approx([0.5, 0.25, 0.25 * 0.95, 0.25 * 0.95**2])
    assert results.iterations_executed == 2 * (2 + 2 + 2), "each size's two shared epochs trained once"
    # The grown ranks' placement groups go with the study (Ray would keep them as long as the job).
    grown = [info for info in ray.util.placement_group_table().values() if info["name"].startswith(GROWN_NAME)]
    assert grown and all(info["state"] == "REMOVED" for info in grown)


@pytest.mark.long
def test_a_trainer_that_cannot_take_the_stage_runs_as_a_train_run_of_its_own(ray_session, tmp_path):
    """A result before fit(): the stage cannot become the trainer's group
    (its other ranks would train the batch again from its start), so Ray
    Train starts its own workers, as under Tune, and the trial's results are
    what TuneReportCallback passes on."""
    results = _fit(tmp_path, lr=0.5, workers=2, report_first=True)
    assert results[0].error is None
    frame = results[0].metrics_dataframe
    assert frame["training_iteration"].tolist() == [1, 2, 3, 4, 5]
    assert frame["world_size"].tolist()[1:] == [2] * EPOCHS
    assert frame["loss"].tolist()[1:] == pytest.approx([0.5**k for k in range(1, EPOCHS + 1)])
    # Train's own checkpoints, in the folders the loop named, as under Tune
    assert [path.rsplit("/", 1)[-1] for path in frame["checkpoint_path"][1:]] == [f"epoch_{k}" for k in range(1, 5)]
