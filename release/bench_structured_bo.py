"""StructuredBO against generic searchers at equal worker-seconds (issue 16).

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
2. Real training (``--mnist1d``): the example's 1-D CNN on MNIST-1D with
   the same schedule family over 12 epochs, through ``ray_stagetree.Tuner``
   on 2 workers; the budget is worker-seconds measured (``ResultGrid.worker_seconds``).

Prints, per searcher: median (quartiles) best metric at the budget, the
merge rate of what it explored, and the share of the budget StructuredBO
needs to reach each baseline's median final quality (target, from the seed
paper: a third). Writes ``best_vs_budget_simulator.png`` (and
``best_vs_budget_mnist1d.png``) next to this file, or under ``--out``.

    python release/bench_structured_bo.py                 # simulator, 10 seeds (about 15 minutes)
    python release/bench_structured_bo.py --mnist1d       # and real training (3 seeds, about 15 minutes more)
    python release/bench_structured_bo.py --quick         # 1 seed, small budget (CI smoke test)
"""

from __future__ import annotations

import argparse
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
from ray import tune

from ray_stagetree import Step, Warmup
from ray_stagetree.searchers import StructuredBO
from ray_stagetree.simulation.simulated_study import RESNET20, StudyDefinition, simulate

HORIZON = 30
WORKERS = 4
SPACE = {"lr": Warmup(tune.loguniform(1e-3, 1.0), 10, Step(tune.loguniform(1e-2, 3.0), 10, tune.loguniform(0.01, 1.0)))}


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


def best_so_far(finishes: list[tuple[float, float]]) -> list[tuple[float, float]]:
    values = np.maximum.accumulate([value for _, value in finishes])
    return [(spent, float(best)) for (spent, _), best in zip(finishes, values)]


def simulator_runs(make: Callable[[int], Any], seeds: int, trials: int) -> Runs:
    runs = Runs()
    started = time.perf_counter()
    for seed in range(seeds):
        study = StudyDefinition(
            "s", [], RESNET20, HORIZON, max_concurrent_trials=WORKERS,
            searcher=lambda: make(seed), param_space=SPACE, num_samples=trials,
        )
        run = simulate([study], gpus=WORKERS)
        runs.traces.append(best_so_far(run.studies["s"].finishes))
        runs.merge_rates.append(run.explored_merge_rate)
    runs.seconds = time.perf_counter() - started
    return runs


def share_to_reach(curve: Callable[[float], float], target: float, budget: float) -> float:
    """Smallest share of ``budget`` at which ``curve`` reaches ``target`` (inf: never)."""
    for share in np.linspace(0.01, 1.0, 100):
        if curve(share * budget) >= target:
            return float(share)
    return math.inf


def report(title: str, results: dict[str, Runs], budget: float, unit: str) -> None:
    print(f"\n{title}: best metric at the budget ({budget:,.0f} {unit}), median [quartiles] over {len(next(iter(results.values())).traces)} seeds")
    ours = results.get("structured-bo")
    median_curve = (lambda runs: lambda spent: float(np.nanmedian(runs.best_at(spent))) if np.any(np.isfinite(runs.best_at(spent))) else -math.inf)
    print(f"{'searcher':<14} {'median':>8} {'q25':>8} {'q75':>8} {'merge rate':>10} {'SBO reaches it at':>18} {'wall s':>7}")
    for name, runs in results.items():
        final = runs.best_at(budget)
        q25, median, q75 = np.nanpercentile(final, [25, 50, 75])
        reach = share_to_reach(median_curve(ours), median, budget) if ours is not None and name != "structured-bo" else None
        reach_text = "" if reach is None else ("never" if math.isinf(reach) else f"{reach:.2f} of budget")
        print(
            f"{name:<14} {median:>8.4f} {q25:>8.4f} {q75:>8.4f} {np.mean(runs.merge_rates):>10.2f} {reach_text:>18} {runs.seconds:>7.0f}"
        )


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


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="1 seed, a budget of 8 trials, three searchers")
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--only", default=None, help="comma-separated searcher names")
    parser.add_argument("--mnist1d", action="store_true", help="also run the real MNIST-1D part")
    parser.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)), help="folder for the PNGs")
    args = parser.parse_args()
    started = time.perf_counter()
    seeds, budget_trials = (1, 8) if args.quick else (args.seeds, 30)
    factories = searchers(HORIZON)
    names = args.only.split(",") if args.only else (["random", "optuna-tpe", "structured-bo"] if args.quick else list(factories))
    budget = budget_trials * HORIZON * RESNET20.seconds_per_iteration
    results = {}
    for name in names:
        # A searcher that shares prefixes trains more trials within the budget.
        trials = 2 * budget_trials if name == "structured-bo" else budget_trials
        results[name] = simulator_runs(factories[name], seeds, trials)
    report("1. Simulator, ResNet20 profile, Warmup(w, 10, Step(b, 10, gamma)), 30 epochs, 4 workers", results, budget, "GPU-s")
    if not args.quick:
        plot(os.path.join(args.out, "best_vs_budget_simulator.png"), "Simulated ResNet20, 30 epochs, 4 workers", results, budget, "GPU-seconds")
    print(f"\ntotal {time.perf_counter() - started:.1f} s wall")


if __name__ == "__main__":
    main()
