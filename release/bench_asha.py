"""ASHA on a study with nothing to share: ray_stagetree against Ray Tune at its best.

24 trials with constant learning rates (a grid, in a fixed shuffled order;
nothing to share), a deterministic learning curve, ``--seconds`` per
iteration, ``ASHAScheduler(max_t=16, grace_period=1, reduction_factor=2)``,
``--workers`` workers. The two systems run the same trials in the same order,
interleaved in one process (Tune, stagetree, Tune, stagetree, ...):

* ``ray.tune.Tuner`` with ``reuse_actors=True`` (Tune's fast path);
* ``ray_stagetree.Tuner``.

Printed per run and as medians with ranges: iterations executed (Tune: the
sum of every trial's last ``training_iteration``; ray_stagetree:
``ResultGrid.iterations_executed``), worker-seconds (Tune: each trial's start
to completion, from a ``Callback``; ray_stagetree: each stage batch's dispatch
to completion, ``ResultGrid.worker_seconds``), wall time, and the number of
trials that reached each ASHA rung. With nothing to share, ray_stagetree
must not execute more iterations or use more worker-seconds than Tune: ASHA
decides on what it is fed, and it should be fed what Tune feeds it.

    PYTHONPATH=$PWD python release/bench_asha.py               # 3 repeats
    PYTHONPATH=$PWD python release/bench_asha.py --repeats 5 --checkpoints
    PYTHONPATH=$PWD python release/bench_asha.py --quick       # CI smoke test: 1 repeat, 8 trials
"""

from __future__ import annotations

import argparse
import math
import os
import random
import statistics
import tempfile
import time
from typing import Any

import ray
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


def run_tune(args: argparse.Namespace, storage: str) -> dict[str, Any]:
    occupancy = TrialOccupancy()
    tuner = tune.Tuner(
        tune.with_resources(resuming_trainable if args.checkpoints else trainable, {"cpu": 1}),
        param_space=_space(args),
        tune_config=_tune_config(reuse_actors=True),
        run_config=tune.RunConfig(storage_path=storage, verbose=0, callbacks=[occupancy]),
    )
    started = time.perf_counter()
    results = tuner.fit()
    wall = time.perf_counter() - started
    assert not results.errors, results.errors
    executed = sum(result.metrics["training_iteration"] for result in results)
    return {"iterations": executed, "worker_s": occupancy.seconds, "wall": wall, "rungs": _reached(results)}


def run_stagetree(args: argparse.Namespace, storage: str) -> dict[str, Any]:
    from ray_stagetree import Tuner

    tuner = Tuner(
        tune.with_resources(resuming_trainable if args.checkpoints else trainable, {"cpu": 1}),
        param_space=_space(args),
        tune_config=_tune_config(),
        run_config=tune.RunConfig(storage_path=storage, verbose=0),
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


def _summary(values: list[float]) -> str:
    return f"{statistics.median(values):8.1f}  [{min(values):.1f} .. {max(values):.1f}]"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--trials", type=int, default=24)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--seconds", type=float, default=0.05, help="seconds per iteration")
    parser.add_argument("--checkpoints", action="store_true", help="the trainable reports checkpoints")
    parser.add_argument("--quick", action="store_true", help="1 repeat of 8 trials (CI smoke test)")
    args = parser.parse_args()
    if args.quick:
        args.repeats, args.trials = 1, 8

    ray.init(num_cpus=args.workers, include_dashboard=False, configure_logging=False)
    systems = {"Ray Tune (reuse_actors=True)": run_tune, "ray_stagetree": run_stagetree}
    runs: dict[str, list[dict[str, Any]]] = {name: [] for name in systems}
    print(
        f"{args.trials} trials, ASHA(max_t={MAX_T}, grace={GRACE}, rf={RF}), {args.workers} workers, "
        f"{args.seconds}s/iteration, checkpoints={args.checkpoints}, load {os.getloadavg()[0]:.1f}"
    )
    print(f"trials reaching rungs {RUNGS}")
    with tempfile.TemporaryDirectory() as storage:
        for repeat in range(args.repeats):
            for name, run in systems.items():  # interleaved: A, B, A, B, ...
                outcome = run(args, storage)
                runs[name].append(outcome)
                print(
                    f"  repeat {repeat + 1} {name:30s} iterations {outcome['iterations']:4d}  "
                    f"worker-s {outcome['worker_s']:6.1f}  wall {outcome['wall']:5.1f}  rungs {outcome['rungs']}",
                    flush=True,
                )
    print(
        f"\n{'system':30s} {'iterations: median [range]':>30s} {'worker-s: median [range]':>30s} "
        f"{'wall: median [range]':>26s}"
    )
    for name, outcomes in runs.items():
        print(
            f"{name:30s} {_summary([o['iterations'] for o in outcomes]):>30s} "
            f"{_summary([o['worker_s'] for o in outcomes]):>30s} {_summary([o['wall'] for o in outcomes]):>26s}"
        )
    tune_runs, tree_runs = runs.values()
    for key in ("iterations", "worker_s"):
        ratio = statistics.median(o[key] for o in tree_runs) / statistics.median(o[key] for o in tune_runs)
        print(f"stagetree / Tune, median {key}: {ratio:.2f}x (target <= 1.00)")


if __name__ == "__main__":
    main()
