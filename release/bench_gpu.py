"""Stage sharing against Ray Tune on a GPU, side by side in one run.

The comparison of `bench_tune.py` with a CUDA model and fractional GPUs: a
small ResNet on CIFAR-shaped data generated from a fixed seed (a random
convolutional teacher labels random images, so the task is learnable and
nothing is downloaded), 12 learning-rate x batch-size sequence trials at
``--gpu-per-trial`` GPU each (0.25 by default: four trials share a GPU),
trained by:

(a) ``ray.tune.Tuner`` at its defaults and with ``reuse_actors=True``, every trial on its own;
(b) ``ray_stagetree.Tuner(stage_sharing=False)``;
(c) ``ray_stagetree.Tuner``, shared prefixes trained once;

interleaved ``--repeats`` times.

Printed: wall time, worker-seconds (as in `bench_tune.py`), epochs executed
and best accuracy per system, then the ratios (a)/(c) next to the merge
rate. Without a CUDA device it prints why and exits 3 (``--device cpu``
runs the same comparison on CPU workers, to try it anywhere).

    python release/bench_gpu.py --full          # 12 trials x 12 epochs on the GPUs Ray sees, 3 repeats
    python release/bench_gpu.py --quick         # 4 trials x 3 epochs (exits 3 without a GPU: run_all keeps the last section)
    python release/bench_gpu.py --device cpu --quick
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
import time
from typing import Any

import ray
import torch
from ray import tune
from torch import nn

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from bench_tune import METRIC, MODE, declarative, values_at  # noqa: E402

from ray_stagetree import MultiStep, Tuner, get_checkpoint, get_hparams, merge_rate, report  # noqa: E402
from ray_stagetree.searchers import generate_trials  # noqa: E402
from ray_stagetree.trainables.torch import ResumableLoader, apply_hparams  # noqa: E402


def make_data(num_samples: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random 3x32x32 images labelled by a fixed random convolutional teacher."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(num_samples, 3, 32, 32, generator=generator)
    teacher = nn.Sequential(nn.Conv2d(3, 8, 5, stride=4), nn.Tanh(), nn.Flatten(), nn.LazyLinear(10))
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        with torch.no_grad():
            labels = teacher(images).argmax(1)
    split = num_samples * 4 // 5
    return images[:split], labels[:split], images[split:], labels[split:]


class Block(nn.Module):
    def __init__(self, channels: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.ReLU(),
            nn.Conv2d(channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(x + self.body(x))


def small_resnet(width: int = 32) -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, width, 3, padding=1, bias=False),
        nn.BatchNorm2d(width),
        nn.ReLU(),
        Block(width),
        nn.MaxPool2d(2),
        Block(width),
        nn.MaxPool2d(2),
        Block(width),
        nn.AdaptiveAvgPool2d(1),
        nn.Flatten(),
        nn.Linear(width, 10),
    )


def train_resnet(config: dict[str, Any], data: Any, hparams_at: Any = None) -> None:
    """One epoch per iteration; checkpoints model, optimizer and loader."""
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(config["seed"])
    x_train, y_train, x_test, y_test = data
    model = small_resnet().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    loader = ResumableLoader(torch.utils.data.TensorDataset(x_train, y_train), batch_size=128, seed=config["seed"])
    checkpoint = get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as path:
            state = torch.load(os.path.join(path, "state.pt"), map_location=device, weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
    x_test, y_test = x_test.to(device), y_test.to(device)
    while True:
        hparams = get_hparams() if hparams_at is None else hparams_at(config, loader.epoch)
        apply_hparams(optimizer, hparams)
        loader.set_batch_size(hparams["batch_size"])
        model.train()
        for inputs, targets in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(model(inputs.to(device)), targets.to(device)).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        with tempfile.TemporaryDirectory() as path:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "loader": loader.state_dict()}
            torch.save(state, os.path.join(path, "state.pt"))
            report({METRIC: accuracy}, checkpoint=tune.Checkpoint.from_directory(path))


def space(quick: bool) -> dict[str, Any]:
    if quick:
        return {
            "lr": tune.grid_search([MultiStep(0.1, [1], 0.1), MultiStep(0.1, [2], 0.1)]),
            "batch_size": tune.grid_search([128, MultiStep(values=(128, 256), milestones=[2])]),
            "seed": 0,
        }
    return {
        "lr": tune.grid_search([MultiStep(0.1, [m], g) for m in (6, 9) for g in (0.1, 0.3)]),
        "batch_size": tune.grid_search(
            [128, MultiStep(values=(128, 256), milestones=[6]), MultiStep(values=(128, 256), milestones=[9])]
        ),
        "seed": 0,
    }


def run_tune(trials_space, data, epochs, resources, storage, reuse: bool) -> dict[str, Any]:
    occupancy = harness.TrialOccupancy()
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(train_resnet, data=data, hparams_at=values_at), resources),
        param_space=declarative(trials_space),
        tune_config=tune.TuneConfig(metric=METRIC, mode=MODE, reuse_actors=reuse),
        run_config=tune.RunConfig(
            storage_path=storage, stop={"training_iteration": epochs}, verbose=0, callbacks=[occupancy]
        ),
    )
    started = time.perf_counter()
    results = tuner.fit()
    wall = time.perf_counter() - started
    executed = sum(result.metrics["training_iteration"] for result in results)
    best = results.get_best_result(METRIC, MODE, scope="last").metrics[METRIC]
    return {"wall": wall, "worker_seconds": occupancy.seconds, "epochs": executed, "best": best}


def run_stagetree(trials_space, data, epochs, resources, storage, sharing: bool) -> dict[str, Any]:
    started = time.perf_counter()
    results = Tuner(
        tune.with_resources(tune.with_parameters(train_resnet, data=data), resources),
        param_space=trials_space,
        tune_config=tune.TuneConfig(metric=METRIC, mode=MODE),
        run_config=tune.RunConfig(storage_path=storage, stop={"training_iteration": epochs}, verbose=0),
        stage_sharing=sharing,
    ).fit()
    wall = time.perf_counter() - started
    best = results.get_best_result(METRIC, MODE, scope="last").metrics[METRIC]
    return {"wall": wall, "worker_seconds": results.worker_seconds, "epochs": results.iterations_executed, "best": best}


TUNE_DEFAULT, TUNE_REUSE = "(a) Ray Tune, defaults", "(a) Ray Tune, reuse_actors=True"
ALONE, SHARED = "(b) ray_stagetree, sharing off", "(c) ray_stagetree"


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    parser.add_argument("--gpu-per-trial", type=float, default=0.25, help="GPU fraction per trial (default 0.25)")
    args = harness.parse(parser)
    if not 0 < args.gpu_per_trial <= 1:
        parser.error(f"--gpu-per-trial must be in (0, 1], got {args.gpu_per_trial}")
    section = harness.Section("Stage sharing against Ray Tune on a GPU (`bench_gpu.py`)", args)
    if args.device == "cuda" and not torch.cuda.is_available():
        section.text("Not measured: no CUDA device on this machine (`--device cpu` runs it on CPU workers).")
        section.emit()
        sys.exit(harness.CANNOT_MEASURE_HERE)
    epochs, samples = (3, 1000) if args.quick else (12, 10_000)
    trials_space = space(args.quick)
    resources = {"gpu": args.gpu_per_trial, "cpu": 1} if args.device == "cuda" else {"cpu": 1}
    harness.start_ray()
    data = make_data(samples)
    trials = generate_trials(trials_space)
    with tempfile.TemporaryDirectory(prefix="bench_gpu_") as storage:
        common = (trials_space, data, epochs, resources, storage)
        systems = {
            TUNE_DEFAULT: functools.partial(run_tune, *common, reuse=False),
            TUNE_REUSE: functools.partial(run_tune, *common, reuse=True),
            ALONE: functools.partial(run_stagetree, *common, sharing=False),
            SHARED: functools.partial(run_stagetree, *common, sharing=True),
        }
        runs = harness.interleaved(systems, args.repeats, "gpu")
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU workers"
    section.text(
        f"A small ResNet on {samples:,} CIFAR-shaped images labelled by a random convolutional teacher, {len(trials)}"
        f" learning-rate x batch-size sequence trials x {epochs} epochs at {resources} each, on {device}; systems"
        f" interleaved, median [range] over the repeats; load {harness.loads(runs)} during the runs."
    )
    section.table(
        ["system", "wall s", "worker-s", "epochs executed", "best accuracy"],
        [
            [
                name,
                harness.median_range(harness.values(outcomes, "wall")),
                harness.median_range(harness.values(outcomes, "worker_seconds")),
                harness.median_range(harness.values(outcomes, "epochs"), 0),
                harness.median_range(harness.values(outcomes, "best"), 4),
            ]
            for name, outcomes in runs.items()
        ],
    )
    lines = [f"* merge rate {merge_rate(trials, epochs):.2f}"]
    for key, label in (("worker_seconds", "worker-seconds"), ("wall", "wall")):
        best = harness.fastest(runs, (TUNE_DEFAULT, TUNE_REUSE), key)
        ours = harness.values(runs[SHARED], key)
        lines.append(
            f"* {label}, Tune at its best ({best[4:]}) / (c): **{harness.ratio(harness.values(runs[best], key), ours)}**;"
            f" sharing only, (b) / (c): {harness.ratio(harness.values(runs[ALONE], key), ours)}"
        )
    section.text(*lines)
    section.emit()
    ray.shutdown()


if __name__ == "__main__":
    main()
