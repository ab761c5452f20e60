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
    python release/bench_gpu.py --study resnet20 --repeats 2   # the thesis-sized study
    python release/bench_gpu.py --study resnet20 --asha       # both Tuners under PromotingASHAScheduler
    python release/bench_gpu.py --study resnet20 --deterministic   # and merged == alone, bit for bit

``--study resnet20``: ResNet-20 on 50,000 generated images, the thesis'
learning-rate x batch-size space scaled to 12 epochs (32 trials, merge
rate 3.69), Tune with ``reuse_actors=True`` against ray_stagetree only. An
iteration trains 4,096 images (a tenth of a pass; ``--images-per-iteration``),
so that both systems run twice in one 10-minute device call. At 0.25 GPU a
trial (4 slots) the tree's shape lets sharing save at most 3.1x in wall time
at a constant cost per iteration; at 0.125 (8 slots), 2.4x: the shared
prefix runs alone while the other slots wait (`simulation.replay`).
Every run prints the worker-seconds by phase (`ResultGrid.phase_seconds`;
Tune's split into its trainables' ``time_total_s`` and the rest) and each
system's wall time over the makespan's lower bound.

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

from ray_stagetree import (  # noqa: E402
    MultiStep,
    PromotingASHAScheduler,
    Tuner,
    get_checkpoint,
    get_hparams,
    merge_rate,
    report,
    timed,
)
from ray_stagetree.planning import SearchPlan  # noqa: E402
from ray_stagetree.searchers import generate_trials  # noqa: E402
from ray_stagetree.searchers.variants import tune_grid  # noqa: E402
from ray_stagetree.simulation.replay import replay  # noqa: E402
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


class BasicBlock(nn.Module):
    """ResNet-20's block (He et al., CIFAR-10): two 3x3 convolutions, a 1x1 projection where the shape changes."""

    def __init__(self, inputs: int, outputs: int, stride: int) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(inputs, outputs, 3, stride=stride, padding=1, bias=False),
            nn.BatchNorm2d(outputs),
            nn.ReLU(),
            nn.Conv2d(outputs, outputs, 3, padding=1, bias=False),
            nn.BatchNorm2d(outputs),
        )
        self.shortcut = (
            nn.Identity()
            if stride == 1 and inputs == outputs
            else nn.Sequential(nn.Conv2d(inputs, outputs, 1, stride=stride, bias=False), nn.BatchNorm2d(outputs))
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.body(x) + self.shortcut(x))


def resnet20() -> nn.Module:
    """ResNet-20: three stages of three blocks, 16, 32 and 64 channels (0.27 M parameters)."""
    layers: list[nn.Module] = [nn.Conv2d(3, 16, 3, padding=1, bias=False), nn.BatchNorm2d(16), nn.ReLU()]
    inputs = 16
    for outputs, stride in ((16, 1), (32, 2), (64, 2)):
        for block in range(3):
            layers.append(BasicBlock(inputs, outputs, stride if block == 0 else 1))
            inputs = outputs
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10)]
    return nn.Sequential(*layers)


MODELS = {"small": small_resnet, "resnet20": resnet20}


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
    if config.get("deterministic"):
        deterministic_algorithms()
    torch.manual_seed(config["seed"])
    x_train, y_train, x_test, y_test = data
    with timed("setup"):  # the model built on the device (a process's first pays for the CUDA context)
        model = MODELS[config.get("model", "small")]().to(device)
        trained = wrap(model)
        optimizer = torch.optim.SGD(trained.parameters(), lr=0.1, momentum=0.9)
    loader = ResumableLoader(torch.utils.data.TensorDataset(x_train, y_train), batch_size=128, seed=config["seed"])
    checkpoint = restored()
    iteration = 0
    if checkpoint:
        with timed("restore_to_device"), checkpoint.as_directory() as path:
            state = torch.load(os.path.join(path, "state.pt"), map_location=device, weights_only=False)
            model.load_state_dict(state["model"])
            optimizer.load_state_dict(state["optimizer"])
            loader.load_state_dict(state["loader"])
            iteration = state["iteration"]
    with timed("data_to_device"):
        x_test, y_test = x_test.to(device), y_test.to(device)
    # An iteration is an epoch, or a fixed number of images (the rest of the pass goes on in the next).
    samples = config.get("samples_per_iteration")
    while True:
        hparams = get_hparams() if hparams_at is None else hparams_at(config, iteration)
        apply_hparams(optimizer, hparams)
        loader.set_batch_size(hparams["batch_size"])
        trained.train()
        for inputs, targets in loader.take(max(1, samples // hparams["batch_size"])) if samples else loader:
            with timed("data_to_device"):
                inputs, targets = inputs.to(device, non_blocking=True), targets.to(device, non_blocking=True)
            optimizer.zero_grad()
            nn.functional.cross_entropy(trained(inputs), targets).backward()
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
                    "iteration": iteration + 1,
                }
                with timed("serialize"):  # device to host, pickled to a file
                    torch.save(state, os.path.join(path, "state.pt"))
                saved = tune.Checkpoint.from_directory(path)
            reported({METRIC: accuracy}, checkpoint=saved)
        iteration += 1


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


def deterministic_algorithms() -> None:
    """Merged trials equal trials trained alone, bit for bit, on a GPU too."""
    from torch.backends import cudnn  # imported here: the trainable is pickled by value, and cudnn's module is not

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.use_deterministic_algorithms(True)
    cudnn.benchmark = False


#: ResNet-20's iteration with --study resnet20: a tenth of the 40,000 training images, so that Tune's
#: 32 x 12 iterations and ray_stagetree's, twice each, fit one 10-minute call on one GPU.
RESNET20_IMAGES_PER_ITERATION = 4096


def resnet20_space(epochs: int) -> dict[str, Any]:
    """The thesis' learning-rate x batch-size space for ResNet-20 (step decays
    by 10x, a batch of 128 or one doubling to 256; `paper_spaces.resnet20_policy_space`),
    its milestones scaled to ``epochs``: 8 decays x 4 batch sizes, 32 trials,
    merge rate 3.69 at 12 epochs."""

    def at(fraction: float) -> int:
        return max(1, min(epochs - 1, round(epochs * fraction)))

    # (A short --quick study collapses some milestones into one: each distinct schedule once.)
    decays = sorted({tuple(sorted({at(a), at(b)})) for a in (1 / 2, 7 / 12, 2 / 3, 3 / 4) for b in (5 / 6, 11 / 12)})
    doublings = sorted({at(fraction) for fraction in (1 / 2, 2 / 3, 5 / 6)})
    batch_sizes: list[Any] = [128] + [MultiStep(values=(128, 256), milestones=[m]) for m in doublings]
    return {
        "lr": tune.grid_search([MultiStep(0.1, list(milestones), 0.1) for milestones in decays]),
        "batch_size": tune.grid_search(batch_sizes),
        "model": "resnet20",
        "seed": 0,
    }


def promoting_asha(epochs: int) -> Any:
    """ASHA as its paper defines it (trials wait at a rung and are promoted), under either Tuner."""
    return PromotingASHAScheduler(max_t=epochs, grace_period=max(1, epochs // 4), reduction_factor=2)


def run_tune(trials_space, data, epochs, resources, storage, reuse: bool, asha: bool = False) -> dict[str, Any]:
    occupancy = harness.TrialOccupancy()
    scheduler = promoting_asha(epochs) if asha else None
    tuner = tune.Tuner(
        tune.with_resources(tune.with_parameters(train_resnet, data=data, hparams_at=values_at), resources),
        param_space=tune_grid(trials_space),
        tune_config=tune.TuneConfig(metric=METRIC, mode=MODE, reuse_actors=reuse, scheduler=scheduler),
        run_config=tune.RunConfig(
            storage_path=storage, stop={"training_iteration": epochs}, verbose=0, callbacks=[occupancy]
        ),
    )
    started, started_at = time.perf_counter(), time.monotonic()
    results = tuner.fit()
    wall, ended_at = time.perf_counter() - started, time.monotonic()
    executed = sum(result.metrics["training_iteration"] for result in results)
    best = results.get_best_result(METRIC, MODE, scope="last").metrics[METRIC]
    # Tune times each trial's trainable itself (time_total_s); the rest of its worker-seconds is Tune's.
    trainable = sum(result.metrics["time_total_s"] for result in results)
    phases = {"trainable": trainable, "outside the trainable": max(0.0, occupancy.seconds - trainable)}
    figures = {"wall": wall, "worker_seconds": occupancy.seconds, "epochs": executed, "best": best}
    parts = {
        "start": occupancy.first_start - started_at,
        "makespan": occupancy.last_end - occupancy.first_start,
        "tail": ended_at - occupancy.last_end,
    }
    return {**figures, **parts, "phases": phases, "epoch_seconds": trainable / max(1, executed)}


def run_stagetree(
    trials_space, data, epochs, resources, storage, sharing: bool, asha: bool = False, slots: int = 1
) -> dict[str, Any]:
    started, started_at = time.perf_counter(), time.time()
    results = Tuner(
        tune.with_resources(tune.with_parameters(train_resnet, data=data), resources),
        param_space=trials_space,
        tune_config=tune.TuneConfig(metric=METRIC, mode=MODE, scheduler=promoting_asha(epochs) if asha else None),
        run_config=tune.RunConfig(storage_path=storage, stop={"training_iteration": epochs}, verbose=0),
        stage_sharing=sharing,
    ).fit()
    wall, ended_at = time.perf_counter() - started, time.time()
    best = results.get_best_result(METRIC, MODE, scope="last").metrics[METRIC]
    executed = results.iterations_executed
    curves = [list(result.metrics_dataframe[METRIC]) for result in results]  # in the grid's order, for --deterministic
    figures = {"wall": wall, "worker_seconds": results.worker_seconds, "epochs": executed, "best": best}
    return {**figures, **spent(results), **replayed(results, slots, started_at, ended_at), "curves": curves}


def replayed(results: Any, slots: int, started_at: float, ended_at: float) -> dict[str, Any]:
    """The run's wall time in three parts (``fit()`` to the first batch, the
    batches' makespan, the last batch's end to ``fit()`` returning) and its
    makespan replayed on the simulator with its own measured costs
    (`ray_stagetree.simulation.replay`)."""
    plan = SearchPlan.load(f"{results.experiment_path}/plan")
    study_replay = replay(plan, slots)
    first, last = min(run.began for run in plan.runs), max(run.ended for run in plan.runs)
    parts = {"start": first - started_at, "makespan": study_replay.measured, "tail": ended_at - last}
    return {**parts, "replay": study_replay}


def spent(results: Any) -> dict[str, Any]:
    """The study's worker-seconds by phase (`ray_stagetree.timed`), and one
    epoch's training seconds: its ``train`` phase over the epochs it trained."""
    phases = dict(results.phase_seconds)
    return {"phases": phases, "epoch_seconds": phases.get("train", 0.0) / max(1, results.iterations_executed)}


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
    parser.add_argument(
        "--study",
        choices=["small", "resnet20"],
        default="small",
        help="small: the small ResNet, 12 trials on 10,000 images (default); resnet20: ResNet-20 on 50,000 images, "
        "the thesis' 32-trial space (merge rate 3.69), Tune reuse_actors=True against ray_stagetree",
    )
    parser.add_argument(
        "--images-per-iteration",
        type=int,
        default=None,
        metavar="N",
        help="train N images an iteration, the pass over the data going on in the next (default: an epoch; "
        f"--study resnet20 {RESNET20_IMAGES_PER_ITERATION:,}, so that both systems run twice in one 10-minute call)",
    )
    parser.add_argument("--asha", action="store_true", help="both Tuners under PromotingASHAScheduler")
    parser.add_argument(
        "--deterministic",
        action="store_true",
        help="deterministic algorithms, and check that each merged trial equals it trained alone, bit for bit",
    )
    args = harness.parse(parser)
    if not 0 < args.gpu_per_trial <= 1:
        parser.error(f"--gpu-per-trial must be in (0, 1], got {args.gpu_per_trial}")
    if args.data_parallel == 1 or args.data_parallel < 0:
        parser.error(f"--data-parallel must be >= 2 ranks per trial, got {args.data_parallel}")
    if args.images_per_iteration is not None and args.images_per_iteration < 1:
        parser.error(f"--images-per-iteration must be >= 1, got {args.images_per_iteration}")
    if args.deterministic and args.asha:
        parser.error("--deterministic compares every trial's whole curve: run it without --asha, whose stops vary")
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
    resnet = args.study == "resnet20"
    if resnet:
        epochs, samples = (4, 1000) if args.quick else (12, 50_000)
        trials_space = resnet20_space(epochs)
    else:
        epochs, samples = (3, 1000) if args.quick else (12, 10_000)
        trials_space = space(args.quick)
    trials_space["deterministic"] = args.deterministic
    images = args.images_per_iteration
    if images is None and resnet and not args.quick:
        images = RESNET20_IMAGES_PER_ITERATION
    trials_space["samples_per_iteration"] = images
    resources = {"gpu": args.gpu_per_trial, "cpu": 1} if args.device == "cuda" else {"cpu": 1}
    harness.start_ray()
    unit = "gpu" if args.device == "cuda" else "cpu"
    slots = max(1, int(ray.cluster_resources().get(unit.upper(), 1) // resources[unit]))
    data = make_data(samples)
    trials = generate_trials(trials_space)
    with tempfile.TemporaryDirectory(prefix="bench_gpu_") as storage:
        common = (trials_space, data, epochs, resources, storage)
        systems = {
            TUNE_DEFAULT: functools.partial(run_tune, *common, reuse=False, asha=args.asha),
            TUNE_REUSE: functools.partial(run_tune, *common, reuse=True, asha=args.asha),
            ALONE: functools.partial(run_stagetree, *common, sharing=False, asha=args.asha, slots=slots),
            SHARED: functools.partial(run_stagetree, *common, sharing=True, asha=args.asha, slots=slots),
        }
        if resnet:  # the large study: Tune at its best for trials of this length against ray_stagetree
            systems = {name: systems[name] for name in (TUNE_REUSE, SHARED)}
        runs = harness.interleaved(systems, args.repeats, "gpu")
        if args.deterministic:
            alone = run_stagetree(*common, sharing=False, asha=args.asha)
    device = torch.cuda.get_device_name(0) if args.device == "cuda" else "CPU workers"
    model = "ResNet-20" if resnet else "A small ResNet"
    unit_name = "epochs" if images is None else f"iterations of {images:,} images (epochs of the schedule)"
    section.text(
        f"{model} on {samples:,} CIFAR-shaped images labelled by a random convolutional teacher, {len(trials)}"
        f" learning-rate x batch-size sequence trials x {epochs} {unit_name} at {resources} each, on {device}; systems"
        f" interleaved, median [range] over the repeats; load {harness.loads(runs)} during the runs. Always"
        f" predicting the most common class scores {majority_accuracy(data):.4f}."
    )
    results_table(section, runs, "worker-s")
    breakdown(section, runs, epochs, len(trials), slots)
    wall_parts(section, runs, slots)
    lines = [f"* merge rate {merge_rate(trials, epochs):.2f}"]
    for key, label in (("worker_seconds", "worker-seconds"), ("wall", "wall")):
        best = harness.fastest(runs, [name for name in (TUNE_DEFAULT, TUNE_REUSE) if name in runs], key)
        ours = harness.values(runs[SHARED], key)
        line = f"* {label}, Tune at its best ({best[4:]}) / (c): **{harness.ratio(harness.values(runs[best], key), ours)}**"
        if ALONE in runs:
            line += f"; sharing only, (b) / (c): {harness.ratio(harness.values(runs[ALONE], key), ours)}"
        lines.append(line)
    if args.deterministic:
        merged = runs[SHARED][0]["curves"]
        same = sum(a == b for a, b in zip(merged, alone["curves"]))
        lines.append(
            f"* deterministic algorithms: {same} of {len(merged)} trials' accuracy curves trained merged equal "
            f"those trained alone (sharing off), bit for bit"
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


def breakdown(
    section: harness.Section, runs: dict[str, list[dict[str, Any]]], epochs: int, trials: int, slots: int
) -> None:
    """Where each system's worker-seconds went (medians over the repeats), and
    its wall time over the makespan's lower bound, max(longest path, work /
    slots), in epochs of the run's own training time per epoch: a trial's
    ``epochs`` on the longest path, the epochs the run executed as its work."""
    names = list(dict.fromkeys(name for outcomes in runs.values() for run in outcomes for name in run["phases"]))
    section.table(
        ["system", *names],
        [[system, *(phase_cell(outcomes, name) for name in names)] for system, outcomes in runs.items()],
    )
    bounds = {
        system: [run["epoch_seconds"] * max(epochs, run["epochs"] / slots) for run in outcomes]
        for system, outcomes in runs.items()
    }
    epoch = harness.median([run["epoch_seconds"] for run in runs[SHARED]])
    section.text(
        f"Worker-seconds by phase above (ray_stagetree's own, `ResultGrid.phase_seconds`; Ray Tune's split into its "
        f"trainables' `time_total_s` and the rest). Wall time over the makespan's lower bound, max(longest path, "
        f"work / slots), which leaves out the wait a narrow tree's first stages impose (the replay below counts it), "
        f"in each run's training seconds per epoch (ray_stagetree's {epoch:.2f} s; {slots} slots; a trial {epochs} "
        f"epochs; {trials} trials): "
        + "; ".join(
            f"{system} {harness.ratio(harness.values(outcomes, 'wall'), bounds[system])}"
            for system, outcomes in runs.items()
        )
    )


def wall_parts(section: harness.Section, runs: dict[str, list[dict[str, Any]]], slots: int) -> None:
    """Each system's wall time in parts; ray_stagetree's makespan against the
    simulator's replay of the same work at the run's own costs, and the
    wall-time saving the tree's shape allows on these slots."""
    replayed = {
        "replayed s": (lambda replay: replay.predicted, 1),
        "measured / replayed": (lambda replay: replay.accuracy, 2),
        "a worker's first batch, more s": (lambda replay: replay.worker_start_seconds, 2),
        "a batch from a checkpoint, more s": (
            lambda replay: replay.batch_start_seconds + replay.checkpoint_load_seconds,
            2,
        ),
        f"tree's limit on {slots} slots": (lambda replay: replay.tree_limit, 2),
    }

    def row(name: str, outcomes: list[dict[str, Any]]) -> list[str]:
        cells = [name] + [harness.median_range(harness.values(outcomes, key)) for key in ("start", "makespan", "tail")]
        for value, digits in replayed.values():
            ran = "replay" in outcomes[0]
            cells.append(harness.median_range([value(run["replay"]) for run in outcomes], digits) if ran else "-")
        return cells

    section.table(
        ["system", "fit() to first batch s", "makespan s", "last batch to return s", *replayed],
        [row(name, outcomes) for name, outcomes in runs.items()],
    )
    section.text(
        "The makespan runs from the first batch's dispatch (Tune: its first trial's start) to the last batch's end "
        "(its last trial's); replayed, the same work scheduled by the simulator under the same policy with the "
        "run's own costs (`simulation.replay`: each iteration as its cost model fits the run's timings, and each "
        "batch what its runs took beyond their iterations, on average: a worker's first more, its process warming "
        "up (the first model built, the CUDA context), and one from a checkpoint the fetch and restore); the "
        "tree's limit, the trial-by-trial replay's makespan over the shared one's, both without per-batch costs: "
        "the wall-time saving this tree allows on these slots at a constant cost per epoch, whatever the runtime "
        "does (the merge rate counts epochs, not the slots a narrow tree leaves idle). Target: measured within 15% "
        "of replayed."
    )


def phase_cell(outcomes: list[dict[str, Any]], name: str) -> str:
    if not any(name in run["phases"] for run in outcomes):
        return "-"
    return harness.median_range([run["phases"].get(name, 0.0) for run in outcomes])


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
