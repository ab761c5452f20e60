"""Trials bigger than one worker: each trial trained data-parallel by 2 ranks.

A small CNN on scikit-learn's 8x8 digits (bundled with scikit-learn: nothing
is downloaded), 4 trials: 2 learning-rate schedules that agree for the first
3 epochs x 2 global batch sizes. Each trial asks for
``ScalingConfig(num_workers=2)``: every stage batch runs on a group of 2
processes with ``torch.distributed`` (gloo on CPUs) and
``DistributedDataParallel``; a ``ResumableLoader`` gives each rank its
share of the global batch. Trials with the same batch size share their first
3 epochs, trained once by one group.

The trainable is Ray Train's ``train_loop_per_worker`` as Ray's docs write
it, with ``get_hparams()`` for this epoch's sequence values.

    python examples/data_parallel_study.py     # about a minute on 2 CPUs
"""

import argparse
import os
import tempfile
import time

import torch
import torch.distributed as dist
from ray import train, tune
from ray.train import ScalingConfig
from torch import nn
from torch.nn.parallel import DistributedDataParallel

from ray_stagetree import MultiStep, Tuner, get_hparams, init_ray
from ray_stagetree.trainables.torch import ResumableLoader, apply_hparams

EPOCHS = 5
#: Each rank: half a CPU, so that a 2-CPU machine runs two groups at once.
SCALING = ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5})


def make_data():
    from sklearn.datasets import load_digits

    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    labels = torch.tensor(digits.target)
    split = 1400
    return (images[:split], labels[:split]), (images[split:], labels[split:])


class CNN(nn.Module):
    def __init__(self, width: int = 8):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, width, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Conv2d(width, 2 * width, 3, padding=1)
        )
        self.head = nn.Linear(2 * width * 16, 10)

    def forward(self, x):
        return self.head(torch.relu(self.features(x)).flatten(1))


def train_loop_per_worker(config):
    torch.set_num_threads(1)
    torch.manual_seed(0)  # the same initial model on every rank (DDP also broadcasts rank 0's)
    (x_train, y_train), (x_test, y_test) = make_data()
    model = DistributedDataParallel(CNN())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    # batch_size is the global batch: each rank takes every second sample of it.
    loader = ResumableLoader(torch.utils.data.TensorDataset(x_train, y_train), batch_size=64, seed=0)

    checkpoint = train.get_checkpoint()  # the shared stage's, on every rank; restores each rank's RNG states
    if checkpoint:
        with checkpoint.as_directory() as path:
            state = torch.load(os.path.join(path, "state.pt"), weights_only=True)
        model.module.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])

    while True:
        hparams = get_hparams()  # the same values on every rank
        apply_hparams(optimizer, hparams)
        loader.set_batch_size(hparams["batch_size"])
        model.train()
        for inputs, targets in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(inputs), targets).backward()  # gradients averaged over the ranks
            optimizer.step()
        model.eval()
        with torch.no_grad():
            accuracy = (model.module(x_test).argmax(1) == y_test).float().mean().item()
        with tempfile.TemporaryDirectory() as path:
            saved = None
            if dist.get_rank() == 0:  # rank 0's checkpoint is the stage's
                state = {
                    "model": model.module.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "loader": loader.state_dict(),
                }
                torch.save(state, os.path.join(path, "state.pt"))
                saved = train.Checkpoint.from_directory(path)
            train.report({"accuracy": accuracy, "ranks": dist.get_world_size()}, checkpoint=saved)


def run(stage_sharing: bool = True, storage_path: str | None = None):
    tuner = Tuner(
        train_loop_per_worker,
        param_space={
            "lr": tune.grid_search([MultiStep(0.05, [3], 0.1), MultiStep(0.05, [3], 0.3)]),
            "batch_size": tune.grid_search([64, 128]),
        },
        tune_config=tune.TuneConfig(metric="accuracy", mode="max"),
        run_config=tune.RunConfig(
            name=f"data_parallel_{int(time.time())}", storage_path=storage_path, stop={"training_iteration": EPOCHS}
        ),
        scaling_config=SCALING,
        stage_sharing=stage_sharing,
    )
    started = time.perf_counter()
    results = tuner.fit()
    return results, time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--storage-path", default=None, help="where the experiment folder goes (default ~/ray_results)")
    args = parser.parse_args()
    init_ray(include_dashboard=False)  # joins a running cluster, else starts a local Ray
    results, seconds = run(storage_path=args.storage_path)
    best = results.get_best_result()
    print(f"\n{len(results)} trials of {SCALING.num_workers} ranks each, {results.num_errors} errors, {seconds:.1f} s")
    print(f"best accuracy {best.metrics['accuracy']:.4f} (trained by {best.metrics['ranks']} ranks)")
    print(
        f"epochs executed: {results.iterations_executed}; trial by trial: {results.trial_by_trial_iterations} "
        f"({results.trial_by_trial_iterations / results.iterations_executed:.2f}x more)"
    )


if __name__ == "__main__":
    main()
