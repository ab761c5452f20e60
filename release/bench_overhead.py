"""Bookkeeping overhead against Ray Tune, side by side in one run.

Ray Tune's bookkeeping release test runs 10,000 one-second trials on 16 CPUs
(715 s against 625 s ideal). Scaled to this machine: many short trials, each
``iterations`` x ``sleep`` seconds of work, two at a time (one CPU each),
run by ``ray.tune.Tuner`` (as configured by default, and with
``reuse_actors=True``, its fastest set-up for short trials) and by
``ray_stagetree.Tuner`` with the same Tune-style function trainable. Every
trial has its own config value, so nothing is shared: this measures the
machinery, not stage sharing.

1. Short trials (default 200 x 10 x 0.05 s; ``--trials 500`` for the
   issue's 500, which takes Tune's default set-up over 20 minutes): wall time, the ideal
   ``trials x iterations x sleep / workers``, and the overhead per trial:
   ``(wall - ideal) x workers / trials``, the worker-seconds each trial
   costs beyond its own work.
2. Result throughput (default 20 trials x 1,000 iterations that do no work):
   results reported per second of wall time, end to end (worker, controller,
   results), and in the steady state: per second of wall time beyond a
   one-trial, one-result study's (starting the study's processes, writing
   its results). Everything a worker reports goes through the controller,
   so this is a lower bound on the controller's throughput.

3. Persistence: the short-trial study by ray_stagetree with its study
   snapshots for ``Tuner.restore`` as by default, and with only the final one
   (``TUNE_GLOBAL_CHECKPOINT_S=inf``), alternated; the controller's seconds
   spent taking snapshots against the workers' seconds.

Targets: overhead per trial at most Tune's; result throughput with Tune's
default loggers on at least 10x Tune's and at least 10,000 results/s on 2
CPUs (issue 30). Persistence under 5% of worker time.

    python release/bench_overhead.py            # about 15 minutes on 2 CPUs
    python release/bench_overhead.py --quick    # 8 short trials, 4 x 500 results, Tune reused only (CI smoke test)
    python release/bench_overhead.py --sections persistence   # section 3 only
    # section 2 only, Tune's best set-up against ray_stagetree, 3 interleaved rounds:
    python release/bench_overhead.py --quick --sections throughput --throughput 4x5000 --repeats 3
    # Tune's own shape (one-second trials of one iteration, 16 workers):
    python release/bench_overhead.py --workers 16 --trials 1600 --iterations 1 --seconds 1 --sections short
"""

from __future__ import annotations

import argparse
import math
import os
import platform
import statistics
import tempfile
import time
from typing import Any

import ray
from ray import tune

import ray_stagetree

WORKERS = os.cpu_count() or 1  # --workers


def sleepy(config: dict[str, Any]) -> None:
    """Tune's bookkeeping trainable: sleep, report, until stopped. Each result
    also says when its work began and ended and in which process (`gaps`)."""
    iteration = 0
    while True:
        began = time.time()
        if config["sleep"]:
            time.sleep(config["sleep"])
        iteration += 1
        tune.report({"score": config["index"] + iteration, "began": began, "ended": time.time(), "pid": os.getpid()})


def gaps(results: Any) -> list[float]:
    """Seconds a worker process spent between one trial's last iteration and
    the next trial's first: the bookkeeping per trial, without the study's
    start and end. (None where each trial has a process of its own.)"""
    runs = sorted(
        (frame["pid"].iloc[0], frame["began"].iloc[0], frame["ended"].iloc[-1])
        for frame in (result.metrics_dataframe for result in results)
    )
    return [began - ended for (pid, _, ended), (next_pid, began, _) in zip(runs, runs[1:]) if next_pid == pid]


def _fit(system: str, trials: int, iterations: int, sleep: float, storage: str) -> tuple[float, int]:
    """Wall seconds of one study, and the results it reported."""
    wall, results, _ = _run(system, trials, iterations, sleep, storage)
    return wall, sum(len(result.metrics_dataframe) for result in results)


def _run(system: str, trials: int, iterations: int, sleep: float, storage: str) -> tuple[float, Any, float]:
    """Wall seconds of one study, its results, and the seconds before its
    first iteration and after its last (starting and ending the study)."""
    tuner_class, options = SYSTEMS[system]
    tuner = tuner_class(
        tune.with_resources(sleepy, {"cpu": 1}),
        param_space={"index": tune.grid_search(list(range(trials))), "sleep": sleep},
        tune_config=tune.TuneConfig(metric="score", mode="max", **options),
        run_config=tune.RunConfig(storage_path=storage, stop={"training_iteration": iterations}, verbose=0),
    )
    started, clock = time.perf_counter(), time.time()
    results = tuner.fit()
    wall = time.perf_counter() - started
    frames = [result.metrics_dataframe for result in results]
    first, last = min(frame["began"].min() for frame in frames), max(frame["ended"].max() for frame in frames)
    if results.errors:
        raise RuntimeError(f"{system}: trials failed: {results.errors[0]}")
    reported = sum(len(result.metrics_dataframe) for result in results)
    if reported != trials * iterations:
        raise RuntimeError(f"{system}: {reported} results, expected {trials * iterations}")
    return wall, results, (first - clock) + (clock + wall - last)


#: Tune as configured by default (a new actor per trial) and at its fastest
#: for many short trials (actors reused).
SYSTEMS = {
    "Ray Tune": (tune.Tuner, {}),
    "Ray Tune reuse": (tune.Tuner, {"reuse_actors": True}),
    "ray_stagetree": (ray_stagetree.Tuner, {}),
}


def _tune_best(values: dict[str, float], best) -> float:
    return best(value for name, value in values.items() if name.startswith("Ray Tune"))


#: Ray Tune's bookkeeping shape, scaled down from its release test (10,000
#: trials): trials, workers, seconds per one-iteration trial.
TUNE_SHAPE = (1600, 16, 1.0)


def short_trials(trials: int, iterations: int, sleep: float, storage: str, systems: list[str]) -> dict[str, float]:
    """Wall time and overhead per trial; and, from the gap between trials on
    a worker and the study's start and end, the wall time projected for
    `TUNE_SHAPE` (on cores as fast as these, with the controller keeping up)."""
    ideal = trials * iterations * sleep / WORKERS
    print(f"\n1. {trials} trials x {iterations} iterations x {sleep} s on {WORKERS} workers (ideal {ideal:.1f} s)")
    print(
        f"{'system':<14} {'wall s':>8} {'overhead/trial s':>17} {'results/s':>10} {'gap ms':>7} {'start+end s':>12}"
        f" {'projected':>10}"
    )
    overhead = {}
    shape_trials, shape_workers, shape_seconds = TUNE_SHAPE
    for name in systems:
        wall, results, fixed = _run(name, trials, iterations, sleep, storage)
        reported = sum(len(result.metrics_dataframe) for result in results)
        overhead[name] = (wall - ideal) * WORKERS / trials
        between = gaps(results)
        if between:
            gap = statistics.median(between)
            projected = (fixed + shape_trials / shape_workers * (shape_seconds + gap)) / (
                shape_trials * shape_seconds / shape_workers
            )
            extra = f"{gap * 1000:>7.0f} {fixed:>12.1f} {projected:>9.3f}x"
        else:  # a process per trial: its start is in every trial
            extra = f"{'-':>7} {fixed:>12.1f} {'-':>10}"
        print(f"{name:<14} {wall:>8.1f} {overhead[name]:>17.3f} {reported / wall:>10.0f} {extra}")
    tune_best = _tune_best(overhead, min)
    print(
        f"overhead per trial, ray_stagetree / Ray Tune's best: {overhead['ray_stagetree'] / tune_best:.2f} (target <= 1)"
    )
    print(
        f"projected: wall time for {shape_trials} trials of one {shape_seconds:g} s iteration on {shape_workers} "
        "workers over its ideal, from the median gap and the start+end measured here (target <= 1.05x)"
    )
    return overhead


def throughput(trials: int, iterations: int, storage: str, systems: list[str], repeats: int = 1) -> dict[str, float]:
    """Results per second, ``repeats`` rounds with the systems interleaved
    (A, B, A, B, ...); each round measures its fixed cost (a one-trial,
    one-result study) beside the bulk study. Medians, and ranges with more
    than one round."""
    print(
        f"\n2. Result throughput: {trials} trials x {iterations} iterations of no work, Tune's default loggers on, "
        f"{repeats} round(s) interleaved"
    )
    print(f"{'system':<14} {'round':>5} {'wall s':>8} {'results/s':>10} {'fixed s':>8} {'steady results/s':>17}")
    steady: dict[str, list[float]] = {name: [] for name in systems}
    for round_ in range(1, repeats + 1):
        for name in systems:
            fixed, _ = _fit(name, 1, 1, 0.0, storage)
            wall, reported = _fit(name, trials, iterations, 0.0, storage)
            # A study shorter than its fixed cost (the load drifts between the two) has no steady state to measure.
            steady[name].append(reported / (wall - fixed) if wall > fixed else math.nan)
            print(
                f"{name:<14} {round_:>5} {wall:>8.1f} {reported / wall:>10.0f} {fixed:>8.1f} {steady[name][-1]:>17.0f}",
                flush=True,
            )
    tunes = [values for name, values in steady.items() if name.startswith("Ray Tune")]
    # Each round's ratio: ray_stagetree against the best Tune set-up of the same round.
    ratios = [ours / max(round_[1:]) for round_ in zip(steady["ray_stagetree"], *tunes) for ours in round_[:1]]
    ratios = [ratio for ratio in ratios if not math.isnan(ratio)] or [math.nan]
    for name in steady:
        steady[name] = [value for value in steady[name] if not math.isnan(value)] or [math.nan]
    rates = {name: statistics.median(values) for name, values in steady.items()}
    for name, values in steady.items():
        print(f"{name:<14} median {rates[name]:.0f} results/s steady, range {min(values):.0f}-{max(values):.0f}")
    print(
        f"ray_stagetree: {rates['ray_stagetree']:.0f} results/s in the steady state (median; target >= 10,000 on 2 "
        f"CPUs), {statistics.median(ratios):.1f}x Ray Tune's best of the same round (median; range "
        f"{min(ratios):.1f}-{max(ratios):.1f}; target >= 10x)"
    )
    return rates


def persistence(trials: int, iterations: int, sleep: float, storage: str, rounds: int) -> float:
    print(f"\n3. Persistence: {trials} trials x {iterations} iterations x {sleep} s, {rounds} rounds alternated")
    print(f"{'snapshots':<22} {'wall s':>8} {'worker s':>9} {'snapshot s':>11} {'snapshot/worker':>16}")
    walls: dict[str, list[float]] = {"continuous (default)": [], "final only": []}
    fractions = []
    for _ in range(rounds):
        for setting, period in (("continuous (default)", None), ("final only", "inf")):
            if period is None:
                os.environ.pop("TUNE_GLOBAL_CHECKPOINT_S", None)
            else:
                os.environ["TUNE_GLOBAL_CHECKPOINT_S"] = period
            wall, results, _ = _run("ray_stagetree", trials, iterations, sleep, storage)
            walls[setting].append(wall)
            fraction = results.state_seconds / results.worker_seconds
            if period is None:
                fractions.append(fraction)
            print(
                f"{setting:<22} {wall:>8.1f} {results.worker_seconds:>9.1f} {results.state_seconds:>11.3f} "
                f"{fraction:>15.2%}"
            )
    os.environ.pop("TUNE_GLOBAL_CHECKPOINT_S", None)
    ratio = sum(walls["continuous (default)"]) / sum(walls["final only"])
    worst = max(fractions)
    print(
        f"snapshot seconds / worker seconds: at most {worst:.2%} (target < 5%); wall time with continuous "
        f"snapshots / final only: {ratio:.3f}"
    )
    return worst


def main() -> None:
    global WORKERS
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="8 short trials; 4 trials x 500 results")
    parser.add_argument("--trials", type=int, default=200, help="short trials (default 200)")
    parser.add_argument("--workers", type=int, default=WORKERS, help="workers (default: CPUs)")
    parser.add_argument("--iterations", type=int, default=10, help="iterations per short trial (default 10)")
    parser.add_argument(
        "--seconds", type=float, default=0.05, help="seconds per iteration of a short trial (default 0.05)"
    )
    parser.add_argument(
        "--throughput",
        metavar="TRIALSxITERATIONS",
        help="section 2's study (default 20x1000; 4x500 with --quick), e.g. 4x5000",
    )
    parser.add_argument("--repeats", type=int, default=1, help="section 2's interleaved rounds (default 1)")
    parser.add_argument(
        "--sections",
        default="short,throughput,persistence",
        help="comma-separated sections to run (default: short,throughput,persistence)",
    )
    args = parser.parse_args()
    if args.trials < 1:
        parser.error(f"--trials must be at least 1, got {args.trials}")
    for name in ("workers", "iterations"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if not args.seconds >= 0:
        parser.error(f"--seconds must be >= 0, got {args.seconds}")
    WORKERS = args.workers
    sections = set(args.sections.split(","))
    unknown = sections - {"short", "throughput", "persistence"}
    if unknown:
        parser.error(f"--sections takes short, throughput and persistence, got {sorted(unknown)}")
    short = (8, 5, 0.02) if args.quick else (args.trials, args.iterations, args.seconds)
    bulk = (4, 500) if args.quick else (20, 1000)
    if args.throughput:
        try:
            bulk = tuple(int(part) for part in args.throughput.lower().split("x"))  # type: ignore[assignment]
        except ValueError:
            bulk = ()  # type: ignore[assignment]
        if len(bulk) != 2 or min(bulk) < 1:
            parser.error(f"--throughput takes TRIALSxITERATIONS (e.g. 4x5000), got {args.throughput!r}")
    if args.repeats < 1:
        parser.error(f"--repeats must be at least 1, got {args.repeats}")
    # The smoke test compares with Tune's best set-up only.
    systems = ["Ray Tune reuse", "ray_stagetree"] if args.quick else list(SYSTEMS)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, ray {ray.__version__}"
    )
    ray_stagetree.init_ray(num_cpus=WORKERS, include_dashboard=False, configure_logging=False, log_to_driver=False)
    with tempfile.TemporaryDirectory(prefix="bench_overhead_") as storage:
        if "short" in sections:
            short_trials(*short, storage, systems)
        if "throughput" in sections:
            throughput(*bulk, storage, systems, args.repeats)
        if "persistence" in sections:
            persistence(*short, storage, rounds=1 if args.quick else 3)
    ray.shutdown()


if __name__ == "__main__":
    main()
