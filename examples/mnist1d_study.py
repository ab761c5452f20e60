"""A real PyTorch study on MNIST-1D with learning-rate and batch-size sequences.

A small 1-D CNN, 14 trials: 7 learning-rate schedules (step decay at epoch 8
or 12 by 0.1 or 0.3, warm-up then step, warm-up then cosine, warm-up then
exponential) x 2 batch-size schedules (constant 128, or 128 then 256 from
epoch 8). The data is generated offline
with ``mnist1d.data.make_dataset``: nothing is downloaded.

The trainable is written the way Ray Tune's docs write function trainables;
the difference is ``get_hparams()``, which gives this epoch's value of every
sequence, under ``ray_stagetree.Tuner`` and under ``ray.tune.Tuner`` alike.

    python examples/mnist1d_study.py            # about 30 s on 2 CPUs
    python examples/mnist1d_study.py --compare  # also runs the same trials on ray.tune.Tuner
"""

import argparse
import os
import tempfile
import time

import torch
from ray import tune
from torch import nn

from ray_stagetree import (
    Cosine,
    Exponential,
    MultiStep,
    Tuner,
    Warmup,
    from_json,
    get_checkpoint,
    get_hparams,
    init_ray,
    report,
)
from ray_stagetree.searchers.variants import tune_grid
from ray_stagetree.trainables.torch import ResumableLoader, apply_hparams

EPOCHS = 16


def make_data(num_samples: int = 4000, seed: int = 42):
    from mnist1d.data import get_dataset_args, make_dataset

    args = get_dataset_args()
    args.num_samples, args.seed = num_samples, seed
    data = make_dataset(args)
    as_tensors = lambda x, y: (torch.tensor(x, dtype=torch.float32).unsqueeze(1), torch.tensor(y))  # noqa: E731
    return as_tensors(data["x"], data["y"]), as_tensors(data["x_test"], data["y_test"])


class CNN(nn.Module):
    def __init__(self, width: int = 16):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv1d(1, width, 5, padding=2),
            nn.ReLU(),
            nn.MaxPool1d(2),
            nn.Conv1d(width, 2 * width, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool1d(2),
        )
        self.head = nn.Linear(2 * width * 10, 10)

    def forward(self, x):
        return self.head(self.features(x).flatten(1))


def train_mnist1d(config, data, hparams_at=None, checkpoints=True):
    """``hparams_at(config, epoch)``: how this epoch's hyper-parameters are
    found; ray_stagetree's ``get_hparams()`` by default. (The release
    benchmark passes its own to train the same trials on vanilla Ray Tune,
    which knows nothing of sequences, and ``checkpoints=False`` to measure a
    trainable that keeps none.)"""
    torch.set_num_threads(1)
    torch.manual_seed(config["seed"])
    (x_train, y_train), (x_test, y_test) = data
    model = CNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = ResumableLoader(torch.utils.data.TensorDataset(x_train, y_train), batch_size=128, seed=config["seed"])

    checkpoint = get_checkpoint()  # also restores the RNG states saved with it
    if checkpoint:
        with checkpoint.as_directory() as path:
            state = torch.load(os.path.join(path, "state.pt"), weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])

    while True:
        hparams = get_hparams() if hparams_at is None else hparams_at(config, loader.epoch)
        apply_hparams(optimizer, hparams)
        loader.set_batch_size(hparams["batch_size"])
        model.train()
        for inputs, targets in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(inputs), targets).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            logits = model(x_test)
            accuracy = (logits.argmax(1) == y_test).float().mean().item()
            loss = nn.functional.cross_entropy(logits, y_test).item()
        if not checkpoints:
            report({"accuracy": accuracy, "loss": loss})
            continue
        with tempfile.TemporaryDirectory() as path:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "loader": loader.state_dict()}
            torch.save(state, os.path.join(path, "state.pt"))
            report({"accuracy": accuracy, "loss": loss}, checkpoint=tune.Checkpoint.from_directory(path))


def param_space(epochs: int = EPOCHS):
    step_decay = tune.grid_search([0.1, 0.3])  # decay factor
    return {
        "lr": tune.grid_search(
            [
                MultiStep(0.1, [8], step_decay),
                MultiStep(0.1, [12], step_decay),
                Warmup(0.02, 2, MultiStep(0.1, [8], 0.1)),
                Warmup(0.02, 2, Cosine(0.1, 0.001, epochs - 2)),
                Warmup(0.02, 2, Exponential(0.1, 0.85)),
            ]
        ),
        "batch_size": tune.grid_search([128, MultiStep(values=(128, 256), milestones=[8])]),
        "seed": 0,
    }


def run(stage_sharing: bool, epochs: int = EPOCHS, storage_path: str | None = None):
    tuner = Tuner(
        tune.with_parameters(train_mnist1d, data=make_data()),
        param_space=param_space(epochs),
        tune_config=tune.TuneConfig(metric="accuracy", mode="max"),
        run_config=tune.RunConfig(
            name=f"mnist1d_{'shared' if stage_sharing else 'trial'}_{int(time.time())}",
            storage_path=storage_path,
            stop={"training_iteration": epochs},
        ),
        stage_sharing=stage_sharing,
    )
    started = time.perf_counter()
    results = tuner.fit()
    return results, time.perf_counter() - started


def run_on_ray_tune(epochs: int = EPOCHS, storage_path: str | None = None):
    """The same trainable and trials on ``ray.tune.Tuner`` at its fastest
    setting (``reuse_actors=True``: one process per worker, not per trial)."""
    tuner = tune.Tuner(
        tune.with_parameters(train_mnist1d, data=make_data()),
        param_space=tune_grid(param_space(epochs)),
        tune_config=tune.TuneConfig(metric="accuracy", mode="max", reuse_actors=True),
        run_config=tune.RunConfig(
            name=f"mnist1d_ray_tune_{int(time.time())}",
            storage_path=storage_path,
            stop={"training_iteration": epochs},
            verbose=0,
        ),
    )
    started = time.perf_counter()
    results = tuner.fit()
    return results, time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--compare", action="store_true", help="also run the same trials on ray.tune.Tuner (reuse_actors=True)"
    )
    parser.add_argument("--epochs", type=int, default=EPOCHS, help=f"epochs per trial (default {EPOCHS}; >= 3)")
    parser.add_argument(
        "--storage-path", help="where results go (default ~/ray_results); on several nodes, storage they all see"
    )
    args = parser.parse_args()

    # Joins the cluster under `ray job submit` (or a `ray start` on this
    # machine), else starts a local Ray on every core.
    init_ray(include_dashboard=False)
    if args.epochs < 3:
        parser.error(f"--epochs must be >= 3 (the warm-up takes 2), got {args.epochs}")
    results, seconds = run(stage_sharing=True, epochs=args.epochs, storage_path=args.storage_path)
    best = results.get_best_result()
    print(f"\n{len(results)} trials, {results.num_errors} errors, {seconds:.1f} s")
    lr, batch_size = (
        from_json(v) if isinstance(v, dict) else v for v in (best.config["lr"], best.config["batch_size"])
    )
    print(f"best accuracy {best.metrics['accuracy']:.4f} with lr={lr!r}, batch_size={batch_size!r}")
    print(
        f"epochs executed: {results.iterations_executed} (unique {results.unique_iterations}); "
        f"trial by trial, as Ray Tune runs them: {results.trial_by_trial_iterations} "
        f"({results.trial_by_trial_iterations / results.iterations_executed:.2f}x fewer executed)"
    )
    print(f"experiment: {results.experiment_path}  (watch it with: stagetree monitor {results.experiment_path})")
    if args.compare:
        baseline, baseline_seconds = run_on_ray_tune(epochs=args.epochs, storage_path=args.storage_path)
        epochs_run = sum(len(result.metrics_dataframe) for result in baseline)
        print(
            f"ray.tune.Tuner (reuse_actors=True): {baseline_seconds:.1f} s, {epochs_run} epochs "
            f"({baseline_seconds / seconds:.2f}x ray_stagetree's time); best accuracy "
            f"{baseline.get_best_result().metrics['accuracy']:.4f}"
        )


if __name__ == "__main__":
    main()
