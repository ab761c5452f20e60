"""A Ray Tune + PyTorch Lightning study on MNIST-1D that shares stages.

The trainable is written as Ray Tune's Lightning guide writes one: a
``LightningModule`` built from ``config`` (``SGD(lr=config["lr"])``,
``DataLoader(batch_size=config["batch_size"])``), a
``TuneReportCheckpointCallback`` reporting after each validation, and
``trainer.fit(model, ckpt_path=...)`` from ``tune.get_checkpoint()``. What
differs from a Ray Tune script: the ``Tuner`` import, the learning-rate
schedule, moved from a scheduler in ``configure_optimizers`` into
``param_space`` as sequences, and the callback's import. Trials share
their epochs until their schedules part: the callback sets each epoch's
learning rate, so a trial continues live where its schedule steps. (On
ray_stagetree, Ray's own callback does the same: a script importing it
shares as written, and restarts from its checkpoint where a value that
nothing follows changes, a ``batch_size`` sequence, as Tune's PBT
restarts a trial. ray_stagetree's callback runs on ``ray.tune.Tuner``
too, which ``--compare`` runs.) The data is generated offline with
``mnist1d``.

    pip install -e ".[examples,lightning]"
    python examples/lightning_study.py            # about a minute on 2 CPUs
    python examples/lightning_study.py --compare  # also the same trials on ray.tune.Tuner
"""

import argparse
import os
import time

import lightning.pytorch as pl
import torch
from ray import tune
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from ray_stagetree import MultiStep, Tuner, for_ray_tune, init_ray
from ray_stagetree.searchers.variants import tune_grid
from ray_stagetree.trainables.lightning import TuneReportCheckpointCallback

EPOCHS = 8


def make_data(num_samples: int = 2000, seed: int = 42):
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples, args.seed = num_samples, seed
    data = make_dataset(args)
    as_tensors = lambda x, y: (torch.tensor(x, dtype=torch.float32), torch.tensor(y))  # noqa: E731
    return as_tensors(data["x"], data["y"]), as_tensors(data["x_test"], data["y_test"])


class MNIST1DClassifier(pl.LightningModule):
    def __init__(self, config, data):
        super().__init__()
        self.lr, self.momentum, self.batch_size = config["lr"], config["momentum"], config["batch_size"]
        self.data = data
        self.model = nn.Sequential(nn.Linear(40, 128), nn.ReLU(), nn.Dropout(0.1), nn.Linear(128, 10))

    def training_step(self, batch, batch_index):
        inputs, targets = batch
        loss = nn.functional.cross_entropy(self.model(inputs), targets)
        self.log("ptl/train_loss", loss)
        return loss

    def validation_step(self, batch, batch_index):
        inputs, targets = batch
        logits = self.model(inputs)
        self.log("ptl/val_loss", nn.functional.cross_entropy(logits, targets))
        self.log("ptl/val_accuracy", (logits.argmax(1) == targets).float().mean())

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum)

    def train_dataloader(self):
        return DataLoader(TensorDataset(*self.data[0]), batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(TensorDataset(*self.data[1]), batch_size=500)


def train_mnist1d_lightning(config, data, epochs=EPOCHS):
    torch.set_num_threads(1)
    pl.seed_everything(config["seed"], verbose=False)
    model = MNIST1DClassifier(config, data)
    trainer = pl.Trainer(
        max_epochs=epochs,
        accelerator="cpu",
        devices=1,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        callbacks=[TuneReportCheckpointCallback({"loss": "ptl/val_loss", "accuracy": "ptl/val_accuracy"})],
    )
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder:
            trainer.fit(model, ckpt_path=os.path.join(folder, "checkpoint"))
    else:
        trainer.fit(model)


def param_space(epochs: int = EPOCHS):
    """Step decays at half the epochs (four factors) or three quarters (two):
    every trial of a batch size trains the first half at 0.1, once."""
    return {
        "lr": tune.grid_search(
            [MultiStep(0.1, [epochs // 2], gamma) for gamma in (0.1, 0.2, 0.3, 0.5)]
            + [MultiStep(0.1, [3 * epochs // 4], gamma) for gamma in (0.1, 0.3)]
        ),
        "batch_size": tune.grid_search([64, 128]),
        "momentum": 0.9,
        "seed": 0,
    }


def run(
    on_ray_tune=False, epochs=EPOCHS, num_samples=2000, storage_path=None, space=None, stage_sharing=True, callbacks=()
):
    """The study (``space``: `param_space` by default) on ``ray_stagetree.Tuner``,
    or on ``ray.tune.Tuner`` at its fastest (``reuse_actors=True``; the grid
    in the form its variant generator takes, `tune_grid`, and the config's
    sequences as their values, `for_ray_tune`); its results and wall time."""
    space = param_space(epochs) if space is None else space
    data = make_data(num_samples)
    run_config = tune.RunConfig(
        storage_path=storage_path, stop={"training_iteration": epochs}, verbose=0, callbacks=list(callbacks)
    )
    if on_ray_tune:
        tuner = tune.Tuner(
            tune.with_parameters(for_ray_tune(train_mnist1d_lightning), data=data, epochs=epochs),
            param_space=tune_grid(space),
            tune_config=tune.TuneConfig(metric="accuracy", mode="max", reuse_actors=True),
            run_config=run_config,
        )
    else:
        tuner = Tuner(
            tune.with_parameters(train_mnist1d_lightning, data=data, epochs=epochs),
            param_space=space,
            tune_config=tune.TuneConfig(metric="accuracy", mode="max"),
            run_config=run_config,
            stage_sharing=stage_sharing,
        )
    started = time.perf_counter()
    results = tuner.fit()
    return results, time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", action="store_true", help="also run the trials on ray.tune.Tuner")
    parser.add_argument("--epochs", type=int, default=EPOCHS, help=f"epochs per trial (default {EPOCHS}; >= 4)")
    parser.add_argument("--storage-path", help="where results go (default ~/ray_results)")
    args = parser.parse_args()
    if args.epochs < 4:
        parser.error(f"--epochs must be >= 4 (the schedules step at half and three quarters), got {args.epochs}")
    init_ray(include_dashboard=False)
    results, seconds = run(epochs=args.epochs, storage_path=args.storage_path)
    best = results.get_best_result()
    print(f"\n{len(results)} trials, {results.num_errors} errors, {seconds:.1f} s")
    print(f"best accuracy {best.metrics['accuracy']:.4f}")
    print(
        f"epochs executed: {results.iterations_executed}; trial by trial, as Ray Tune runs them: "
        f"{results.trial_by_trial_iterations} ({results.trial_by_trial_iterations / results.iterations_executed:.2f}x)"
    )
    if args.compare:
        baseline, baseline_seconds = run(on_ray_tune=True, epochs=args.epochs, storage_path=args.storage_path)
        print(
            f"ray.tune.Tuner (reuse_actors=True): {baseline_seconds:.1f} s ({baseline_seconds / seconds:.2f}x "
            f"ray_stagetree's time); best accuracy {baseline.get_best_result().metrics['accuracy']:.4f}"
        )


if __name__ == "__main__":
    main()
