"""PyTorch Lightning and Hugging Face ``Trainer`` studies share stages
(issue 57): the examples, run on ``ray_stagetree.Tuner``, report exactly
what ``ray.tune.Tuner`` reports for the same trials, bit for bit, and
execute fewer iterations; a script that imports Ray's own callback, reads
its config as numbers and has a value nothing follows (a batch size that
changes) shares too, restarting where that value changes, and equals the
same study trained trial by trial."""

from __future__ import annotations

import json
import os

import pytest
from ray import tune

pytest.importorskip("lightning")
pytest.importorskip("transformers")

import lightning_study  # noqa: E402
import transformers_study  # noqa: E402

import ray_stagetree  # noqa: E402
from ray_stagetree import MultiStep  # noqa: E402

pytestmark = pytest.mark.long


def curves(grid, metric):
    """Each trial's ``metric`` per iteration, by its config (sequences in their JSON form, as Tune's config has them)."""
    assert not grid.errors, [str(result.error) for result in grid if result.error]

    def key(config):
        return json.dumps({k: v.to_json() if hasattr(v, "to_json") else v for k, v in config.items()}, sort_keys=True)

    return {key(result.config): result.metrics_dataframe[metric].tolist() for result in grid}


def reported(grid):
    return sum(len(result.metrics_dataframe) for result in grid)


def smaller(space, key):
    """``space`` with two of its ``key`` schedules, the first and the fourth
    (equal for the first half of the iterations, apart after it), and its
    first batch size."""
    schedules = space[key]["grid_search"]
    return {
        **space,
        key: tune.grid_search([schedules[0], schedules[3]]),
        "batch_size": space["batch_size"]["grid_search"][0],
    }


@pytest.mark.release
def test_the_lightning_example_shares_and_reports_what_ray_tune_reports(ray_session, tmp_path):
    space = smaller(lightning_study.param_space(4), "lr")
    ours, _ = lightning_study.run(epochs=4, num_samples=600, storage_path=str(tmp_path / "ours"), space=space)
    theirs, _ = lightning_study.run(
        on_ray_tune=True, epochs=4, num_samples=600, storage_path=str(tmp_path / "tune"), space=space
    )
    assert curves(ours, "loss") == curves(theirs, "loss")
    assert ours.iterations_executed == 2 + 2 * 2 < reported(ours)  # 2 epochs once, then 2 branches


@pytest.mark.release
def test_the_transformers_example_shares_and_reports_what_ray_tune_reports(ray_session, tmp_path):
    space = smaller(transformers_study.param_space(4), "learning_rate")
    ours, _ = transformers_study.run(iterations=4, num_samples=400, storage_path=str(tmp_path / "ours"), space=space)
    theirs, _ = transformers_study.run(
        on_ray_tune=True, iterations=4, num_samples=400, storage_path=str(tmp_path / "tune"), space=space
    )
    assert curves(ours, "eval_loss") == curves(theirs, "eval_loss")
    assert ours.iterations_executed == 2 + 2 * 2 < reported(ours)


def shared_and_alone(trainable, data, space, tmp_path):
    """The study of 4 iterations per trial on ray_stagetree, shared and trial by trial."""

    def run(name, **options):
        return ray_stagetree.Tuner(
            tune.with_parameters(trainable, data=data),
            param_space=space,
            run_config=tune.RunConfig(storage_path=str(tmp_path / name), stop={"training_iteration": 4}, verbose=0),
            **options,
        ).fit()

    return run("shared"), run("alone", stage_sharing=False)


def lightning_as_written(config, data):
    """Ray's Lightning pattern, unchanged but for the schedule in param_space."""
    import lightning.pytorch as pl
    from ray.tune.integration.pytorch_lightning import TuneReportCheckpointCallback

    pl.seed_everything(config["seed"], verbose=False)
    model = lightning_study.MNIST1DClassifier(config, data)
    trainer = pl.Trainer(
        max_epochs=4,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        callbacks=[TuneReportCheckpointCallback({"loss": "ptl/val_loss"})],
    )
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder:
            trainer.fit(model, ckpt_path=os.path.join(folder, "checkpoint"))
    else:
        trainer.fit(model)


def test_a_lightning_script_with_rays_callback_shares_and_restarts_where_its_batch_size_changes(ray_session, tmp_path):
    space = {
        "lr": tune.grid_search([MultiStep(0.1, [2], 0.1), MultiStep(0.1, [3], 0.1)]),
        "batch_size": tune.grid_search([64, MultiStep(values=(64, 128), milestones=[2])]),
        "momentum": 0.9,
        "seed": 0,
    }

    shared, alone = shared_and_alone(lightning_as_written, lightning_study.make_data(600), space, tmp_path)
    losses = curves(shared, "loss")
    assert losses == curves(alone, "loss")
    assert shared.iterations_executed == 2 + 4 * 2 < reported(shared)  # the first 2 epochs once, then 4 branches
    by_batch_size = sorted(losses.items(), key=lambda item: json.loads(item[0])["lr"]["milestones"])
    for (_, constant), (_, changed) in zip(by_batch_size[0::2], by_batch_size[1::2]):
        assert constant[:2] == changed[:2] and constant[2:] != changed[2:]  # restarted with batch size 128 at epoch 2


def transformers_as_written(config, data):
    """Ray's Transformers pattern (its RayTrainReportCallback), reporting to Tune."""
    from ray.train.huggingface.transformers import RayTrainReportCallback
    from transformers import Trainer

    model = transformers_study.tiny_bert(config["seed"])
    with transformers_study.training_arguments(config, iterations=4) as args:
        trainer = Trainer(
            model=model, args=args, train_dataset=data[0], eval_dataset=data[1], callbacks=[RayTrainReportCallback()]
        )
        checkpoint = tune.get_checkpoint()
        if checkpoint:
            with checkpoint.as_directory() as folder:
                trainer.train(resume_from_checkpoint=os.path.join(folder, RayTrainReportCallback.CHECKPOINT_NAME))
        else:
            trainer.train()


def test_a_transformers_script_with_rays_callback_shares_and_equals_trial_by_trial(ray_session, tmp_path):
    space = {
        "learning_rate": tune.grid_search([MultiStep(3e-3, [2], 0.1), MultiStep(3e-3, [3], 0.1)]),
        "batch_size": 16,
        "weight_decay": 0.0,
        "seed": 0,
    }

    shared, alone = shared_and_alone(transformers_as_written, transformers_study.make_data(400), space, tmp_path)
    assert curves(shared, "eval_loss") == curves(alone, "eval_loss")
    assert shared.iterations_executed == 6 < reported(shared)  # the first 2 step groups once
