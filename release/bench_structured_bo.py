"""StructuredBO against generic searchers at equal budgets, in evaluations too.

Each searcher drives one study at a time, once per seed (the repeats), 4
trials at once; the best final metric reached is recorded against the
budget spent so far and the trials finished (evaluations). Under stage
sharing a searcher that proposes trials which share prefixes gets more
trials for the same budget, so the budget counts each trained iteration
once (unique iterations), not trials.

Baselines, all Tune searchers hosted unchanged: random search (Optuna's
RandomSampler), Optuna TPE and Optuna's GP sampler (a GP-BO that searches
log domains in log space), both with a random start-up of a quarter of the
budget, HyperOpt TPE and Tune's BayesOptSearch (a GP with UCB; it searches
log-uniform domains uniformly, Tune drops the log).

1. Simulator (``ray_stagetree.simulation``: the real planner, the critical
   path policy, learning curves that depend on the whole schedule; a
   calibrated model): a ResNet20 profile (35 GPU-seconds an epoch), 30
   epochs, two spaces: ``Warmup(w, 10, Step(b, 10, gamma))`` (3
   log-uniform parameters), and 8 parameters (a warm-up and two decays,
   momentum, batch size, weight decay, label smoothing, cutout). Budget: 30
   unshared trials (31,500 GPU-seconds).
2. Real training (``--mnist1d``): the metric is the example's 1-D CNN on
   MNIST-1D (2,000 samples) trained for real, one epoch per iteration, at
   the schedule ``Warmup(w, 2, Step(b, 3, gamma))`` over 8 epochs; the
   order and the accounting are the simulator's (4 workers, each epoch
   costs the median epoch measured on this machine). Budget:
   ``--mnist1d-budget`` unshared trials (24).

Prints, per searcher: median [quartiles] best metric at the budget, the
evaluations within it, the merge rate of what it explored, and the share of
the budget and the evaluations StructuredBO needs to reach each baseline's
median final quality (target, from the seed paper: a third of the budget).
Writes ``best_vs_budget_*.png`` under ``--out`` (default: a temporary folder).

    python release/bench_structured_bo.py --full          # simulator, both spaces, 10 seeds
    python release/bench_structured_bo.py --mnist1d       # and real training (--mnist1d-seeds, default 3)
    python release/bench_structured_bo.py --quick         # 1 seed, small budget (CI smoke test)
"""

from __future__ import annotations

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

import harness  # noqa: E402  (release/, next to this file)
import numpy as np
from ray import tune

from ray_stagetree import MultiStep, Step, Warmup
from ray_stagetree.planning.plan import PlanNode
from ray_stagetree.searchers import StructuredBO
from ray_stagetree.simulation.simulated_study import RESNET20, ModelProfile, StudyDefinition, simulate

HORIZON = 30
WORKERS = 4
SPACE = {"lr": Warmup(tune.loguniform(1e-3, 1.0), 10, Step(tune.loguniform(1e-2, 3.0), 10, tune.loguniform(0.01, 1.0)))}
SPACE8 = {
    "lr": Warmup(
        tune.loguniform(1e-3, 1.0),
        5,
        MultiStep(tune.loguniform(1e-2, 3.0), [15, 25], tune.loguniform(0.01, 1.0)),
    ),
    "momentum": tune.uniform(0.5, 0.99),
    "batch_size": tune.choice([64, 128, 256]),
    "weight_decay": tune.loguniform(1e-5, 1e-3),
    "label_smoothing": tune.uniform(0.0, 0.2),
    "cutout": tune.uniform(0.0, 0.5),
}
#: Searchers that refuse a space, by space: why.
REFUSES = {"8": {"bayesopt": "Tune's BayesOptSearch takes no categorical parameter (the batch size)"}}
SPACE_TITLES = {
    "3": "Warmup(w, 10, Step(b, 10, gamma)), 3 log-uniform parameters",
    "8": "Warmup(w, 5, MultiStep(b, [15, 25], gamma)), momentum, batch size, weight decay, label smoothing, cutout:"
    " 8 parameters",
}
MNIST1D_HORIZON = 8
MNIST1D_SPACE = {
    "lr": Warmup(tune.loguniform(1e-3, 0.3), 2, Step(tune.loguniform(1e-2, 1.0), 3, tune.loguniform(0.01, 1.0)))
}


def searchers(horizon: int, startup: int) -> dict[str, Callable[[int], Any]]:
    """Searcher factories by name, each taking a seed. Optuna's model-based
    samplers draw their first ``startup`` trials at random, then model."""
    import optuna
    from ray.tune.search.bayesopt import BayesOptSearch
    from ray.tune.search.hyperopt import HyperOptSearch
    from ray.tune.search.optuna import OptunaSearch

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return {
        "random": lambda seed: OptunaSearch(sampler=optuna.samplers.RandomSampler(seed=seed)),
        "optuna-tpe": lambda seed: OptunaSearch(
            sampler=optuna.samplers.TPESampler(seed=seed, n_startup_trials=startup)
        ),
        # A GP-BO that searches log domains in log space (Tune's BayesOptSearch drops the log).
        "optuna-gp": lambda seed: OptunaSearch(sampler=optuna.samplers.GPSampler(seed=seed, n_startup_trials=startup)),
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

    def evaluations_at(self, budget: float) -> np.ndarray:
        """Trials finished within ``budget``, one per seed."""
        return np.array([sum(1 for spent, _ in trace if spent <= budget) for trace in self.traces])

    def evaluations_to(self, target: float, budget: float) -> np.ndarray:
        """Trials finished when the best first reached ``target`` within ``budget`` (inf: never), one per seed."""
        return np.array(
            [
                next((k for k, (spent, v) in enumerate(trace, 1) if spent <= budget and v >= target), math.inf)
                for trace in self.traces
            ]
        )

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
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
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


def report(section: harness.Section, title: str, results: dict[str, Runs], budget: float, unit: str) -> None:
    seeds = len(next(iter(results.values())).traces)
    ours = results.get("structured-bo")
    section.text(
        f"### {title}",
        f"Budget {budget:,.0f} {unit} (each trained iteration counted once); median [quartiles] over {seeds} seeds."
        " Evaluations: trials finished within the budget. The last two columns: StructuredBO against that"
        " searcher's median final quality: the share of the budget at which the median over seeds of its best"
        " first reaches it, and the median over seeds of the evaluations each seed needed to reach it (never:"
        " half of the seeds or more never did).",
    )
    rows = []
    for name, runs in results.items():
        final = runs.best_at(budget)
        q25, median, q75 = np.nanpercentile(final, [25, 50, 75])
        compared = ours is not None and name != "structured-bo"
        share, evaluations = "", ""
        if compared:
            assert ours is not None
            reach = share_to_reach(lambda spent: median_at(ours, spent), median, budget)
            share = "never" if math.isinf(reach) else f"{reach:.2f}"
            needed = float(np.median(ours.evaluations_to(median, budget)))
            evaluations = "never" if math.isinf(needed) else f"{needed:.0f}"
        rows.append(
            [
                name,
                f"{median:.4f} [{q25:.4f}-{q75:.4f}]",
                f"{np.median(runs.evaluations_at(budget)):.0f}",
                f"{np.mean(runs.merge_rates):.2f}",
                share,
                evaluations,
                f"{runs.seconds:.0f}",
            ]
        )
    section.table(
        [
            "searcher",
            "best metric at the budget",
            "evaluations",
            "merge rate",
            "StructuredBO reaches it at (share of budget)",
            "... after (evaluations)",
            "wall s",
        ],
        rows,
    )
    if ours is not None and "optuna-tpe" in results:
        tpe = results["optuna-tpe"]
        tpe_final = float(np.median(tpe.best_at(budget)))
        needed = float(np.median(ours.evaluations_to(tpe_final, budget)))
        tpe_evaluations = float(np.median(tpe.evaluations_at(budget)))
        verdict = (
            f"does (after {needed:.0f} evaluations against TPE's {tpe_evaluations:.0f})"
            if needed < tpe_evaluations
            else "does **not**"
            + (
                " reach it at all"
                if math.isinf(needed)
                else f" (it needs {needed:.0f} against TPE's {tpe_evaluations:.0f})"
            )
        )
        section.text(f"StructuredBO reaching TPE's final quality with fewer evaluations: it {verdict}.")


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
    harness.log(f"wrote {path}")


def real_training(
    section: harness.Section, names: list[str], seeds: int, budget_trials: int, out: str, cache: str | None
) -> None:
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
    budget = budget_trials * MNIST1D_HORIZON * profile.seconds_per_iteration
    factories = searchers(MNIST1D_HORIZON, startup(budget_trials))
    results = {}
    for name in names:
        trials = 2 * budget_trials if name == "structured-bo" else budget_trials
        results[name] = cached(
            cache and os.path.join(cache, f"mnist1d-{name}-{seeds}-{budget_trials}.json"),
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
        section,
        f"MNIST-1D CNN trained for real ({profile.seconds_per_iteration:.2f} s an epoch here),"
        f" Warmup(w, 2, Step(b, 3, gamma)), {MNIST1D_HORIZON} epochs, 4 workers, {budget_trials} unshared trials",
        results,
        budget,
        "worker-s",
    )
    title = f"MNIST-1D CNN, {MNIST1D_HORIZON} epochs, 4 workers"
    plot(os.path.join(out, "best_vs_budget_mnist1d.png"), title, results, budget, "worker-seconds")


def startup(budget_trials: int) -> int:
    """Random start-up trials of the model-based samplers: a quarter of the
    budget, so that three quarters of it is spent where the model points."""
    return max(1, budget_trials // 4)


def main() -> None:
    parser = harness.parser(__doc__, full_repeats=10)
    parser.add_argument("--first-seed", type=int, default=0, help="seeds are first-seed, first-seed + 1, ...")
    parser.add_argument("--only", default=None, help="comma-separated searcher names")
    parser.add_argument("--spaces", default="3,8", help="simulated spaces: 3 (parameters), 8, or both (default)")
    parser.add_argument("--mnist1d", action="store_true", help="also run the real MNIST-1D part")
    parser.add_argument("--mnist1d-seeds", type=int, default=3)
    parser.add_argument("--mnist1d-budget", type=int, default=24, help="unshared trials of the MNIST-1D budget")
    parser.add_argument("--cache", default=None, help="folder keeping each searcher's runs (reused when present)")
    args = harness.parse(parser)
    spaces = {"3": SPACE, "8": SPACE8}
    chosen = [name.strip() for name in args.spaces.split(",") if name.strip()]
    if not chosen or set(chosen) - set(spaces):
        parser.error(f"--spaces takes 3, 8 or 3,8, got {args.spaces!r}")
    out = harness.out_dir(args, "bench_structured_bo")
    section = harness.Section(
        "StructuredBO against generic searchers at equal budgets (`bench_structured_bo.py`)", args, model=True
    )
    seeds, budget_trials = (1, 6) if args.quick else (args.repeats, 30)
    factories = searchers(HORIZON, startup(budget_trials))
    # Quick: one hosted Tune searcher and StructuredBO (Optuna's GP sampler doubled the smoke test's time).
    default = ["random", "optuna-tpe", "structured-bo"] if args.quick else list(factories)
    names = args.only.split(",") if args.only else default
    unknown = sorted(set(names) - set(factories))
    if unknown:
        parser.error(f"--only takes searchers of {sorted(factories)}, got {unknown}")
    budget = budget_trials * HORIZON * RESNET20.seconds_per_iteration
    section.text(
        "Each searcher (Tune searchers hosted unchanged, and StructuredBO) drives one study at a time, 4 trials at"
        " once, on the simulator (the real planner, the critical path policy; learning curves and costs a calibrated"
        f" model, a ResNet20 profile). TPE and Optuna's GP sampler start with {startup(budget_trials)} random trials"
        f" of the budget's {budget_trials}; BayesOptSearch is Tune's GP-UCB, which searches log domains uniformly."
        " StructuredBO may propose twice the trials: sharing lets more of them fit in the budget. Seeds are the"
        " repeats."
    )
    for space_name in chosen:
        results = {}
        refused = []
        for name in names:
            if name in REFUSES.get(space_name, {}):
                refused.append(f"{name}: {REFUSES[space_name][name]}")
                continue
            # A searcher that shares prefixes trains more trials within the budget.
            trials = 2 * budget_trials if name == "structured-bo" else budget_trials
            part = f"{seeds}" if args.first_seed == 0 else f"{args.first_seed}+{seeds}"
            results[name] = cached(
                args.cache and os.path.join(args.cache, f"simulator-{space_name}-{name}-{part}.json"),
                functools.partial(
                    simulator_runs,
                    factories[name],
                    range(args.first_seed, args.first_seed + seeds),
                    trials,
                    space=spaces[space_name],
                ),
            )
        title = f"Simulator, ResNet20 profile, {HORIZON} epochs, 4 workers: {SPACE_TITLES[space_name]}"
        report(section, title, results, budget, "GPU-s")
        if refused:
            section.text("Not run on this space: " + "; ".join(refused) + ".")
        if not args.quick:
            plot(os.path.join(out, f"best_vs_budget_simulator_{space_name}.png"), title, results, budget, "GPU-seconds")
    if args.mnist1d:
        real_training(section, names, args.mnist1d_seeds, args.mnist1d_budget, out, args.cache)
    section.emit()


if __name__ == "__main__":
    main()
