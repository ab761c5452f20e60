"""Stage sharing against Ray Tune on real training, side by side in one run.

The same study four ways, interleaved (``--repeats`` times) on one local Ray
instance:

(a) ``ray.tune.Tuner`` at its defaults (a new actor, so a new process
    importing torch, per trial) and with ``reuse_actors=True`` (Tune's fast
    path): every trial trained on its own;
(b) ``ray_stagetree.Tuner(stage_sharing=False)``: trial by trial;
(c) ``ray_stagetree.Tuner``: shared prefixes trained once.

Every run trains the example's 1-D CNN (`examples/mnist1d_study.py`) on
MNIST-1D, generated offline, on one worker per CPU but one (``--workers``;
the one left runs the driver side of either system), over the
example's 14 learning-rate x batch-size sequences: as a grid search, under
``ASHAScheduler``, and under ASHA with a trainable that keeps no checkpoint
(live continuation must keep every prefix from being retrained, so
stagetree never executes more epochs than Tune). The Optuna study is the
latter with Optuna's seeded searcher (both systems get the same
suggestions) over warm-up and decay parameters. The trainable is the
example's for all; under Tune, to which ray_stagetree's ``report`` and
``get_checkpoint`` forward, it computes each epoch's hyper-parameters from
the sequences itself (Tune knows nothing of sequences).

Printed per system as median [range] over the repeats: wall time,
worker-seconds (Tune: each trial's start to completion, from a
``Callback``; ray_stagetree: each stage batch's dispatch to completion,
`ResultGrid.worker_seconds`), epochs executed, rows reported and the best
final accuracy. Then the ratios against the faster Tune configuration next
to the merge rate, the sharing-only ratio (b)/(c), and (c)'s makespan
against the lower bound ``max(longest path, unique work / workers)``.

    python release/bench_tune.py --full      # 16 epochs, 20,000 samples, 3 repeats (about 2 hours on 2 CPUs)
    python release/bench_tune.py --samples 5000 --studies grid,asha   # smaller
    python release/bench_tune.py --quick     # grid only: 4 trials, 3 epochs, small data, 1 repeat (CI smoke test)
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from typing import Any

import ray
from ray import tune

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
sys.path.insert(0, EXAMPLES)

import harness  # noqa: E402
import mnist1d_study as example  # noqa: E402

from ray_stagetree import Exponential, MultiStep, Tuner, Warmup, from_json, merge_rate  # noqa: E402
from ray_stagetree.searchers import generate_trials  # noqa: E402
from ray_stagetree.searchers.variants import to_tune_space, tune_grid  # noqa: E402

# One CPU is left to the driver-side processes of either system (Tune's driver; ray_stagetree's driver,
# controller and storage actor), as on a GPU cluster they do not share the trainables' devices. With a
# trainable on every CPU they take CPU from the epochs, the more the shorter the run: sharing's own.
WORKERS = max(1, (os.cpu_count() or 1) - 1)  # --workers
METRIC, MODE = "accuracy", "max"
TUNE_DEFAULT, TUNE_REUSE = "(a) Ray Tune, defaults", "(a) Ray Tune, reuse_actors=True"
ALONE, SHARED = "(b) ray_stagetree, sharing off", "(c) ray_stagetree"
TUNES = (TUNE_DEFAULT, TUNE_REUSE)
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


def values_at(config: dict[str, Any], epoch: int) -> dict[str, Any]:
    """The epoch's hyper-parameters, as a trainable on vanilla Tune must find them."""
    return {name: from_json(value).value(epoch) if isinstance(value, dict) else value for name, value in config.items()}


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


def _tune_config(asha: bool, epochs: int, searcher: bool, **options: Any) -> tune.TuneConfig:
    return tune.TuneConfig(
        **options,
        metric=METRIC,
        mode=MODE,
        scheduler=_scheduler(asha, epochs),
        search_alg=_searcher(searcher),
        num_samples=SEARCHER_SAMPLES if searcher else 1,
    )


def run_tune(
    space: dict[str, Any],
    data: Any,
    epochs: int,
    asha: bool,
    storage: str,
    checkpoints: bool,
    searcher: bool = False,
    reuse: bool = False,
) -> Run:
    occupancy = harness.TrialOccupancy()
    tuner = tune.Tuner(
        tune.with_resources(
            tune.with_parameters(example.train_mnist1d, data=data, hparams_at=values_at, checkpoints=checkpoints),
            {"cpu": 1},
        ),
        # A searcher gets the sequences' declarative form, domains inside, as ray_stagetree gives it them.
        param_space=to_tune_space(space) if searcher else tune_grid(space),
        tune_config=_tune_config(asha, epochs, searcher, reuse_actors=reuse),
        run_config=tune.RunConfig(
            storage_path=storage, stop={"training_iteration": epochs}, verbose=0, callbacks=[occupancy]
        ),
    )
    results, wall = _fit(tuner, "Ray Tune")
    executed = sum(result.metrics["training_iteration"] for result in results)
    configs = [_lr_json(result.config) for result in results]
    name = TUNE_REUSE if reuse else TUNE_DEFAULT
    return Run(name, wall, occupancy.seconds, executed, _best(results), configs=configs)


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
    name = SHARED if sharing else ALONE
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
    section: harness.Section,
    label: str,
    space: dict[str, Any],
    data: Any,
    epochs: int,
    asha: bool,
    storage: str,
    repeats: int,
    checkpoints: bool = True,
    searcher: bool = False,
) -> dict:
    """One study, the four systems interleaved ``repeats`` times; its table and ratios added to ``section``."""
    count = SEARCHER_SAMPLES if searcher else len(generate_trials(space))
    systems = {
        TUNE_DEFAULT: lambda: vars(run_tune(space, data, epochs, asha, storage, checkpoints, searcher, reuse=False)),
        TUNE_REUSE: lambda: vars(run_tune(space, data, epochs, asha, storage, checkpoints, searcher, reuse=True)),
        ALONE: lambda: vars(run_stagetree(space, data, epochs, asha, storage, False, checkpoints, searcher)),
        SHARED: lambda: {
            **vars(run_stagetree(space, data, epochs, asha, storage, True, checkpoints, searcher)),
            # What a study costs besides its epochs, next to the run it is taken from (the load changes).
            "fixed": fixed_seconds(space, data, storage),
        },
    }
    runs = harness.interleaved(systems, repeats, label)
    shared = runs[SHARED][0]
    same_trials = all(
        sorted(map(json.dumps, run["configs"])) == sorted(map(json.dumps, shared["configs"]))
        for system in runs.values()
        for run in system
    )
    rows = []
    for name, system in runs.items():
        reported = [run["reported"] or run["epochs"] for run in system]  # Tune executes each reported epoch once
        rows.append(
            [
                name,
                harness.median_range(harness.values(system, "wall")),
                harness.median_range(harness.values(system, "worker_seconds")),
                harness.median_range(harness.values(system, "epochs"), 0),
                harness.median_range(reported, 0),
                harness.median_range(harness.values(system, "best"), 4),
            ]
        )
    section.text(
        f"### {label}",
        f"{count} trials x {epochs} epochs, {WORKERS} workers; load {harness.loads(runs)} during the runs;"
        f" {'the same trials in every run' if same_trials else 'the trials DIFFERED between runs'}.",
    )
    section.table(["system", "wall s", "worker-s", "epochs executed", "reported", "best accuracy"], rows)

    best_work = harness.fastest(runs, TUNES, "worker_seconds")
    best_wall = harness.fastest(runs, TUNES, "wall")
    shared_runs = runs[SHARED]
    epoch_seconds = harness.median(harness.values(shared_runs, "epoch_seconds"))
    unique_work = harness.median(harness.values(shared_runs, "epochs")) * epoch_seconds
    longest_path = max(run["longest_path"] for run in shared_runs) * epoch_seconds
    bound = max(longest_path, unique_work / WORKERS)
    walls = harness.values(shared_runs, "wall")
    fixed = harness.values(shared_runs, "fixed")
    figures = {
        "merge_rate": merge_rate(shared["trials"], epochs),
        "worker_seconds": harness.ratios(
            harness.values(runs[best_work], "worker_seconds"), harness.values(shared_runs, "worker_seconds")
        ),
        "best_equal": all(
            run["best"] == other["best"] for run, other in zip(runs[best_work], shared_runs, strict=True)
        ),
    }
    target = figures["merge_rate"]
    met = harness.median(figures["worker_seconds"]) >= target
    section.table(
        ["figure", "median [range] over repeats"],
        [
            ["merge rate of the trials", f"{figures['merge_rate']:.2f}"],
            [
                f"worker-s, Tune at its best ({best_work[4:]}) / (c)",
                f"**{harness.ratio(harness.values(runs[best_work], 'worker_seconds'), harness.values(shared_runs, 'worker_seconds'))}**"
                f" (target >= merge rate {target:.2f}: {'met' if met else 'NOT met'})",
            ],
            [
                f"wall, Tune at its best ({best_wall[4:]}) / (c)",
                harness.ratio(harness.values(runs[best_wall], "wall"), walls),
            ],
            [
                "worker-s, Tune defaults / Tune reuse_actors=True",
                harness.ratio(
                    harness.values(runs[TUNE_DEFAULT], "worker_seconds"),
                    harness.values(runs[TUNE_REUSE], "worker_seconds"),
                ),
            ],
            [
                "sharing only: worker-s (b) / (c)",
                harness.ratio(
                    harness.values(runs[ALONE], "worker_seconds"), harness.values(shared_runs, "worker_seconds")
                ),
            ],
            ["sharing only: wall (b) / (c)", harness.ratio(harness.values(runs[ALONE], "wall"), walls)],
            [
                "epochs, Tune / (c)",
                harness.ratio(harness.values(runs[best_work], "epochs"), harness.values(shared_runs, "epochs")),
            ],
            [
                f"(c) makespan / lower bound {bound:.1f} s",
                harness.ratio(walls, [bound] * len(walls))
                + f"; without the fixed cost, {harness.median_range(fixed)} s: "
                + harness.ratio([wall - cost for wall, cost in zip(walls, fixed, strict=True)], [bound] * len(walls)),
            ],
            ["best accuracy equal to Tune's in every repeat", "yes" if figures["best_equal"] else "no"],
        ],
    )
    return figures


def quick_space() -> dict[str, Any]:
    return {
        "lr": tune.grid_search([MultiStep(0.1, [1], 0.1), MultiStep(0.1, [2], 0.1)]),
        "batch_size": tune.grid_search([128, MultiStep(values=(128, 256), milestones=[2])]),
        "seed": 0,
    }


def main() -> None:
    global WORKERS
    parser = harness.parser(__doc__)
    parser.add_argument(
        "--workers",
        type=int,
        default=WORKERS,
        help="stage workers and Tune trials at once (default: CPUs less one, for the drivers and controllers)",
    )
    parser.add_argument("--epochs", type=int, default=example.EPOCHS, help="epochs per trial (--full)")
    parser.add_argument("--samples", type=int, default=20_000, help="MNIST-1D samples (--full)")
    parser.add_argument(
        "--studies",
        default=None,
        help="comma-separated: grid, asha, bare (ASHA without checkpoints), searcher (bare with Optuna);"
        " default all four (grid with --quick)",
    )
    args = harness.parse(parser)
    if args.studies is None:
        args.studies = "grid" if args.quick else "grid,asha,bare,searcher"
    args.studies = [name.strip() for name in args.studies.split(",") if name.strip()]
    unknown = sorted(set(args.studies) - {"grid", "asha", "bare", "searcher"})
    if unknown or not args.studies:
        parser.error(f"--studies takes grid, asha, bare and searcher, got {unknown or 'none'}")
    for name in ("workers", "epochs", "samples"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be >= 1, got {getattr(args, name)}")
    WORKERS = args.workers
    epochs, samples = (3, 1000) if args.quick else (args.epochs, args.samples)
    space = quick_space() if args.quick else example.param_space(epochs)
    section = harness.Section("Stage sharing against Ray Tune on real training (`bench_tune.py`)", args)
    section.text(
        f"The example's 1-D CNN (`examples/mnist1d_study.py`) on {samples:,} MNIST-1D samples, {WORKERS} worker(s),"
        " one CPU each; "
        + (
            "the CPUs left run each system's driver side (Tune's driver; ray_stagetree's driver, controller and"
            " storage actor), as on a GPU cluster, where they do not share the trainables' devices (with a"
            " trainable on every CPU, they take CPU from the epochs, the more the shorter the run)."
            if WORKERS < (os.cpu_count() or 1)
            else "no CPU is left for either system's driver side, which takes CPU from the epochs."
        )
        + " Systems: (a) `ray.tune.Tuner` at its defaults (a new actor per trial) and with `reuse_actors=True`"
        " (Tune's fast path); (b) `ray_stagetree.Tuner(stage_sharing=False)`, trial by trial; (c)"
        " `ray_stagetree.Tuner`, shared prefixes trained once. Worker-seconds: Tune, each trial's start to"
        " completion (a `Callback`); ray_stagetree, each stage batch's dispatch to completion"
        " (`ResultGrid.worker_seconds`; a batch goes only to a started worker, as Tune's callback counts a trial"
        " from when its actor is up). Headline ratios are against the faster Tune configuration; (b)/(c) is what"
        " sharing alone saves. Figures: median [range] over the repeats, systems interleaved in one process."
    )
    # Ray's workers import the example's module by name.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [EXAMPLES, os.environ.get("PYTHONPATH")]))
    harness.start_ray(num_cpus=WORKERS)
    data = example.make_data(num_samples=samples)
    studies = {
        "grid": ("Grid search", False, True),
        "asha": ("ASHA", True, True),
        "bare": ("ASHA, a trainable without checkpoints", True, False),
        "searcher": ("Optuna (seeded) and ASHA, no checkpoints", True, False),
    }
    with tempfile.TemporaryDirectory(prefix="bench_tune_") as storage:
        for name in args.studies:
            label, asha, checkpoints = studies[name]
            searcher = name == "searcher"
            study(
                section,
                label,
                searcher_space() if searcher else space,
                data,
                epochs,
                asha,
                storage,
                args.repeats,
                checkpoints,
                searcher,
            )
    section.text(
        f"ASHA: `ASHAScheduler(max_t={epochs}, grace_period={max(1, epochs // 8)}, reduction_factor=2)`."
        " Targets: worker-seconds ratio against Tune at its best at least the merge rate on grid and"
        " ASHA studies; without checkpoints never more epochs than Tune. The lower bound on (c)'s makespan is"
        " max(longest path, unique work / workers) at the median epoch time (c) measured; the fixed cost (a"
        " one-trial, one-epoch study less its epoch, after each (c) run) is what a study costs besides its epochs."
    )
    section.emit()
    ray.shutdown()


if __name__ == "__main__":
    main()
