"""The Hermes paper's comparison (section 4) on simulated GPUs: time-sharing
policies on bins of 16 jobs over 4 GPUs.

Workload, as close as the paper describes it: for each of its four CNNs
(GoogleNet, VGG16, VGG19, ResNet50) the 192 combinations of Table 1
(optimizer x batch size x learning rate x weight decay), each trained for
1000 SGD steps. A job reports its loss every 10 steps (one iteration here;
the paper's node scheduler sees losses as they come). A combination is
*good* when it reaches the target, 90% of the best final accuracy of the
model's 192 (the paper's "at least 90% of the optimal"), within its 1000
steps. Bin type 1 holds 4 good and 12 bad jobs, bin type 2 12 good and 4
bad, drawn at random and submitted in a random order (five draws, as the
paper averages five runs). The figures of merit are the paper's: the
average time the good jobs of a bin take to reach the target (Figure 5),
and the average time its top four jobs, the four of the highest final
accuracy, take (Figure 6: how soon the best of many good combinations are
found). In a bin of type 1 the two are the same four jobs.

Learning curves are `LearningCurve`'s (simulation/simulated_study.py),
with Adam at learning rate 5e-4 and batch 32 as the recipe every step size
is relative to: RMSProp counts as Adam, SGD without momentum is 30 times
slower, larger learning rates with small batches diverge, and weight decay
shifts the reachable accuracy a little. The loss is ``1 - accuracy``.

Costs: Table 2's TensorFlow time for 1000 steps at batch 16 (GoogleNet
30.12 s, VGG16 94.26 s, VGG19 110.49 s, ResNet50 66.88 s), 60% of it
proportional to the batch size. A pre-emption saves a checkpoint and the
resumed job restores it: GoogleNet 0.24 s + 0.43 s and VGG19 1.57 s in all
(section 4.3); VGG16 and ResNet50, whose figures the text does not give,
are set between by model size (1.5 s, 0.9 s). Every time-sharing policy
(Hermes, round robin, SLAQ) pays that same cost per pre-emption: the paper
runs all of them on its own pre-emption module; FIFO never pre-empts.
"""

from __future__ import annotations

import itertools
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ray_stagetree.planning.plan import PlanNode, SearchPlan
from ray_stagetree.planning.policies import ExecutionPolicy
from ray_stagetree.simulation.simulated_study import Curves, LearningCurve, ModelProfile
from ray_stagetree.simulation.simulator import Simulation, SimulationResult

TABLE_1 = {
    "optimizer": ("sgd", "sgd_momentum", "rmsprop", "adam"),
    "batch_size": (16, 24, 32, 50),
    "lr": (0.001, 0.0005, 0.0001, 0.00001),
    "weight_decay": (0.1, 0.01, 0.001),
}

STEPS_PER_ITERATION = 10
ITERATIONS = 1000 // STEPS_PER_ITERATION
GPUS = 4
JOBS_PER_BIN = 16
GOOD_JOBS = {1: 4, 2: 12}  # bin type -> good jobs of its 16
TOP_JOBS = 4  # Figure 6 times a bin's best four
TARGET_FRACTION = 0.9


@dataclass(frozen=True)
class CnnModel:
    """One of the paper's models: seconds of 1000 steps at batch 16 (Table 2),
    and the seconds of saving and of restoring a checkpoint."""

    name: str
    seconds_per_1000_steps: float
    save_seconds: float
    load_seconds: float

    def iteration_seconds(self, batch_size: int) -> float:
        per_step = self.seconds_per_1000_steps / 1000 * (0.4 + 0.6 * batch_size / 16)
        return per_step * STEPS_PER_ITERATION


MODELS = (
    CnnModel("googlenet", 30.12, 0.24, 0.43),
    CnnModel("vgg16", 94.26, 0.55, 0.95),
    CnnModel("vgg19", 110.49, 0.57, 1.00),
    CnnModel("resnet50", 66.88, 0.32, 0.58),
)

_CURVE = LearningCurve(
    0.0, 0.9, 16.0, 0.04, {"lr": 0.0005, "optimizer": "adam", "batch_size": 32}, offset_scale=0.01, noise=0.005
)


def _profile(model: CnnModel) -> ModelProfile:
    return ModelProfile(model.name, "accuracy", 0.0, _CURVE, model.load_seconds, model.save_seconds)


def combinations(model: CnnModel) -> list[dict[str, Any]]:
    """Table 1's 192 combinations of ``model``, as configs."""
    names = list(TABLE_1)
    return [
        {"model": model.name, **dict(zip(names, values))}
        for values in itertools.product(*(TABLE_1[name] for name in names))
    ]


def _curve_values(config: dict[str, Any]) -> dict[str, Any]:
    """What the learning curve reads: RMSProp steps like Adam (its own name,
    under ``algorithm``, shifts the reachable accuracy as other values do)."""
    optimizer = "adam" if config["optimizer"] == "rmsprop" else config["optimizer"]
    momentum = {"momentum": 0.9} if optimizer == "sgd_momentum" else {}
    return {**config, "optimizer": optimizer, "algorithm": config["optimizer"], **momentum}


class _Metrics:
    """Loss and accuracy of the simulated jobs, by plan node and iteration."""

    def __init__(self, model: CnnModel) -> None:
        self.model = model
        self.curves = Curves({model.name: _profile(model)})

    def __call__(self, node: PlanNode, iteration: int) -> dict[str, float]:
        accuracy = self.curves.metrics(node, iteration)["accuracy"]
        return {"accuracy": accuracy, "loss": 1.0 - accuracy}

    def seconds(self, node: PlanNode, iteration: int) -> float:
        return self.model.iteration_seconds(node.config.hparams_at(iteration)["batch_size"])


def _final_accuracy(model: CnnModel, config: dict[str, Any]) -> float:
    state = _CURVE.initial({})
    values = _curve_values(config)
    for _ in range(ITERATIONS):
        state = _CURVE.advance(state, values)
    return _CURVE.score(state)


@dataclass(frozen=True)
class Bin:
    """16 jobs in submission order, which of them are good and which are
    its top four (the timed ones), and the target accuracy."""

    model: CnnModel
    bin_type: int
    jobs: tuple[dict[str, Any], ...]
    good: frozenset[int]
    top: frozenset[int]
    target: float


def make_bins(model: CnnModel, bin_type: int, draws: int, seed: int = 0) -> list[Bin]:
    """``draws`` random bins of ``bin_type`` (1 or 2) for ``model``."""
    if bin_type not in GOOD_JOBS:
        raise ValueError(f"bin_type must be one of {sorted(GOOD_JOBS)}, got {bin_type!r}")
    configs = [_curve_values(config) for config in combinations(model)]
    finals = [_final_accuracy(model, config) for config in configs]
    target = TARGET_FRACTION * max(finals)
    good = [(config, final) for config, final in zip(configs, finals) if final >= target]
    bad = [(config, final) for config, final in zip(configs, finals) if final < target]
    rng = random.Random(f"{seed}-{model.name}-{bin_type}")
    bins = []
    for _ in range(draws):
        chosen = [(c, f, True) for c, f in rng.sample(good, GOOD_JOBS[bin_type])]
        chosen += [(c, f, False) for c, f in rng.sample(bad, JOBS_PER_BIN - GOOD_JOBS[bin_type])]
        rng.shuffle(chosen)
        jobs = tuple(config for config, _, _ in chosen)
        good_positions = frozenset(i for i, (_, _, is_good) in enumerate(chosen) if is_good)
        best_first = sorted(range(JOBS_PER_BIN), key=lambda i: chosen[i][1], reverse=True)
        bins.append(Bin(model, bin_type, jobs, good_positions, frozenset(best_first[:TOP_JOBS]), target))
    return bins


@dataclass(frozen=True)
class BinRun:
    average_time_to_target: float  # the good jobs' (Figure 5)
    top_time_to_target: float  # the top four jobs' (Figure 6)
    makespan: float
    yielded: int
    worker_seconds: float


def simulate_bin(job_bin: Bin, policy: ExecutionPolicy, gpus: int = GPUS) -> tuple[SearchPlan, SimulationResult]:
    """Train a bin's jobs (trials ``job00`` ...) to 1000 steps under ``policy``."""
    metrics = _Metrics(job_bin.model)
    simulation = Simulation(
        gpus,
        seconds_per_iteration=metrics.seconds,
        checkpoint_load_seconds=job_bin.model.load_seconds,
        checkpoint_save_seconds=job_bin.model.save_seconds,
        metrics=metrics,
    )
    plan = SearchPlan()
    plan.add_trials([(f"job{i:02d}", config, ITERATIONS) for i, config in enumerate(job_bin.jobs)])
    return plan, simulation.run(plan, policy)


def run_bin(job_bin: Bin, policy: ExecutionPolicy, gpus: int = GPUS) -> BinRun:
    """The good jobs' and the top four jobs' average time to reach the
    target under ``policy`` (the paper's metrics), the makespan, the
    pre-emptions and the worker time."""
    plan, result = simulate_bin(job_bin, policy, gpus)
    return BinRun(
        mean_time_to_target(plan, job_bin, job_bin.good),
        mean_time_to_target(plan, job_bin, job_bin.top),
        result.makespan,
        result.yielded,
        result.worker_seconds,
    )


def mean_time_to_target(plan: SearchPlan, job_bin: Bin, jobs: frozenset[int]) -> float:
    """The mean time of ``jobs`` (positions in the bin) to their first
    result at the target (90% of the optimal accuracy), from the study's start."""
    times = [time_to(plan, f"job{i:02d}", job_bin.target) for i in sorted(jobs)]
    return sum(times) / len(times)


def time_to(plan: SearchPlan, trial_id: str, target: float) -> float:
    """When the trial first reported an accuracy at ``target`` or above."""
    history = plan.history(trial_id)
    return min(history[at]["time_total_s"] for at in sorted(history) if history[at]["accuracy"] >= target)


def compare(
    policies: dict[str, Callable[[], ExecutionPolicy]], models=MODELS, bin_types=(1, 2), draws: int = 5
) -> dict[tuple[str, int, str], list[BinRun]]:
    """``(model, bin type, policy) -> its runs on ``draws`` random bins``
    (random jobs in a random order; the same bins for every policy)."""
    out = {}
    for model in models:
        for bin_type in bin_types:
            bins = make_bins(model, bin_type, draws)
            for name, make in policies.items():
                out[model.name, bin_type, name] = [run_bin(job_bin, make()) for job_bin in bins]
    return out
