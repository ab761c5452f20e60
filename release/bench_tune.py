"""Stage sharing against Ray Tune on real training, side by side in one run.

The same study three ways, one after the other on one local Ray instance:

(a) ``ray.tune.Tuner``: vanilla Ray Tune, every trial trained on its own.
(b) ``ray_stagetree.Tuner(stage_sharing=False)``: trial by trial.
(c) ``ray_stagetree.Tuner``: shared prefixes trained once.

Every run trains the example's 1-D CNN (`examples/mnist1d_study.py`) on
MNIST-1D, generated offline, on one worker per CPU (``--workers``), over the
example's 14 learning-rate x batch-size sequences: as a grid search, under
``ASHAScheduler``, and under ASHA with a trainable that keeps no checkpoint
(study 1c: live continuation must keep every prefix from being retrained,
so stagetree never executes more epochs than Tune). Study 1d is 1c's with
Optuna's searcher (seeded: both systems get the same suggestions) over
warm-up and decay parameters. The trainable is the example's for all three; under
Tune, to which ray_stagetree's ``report`` and ``get_checkpoint`` forward, it
computes each epoch's hyper-parameters from the sequences itself (Tune knows
nothing of sequences; ray_stagetree's ``get_hparams()`` does it otherwise).

Printed per system: wall time, worker-seconds (Tune: each trial's start to
completion, from a ``Callback``; ray_stagetree: each stage batch's dispatch
to completion, `ResultGrid.worker_seconds`), epochs executed and the best
final accuracy. Then the ratios (a)/(c) next to the merge rate, and (c)'s
makespan next to the lower bound ``max(longest path, unique work /
workers)``, where an epoch costs the median ``time_this_iter_s`` (training,
evaluation and checkpoint) that (c) measured. The bound leaves out what a
study costs before its first epoch and after its last (worker processes
importing torch, building the model and optimizer; writing results):
measured as a one-trial, one-epoch study's wall time less that epoch, it is
printed, and the makespan is also given without it.

Targets: worker-seconds ratio (a)/(c) at least 0.9 x the merge rate
on the grid and above it on ASHA; makespan at most 1.2 x the lower bound;
best accuracy equal to Tune's.

    python release/bench_tune.py              # 16 epochs, 20,000 samples (about 18 minutes on 2 CPUs)
    python release/bench_tune.py --quick      # grid only: 4 trials, 3 epochs, small data (CI smoke test)
    python release/bench_tune.py --workers 16 # on a 16-core machine
    python release/bench_tune.py --studies bare,searcher  # only the studies without checkpoints
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import ray
import torch
from ray import tune

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
sys.path.insert(0, EXAMPLES)

import mnist1d_study as example  # noqa: E402

from ray_stagetree import Exponential, MultiStep, Sequence, Tuner, Warmup, from_json, init_ray, merge_rate  # noqa: E402
from ray_stagetree.searchers import generate_trials  # noqa: E402
from ray_stagetree.searchers.variants import to_tune_space  # noqa: E402

WORKERS = os.cpu_count() or 1  # --workers
METRIC, MODE = "accuracy", "max"
SEARCHER_SAMPLES = 12  # study 1d's trials: inside Optuna's seeded random start-up (10 by default, set to this)


def searcher_space() -> dict[str, Any]:
    """Study 1d's space: trials with the same warm-up share it."""
    inner = Exponential(tune.choice([0.05, 0.1]), tune.choice([0.8, 0.9]))
    return {"lr": Warmup(0.02, tune.choice([2, 3]), inner), "batch_size": 128, "seed": 0}


def _searcher(searcher: bool) -> Any:
    if not searcher:
        return None
    import optuna
    from ray.tune.search.optuna import OptunaSearch

    sampler = optuna.samplers.TPESampler(seed=0, n_startup_trials=SEARCHER_SAMPLES)
    return OptunaSearch(sampler=sampler)


def declarative(space: dict[str, Any]) -> dict[str, Any]:
    """The same trials as a space vanilla Tune takes: a grid over each
    parameter's resolved values, sequences in their JSON form. (Tune cannot
    resolve a search-space domain inside a sequence, and its placeholder
    resolution takes sequence objects apart.)"""
    trials = generate_trials(space)
    values: dict[str, dict[str, Any]] = {}
    for trial in trials:
        for name, value in trial.items():
            value = value.to_json() if isinstance(value, Sequence) else value
            values.setdefault(name, {}).setdefault(json.dumps(value, sort_keys=True), value)
    if math.prod(len(choices) for choices in values.values()) != len(trials):
        raise ValueError("the benchmark's spaces must be full grids")
    return {
        name: tune.grid_search(list(choices.values())) if len(choices) > 1 else next(iter(choices.values()))
        for name, choices in values.items()
    }


def values_at(config: dict[str, Any], epoch: int) -> dict[str, Any]:
    """The epoch's hyper-parameters, as a trainable on vanilla Tune must find them."""
    return {name: from_json(value).value(epoch) if isinstance(value, dict) else value for name, value in config.items()}


class TrialOccupancy(tune.Callback):
    """Seconds each Tune trial held its worker: start to completion."""

    def __init__(self) -> None:
        self.started: dict[str, float] = {}
        self.seconds = 0.0

    def on_trial_start(self, iteration, trials, trial, **info) -> None:
        self.started[trial.trial_id] = time.monotonic()

    def _ended(self, trial) -> None:
        started = self.started.pop(trial.trial_id, None)
        if started is not None:
            self.seconds += time.monotonic() - started

    def on_trial_complete(self, iteration, trials, trial, **info) -> None:
        self._ended(trial)

    def on_trial_error(self, iteration, trials, trial, **info) -> None:
        self._ended(trial)


@dataclass
class Run:
    system: str
    wall: float
    worker_seconds: float
    epochs: int
    best: float
    reported: int = 0  # rows the trials reported, summed (executed <= reported, sharing makes it fewer)
    epoch_seconds: float = float("nan")  # median time_this_iter_s
    longest_path: int = 0  # epochs of the longest trial
    configs: list | None = None  # each trial's lr sequence (JSON form): did both systems run the same trials?
    trials: list | None = None  # ray_stagetree's trial configs, for the merge rate


def _lr_json(config: dict[str, Any]) -> Any:
    """A trial's lr in one form, whichever system's result config holds it."""
    lr = config["lr"]
    return (from_json(lr) if isinstance(lr, dict) else lr).to_json() if not isinstance(lr, (int, float)) else lr


def _best(results: Any) -> float:
    return results.get_best_result(METRIC, MODE, scope="last").metrics[METRIC]


def _scheduler(asha: bool, epochs: int) -> Any:
    from ray.tune.schedulers import ASHAScheduler

    return ASHAScheduler(max_t=epochs, grace_period=max(1, epochs // 8), reduction_factor=2) if asha else None


def _fit(tuner: Any, system: str) -> tuple[Any, float]:
    started = time.perf_counter()
    results = tuner.fit()
    wall = time.perf_counter() - started
    if results.errors:
        raise RuntimeError(f"{system}: trials failed: {results.errors[0]}")
    return results, wall


def _tune_config(asha: bool, epochs: int, searcher: bool) -> tune.TuneConfig:
    return tune.TuneConfig(
        metric=METRIC,
        mode=MODE,
        scheduler=_scheduler(asha, epochs),
        search_alg=_searcher(searcher),
        num_samples=SEARCHER_SAMPLES if searcher else 1,
    )


def run_tune(
    space: dict[str, Any], data: Any, epochs: int, asha: bool, storage: str, checkpoints: bool, searcher: bool = False
) -> Run:
    occupancy = TrialOccupancy()
    tuner = tune.Tuner(
        tune.with_resources(
            tune.with_parameters(example.train_mnist1d, data=data, hparams_at=values_at, checkpoints=checkpoints),
            {"cpu": 1},
        ),
        # A searcher gets the sequences' declarative form, domains inside, as ray_stagetree gives it them.
        param_space=to_tune_space(space) if searcher else declarative(space),
        tune_config=_tune_config(asha, epochs, searcher),
        run_config=tune.RunConfig(
            storage_path=storage, stop={"training_iteration": epochs}, verbose=0, callbacks=[occupancy]
        ),
    )
    results, wall = _fit(tuner, "Ray Tune")
    executed = sum(result.metrics["training_iteration"] for result in results)
    configs = [_lr_json(result.config) for result in results]
    return Run("(a) Ray Tune", wall, occupancy.seconds, executed, _best(results), configs=configs)


def run_stagetree(
    space: dict[str, Any],
    data: Any,
    epochs: int,
    asha: bool,
    storage: str,
    sharing: bool,
    checkpoints: bool = True,
    searcher: bool = False,
) -> Run:
    tuner = Tuner(
        tune.with_resources(
            tune.with_parameters(example.train_mnist1d, data=data, checkpoints=checkpoints), {"cpu": 1}
        ),
        param_space=space,
        tune_config=_tune_config(asha, epochs, searcher),
        run_config=tune.RunConfig(storage_path=storage, stop={"training_iteration": epochs}, verbose=0),
        stage_sharing=sharing,
    )
    name = "(c) stagetree shared" if sharing else "(b) stagetree alone"
    results, wall = _fit(tuner, name)
    frames = [result.metrics_dataframe for result in results if result.metrics_dataframe is not None]
    times = [seconds for frame in frames for seconds in frame["time_this_iter_s"]]
    return Run(
        name,
        wall,
        results.worker_seconds,
        results.iterations_executed,
        _best(results),
        reported=sum(len(frame) for frame in frames),
        epoch_seconds=statistics.median(times),
        longest_path=max(len(frame) for frame in frames),
        configs=[_lr_json(result.config) for result in results],
        trials=[result.config for result in results],
    )


def fixed_seconds(space: dict[str, Any], data: Any, storage: str) -> float:
    """What a ray_stagetree study costs besides its epochs: a one-trial,
    one-epoch study's wall time less its epoch."""
    run = run_stagetree(generate_trials(space)[0], data, 1, False, storage, sharing=True)
    return run.wall - run.epoch_seconds


def study(
    label: str,
    space: dict[str, Any],
    data: Any,
    epochs: int,
    asha: bool,
    storage: str,
    fixed: float,
    checkpoints: bool = True,
    searcher: bool = False,
) -> dict:
    count = SEARCHER_SAMPLES if searcher else len(generate_trials(space))
    print(f"\n{label}: {count} trials x {epochs} epochs, {WORKERS} workers")
    runs = [
        run_tune(space, data, epochs, asha, storage, checkpoints, searcher),
        run_stagetree(space, data, epochs, asha, storage, sharing=False, checkpoints=checkpoints, searcher=searcher),
        run_stagetree(space, data, epochs, asha, storage, sharing=True, checkpoints=checkpoints, searcher=searcher),
    ]
    tune_run, alone, shared = runs
    trials = shared.trials
    if searcher:
        same = sorted(map(json.dumps, tune_run.configs)) == sorted(map(json.dumps, shared.configs))
        print(f"the searcher suggested {'the same' if same else 'DIFFERENT'} trials to Tune and to ray_stagetree")
    print(f"{'system':<22} {'wall s':>7} {'worker-s':>9} {'epochs':>7} {'reported':>9} {'best acc':>9}")
    for run in runs:
        reported = run.reported or run.epochs  # Tune executes each reported epoch once
        print(
            f"{run.system:<22} {run.wall:>7.1f} {run.worker_seconds:>9.1f} {run.epochs:>7d} {reported:>9d}"
            f" {run.best:>9.4f}"
        )

    unique_work = shared.epochs * shared.epoch_seconds
    longest_path = shared.longest_path * shared.epoch_seconds
    bound = max(longest_path, unique_work / WORKERS)
    figures = {
        "merge_rate": merge_rate(trials, epochs),
        "worker_seconds_ratio": tune_run.worker_seconds / shared.worker_seconds,
        "makespan_ratio": shared.wall / bound,
        "makespan_ratio_without_fixed": (shared.wall - fixed) / bound,
        "best_equal": shared.best == tune_run.best,
        "epochs_ratio": tune_run.epochs / shared.epochs,
        "executed_over_reported": shared.epochs / shared.reported,
    }
    print(f"merge rate of the trials at the horizon: {figures['merge_rate']:.2f}")
    print(
        f"(a)/(c): worker-seconds {figures['worker_seconds_ratio']:.2f}x, wall {tune_run.wall / shared.wall:.2f}x,"
        f" epochs {tune_run.epochs / shared.epochs:.2f}x;"
        f" (b)/(c): worker-seconds {alone.worker_seconds / shared.worker_seconds:.2f}x"
    )
    print(
        f"(c) makespan {shared.wall:.1f} s = {figures['makespan_ratio']:.2f}x the lower bound {bound:.1f} s"
        f" (longest path {longest_path:.1f} s, unique work {unique_work:.1f} s / {WORKERS} workers;"
        f" an epoch {shared.epoch_seconds:.3f} s); without the fixed {fixed:.1f} s:"
        f" {figures['makespan_ratio_without_fixed']:.2f}x"
    )
    same = "equal" if figures["best_equal"] else "DIFFERENT"
    print(f"best accuracy: Tune {tune_run.best:.4f}, stagetree {shared.best:.4f} ({same})")
    return figures


def quick_space() -> dict[str, Any]:
    return {
        "lr": tune.grid_search([MultiStep(0.1, [1], 0.1), MultiStep(0.1, [2], 0.1)]),
        "batch_size": tune.grid_search([128, MultiStep(values=(128, 256), milestones=[2])]),
        "seed": 0,
    }


def main() -> None:
    global WORKERS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 trials, 3 epochs, 1,000 samples")
    parser.add_argument(
        "--workers", type=int, default=WORKERS, help="stage workers and Tune trials at once (default: CPUs)"
    )
    parser.add_argument(
        "--studies",
        default=None,
        help="comma-separated: grid, asha, bare (ASHA without checkpoints), searcher (bare with Optuna);"
        " default all four (grid with --quick)",
    )
    args = parser.parse_args()
    if args.studies is None:
        args.studies = "grid" if args.quick else "grid,asha,bare,searcher"
    args.studies = [name.strip() for name in args.studies.split(",") if name.strip()]
    unknown = sorted(set(args.studies) - {"grid", "asha", "bare", "searcher"})
    if unknown or not args.studies:
        parser.error(f"--studies takes grid, asha, bare and searcher, got {unknown or 'none'}")
    if args.workers < 1:
        parser.error(f"--workers must be >= 1, got {args.workers}")
    WORKERS = args.workers
    epochs, samples = (3, 1000) if args.quick else (example.EPOCHS, 20_000)
    space = quick_space() if args.quick else example.param_space()
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()},"
        f" ray {ray.__version__}, torch {torch.__version__}; {samples} MNIST-1D samples"
    )
    # Ray's workers import the example's module by name.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [EXAMPLES, os.environ.get("PYTHONPATH")]))
    init_ray(num_cpus=WORKERS, include_dashboard=False, configure_logging=False, log_to_driver=False)
    data = example.make_data(num_samples=samples)
    studies = {
        "grid": ("1a. Grid search", False, True),
        "asha": ("1b. ASHA", True, True),
        "bare": ("1c. ASHA, no checkpoints", True, False),
        "searcher": ("1d. Optuna and ASHA, no checkpoints", True, False),
    }
    figures = {}
    with tempfile.TemporaryDirectory(prefix="bench_tune_") as storage:
        fixed = fixed_seconds(space, data, storage)
        for name in args.studies:
            label, asha, checkpoints = studies[name]
            searcher = name == "searcher"
            figures[name] = study(
                label,
                searcher_space() if searcher else space,
                data,
                epochs,
                asha,
                storage,
                fixed,
                checkpoints,
                searcher,
            )
    print("\nTargets: worker-seconds ratio >= 0.9 x merge rate (grid), > merge rate (ASHA); makespan <= 1.2 x bound;")
    print("without checkpoints, never more epochs than Tune")
    for name, result in figures.items():
        target = 1.0 if name in ("bare", "searcher") else result["merge_rate"] * (0.9 if name == "grid" else 1.0)
        print(
            f"{name}: worker-seconds {result['worker_seconds_ratio']:.2f}x (target {target:.2f});"
            f" epochs Tune/stagetree {result['epochs_ratio']:.2f}x,"
            f" executed/reported {result['executed_over_reported']:.2f} (<= 1);"
            f" makespan {result['makespan_ratio']:.2f}x the bound,"
            f" {result['makespan_ratio_without_fixed']:.2f}x without the fixed cost;"
            f" best accuracy equal to Tune's: {result['best_equal']}"
        )
    ray.shutdown()


if __name__ == "__main__":
    main()
