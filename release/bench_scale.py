"""Scale: studies of many trials, and whether their cost grows linearly.

Each study samples ``N`` trials of a five-iteration trainable that does no
work (``num_samples=N``, one float each, nothing shared), run by
``ray_stagetree.Tuner`` with Tune's default loggers. Per study: the wall
time, the seconds before the first result (everything ``fit()`` does before
training: validation, variants, starting the processes), and the rate at
which trials complete in the second and in the last tenth of the study (the
first tenth includes the workers' start). In a linear study the two rates
are equal (ratio 1.0); a ratio well below 1 is work per trial that grows
with the number of trials already seen. Then a study of one
``tune.grid_search`` of ``--grid`` values under a 30 s time budget: the
seconds from ``Tuner()`` to its first result (a grid must not be expanded or
checked whole before its first trial runs).

Then studies of ``--budget-trials`` trials of the same trainable under a
30 s time budget (``time_budget_s``): the trials that complete, the rate at
which they complete after the first result, the controller actor's peak
memory, and how long after ``Tuner()`` plus the budget ``fit()`` returns.
A study of 100,000 trials should train about as fast as one of 10,000.

Every study runs in a driver process of its own (each with its own Ray), so
that the driver's peak memory (its maximum resident set) is that study's;
the sizes and the grid run interleaved ``--repeats`` times, and the
per-trial cost at the largest size / at the smallest is taken per repeat.
Targets: the driver's peak under 400 MB at 10,000 trials, a 100,000-value
grid's first result within 60 s, and under the budget: at 100,000 trials
at least half the completion rate of 10,000 and the controller under 500 MB.

    python release/bench_scale.py --full                     # 1,000 and 10,000 trials, a 100,000-value grid, 10,000 and 100,000 under the budget, 3 repeats
    python release/bench_scale.py --trials 10000,100000 --grid 0 --budget-trials 0 --repeats 1   # the long sizes only
    python release/bench_scale.py --quick                    # 20 and 60 trials, a 1,000-value grid, 200 trials in a 5 s budget (CI smoke test)
    python release/bench_scale.py --final-checkpoints 200

``--final-checkpoints N`` runs instead the memory case of the same issue: N
trials that each end with a 1 MiB checkpoint (``tests/runtime/control/test_memory.py``'s
trainable), ``checkpoint_budget_bytes`` of 20 MiB, and prints the peak of
the object-store bytes referenced from the first batch to the trial
folders written at the end (the study's end once reloaded them all).
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import harness
import ray
from ray import tune

import ray_stagetree

ITERATIONS = 5


def five_results(config):
    for iteration in range(ITERATIONS):
        tune.report({"y": config["x"] * iteration})


class CompletionClock(tune.Callback):
    """When the first result came, and when each trial completed; both are
    printed as they come (a tenth of the trials at a time), so that a study
    too long to wait for still shows its start and its rate."""

    def __init__(self, trials: int, started: float) -> None:
        self.trials, self.started = trials, started
        self.first_result: float | None = None
        self.completed: list[float] = []
        self.trained: list[float] = []  # when trials reported their last iteration (a budget ends others unfinished)

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if self.first_result is None:
            self.first_result = time.perf_counter()
            harness.log(f"  {self.trials} trials: first result after {self.first_result - self.started:.1f} s")
        if result["training_iteration"] == ITERATIONS:
            self.trained.append(time.perf_counter())

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.completed.append(time.perf_counter())
        if len(self.completed) % max(1, self.trials // 10) == 0:
            harness.log(f"  {len(self.completed)} completed after {self.completed[-1] - self.started:.1f} s")


def study(trials: int, storage: str) -> dict[str, float]:
    started = time.perf_counter()
    clock = CompletionClock(trials, started)
    grid = ray_stagetree.Tuner(
        five_results,
        param_space={"x": tune.uniform(0, 1)},
        tune_config=tune.TuneConfig(num_samples=trials),
        run_config=tune.RunConfig(storage_path=storage, name=f"scale_{trials}", verbose=0, callbacks=[clock]),
    ).fit()
    wall = time.perf_counter() - started
    if len(grid) != trials or grid.num_errors:
        raise RuntimeError(f"{trials} trials: {len(grid)} results, {grid.num_errors} errors")
    done = clock.completed
    tenth = max(1, len(done) // 10)
    # The second tenth, not the first: the first includes the workers' start.
    first_rate = tenth / max(done[2 * tenth - 1] - done[tenth - 1], 1e-9)
    last_rate = tenth / max(done[-1] - done[-tenth - 1], 1e-9)
    return {
        "wall": wall,
        "setup": clock.first_result - started,
        "first": first_rate,
        "last": last_rate,
        "per_trial": (wall - (clock.first_result - started)) / trials,
        "driver_mb": driver_peak_mb(),
    }


class ControllerPeak:
    """The study controller actor's peak resident memory (``VmHWM``), read
    twice a second from its process (``ray::StudyController``) on this
    machine, from ``/proc`` (Linux)."""

    def __init__(self) -> None:
        self.peak_mb = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def __enter__(self) -> ControllerPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _sample(self) -> None:
        while not self._stop.wait(0.5):
            for process in Path("/proc").glob("[0-9]*"):
                try:
                    if b"StudyController" not in (process / "cmdline").read_bytes():
                        continue
                    status = (process / "status").read_text()
                except OSError:
                    continue  # it ended between the listing and the reading
                peak_kb = next((line.split()[1] for line in status.splitlines() if line.startswith("VmHWM:")), "0")
                self.peak_mb = max(self.peak_mb, int(peak_kb) * 1024 / 10**6)


def budget_study(trials: int, storage: str, budget_s: float) -> dict[str, float]:
    """``trials`` trials under a ``budget_s`` time budget: what completes and how fast."""
    started = time.perf_counter()
    clock = CompletionClock(trials, started)
    with ControllerPeak() as controller:
        ray_stagetree.Tuner(
            five_results,
            param_space={"x": tune.uniform(0, 1)},
            tune_config=tune.TuneConfig(num_samples=trials, time_budget_s=budget_s),
            run_config=tune.RunConfig(storage_path=storage, name=f"budget_{trials}", verbose=0, callbacks=[clock]),
        ).fit()
    returned = time.perf_counter()
    if clock.first_result is None or not clock.trained:
        raise RuntimeError(f"{trials} trials: no trial completed within the {budget_s:.0f} s budget")
    return {
        "complete": len(clock.trained),
        "rate": len(clock.trained) / max(clock.trained[-1] - clock.first_result, 1e-9),
        "controller_mb": controller.peak_mb,
        "over_s": returned - started - budget_s,
        "driver_mb": driver_peak_mb(),
    }


def driver_peak_mb() -> float:
    """The driver's peak resident memory so far, in MB (each study has a driver process of its own)."""
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def grid_start(values: int, storage: str, budget_s: float = 30.0) -> tuple[float, float]:
    """Seconds from ``Tuner()`` to the first result of a ``values``-value
    grid, and the driver's peak resident memory in MB after the study."""
    started = time.perf_counter()
    clock = CompletionClock(values, started)
    ray_stagetree.Tuner(
        five_results,
        param_space={"x": tune.grid_search(list(range(values)))},
        tune_config=tune.TuneConfig(time_budget_s=budget_s),
        run_config=tune.RunConfig(storage_path=storage, name=f"grid_{values}", verbose=0, callbacks=[clock]),
    ).fit()
    if clock.first_result is None:
        raise RuntimeError(f"a {values}-value grid gave no result within its {budget_s:.0f} s budget")
    return clock.first_result - started, driver_peak_mb()


def final_checkpoints_peak(trials: int, budget_bytes: int, storage: str) -> float:
    """Peak object-store bytes while ``trials`` trials end with 1 MiB checkpoints."""
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "runtime"))
    import test_memory

    ray.cloudpickle.register_pickle_by_value(test_memory)  # the workers do not see the tests folder
    tuner = ray_stagetree.Tuner(
        test_memory.heavy_checkpoints,
        param_space={"lr": tune.grid_search(list(range(1, trials + 1)))},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(storage_path=storage, name=f"final_checkpoints_{trials}", verbose=0),
        checkpoint_budget_bytes=budget_bytes,
    )
    with test_memory.ObjectStorePeak() as store:
        grid = tuner.fit()
    if grid.errors or any(result.checkpoint is None for result in grid):
        raise RuntimeError(f"{len(grid.errors)} errors; every trial must end with its checkpoint in its folder")
    return store.peak_bytes


#: The targets of the fault and scale issues.
PEAK_MB_TARGET, PEAK_MB_AT = 400, 10_000
GRID_FIRST_S_TARGET, GRID_TARGET_VALUES = 60.0, 100_000
CONTROLLER_MB_TARGET, RATE_RATIO_TARGET = 500, 0.5


def in_own_process(kind: str, size: int, budget_s: float = 0.0) -> dict[str, float]:
    """One study (``kind`` "trials", "grid" or "budget") in a new driver
    process with a Ray of its own: its figures, the driver's peak being that
    study's."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        done = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--one", f"{kind}:{size}:{budget_s}", "--result", out.name],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"the {kind} study of {size} exited with {done.returncode}:\n{done.stderr[-3000:]}")
        return json.loads(Path(out.name).read_text())


def run_one(kind: str, size: int, budget_s: float, result: str) -> None:
    """``--one``: the study, its figures written to ``result`` as JSON."""
    harness.start_ray(num_cpus=2)
    with tempfile.TemporaryDirectory(prefix="bench_scale_") as storage:
        if kind == "trials":
            figures = study(size, storage)
        elif kind == "budget":
            figures = budget_study(size, storage, budget_s)
        else:
            first, peak_mb = grid_start(size, storage)
            figures = {"first_result": first, "driver_mb": peak_mb}
    ray.shutdown()
    Path(result).write_text(json.dumps(figures))


def scale_section(section: harness.Section, sizes: list[int], grid: int, repeats: int) -> None:
    """The sizes and the grid, interleaved, as a table and the targets."""
    studies = {f"{size} trials": functools.partial(in_own_process, "trials", size) for size in sizes}
    if grid:
        studies[f"grid {grid}"] = functools.partial(in_own_process, "grid", grid)
    runs = harness.interleaved(studies, repeats, "scale")

    def of(size: int | str, key: str, scale: float = 1.0) -> list[float]:
        name = f"grid {grid}" if size == "grid" else f"{size} trials"
        return [scale * value for value in harness.values(runs[name], key)]

    rows = [
        [
            f"{size:,}",
            harness.median_range(of(size, "wall")),
            harness.median_range(of(size, "setup")),
            harness.median_range(of(size, "per_trial", 1000), 2),
            harness.median_range(of(size, "first"), 0),
            harness.median_range(of(size, "last"), 0),
            harness.median_range(harness.ratios(of(size, "last"), of(size, "first")), 2),
            harness.median_range(of(size, "driver_mb"), 0),
        ]
        for size in sizes
    ]
    section.text(
        f"Median [range] over {repeats} interleaved repeat(s), each study in a driver process of its own (2 CPUs); "
        f"load {harness.loads(runs)} during the runs."
    )
    headers = ["trials", "wall s", "setup s", "ms per trial", "2nd 10% trials/s", "last 10% trials/s", "last / 2nd"]
    section.table([*headers, "driver peak MB"], rows)
    verdicts = []
    if len(sizes) > 1:
        growth = harness.ratio(of(sizes[-1], "per_trial"), of(sizes[0], "per_trial"))
        verdicts.append(f"per-trial cost at {sizes[-1]:,} trials / at {sizes[0]:,}: {growth} (linear: 1.0)")
    if PEAK_MB_AT in sizes:
        peak = harness.median(of(PEAK_MB_AT, "driver_mb"))
        met = "met" if peak < PEAK_MB_TARGET else "NOT met"
        verdicts.append(f"driver peak at {PEAK_MB_AT:,} trials {peak:.0f} MB (target < {PEAK_MB_TARGET} MB: **{met}**)")
    if grid:
        first = of("grid", "first_result")
        line = (
            f"a {grid:,}-value grid's first result {harness.median_range(first)} s after `Tuner()`, driver peak "
            f"{harness.median_range(of('grid', 'driver_mb'), 0)} MB (with the {grid:,}-value list the script builds)"
        )
        if grid == GRID_TARGET_VALUES:
            met = "met" if max(first) <= GRID_FIRST_S_TARGET else "NOT met"
            line += f" (target within {GRID_FIRST_S_TARGET:.0f} s: **{met}**)"
        verdicts.append(line)
    section.text("Targets and growth: " + "; ".join(verdicts) + ".")


def budget_section(section: harness.Section, sizes: list[int], budget_s: float, repeats: int) -> None:
    """Studies of ``sizes`` trials under a ``budget_s`` budget, interleaved."""
    studies = {f"{size} trials": functools.partial(in_own_process, "budget", size, budget_s) for size in sizes}
    runs = harness.interleaved(studies, repeats, "budget")

    def of(size: int, key: str) -> list[float]:
        return harness.values(runs[f"{size} trials"], key)

    section.text(
        f"The same trainable, {ITERATIONS} iterations a trial, `num_samples=N` under `time_budget_s={budget_s:.0f}`: "
        f"median [range] over {repeats} interleaved repeat(s); load {harness.loads(runs)} during the runs. "
        "Complete: trials that reported all their iterations; completion rate: those per second after the first result; `fit()` after the budget: seconds "
        "from `Tuner()` plus the budget to `fit()` returning (the start of Ray's workers included)."
    )
    headers = ["trials", "complete", "trials/s", "controller peak MB", "fit() after the budget s", "driver peak MB"]
    rows = [
        [
            f"{size:,}",
            harness.median_range(of(size, "complete"), 0),
            harness.median_range(of(size, "rate"), 0),
            harness.median_range(of(size, "controller_mb"), 0),
            harness.median_range(of(size, "over_s")),
            harness.median_range(of(size, "driver_mb"), 0),
        ]
        for size in sizes
    ]
    section.table(headers, rows)
    if len(sizes) > 1:
        rates = harness.ratios(of(sizes[-1], "rate"), of(sizes[0], "rate"))
        controller = harness.median(of(sizes[-1], "controller_mb"))
        rate_met = "met" if harness.median(rates) >= RATE_RATIO_TARGET else "NOT met"
        memory_met = "met" if controller < CONTROLLER_MB_TARGET else "NOT met"
        section.text(
            f"Targets: completion rate at {sizes[-1]:,} trials / at {sizes[0]:,}: "
            f"{harness.median_range(rates, 2, 'x')} (target >= {RATE_RATIO_TARGET}x: **{rate_met}**); controller peak "
            f"at {sizes[-1]:,} trials {controller:.0f} MB (target < {CONTROLLER_MB_TARGET} MB: **{memory_met}**)."
        )


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument(
        "--trials", default=None, help="comma-separated study sizes (default 1000,10000; 20,60 with --quick)"
    )
    parser.add_argument(
        "--grid",
        type=int,
        default=None,
        metavar="N",
        help="the grid's values (default 100000; 1000 with --quick; 0: none)",
    )
    parser.add_argument(
        "--final-checkpoints", type=int, metavar="N", help="the memory case instead, N trials (max 255)"
    )
    parser.add_argument(
        "--budget-trials",
        default=None,
        help="comma-separated sizes under the time budget (default 10000,100000; 200 with --quick; 0: none)",
    )
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # "kind:N:budget": in_own_process's child
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = harness.parse(parser)
    if args.one is not None:
        kind, size, budget_s = args.one.split(":")
        run_one(kind, int(size), float(budget_s), args.result)
        return
    section = harness.Section("Scale: studies of many trials, end to end (`bench_scale.py`)", args)
    if args.final_checkpoints is not None:
        if not 1 <= args.final_checkpoints <= 255:  # the trainable fills its checkpoint with the trial's uint8 lr
            parser.error(f"--final-checkpoints takes 1 to 255 trials, got {args.final_checkpoints}")
        harness.start_ray(num_cpus=2)
        budget = 20 * 1024**2
        with tempfile.TemporaryDirectory(prefix="bench_scale_") as storage:
            peak = final_checkpoints_peak(args.final_checkpoints, budget, storage)
        section.text(
            f"{args.final_checkpoints} trials x 1 MiB final checkpoints, budget {budget / 1024**2:.0f} MiB: "
            f"object-store peak {peak / 1024**2:.1f} MiB."
        )
        section.emit()
        ray.shutdown()
        return
    sizes = sizes_of(parser, "--trials", args.trials or ("20,60" if args.quick else "1000,10000"))
    grid = args.grid if args.grid is not None else (1000 if args.quick else GRID_TARGET_VALUES)
    if grid < 0:
        parser.error(f"--grid takes a number of values >= 0 (0: no grid), got {grid}")
    budget_trials = args.budget_trials or ("200" if args.quick else "10000,100000")
    scale_section(section, sizes, grid, args.repeats)
    if budget_trials != "0":
        budget_section(
            section, sizes_of(parser, "--budget-trials", budget_trials), 5.0 if args.quick else 30.0, args.repeats
        )
    section.emit()


def sizes_of(parser: argparse.ArgumentParser, option: str, given: str) -> list[int]:
    """The study sizes ``option`` names, smallest first."""
    try:
        sizes = sorted({int(size) for size in given.split(",")})
    except ValueError:
        parser.error(f"{option} takes comma-separated whole numbers, got {given!r}")
    if not sizes or min(sizes) < 10:
        parser.error(f"{option} needs sizes of at least 10 trials, got {given!r}")
    return sizes


if __name__ == "__main__":
    main()
