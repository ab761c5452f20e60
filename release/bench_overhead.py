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
   results), and in the steady state: the results beyond one per trial per
   second of wall time beyond a study of the same trials reporting once each
   (the same processes to start, trials to begin and end, files to open:
   what the results themselves cost). Everything a worker reports goes
   through the controller, so this is a lower bound on the controller's
   throughput.

3. Persistence: the short-trial study by ray_stagetree with its study
   snapshots for ``Tuner.restore`` as by default, and with only the final one
   (``TUNE_GLOBAL_CHECKPOINT_S=inf``), alternated; the controller's seconds
   spent taking snapshots against the workers' seconds.

4. Start: a study of ``WORKERS`` one-iteration trials, fitted `FITS_IN_A_ROW`
   times in a row in one driver (a notebook, a script of several studies),
   each system's rows interleaved: the wall time of each ``fit()`` and the
   CPU-seconds the whole machine spent from its start until `SETTLE_S`
   after it returned (the processes it started end then), the first fit
   of each row apart from the later ones.

5. Checkpoints a callback asks for: a class trainable of ``trials`` x
   ``iterations`` x ``seconds`` (default 8 x 20 x 0.02 s) with a callback
   of the user's that sets ``result[SHOULD_CHECKPOINT] = True`` every
   `ASK_EVERY`-th result (Ray's ``custom_checkpointing_with_callback.py``):
   Tune's trainable waits for its driver after each result, and so does
   ray_stagetree's once such a callback is there. Wall time against Tune
   with the same callback, and the wait per result: the wall time beyond
   the same study without the callback, in worker-milliseconds per result.
   Each fit starts its own workers, as a script's one fit does (none kept
   from the fit before).

Targets: overhead per trial at most Tune's; result throughput with Tune's
default loggers on at least 10x Tune's and at least 10,000 results/s on 2
CPUs (issue 30). Persistence under 5% of worker time.

    python release/bench_overhead.py --full     # 3 repeats (about 45 minutes on 2 idle CPUs)
    python release/bench_overhead.py --quick    # 8 short trials, 4 x 500 results, Tune reused only, 1 repeat (CI smoke test)
    python release/bench_overhead.py --sections persistence   # section 3 only
    python release/bench_overhead.py --sections start --repeats 5   # section 4 only
    python release/bench_overhead.py --sections asked --repeats 5   # section 5 only
    # section 2 only, Tune's best set-up against ray_stagetree, 3 interleaved rounds:
    python release/bench_overhead.py --quick --sections throughput --throughput 4x5000 --repeats 3
    # Tune's own shape (one-second trials of one iteration, 16 workers), against Tune's fastest set-up only:
    python release/bench_overhead.py --workers 16 --trials 1600 --iterations 1 --seconds 1 --sections short \
        --systems "Ray Tune reuse,ray_stagetree"
"""

from __future__ import annotations

import functools
import math
import os
import statistics
import tempfile
import time
from typing import Any

import harness
import ray
from ray import tune
from ray.tune.result import SHOULD_CHECKPOINT

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


#: Ray Tune's bookkeeping shape, scaled down from its release test (10,000
#: trials): trials, workers, seconds per one-iteration trial.
TUNE_SHAPE = (1600, 16, 1.0)


def short_trials(
    section: harness.Section, trials: int, iterations: int, sleep: float, storage: str, systems: list[str], repeats: int
) -> None:
    """Wall time and overhead per trial; and, from the gap between trials on
    a worker and the study's start and end, the wall time projected for
    `TUNE_SHAPE` (on cores as fast as these, with the controller keeping up)."""
    ideal = trials * iterations * sleep / WORKERS
    shape_trials, shape_workers, shape_seconds = TUNE_SHAPE

    def measure(name: str) -> dict[str, Any]:
        wall, results, fixed = _run(name, trials, iterations, sleep, storage)
        between = gaps(results)
        gap = statistics.median(between) if between else math.nan  # NaN: a process per trial, its start in each
        projected = (fixed + shape_trials / shape_workers * (shape_seconds + gap)) / (
            shape_trials * shape_seconds / shape_workers
        )
        return {
            "wall": wall,
            "overhead": (wall - ideal) * WORKERS / trials,
            "results_per_s": trials * iterations / wall,
            "gap_ms": gap * 1000,
            "fixed": fixed,
            "projected": projected,
        }

    runs = harness.interleaved({name: functools.partial(measure, name) for name in systems}, repeats, "short")
    section.text(
        f"### 1. Short trials: {trials} trials x {iterations} iterations x {sleep} s on {WORKERS} workers",
        f"Ideal {ideal:.1f} s; overhead per trial = (wall - ideal) x workers / trials; gap: a worker's idle time"
        " between one trial's last iteration and the next one's first (none where each trial has its own"
        f" process); load {harness.loads(runs)} during the runs.",
    )
    section.table(
        ["system", "wall s", "overhead per trial s", "results/s", "gap ms", "start + end s", "projected"],
        [
            [
                name,
                harness.median_range(harness.values(outcomes, "wall")),
                harness.median_range(harness.values(outcomes, "overhead"), 3),
                harness.median_range(harness.values(outcomes, "results_per_s"), 0),
                harness.median_range(harness.values(outcomes, "gap_ms"), 0, missing="-"),
                harness.median_range(harness.values(outcomes, "fixed")),
                harness.median_range(harness.values(outcomes, "projected"), 3, "x", missing="-"),
            ]
            for name, outcomes in runs.items()
        ],
    )
    best = harness.fastest(runs, [name for name in systems if name.startswith("Ray Tune")], "overhead")
    ours = harness.values(runs["ray_stagetree"], "overhead")
    section.text(
        f"Overhead per trial, ray_stagetree / Ray Tune at its best ({best}):"
        f" **{harness.ratio(ours, harness.values(runs[best], 'overhead'))}** (target <= 1). Projected: the wall time"
        f" of {shape_trials} trials of one {shape_seconds:g} s iteration on {shape_workers} workers over its ideal,"
        " from the median gap and the start + end measured here (target <= 1.05x)."
    )


def throughput(
    section: harness.Section, trials: int, iterations: int, storage: str, systems: list[str], repeats: int
) -> None:
    def measure(name: str) -> dict[str, Any]:
        fixed, once = _fit(name, trials, 1, 0.0, storage)
        wall, reported = _fit(name, trials, iterations, 0.0, storage)
        return {
            "wall": wall,
            "results_per_s": reported / wall,
            "fixed": fixed,
            # A study shorter than its fixed cost (the load drifts between the two) has no steady state to measure.
            "steady": (reported - once) / (wall - fixed) if wall > fixed else math.nan,
        }

    runs = harness.interleaved({name: functools.partial(measure, name) for name in systems}, repeats, "throughput")
    section.text(
        f"### 2. Result throughput: {trials} trials x {iterations} iterations of no work",
        "Steady state: the results beyond the first of each trial per second of wall time beyond a study of the"
        f" same {trials} trials reporting once each (fixed s: the same processes, trials and files, so the"
        f" difference is what the results cost); load {harness.loads(runs)} during the runs.",
    )
    section.table(
        ["system", "wall s", "results/s", "fixed s", "steady results/s"],
        [
            [
                name,
                harness.median_range(harness.values(outcomes, "wall")),
                harness.median_range(harness.values(outcomes, "results_per_s"), 0),
                harness.median_range(harness.values(outcomes, "fixed")),
                harness.median_range(harness.values(outcomes, "steady"), 0),
            ]
            for name, outcomes in runs.items()
        ],
    )
    best = max(
        (name for name in systems if name.startswith("Ray Tune")),
        key=lambda name: harness.median(harness.values(runs[name], "steady")),
    )
    ours = harness.values(runs["ray_stagetree"], "steady")
    section.text(
        f"ray_stagetree: {harness.median_range(ours, 0)} results/s in the steady state (targets: >= 10,000 on 2 CPUs, and 10x),"
        f" {harness.ratio(ours, harness.values(runs[best], 'steady'))} Ray Tune's best ({best})."
    )


def persistence(
    section: harness.Section, trials: int, iterations: int, sleep: float, storage: str, repeats: int
) -> None:
    def measure(period: str | None) -> dict[str, Any]:
        if period is None:
            os.environ.pop("TUNE_GLOBAL_CHECKPOINT_S", None)
        else:
            os.environ["TUNE_GLOBAL_CHECKPOINT_S"] = period
        try:
            wall, results, _ = _run("ray_stagetree", trials, iterations, sleep, storage)
        finally:
            os.environ.pop("TUNE_GLOBAL_CHECKPOINT_S", None)
        return {
            "wall": wall,
            "worker_s": results.worker_seconds,
            "snapshot_s": results.state_seconds,
            "fraction": results.state_seconds / results.worker_seconds,
        }

    settings = {"continuous (default)": None, "final only": "inf"}
    runs = harness.interleaved(
        {name: functools.partial(measure, period) for name, period in settings.items()}, repeats, "persistence"
    )
    section.text(
        f"### 3. Persistence: {trials} trials x {iterations} iterations x {sleep} s",
        "ray_stagetree with its study snapshots for `Tuner.restore` as by default, and with only the final one"
        f" (`TUNE_GLOBAL_CHECKPOINT_S=inf`), interleaved; load {harness.loads(runs)} during the runs.",
    )
    section.table(
        ["snapshots", "wall s", "worker-s", "snapshot s", "snapshot s / worker-s"],
        [
            [
                name,
                harness.median_range(harness.values(outcomes, "wall")),
                harness.median_range(harness.values(outcomes, "worker_s")),
                harness.median_range(harness.values(outcomes, "snapshot_s"), 3),
                harness.median_range([100 * f for f in harness.values(outcomes, "fraction")], 2, "%"),
            ]
            for name, outcomes in runs.items()
        ],
    )
    continuous, final = (runs[name] for name in settings)
    worst = max(harness.values(continuous, "fraction"))
    section.text(
        f"Snapshot seconds / worker-seconds: at most {worst:.2%} (target < 5%); wall time with continuous"
        f" snapshots / final only: {harness.ratio(harness.values(continuous, 'wall'), harness.values(final, 'wall'))}."
    )


#: Seconds after a fit() returns that section 4 still counts the machine's CPU time.
SETTLE_S = 1.5


def machine_cpu_seconds() -> float:
    """CPU-seconds every process of this machine has used since it booted
    (user, nice and system time of /proc/stat; NaN where there is none)."""
    try:
        with open("/proc/stat") as stat:
            user, nice, system = (int(ticks) for ticks in stat.readline().split()[1:4])
    except OSError:
        return math.nan
    return (user + nice + system) / os.sysconf("SC_CLK_TCK")


#: Fits in a row of one system in section 4: the first starts what the later ones may reuse.
FITS_IN_A_ROW = 4


def fit_start(section: harness.Section, storage: str, systems: list[str], repeats: int) -> None:
    def measure(name: str) -> dict[str, float]:
        cpu = machine_cpu_seconds()
        wall, _, _ = _run(name, WORKERS, 1, 0.0, storage)
        time.sleep(SETTLE_S)
        return {"wall": wall, "cpu": machine_cpu_seconds() - cpu}

    def in_a_row(name: str) -> dict[str, float]:
        fits = [measure(name) for _ in range(FITS_IN_A_ROW)]
        later = fits[1:]
        return {
            "first wall": fits[0]["wall"],
            "first cpu": fits[0]["cpu"],
            "wall": harness.median(harness.values(later, "wall")),
            "cpu": harness.median(harness.values(later, "cpu")),
        }

    # A system's fits in a row, as a driver fitting again runs them: a Tune run in between would take back the
    # stage workers ray_stagetree keeps for its next fit (anything waiting for their resources does).
    runs = harness.interleaved({name: functools.partial(in_a_row, name) for name in systems}, repeats, "start")
    section.text(
        f"### 4. Start: a study of {WORKERS} one-iteration trials, fitted {FITS_IN_A_ROW} times in a row in one driver",
        f"Wall time of `fit()`, and the machine's CPU-seconds from its start until {SETTLE_S} s after it returned:"
        " the first fit of each row, and the median of the later ones (per row; then the median [range] over the"
        f" {repeats} rows, systems' rows interleaved); load {harness.loads(runs)}.",
    )
    rows = []
    for name, outcomes in runs.items():
        rows.append([name] + [harness.median_range(harness.values(outcomes, key), 2) for key in FIGURES])
    section.table(["system", "first fit s", "first fit CPU-s", "later fits s", "later fits CPU-s"], rows)
    best = harness.fastest(runs, [name for name in systems if name.startswith("Ray Tune")], "wall")
    ours, theirs = runs["ray_stagetree"], runs[best]
    section.text(
        f"Later fits, ray_stagetree / Ray Tune at its best ({best}): wall"
        f" **{harness.ratio(harness.values(ours, 'wall'), harness.values(theirs, 'wall'))}**, CPU-seconds"
        f" **{harness.ratio(harness.values(ours, 'cpu'), harness.values(theirs, 'cpu'))}**."
    )


FIGURES = ("first wall", "first cpu", "wall", "cpu")

#: Section 5's callback asks for a checkpoint at every this many results.
ASK_EVERY = 5


class SleepyClass(tune.Trainable):
    """Section 5's class trainable: `sleepy` as a ``tune.Trainable``, whose checkpoint holds its iteration."""

    def setup(self, config: dict[str, Any]) -> None:
        self.sleep, self.index, self.steps = config["sleep"], config["index"], 0

    def reset_config(self, new_config: dict[str, Any]) -> bool:  # Tune's reuse_actors needs it
        self.setup(new_config)
        return True

    def step(self) -> dict[str, Any]:
        if self.sleep:
            time.sleep(self.sleep)
        self.steps += 1
        return {"score": self.index + self.steps}

    def save_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "steps"), "w") as file:
            file.write(str(self.steps))

    def load_checkpoint(self, checkpoint_dir: str) -> None:
        with open(os.path.join(checkpoint_dir, "steps")) as file:
            self.steps = int(file.read())


class AsksEvery(tune.Callback):
    """A user's callback that asks for a checkpoint at every `ASK_EVERY`-th result."""

    def on_trial_result(self, iteration: int, trials: Any, trial: Any, result: dict, **info: Any) -> None:
        if result["training_iteration"] % ASK_EVERY == 0:
            result[SHOULD_CHECKPOINT] = True


def asked_checkpoints(
    section: harness.Section, trials: int, iterations: int, sleep: float, storage: str, systems: list[str], repeats: int
) -> None:
    def run(name: str, asks: bool) -> dict[str, float]:
        tuner_class, options = SYSTEMS[name]
        tuner = tuner_class(
            tune.with_resources(SleepyClass, {"cpu": 1}),
            param_space={"index": tune.grid_search(list(range(trials))), "sleep": sleep},
            tune_config=tune.TuneConfig(metric="score", mode="max", **options),
            run_config=tune.RunConfig(
                storage_path=storage,
                stop={"training_iteration": iterations},
                callbacks=[AsksEvery()] if asks else None,
                checkpoint_config=tune.CheckpointConfig(checkpoint_at_end=True),
                verbose=0,
            ),
        )
        started = time.perf_counter()
        results = tuner.fit()
        wall = time.perf_counter() - started
        saved = sum(len(result.best_checkpoints) for result in results)
        expected = trials * (-(-iterations // ASK_EVERY) if asks else 1)
        if results.errors or saved != expected:
            raise RuntimeError(f"{name}: {saved} checkpoints, expected {expected} ({results.errors[:1]})")
        return {"wall": wall}

    # Each fit as a script's one fit: on workers of its own, as Tune's (not on those the last fit kept).
    os.environ["RAY_STAGETREE_KEEP_WORKERS_S"] = "0"
    tune_systems = [name for name in systems if name.startswith("Ray Tune")]
    cases = {
        f"{name}, asking callback": functools.partial(run, name, True) for name in [*tune_systems, "ray_stagetree"]
    }
    cases["ray_stagetree, no callback"] = functools.partial(run, "ray_stagetree", False)
    try:
        runs = harness.interleaved(cases, repeats, "asked")
    finally:
        del os.environ["RAY_STAGETREE_KEEP_WORKERS_S"]
    section.text(
        f"### 5. Checkpoints a callback asks for: {trials} class trials x {iterations} iterations x {sleep:g} s,"
        f" a checkpoint asked for every {ASK_EVERY}th result",
        f"Wall s, median [range] over {repeats} interleaved repeats; load {harness.loads(runs)}.",
    )
    section.table(
        ["system", "wall s"], [[name, harness.median_range(harness.values(r, "wall"), 2)] for name, r in runs.items()]
    )
    best = harness.fastest(runs, [f"{name}, asking callback" for name in tune_systems], "wall")
    ours, plain = (
        harness.values(runs["ray_stagetree, asking callback"], "wall"),
        harness.values(runs["ray_stagetree, no callback"], "wall"),
    )
    per_result = [(a - b) * WORKERS / (trials * iterations) * 1000 for a, b in zip(ours, plain)]
    section.text(
        f"ray_stagetree / {best}, both asked: wall **{harness.ratio(ours, harness.values(runs[best], 'wall'))}**;"
        f" waiting for the driver's callbacks costs **{harness.median_range(per_result, 1)} worker-ms** a result."
    )


def main() -> None:
    global WORKERS
    parser = harness.parser(__doc__)
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
    parser.add_argument(
        "--systems",
        help="comma-separated systems to compare (default: all three; Tune reused and ray_stagetree with --quick),"
        f" from: {', '.join(SYSTEMS)}",
    )
    parser.add_argument(
        "--sections",
        default="short,throughput,persistence,start,asked",
        help="comma-separated sections to run (default: short,throughput,persistence,start,asked)",
    )
    args = harness.parse(parser)
    if args.trials < 1:
        parser.error(f"--trials must be at least 1, got {args.trials}")
    for name in ("workers", "iterations"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be at least 1, got {getattr(args, name)}")
    if not args.seconds >= 0:
        parser.error(f"--seconds must be >= 0, got {args.seconds}")
    WORKERS = args.workers
    sections = set(args.sections.split(","))
    unknown = sections - {"short", "throughput", "persistence", "start", "asked"}
    if unknown:
        parser.error(f"--sections takes short, throughput, persistence, start and asked, got {sorted(unknown)}")
    short = (8, 5, 0.02) if args.quick else (args.trials, args.iterations, args.seconds)
    bulk = (4, 500) if args.quick else (20, 1000)
    if args.throughput:
        try:
            bulk = tuple(int(part) for part in args.throughput.lower().split("x"))  # type: ignore[assignment]
        except ValueError:
            bulk = ()  # type: ignore[assignment]
        if len(bulk) != 2 or min(bulk) < 1:
            parser.error(f"--throughput takes TRIALSxITERATIONS (e.g. 4x5000), got {args.throughput!r}")
    # The smoke test compares with Tune's best set-up only.
    systems = ["Ray Tune reuse", "ray_stagetree"] if args.quick else list(SYSTEMS)
    if args.systems:
        systems = args.systems.split(",")
        if set(systems) - set(SYSTEMS) or "ray_stagetree" not in systems or len(systems) < 2:
            parser.error(
                f"--systems takes ray_stagetree and at least one of {', '.join(list(SYSTEMS)[:-1])}, got {args.systems!r}"
            )
    section = harness.Section("Bookkeeping overhead against Ray Tune (`bench_overhead.py`)", args)
    section.text(
        "Many short trials, nothing shared (every trial has its own config value): the machinery, not stage"
        " sharing. `Ray Tune` is `ray.tune.Tuner` at its defaults (a new actor per trial), `Ray Tune reuse` with"
        " `reuse_actors=True`, its fastest set-up for short trials; all with the same function trainable, systems"
        " interleaved, median [range] over the repeats."
    )
    harness.start_ray(num_cpus=WORKERS)
    with tempfile.TemporaryDirectory(prefix="bench_overhead_") as storage:
        if "short" in sections:
            short_trials(section, *short, storage, systems, args.repeats)
        if "throughput" in sections:
            throughput(section, *bulk, storage, systems, args.repeats)
        if "persistence" in sections:
            persistence(section, *short, storage, args.repeats)
        if "start" in sections:
            fit_start(section, storage, systems, args.repeats)
        if "asked" in sections:
            asked = (4, 10, 0.02) if args.quick else (8, 20, 0.02)
            asked_checkpoints(section, *asked, storage, systems, args.repeats)
    section.emit()
    ray.shutdown()


if __name__ == "__main__":
    main()
