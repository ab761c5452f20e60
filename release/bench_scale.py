"""Scale: studies of many trials, and whether their cost grows linearly.

Each study samples ``N`` trials of a one-iteration trainable that does no
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

Every study runs in a driver process of its own (each with its own Ray), so
that the driver's peak memory (its maximum resident set) is that study's;
the sizes and the grid run interleaved ``--repeats`` times, and the
per-trial cost at the largest size / at the smallest is taken per repeat.
Targets: the driver's peak under 400 MB at 10,000 trials, and a
100,000-value grid's first result within 60 s.

    python release/bench_scale.py --full                     # 1,000 and 10,000 trials, a 100,000-value grid, 3 repeats
    python release/bench_scale.py --trials 10000,100000 --grid 0 --repeats 1   # the long sizes, no grid
    python release/bench_scale.py --quick                    # 20 and 60 trials, a 1,000-value grid (CI smoke test)
    python release/bench_scale.py --final-checkpoints 200

``--final-checkpoints N`` runs instead the memory case of the same issue: N
trials that each end with a 1 MiB checkpoint (``tests/runtime/test_memory.py``'s
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
import time
from pathlib import Path

import harness
import ray
from ray import tune

import ray_stagetree


def one_result(config):
    tune.report({"y": config["x"]})


class CompletionClock(tune.Callback):
    """When the first result came, and when each trial completed; both are
    printed as they come (a tenth of the trials at a time), so that a study
    too long to wait for still shows its start and its rate."""

    def __init__(self, trials: int, started: float) -> None:
        self.trials, self.started = trials, started
        self.first_result: float | None = None
        self.completed: list[float] = []

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if self.first_result is None:
            self.first_result = time.perf_counter()
            harness.log(f"  {self.trials} trials: first result after {self.first_result - self.started:.1f} s")

    def on_trial_complete(self, iteration, trials, trial, **info):
        self.completed.append(time.perf_counter())
        if len(self.completed) % max(1, self.trials // 10) == 0:
            harness.log(f"  {len(self.completed)} completed after {self.completed[-1] - self.started:.1f} s")


def study(trials: int, storage: str) -> dict[str, float]:
    started = time.perf_counter()
    clock = CompletionClock(trials, started)
    grid = ray_stagetree.Tuner(
        one_result,
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
        one_result,
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


#: The targets of the fault and scale issue.
PEAK_MB_TARGET, PEAK_MB_AT = 400, 10_000
GRID_FIRST_S_TARGET, GRID_TARGET_VALUES = 60.0, 100_000


def in_own_process(kind: str, size: int) -> dict[str, float]:
    """One study (``kind`` "trials" or "grid") in a new driver process with
    a Ray of its own: its figures, the driver's peak being that study's."""
    with tempfile.NamedTemporaryFile(suffix=".json") as out:
        done = subprocess.run(
            [sys.executable, os.path.abspath(__file__), "--one", f"{kind}:{size}", "--result", out.name],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
        )
        if done.returncode != 0:
            raise RuntimeError(f"the {kind} study of {size} exited with {done.returncode}:\n{done.stderr[-3000:]}")
        return json.loads(Path(out.name).read_text())


def run_one(kind: str, size: int, result: str) -> None:
    """``--one``: the study, its figures written to ``result`` as JSON."""
    harness.start_ray(num_cpus=2)
    with tempfile.TemporaryDirectory(prefix="bench_scale_") as storage:
        if kind == "trials":
            figures = study(size, storage)
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
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # "trials:N" or "grid:N": in_own_process's child
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = harness.parse(parser)
    if args.one is not None:
        kind, size = args.one.split(":")
        run_one(kind, int(size), args.result)
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
    trials = args.trials or ("20,60" if args.quick else "1000,10000")
    try:
        sizes = sorted({int(size) for size in trials.split(",")})
    except ValueError:
        parser.error(f"--trials takes comma-separated whole numbers, got {trials!r}")
    if not sizes or min(sizes) < 10:
        parser.error(f"--trials needs sizes of at least 10 trials, got {trials!r}")
    grid = args.grid if args.grid is not None else (1000 if args.quick else GRID_TARGET_VALUES)
    if grid < 0:
        parser.error(f"--grid takes a number of values >= 0 (0: no grid), got {grid}")
    scale_section(section, sizes, grid, args.repeats)
    section.emit()


if __name__ == "__main__":
    main()
