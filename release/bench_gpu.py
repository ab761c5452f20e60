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
    python release/bench_gpu.py --data-parallel 2    # trials of 2 GPUs: Tune's TorchTrainer vs DP stages
    python release/bench_gpu.py --data-parallel 2 --device cpu --quick   # the same with gloo on CPUs

With ``--data-parallel N`` each trial is a ``TorchTrainer`` of N ranks
(``DistributedDataParallel``): (a) ``ray.tune.Tuner(TorchTrainer(...))``
with ``reuse_actors=True`` against (c) ``ray_stagetree.Tuner`` of the same
trainer, whose trials share stages each trained by one group of N ranks.
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
import time
from typing import Any

# Ray 2.60's Tune still runs a TorchTrainer (--data-parallel) on Ray Train's legacy engine only;
# the flag is read when Ray Train is first imported, so before anything imports Ray.
os.environ.setdefault("RAY_TRAIN_V2_ENABLED", "0")

import ray  # noqa: E402
import torch  # noqa: E402
from ray import tune  # noqa: E402
from torch import nn  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import harness  # noqa: E402
from bench_tune import METRIC, MODE, values_at  # noqa: E402

from ray_stagetree import MultiStep, Tuner, get_checkpoint, get_hparams, merge_rate, report  # noqa: E402
from ray_stagetree.searchers import generate_trials  # noqa: E402
from ray_stagetree.searchers.variants import tune_grid  # noqa: E402
from ray_stagetree.trainables.torch import ResumableLoader, apply_hparams  # noqa: E402


def make_data(num_samples: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random 3x32x32 images labelled by a fixed random convolutional teacher.

    The teacher pools over positions, as the student's last layer does, so the
    student can represent it; each of its logits is standardised over the data
    before the argmax, so no class dominates."""
    generator = torch.Generator().manual_seed(seed)
    images = torch.randn(num_samples, 3, 32, 32, generator=generator)
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        teacher = nn.Sequential(
            nn.Conv2d(3, 16, 5), nn.Tanh(), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10)
        )
        with torch.no_grad():
            logits = teacher(images)
    labels = ((logits - logits.mean(0)) / logits.std(0)).argmax(1)
    split = num_samples * 4 // 5
    return images[:split], labels[:split], images[split:], labels[split:]


def majority_accuracy(data: tuple[torch.Tensor, ...]) -> float:
    """The test accuracy of always predicting the most common class: the floor a best accuracy is read against."""
    test_labels = data[3]
    return torch.bincount(test_labels).max().item() / len(test_labels)


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
    _train_epochs(config, data, hparams_at, device, lambda model: model, get_checkpoint, report, rank=0)


def train_loop_per_worker(config: dict[str, Any]) -> None:
    """`train_resnet` as Ray Train's ``train_loop_per_worker``: the model in
    ``DistributedDataParallel``, each rank its share of the global batch
    (``ResumableLoader`` shards by the torch.distributed rank), rank 0's
    checkpoint. The same function under Ray Tune's ``TorchTrainer`` and on
    ray_stagetree's data-parallel stages."""
    import torch.distributed as dist
    from ray import train
    from torch.nn.parallel import DistributedDataParallel

    from ray_stagetree.runtime.workers.context import current

    if not torch.cuda.is_available():
        device = torch.device("cpu")
    elif current() is None:  # Ray Train's worker: its device for this rank
        from ray.train.torch import get_device

        device = get_device()
    else:  # a stage rank: Ray shows it its own GPU
        device = torch.device("cuda", torch.cuda.current_device())
    hparams_at = config.get("hparams_at")
    hyper = {key: value for key, value in config.items() if key not in ("data", "hparams_at")}
    _train_epochs(
        hyper,
        ray.get(config["data"]),
        None if hparams_at is None else lambda _, epoch: hparams_at(hyper, epoch),
        device,
        lambda model: DistributedDataParallel(model, device_ids=[device.index] if device.type == "cuda" else None),
        train.get_checkpoint,
        train.report,
        rank=dist.get_rank(),
    )


def _train_epochs(
    config: dict[str, Any], data: Any, hparams_at: Any, device: Any, wrap: Any, restored: Any, reported: Any, rank: int
) -> None:
    torch.manual_seed(config["seed"])
    x_train, y_train, x_test, y_test = data
    model = small_resnet().to(device)
    trained = wrap(model)
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.1, momentum=0.9)
    loader = ResumableLoader(torch.utils.data.TensorDataset(x_train, y_train), batch_size=128, seed=config["seed"])
    checkpoint = restored()
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
        trained.train()
        for inputs, targets in loader:
            optimizer.zero_grad()
            nn.functional.cross_entropy(trained(inputs.to(device)), targets.to(device)).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        with tempfile.TemporaryDirectory() as path:
            saved = None
            if rank == 0:
                state = {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "loader": loader.state_dict(),
                }
                torch.save(state, os.path.join(path, "state.pt"))
                saved = tune.Checkpoint.from_directory(path)
            reported({METRIC: accuracy}, checkpoint=saved)


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
        param_space=tune_grid(trials_space),
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
    parser.add_argument(
        "--data-parallel",
        type=int,
        default=0,
        metavar="N",
        help="trials of N ranks (N GPUs, or N CPU processes with --device cpu): Ray Tune's Tuner(TorchTrainer) "
        "against ray_stagetree's Tuner(TorchTrainer) on data-parallel stages",
    )
    args = harness.parse(parser)
    if not 0 < args.gpu_per_trial <= 1:
        parser.error(f"--gpu-per-trial must be in (0, 1], got {args.gpu_per_trial}")
    if args.data_parallel == 1 or args.data_parallel < 0:
        parser.error(f"--data-parallel must be >= 2 ranks per trial, got {args.data_parallel}")
    section = harness.Section("Stage sharing against Ray Tune on a GPU (`bench_gpu.py`)", args)
    if args.device == "cuda" and not torch.cuda.is_available():
        section.text("Not measured: no CUDA device on this machine (`--device cpu` runs it on CPU workers).")
        section.emit()
        sys.exit(harness.CANNOT_MEASURE_HERE)
    if args.data_parallel:
        data_parallel(args, section)
        section.emit()
        ray.shutdown()
        return
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
        f" interleaved, median [range] over the repeats; load {harness.loads(runs)} during the runs. Always"
        f" predicting the most common class scores {majority_accuracy(data):.4f}."
    )
    results_table(section, runs, "worker-s")
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


def results_table(section: harness.Section, runs: dict[str, list[dict[str, Any]]], seconds: str) -> None:
    """Each system's wall time, ``seconds`` (its trials' worker- or group-seconds), epochs and best accuracy."""
    section.table(
        ["system", "wall s", seconds, "epochs executed", "best accuracy"],
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


def data_parallel(args: Any, section: harness.Section) -> None:
    """The data-parallel mode: the same ``TorchTrainer`` tuned by Ray Tune
    (``reuse_actors=True``, every trial its own Train run) and by
    ray_stagetree (shared stages, each trained by one group of ranks),
    interleaved over the repeats."""
    from ray.train import ScalingConfig

    epochs, samples = (3, 1000) if args.quick else (12, 10_000)
    trials_space = space(args.quick)
    use_gpu = args.device == "cuda"
    scaling = ScalingConfig(
        num_workers=args.data_parallel,
        use_gpu=use_gpu,
        resources_per_worker={"GPU": 1, "CPU": 1} if use_gpu else {"CPU": 1},
        trainer_resources={"CPU": 0},  # rank 0 is the stage worker here; Tune's trainer actor gets no CPU of its own
    )
    harness.start_ray()
    base = {"data": ray.put(make_data(samples))}
    trials = generate_trials(trials_space)
    with tempfile.TemporaryDirectory(prefix="bench_gpu_dp_") as storage:
        common = (trials_space, base, scaling, epochs, storage)
        systems = {
            TUNE_REUSE: functools.partial(run_tune_trainer, *common),
            SHARED: functools.partial(run_stagetree_trainer, *common),
        }
        runs = harness.interleaved(systems, args.repeats, "data-parallel")
    device = torch.cuda.get_device_name(0) if use_gpu else "CPU processes (gloo)"
    section.text(
        f"### Data-parallel trials: {args.data_parallel} ranks each",
        f"The same `TorchTrainer` ({len(trials)} sequence trials x {epochs} epochs, {samples:,} images) tuned by"
        f" `ray.tune.Tuner(TorchTrainer)` with `reuse_actors=True` and by ray_stagetree's data-parallel stages, on"
        f" {device}; interleaved, median [range]; load {harness.loads(runs)} during the runs.",
    )
    results_table(section, runs, "group-s")
    section.text(
        f"* merge rate {merge_rate(trials, epochs):.2f}; Tune / ray_stagetree: group-seconds"
        f" **{harness.ratio(harness.values(runs[TUNE_REUSE], 'worker_seconds'), harness.values(runs[SHARED], 'worker_seconds'))}**,"
        f" wall {harness.ratio(harness.values(runs[TUNE_REUSE], 'wall'), harness.values(runs[SHARED], 'wall'))}"
    )


def run_tune_trainer(
    trials_space: dict[str, Any], base: dict[str, Any], scaling: Any, epochs: int, storage: str
) -> dict[str, Any]:
    from ray.train.torch import TorchTrainer

    occupancy = harness.TrialOccupancy()
    trainer = TorchTrainer(
        train_loop_per_worker, train_loop_config={**base, "hparams_at": values_at}, scaling_config=scaling
    )
    started = time.perf_counter()
    results = tune.Tuner(
        trainer,
        param_space={"train_loop_config": tune_grid(trials_space)},
        tune_config=tune.TuneConfig(metric=METRIC, mode=MODE, reuse_actors=True),
        run_config=tune.RunConfig(
            storage_path=storage, stop={"training_iteration": epochs}, verbose=0, callbacks=[occupancy]
        ),
    ).fit()
    return {
        "wall": time.perf_counter() - started,
        "worker_seconds": occupancy.seconds,  # seconds a trial (a group of ranks) ran
        "epochs": sum(result.metrics["training_iteration"] for result in results),
        "best": results.get_best_result(METRIC, MODE, scope="last").metrics[METRIC],
    }


def run_stagetree_trainer(
    trials_space: dict[str, Any], base: dict[str, Any], scaling: Any, epochs: int, storage: str
) -> dict[str, Any]:
    from ray.train.torch import TorchTrainer

    started = time.perf_counter()
    results = Tuner(
        TorchTrainer(train_loop_per_worker, train_loop_config=base, scaling_config=scaling),
        param_space={"train_loop_config": trials_space},
        tune_config=tune.TuneConfig(metric=METRIC, mode=MODE),
        run_config=tune.RunConfig(storage_path=storage, stop={"training_iteration": epochs}, verbose=0),
    ).fit()
    return {
        "wall": time.perf_counter() - started,
        "worker_seconds": results.worker_seconds,  # seconds a group of ranks ran a batch
        "epochs": results.iterations_executed,
        "best": results.get_best_result(METRIC, MODE, scope="last").metrics[METRIC],
    }


if __name__ == "__main__":
    main()
