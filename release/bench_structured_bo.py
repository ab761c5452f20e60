"""StructuredBO against generic searchers at equal worker-seconds.

Each searcher drives one study at a time, ``--seeds`` times, 4 trials at
once; the best final metric reached is recorded against the worker-seconds
spent so far. Under stage sharing a searcher that proposes trials which
share prefixes gets more trials for the same budget, so the budget counts
each trained iteration once (unique iterations), not trials.

Baselines, all Tune searchers hosted unchanged: random search (Optuna's
RandomSampler), Optuna TPE, HyperOpt TPE and Tune's BayesOptSearch (a GP
with UCB; it searches log-uniform domains uniformly, Tune drops the log).

1. Simulator (``ray_stagetree.simulation``: the real planner, the critical
   path policy, learning curves that depend on the whole schedule): a
   ResNet20 profile (35 GPU-seconds an epoch), 30 epochs, a warm-up from
   ``w`` to ``b`` over 10 epochs, then ``b`` for 10 and ``b * gamma`` for
   the last 10 (``Warmup(w, 10, Step(b, 10, gamma))``, all three
   log-uniform). Budget: 30 unshared trials (31,500 GPU-seconds).
2. Real training (``--mnist1d``): the metric is the example's 1-D CNN on
   MNIST-1D (2,000 samples) trained for real, one epoch per iteration, at
   the schedule ``Warmup(w, 2, Step(b, 3, gamma))`` over 8 epochs; the
   order and the accounting are the simulator's (4 workers, each epoch
   costs the median epoch measured on this machine). Budget: 12 unshared
   trials.

Prints, per searcher: median (quartiles) best metric at the budget, the
merge rate of what it explored, and the share of the budget StructuredBO
needs to reach each baseline's median final quality (target, from the seed
paper: a third). Writes ``best_vs_budget_simulator.png`` (and
``best_vs_budget_mnist1d.png``) next to this file, or under ``--out``.

    python release/bench_structured_bo.py                 # simulator, 10 seeds (about 15 minutes)
    python release/bench_structured_bo.py --mnist1d       # and real training (--mnist1d-seeds, default 3)
    python release/bench_structured_bo.py --quick         # 1 seed, small budget (CI smoke test)
"""

from __future__ import annotations

import argparse
import dataclasses
import functools
import json
import math
import os
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from ray import tune

from ray_stagetree import Step, Warmup
from ray_stagetree.planning.plan import PlanNode
from ray_stagetree.searchers import StructuredBO
from ray_stagetree.simulation.simulated_study import RESNET20, ModelProfile, StudyDefinition, simulate

HORIZON = 30
WORKERS = 4
SPACE = {"lr": Warmup(tune.loguniform(1e-3, 1.0), 10, Step(tune.loguniform(1e-2, 3.0), 10, tune.loguniform(0.01, 1.0)))}
MNIST1D_HORIZON = 8
MNIST1D_SPACE = {
    "lr": Warmup(tune.loguniform(1e-3, 0.3), 2, Step(tune.loguniform(1e-2, 1.0), 3, tune.loguniform(0.01, 1.0)))
}


def searchers(horizon: int) -> dict[str, Callable[[int], Any]]:
    """Searcher factories by name, each taking a seed."""
    import optuna
    from ray.tune.search.bayesopt import BayesOptSearch
    from ray.tune.search.hyperopt import HyperOptSearch
    from ray.tune.search.optuna import OptunaSearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return {
        "random": lambda seed: OptunaSearch(sampler=optuna.samplers.RandomSampler(seed=seed)),
        "optuna-tpe": lambda seed: OptunaSearch(sampler=optuna.samplers.TPESampler(seed=seed)),
        "hyperopt": lambda seed: HyperOptSearch(random_state_seed=seed),
        "bayesopt": lambda seed: BayesOptSearch(random_state=seed, verbose=0),
        "structured-bo": lambda seed: StructuredBO(horizon=horizon, seed=seed),
    }


@dataclass
class Runs:
    """One searcher's runs: per seed, (budget spent, best so far) at each
    finished trial, and the merge rate of what it explored."""

    traces: list[list[tuple[float, float]]] = field(default_factory=list)
    merge_rates: list[float] = field(default_factory=list)
    seconds: float = 0.0

    def best_at(self, budget: float) -> np.ndarray:
        """Best metric reached within ``budget``, one per seed (NaN: none yet)."""
        return np.array([max((v for spent, v in trace if spent <= budget), default=np.nan) for trace in self.traces])


def cached(path: str | None, compute: Callable[[], Runs]) -> Runs:
    """``compute()``, or the runs a previous invocation wrote to ``path``
    (so searchers can run in separate processes and be reported together)."""
    if path is not None and os.path.exists(path):
        with open(path) as file:
            data = json.load(file)
        traces = [[tuple(point) for point in trace] for trace in data["traces"]]
        return Runs(traces, data["merge_rates"], data["seconds"])
    runs = compute()
    if path is not None:
        with open(path, "w") as file:
            json.dump(dataclasses.asdict(runs), file)
    return runs


def best_so_far(finishes: list[tuple[float, float]]) -> list[tuple[float, float]]:
    values = np.maximum.accumulate([value for _, value in finishes])
    return [(spent, float(best)) for (spent, _), best in zip(finishes, values)]


class RealTraining:
    """The example's MNIST-1D CNN (``examples/mnist1d_study.py``) trained for
    real as the simulated trials' metric: iteration ``k`` of a path is one
    epoch of SGD (momentum 0.9, batch 128) at that path's learning rate,
    from the model state after its first ``k - 1`` epochs, then the test
    accuracy. States are kept by learning-rate prefix, so a prefix trains
    once in this process (the budget still counts each run's own
    iterations: the simulator's accounting)."""

    def __init__(self) -> None:
        import torch

        sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples"))
        from mnist1d_study import CNN, make_data

        torch.set_num_threads(1)
        self.torch, self.cnn = torch, CNN
        (self.x, self.y), (self.x_test, self.y_test) = make_data(num_samples=2000)
        self.states: dict[tuple[float, ...], tuple[dict, dict, float]] = {}
        self.seconds: list[float] = []

    def __call__(self, node: PlanNode, iteration: int) -> dict[str, float]:
        lrs = tuple(float(lr) for lr in node.config.sequences[node.config.names.index("lr")].values(0, iteration))
        if lrs not in self.states:
            self._train(lrs)
        return {"accuracy": self.states[lrs][2]}

    def _train(self, lrs: tuple[float, ...]) -> None:
        torch = self.torch
        started = time.perf_counter()
        torch.manual_seed(0)
        model = self.cnn()
        optimizer = torch.optim.SGD(model.parameters(), lr=lrs[-1], momentum=0.9)
        if len(lrs) > 1:
            if lrs[:-1] not in self.states:
                self._train(lrs[:-1])
            model_state, optimizer_state, _ = self.states[lrs[:-1]]
            model.load_state_dict(model_state)
            optimizer.load_state_dict(optimizer_state)
            for group in optimizer.param_groups:
                group["lr"] = lrs[-1]
        order = torch.randperm(len(self.x), generator=torch.Generator().manual_seed(len(lrs)))
        model.train()
        for batch in order.split(128):
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(self.x[batch]), self.y[batch]).backward()
            optimizer.step()
        model.eval()
        with torch.no_grad():
            accuracy = (model(self.x_test).argmax(1) == self.y_test).float().mean().item()
        self.states[lrs] = (model.state_dict(), optimizer.state_dict(), accuracy if math.isfinite(accuracy) else 0.0)
        self.seconds.append(time.perf_counter() - started)

    def profile(self, epoch_seconds: float | None = None) -> ModelProfile:
        """Costs from this machine: ``epoch_seconds``, or the median of 4
        epochs measured now (after one that warms torch up)."""
        if epoch_seconds is None:
            self._train((0.1,) * 5)
            epoch_seconds = float(np.median(self.seconds[1:]))
        return dataclasses.replace(
            RESNET20,
            name="mnist1d_cnn",
            seconds_per_iteration=epoch_seconds,
            checkpoint_load_seconds=0.05,
            checkpoint_save_seconds=0.05,
        )


def simulator_runs(
    make: Callable[[int], Any],
    seeds: range,
    trials: int,
    profile: ModelProfile = RESNET20,
    horizon: int = HORIZON,
    space: dict[str, Any] = SPACE,
    metrics: Callable[[PlanNode, int], dict[str, float]] | None = None,
) -> Runs:
    runs = Runs()
    started = time.perf_counter()
    for seed in seeds:
        study = StudyDefinition(
            "s",
            [],
            profile,
            horizon,
            max_concurrent_trials=WORKERS,
            searcher=functools.partial(make, seed),
            param_space=space,
            num_samples=trials,
        )
        run = simulate([study], gpus=WORKERS, metrics=metrics)
        runs.traces.append(best_so_far(run.studies["s"].finishes))
        runs.merge_rates.append(run.explored_merge_rate)
    runs.seconds = time.perf_counter() - started
    return runs


def median_at(runs: Runs, spent: float) -> float:
    """Median over seeds of the best reached within ``spent`` (-inf while a seed has none)."""
    best = runs.best_at(spent)
    return float(np.median(best)) if np.all(np.isfinite(best)) else -math.inf


def share_to_reach(curve: Callable[[float], float], target: float, budget: float) -> float:
    """Smallest share of ``budget`` at which ``curve`` reaches ``target`` (inf: never)."""
    for share in np.linspace(0.01, 1.0, 100):
        if curve(share * budget) >= target:
            return float(share)
    return math.inf


def report(title: str, results: dict[str, Runs], budget: float, unit: str) -> None:
    seeds = len(next(iter(results.values())).traces)
    print(f"\n{title}: best metric at the budget ({budget:,.0f} {unit}), median [quartiles] over {seeds} seeds")
    ours = results.get("structured-bo")
    header = f"{'merge rate':>10} {'SBO reaches it at':>18} {'wall s':>7}"
    print(f"{'searcher':<14} {'median':>8} {'q25':>8} {'q75':>8} {header}")
    for name, runs in results.items():
        final = runs.best_at(budget)
        q25, median, q75 = np.nanpercentile(final, [25, 50, 75])
        compared = ours is not None and name != "structured-bo"
        reach = share_to_reach(lambda spent: median_at(ours, spent), median, budget) if compared else None
        reach_text = "" if reach is None else ("never" if math.isinf(reach) else f"{reach:.2f} of budget")
        merge = np.mean(runs.merge_rates)
        print(f"{name:<14} {median:>8.4f} {q25:>8.4f} {q75:>8.4f} {merge:>10.2f} {reach_text:>18} {runs.seconds:>7.0f}")


def plot(path: str, title: str, results: dict[str, Runs], budget: float, unit: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = np.linspace(0, budget, 200)[1:]
    figure, axes = plt.subplots(figsize=(7, 4.5))
    for name, runs in results.items():
        values = np.array([runs.best_at(spent) for spent in grid])  # budget x seeds
        defined = np.all(np.isfinite(values), axis=1)
        median = np.nanmedian(np.where(defined[:, None], values, np.nan), axis=1)
        low, high = np.nanpercentile(np.where(defined[:, None], values, np.nan), [25, 75], axis=1)
        axes.plot(grid, median, label=name, linewidth=2 if name == "structured-bo" else 1.2)
        axes.fill_between(grid, low, high, alpha=0.15)
    axes.set_xlabel(f"budget spent ({unit}, each trained iteration once)")
    axes.set_ylabel("best final metric so far (median, quartiles)")
    axes.set_title(title)
    axes.legend()
    axes.grid(alpha=0.3)
    figure.tight_layout()
    figure.savefig(path, dpi=120)
    print(f"wrote {path}")


def real_training(names: list[str], seeds: int, out: str, cache: str | None) -> None:
    training = RealTraining()
    # Cached runs were charged at the epoch time measured when they ran.
    measured = cache and os.path.join(cache, "mnist1d-epoch-seconds.json")
    if measured and os.path.exists(measured):
        with open(measured) as file:
            profile = training.profile(json.load(file))
    else:
        profile = training.profile()
        if measured:
            with open(measured, "w") as file:
                json.dump(profile.seconds_per_iteration, file)
    budget_trials = 12
    budget = budget_trials * MNIST1D_HORIZON * profile.seconds_per_iteration
    factories = searchers(MNIST1D_HORIZON)
    results = {}
    for name in names:
        trials = 2 * budget_trials if name == "structured-bo" else budget_trials
        results[name] = cached(
            cache and os.path.join(cache, f"mnist1d-{name}-{seeds}.json"),
            functools.partial(
                simulator_runs,
                factories[name],
                range(seeds),
                trials,
                profile,
                MNIST1D_HORIZON,
                MNIST1D_SPACE,
                metrics=training,
            ),
        )
    report(
        f"2. MNIST-1D CNN trained for real ({profile.seconds_per_iteration:.2f} s an epoch here), "
        f"Warmup(w, 2, Step(b, 3, gamma)), {MNIST1D_HORIZON} epochs, 4 workers",
        results,
        budget,
        "worker-s",
    )
    title = f"MNIST-1D CNN, {MNIST1D_HORIZON} epochs, 4 workers"
    plot(os.path.join(out, "best_vs_budget_mnist1d.png"), title, results, budget, "worker-seconds")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 seed, a budget of 6 trials, three searchers")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0, help="seeds are first-seed, first-seed + 1, ...")
    parser.add_argument("--only", default=None, help="comma-separated searcher names")
    parser.add_argument("--mnist1d", action="store_true", help="also run the real MNIST-1D part")
    parser.add_argument("--mnist1d-seeds", type=int, default=3)
    parser.add_argument("--cache", default=None, help="folder keeping each searcher's runs (reused when present)")
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)), help="folder for the PNGs")
    args = parser.parse_args()
    started = time.perf_counter()
    seeds, budget_trials = (1, 6) if args.quick else (args.seeds, 30)
    factories = searchers(HORIZON)
    default = ["random", "optuna-tpe", "structured-bo"] if args.quick else list(factories)
    names = args.only.split(",") if args.only else default
    budget = budget_trials * HORIZON * RESNET20.seconds_per_iteration
    results = {}
    for name in names:
        # A searcher that shares prefixes trains more trials within the budget.
        trials = 2 * budget_trials if name == "structured-bo" else budget_trials
        part = f"{seeds}" if args.first_seed == 0 else f"{args.first_seed}+{seeds}"
        results[name] = cached(
            args.cache and os.path.join(args.cache, f"simulator-{name}-{part}.json"),
            functools.partial(simulator_runs, factories[name], range(args.first_seed, args.first_seed + seeds), trials),
        )
    title = "1. Simulator, ResNet20 profile, Warmup(w, 10, Step(b, 10, gamma)), 30 epochs, 4 workers"
    report(title, results, budget, "GPU-s")
    if not args.quick:
        title = "Simulated ResNet20, 30 epochs, 4 workers"
        plot(os.path.join(args.out, "best_vs_budget_simulator.png"), title, results, budget, "GPU-seconds")
    if args.mnist1d:
        real_training(names, args.mnist1d_seeds, args.out, args.cache)
    print(f"\ntotal {time.perf_counter() - started:.1f} s wall")


if __name__ == "__main__":
    main()
