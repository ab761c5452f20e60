"""Scale: studies of many trials, and whether their cost grows linearly.

Each study samples ``N`` trials of a one-iteration trainable that does no
work (``num_samples=N``, one float each, nothing shared), run by
``ray_stagetree.Tuner`` with Tune's default loggers. Per study: the wall
time, the seconds before the first result (everything ``fit()`` does before
training: validation, variants, starting the processes), and the rate at
which trials complete in the second and in the last tenth of the study (the
first tenth includes the workers' start). In a linear study the two rates
are equal (ratio 1.0); a ratio well below 1 is work per trial that grows
with the number of trials already seen.

The studies run in one process, one after the other, so their ratios are
measured side by side: per-trial cost at the largest size / at the smallest.

    python release/bench_scale.py                    # 10,000 and 100,000 trials (long)
    python release/bench_scale.py --trials 1000,10000
    python release/bench_scale.py --quick            # 20 and 60 trials (CI smoke test)
    python release/bench_scale.py --grid 100000
    python release/bench_scale.py --final-checkpoints 200

``--grid N`` runs instead a study of one ``tune.grid_search`` of N values
under a 30 s time budget, and prints the seconds from ``Tuner()`` to the
first result and the driver's peak memory (its maximum resident set): a
grid must not be expanded or checked whole before its first trial runs.

``--final-checkpoints N`` runs instead the memory case of the same issue: N
trials that each end with a 1 MiB checkpoint (``tests/runtime/test_memory.py``'s
trainable), ``checkpoint_budget_bytes`` of 20 MiB, and prints the peak of
the object-store bytes referenced from the first batch to the trial
folders written at the end (the study's end once reloaded them all).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time

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
    """The driver's peak resident memory so far, in MB (the studies run smallest first)."""
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


def main() -> None:
    parser = harness.parser(__doc__, full_repeats=1)  # one study per size: --repeats is not used
    parser.add_argument("--trials", default="10000,100000", help="comma-separated study sizes (default 10000,100000)")
    parser.add_argument(
        "--final-checkpoints", type=int, metavar="N", help="the memory case instead, N trials (max 255)"
    )
    parser.add_argument("--grid", type=int, metavar="N", help="a grid of N values instead: its start and memory")
    args = harness.parse(parser)
    section = harness.Section("Scale: studies of many trials, end to end (`bench_scale.py`)", args)
    if args.grid is not None:
        if args.grid < 1:
            parser.error(f"--grid takes a number of values >= 1, got {args.grid}")
        harness.start_ray(num_cpus=2)
        with tempfile.TemporaryDirectory(prefix="bench_scale_") as storage:
            first, peak_mb = grid_start(args.grid, storage)
        section.text(
            f"Grid of {args.grid} values: first result {first:.1f} s after Tuner(); driver peak {peak_mb:.0f} MB."
        )
        section.emit()
        ray.shutdown()
        return
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
    try:
        sizes = [int(size) for size in ("20,60" if args.quick else args.trials).split(",")]
    except ValueError:
        parser.error(f"--trials takes comma-separated whole numbers, got {args.trials!r}")
    if not sizes or min(sizes) < 10:
        parser.error(f"--trials needs sizes of at least 10 trials, got {args.trials!r}")
    harness.start_ray(num_cpus=2)
    with section.verbatim():
        measure(sizes)
    section.emit()
    ray.shutdown()


def measure(sizes: list[int]) -> None:
    """Each size's study, one after another, as a text table."""
    print(
        f"{'trials':>8} {'wall s':>8} {'setup s':>8} {'ms/trial':>9} {'2nd 10% /s':>13} {'last 10% /s':>12}"
        f" {'last/first':>11} {'driver peak MB':>15}"
    )
    results = {}
    with tempfile.TemporaryDirectory(prefix="bench_scale_") as storage:
        for size in sorted(sizes):
            r = results[size] = study(size, storage)
            print(
                f"{size:>8} {r['wall']:>8.1f} {r['setup']:>8.1f} {1000 * r['per_trial']:>9.2f} "
                f"{r['first']:>13.0f} {r['last']:>12.0f} {r['last'] / r['first']:>11.2f} {r['driver_mb']:>15.0f}"
            )
    small, large = min(sizes), max(sizes)
    print(
        f"per-trial cost at {large} trials / at {small}: "
        f"{results[large]['per_trial'] / results[small]['per_trial']:.2f} (linear: 1.0)"
    )


if __name__ == "__main__":
    main()
