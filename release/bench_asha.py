"""ASHA on a study with nothing to share: ray_stagetree against Ray Tune at its best.

24 trials with constant learning rates (a grid, in a fixed shuffled order;
nothing to share), a deterministic learning curve, ``--seconds`` per
iteration, ``ASHAScheduler(max_t=16, grace_period=1, reduction_factor=2)``,
``--workers`` workers. The two systems run the same trials in the same order,
interleaved in one process (A, B, C, D, A, B, ...):

* ``ray.tune.Tuner`` at its defaults, and with ``reuse_actors=True`` (Tune's fast path);
* ``ray_stagetree.Tuner`` with ``stage_sharing=False`` and as by default.

Printed per run and as medians with ranges: iterations executed (Tune: the
sum of every trial's last ``training_iteration``; ray_stagetree:
``ResultGrid.iterations_executed``), worker-seconds (Tune: each trial's start
to completion, from a ``Callback``; ray_stagetree: each stage batch's dispatch
to completion, ``ResultGrid.worker_seconds``), wall time, and the number of
trials that reached each ASHA rung. With nothing to share, ray_stagetree
must not execute more iterations or use more worker-seconds than Tune: ASHA
decides on what it is fed, and it should be fed what Tune feeds it.

    python release/bench_asha.py --full          # 5 repeats
    python release/bench_asha.py --repeats 5 --checkpoints
    python release/bench_asha.py --quick         # CI smoke test: 1 repeat, 4 trials, no Tune-defaults run
"""

from __future__ import annotations

import argparse
import math
import os
import random
import tempfile
import time
from typing import Any

import harness
from ray import tune
from ray.tune.schedulers import ASHAScheduler

MAX_T, GRACE, RF = 16, 1, 2
RUNGS = [GRACE * RF**k for k in range(int(math.log(MAX_T / GRACE, RF)) + 1)]


def learning_rates(trials: int, seed: int = 0) -> list[float]:
    """A log grid of constant learning rates, in a fixed shuffled order."""
    rates = [round(10 ** (-4 + 3 * k / (trials - 1)), 6) for k in range(trials)]
    random.Random(seed).shuffle(rates)
    return rates


def score(lr: float, iteration: int) -> float:
    """A deterministic curve: rates near 1e-2 learn fastest, large ones plateau
    lower, so curves cross and rung order matters."""
    speed = 1.0 / (1.0 + abs(math.log10(lr) + 2.0))
    ceiling = 1.0 - 0.3 * max(0.0, math.log10(lr) + 2.0)
    return ceiling * (1.0 - math.exp(-speed * iteration / 3.0))


def trainable(config: dict[str, Any]) -> None:
    import ray_stagetree  # noqa: F401  (both systems: tune.report is forwarded by ray_stagetree's)

    for iteration in range(1, MAX_T + 1):
        time.sleep(config["seconds"])
        metrics = {"score": score(config["lr"], iteration)}
        if config["checkpoints"]:
            with tempfile.TemporaryDirectory() as folder:
                with open(os.path.join(folder, "it"), "w") as file:
                    file.write(str(iteration))
                tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))
        else:
            tune.report(metrics)


def resuming_trainable(config: dict[str, Any]) -> None:
    """The same curve, resuming from a checkpoint when given one."""
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint is not None:
        with checkpoint.as_directory() as folder, open(os.path.join(folder, "it")) as file:
            start = int(file.read())
    for iteration in range(start + 1, MAX_T + 1):
        time.sleep(config["seconds"])
        metrics = {"score": score(config["lr"], iteration)}
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "it"), "w") as file:
                file.write(str(iteration))
            tune.report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))


def _space(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "lr": tune.grid_search(learning_rates(args.trials)),
        "seconds": args.seconds,
        "checkpoints": args.checkpoints,
    }


def _tune_config(**options: Any) -> tune.TuneConfig:
    scheduler = ASHAScheduler(max_t=MAX_T, grace_period=GRACE, reduction_factor=RF)
    return tune.TuneConfig(metric="score", mode="max", scheduler=scheduler, **options)


def _reached(results: Any) -> list[int]:
    last = [result.metrics["training_iteration"] for result in results]
    return [sum(it >= rung for it in last) for rung in RUNGS]


def run_tune(args: argparse.Namespace, storage: str, reuse: bool) -> dict[str, Any]:
    occupancy = harness.TrialOccupancy()
    tuner = tune.Tuner(
        tune.with_resources(resuming_trainable if args.checkpoints else trainable, {"cpu": 1}),
        param_space=_space(args),
        tune_config=_tune_config(reuse_actors=reuse),
        run_config=tune.RunConfig(storage_path=storage, verbose=0, callbacks=[occupancy]),
    )
    started = time.perf_counter()
    results = tuner.fit()
    wall = time.perf_counter() - started
    assert not results.errors, results.errors
    executed = sum(result.metrics["training_iteration"] for result in results)
    return {"iterations": executed, "worker_s": occupancy.seconds, "wall": wall, "rungs": _reached(results)}


def run_stagetree(args: argparse.Namespace, storage: str, sharing: bool) -> dict[str, Any]:
    from ray_stagetree import Tuner

    tuner = Tuner(
        tune.with_resources(resuming_trainable if args.checkpoints else trainable, {"cpu": 1}),
        param_space=_space(args),
        tune_config=_tune_config(),
        run_config=tune.RunConfig(storage_path=storage, verbose=0),
        stage_sharing=sharing,
    )
    started = time.perf_counter()
    results = tuner.fit()
    wall = time.perf_counter() - started
    assert not results.errors, results.errors
    return {
        "iterations": results.iterations_executed,
        "worker_s": results.worker_seconds,
        "wall": wall,
        "rungs": _reached(results),
    }


TUNE_DEFAULT, TUNE_REUSE = "Ray Tune, defaults", "Ray Tune, reuse_actors=True"
ALONE, SHARED = "ray_stagetree, sharing off", "ray_stagetree"


def main() -> None:
    parser = harness.parser(__doc__, full_repeats=5)
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=0.05, help="seconds per iteration")
    parser.add_argument("--checkpoints", action="store_true", help="the trainable reports checkpoints")
    args = harness.parse(parser)
    if args.quick:
        args.trials = 4  # each of Tune's default runs starts a process per trial
    if args.trials < 2 or args.workers < 1 or not args.seconds >= 0:
        parser.error(
            f"--trials >= 2, --workers >= 1, --seconds >= 0; got {args.trials}, {args.workers}, {args.seconds}"
        )
    section = harness.Section("ASHA on a study with nothing to share (`bench_asha.py`)", args)
    harness.start_ray(num_cpus=args.workers)
    with tempfile.TemporaryDirectory() as storage:
        systems = {
            TUNE_DEFAULT: lambda: run_tune(args, storage, reuse=False),
            TUNE_REUSE: lambda: run_tune(args, storage, reuse=True),
            ALONE: lambda: run_stagetree(args, storage, sharing=False),
            SHARED: lambda: run_stagetree(args, storage, sharing=True),
        }
        if args.quick:  # the smoke test skips Tune's process-per-trial start-ups (the same code with reuse_actors)
            del systems[TUNE_DEFAULT]
        runs = harness.interleaved(systems, args.repeats, "asha")
    section.text(
        f"{args.trials} trials with constant learning rates (a grid in a fixed shuffled order: nothing to share),"
        f" a deterministic curve, {args.seconds} s per iteration, `ASHAScheduler(max_t={MAX_T},"
        f" grace_period={GRACE}, reduction_factor={RF})`, {args.workers} workers, checkpoints={args.checkpoints};"
        f" the {len(runs)} systems interleaved in one process; load {harness.loads(runs)} during the runs. Iterations"
        " executed: Tune, the sum of each trial's last `training_iteration`; ray_stagetree,"
        " `ResultGrid.iterations_executed`. Worker-seconds as in `bench_tune.py`."
    )
    rows = []
    for name, outcomes in runs.items():
        rungs = [" ".join(map(str, outcome["rungs"])) for outcome in outcomes]
        rows.append(
            [
                name,
                harness.median_range(harness.values(outcomes, "iterations"), 0),
                harness.median_range(harness.values(outcomes, "worker_s")),
                harness.median_range(harness.values(outcomes, "wall")),
                "; ".join(rungs),
            ]
        )
    section.text(
        "ASHA decides on the order trials reach each rung, which no system running two trials at once fixes:"
        " the first trial at a rung is compared with fewer others, so it goes on more often. Under Tune that order"
        " is a race between the two trials started first (in Tune's 114-iteration runs the worst of the two reached"
        " every rung first and ran to `max_t`); ray_stagetree dispatches trials in their admission order to the"
        " workers that are ready, so the race is rarer, not gone: on a loaded machine workers start late and out of"
        " order, and either system's runs spread more."
    )
    section.table(
        ["system", "iterations executed", "worker-s", "wall s", f"trials reaching rungs {RUNGS}, per run"],
        rows,
        right=[False, True, True, True, False],
    )
    lines = []
    for key, label in (("iterations", "iterations"), ("worker_s", "worker-seconds")):
        best = harness.fastest(runs, (TUNE_DEFAULT, TUNE_REUSE), key)
        ours = harness.values(runs[SHARED], key)
        met = harness.median(ours) <= harness.median(harness.values(runs[best], key))
        lines.append(
            f"* ray_stagetree / Tune at its best ({best}), {label}: **{harness.ratio(ours, harness.values(runs[best], key))}**"
            f" (target <= 1.00 on medians: {'met' if met else 'NOT met'}); sharing off / on:"
            f" {harness.ratio(harness.values(runs[ALONE], key), ours)}"
        )
    section.text(*lines)
    section.emit()


if __name__ == "__main__":
    main()
