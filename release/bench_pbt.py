"""Population-based training as Ray Tune runs it: Ray's own PBT examples on
both Tuners, side by side in one run.

Ray's ``pbt_example.py`` (a class ``Trainable`` with ``reset_config``,
dict checkpoints every 5 iterations, ``num_to_keep=4``) and
``pbt_function.py`` (a function trainable that checkpoints every 5
iterations), imported from the installed Ray and configured as their
``__main__`` configures them: 8 trials, ``perturbation_interval=5``,
``reuse_actors=True``, stop at ``done`` (accuracy above 200) or at 1,000
iterations; and ``pb2_example.py`` (PB2 over ``pbt_function``, every trial
from one config, 30 iterations, judged by its best accuracy). Each runs on
``ray.tune.Tuner`` and on ``ray_stagetree.Tuner``,
interleaved ``--repeats`` times, on 2 CPUs as Ray's smoke test runs them
(more trials than fit: PBT pauses trials to let the others train).

Printed per example and system, median [range] over the repeats: trials
that reached the target, the sum of the trials' last iterations (the
example's cost in iterations), the largest last iteration, the best final
accuracy and the wall time (a run with a failed trial has none of these
but the first two: Tune's ``pbt_function.py`` run can fail fast when a
checkpoint it clones was deleted, ``num_to_keep=2``); then ours over Tune's
for the sum. The target:
every trial reaches it, in a sum of iterations within 1.5x of Tune's.

    python release/bench_pbt.py --full    # 3 repeats (about 10 min on 2 CPUs)
    python release/bench_pbt.py --quick   # 1 repeat, stopped at 100 iterations (CI smoke test)
"""

from __future__ import annotations

import math
import random
import time
from typing import Any

import harness
from ray import tune
from ray.tune.examples.pbt_example import PBTBenchmarkExample
from ray.tune.examples.pbt_function import pbt_function
from ray.tune.schedulers import PopulationBasedTraining

from ray_stagetree import Tuner

TUNE, OURS = "Ray Tune", "ray_stagetree"
PERTURBATION_INTERVAL = 5


def pbt_example(tuner_class: Any, cap: int, storage: str) -> Any:
    """Ray's ``pbt_example.py``, as its ``__main__`` runs it."""
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=PERTURBATION_INTERVAL,
        hyperparam_mutations={"lr": lambda: random.uniform(0.0001, 0.02), "some_other_factor": [1, 2]},
    )
    return tuner_class(
        PBTBenchmarkExample,
        run_config=tune.RunConfig(
            storage_path=storage,
            stop={"done": True, "training_iteration": cap},
            verbose=0,
            checkpoint_config=tune.CheckpointConfig(
                checkpoint_frequency=PERTURBATION_INTERVAL, checkpoint_score_attribute="mean_accuracy", num_to_keep=4
            ),
        ),
        tune_config=tune.TuneConfig(
            scheduler=pbt, metric="mean_accuracy", mode="max", reuse_actors=True, num_samples=8
        ),
        param_space={"lr": 0.0001, "some_other_factor": 1},
    )


def pbt_function_example(tuner_class: Any, cap: int, storage: str) -> Any:
    """Ray's ``pbt_function.py``, as its ``run_tune_pbt`` runs it."""
    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=PERTURBATION_INTERVAL,
        hyperparam_mutations={"lr": tune.uniform(0.0001, 0.02), "some_other_factor": [1, 2]},
    )
    return tuner_class(
        pbt_function,
        run_config=tune.RunConfig(
            storage_path=storage,
            verbose=0,
            stop={"done": True, "training_iteration": cap},
            failure_config=tune.FailureConfig(fail_fast=True),
            checkpoint_config=tune.CheckpointConfig(checkpoint_score_attribute="mean_accuracy", num_to_keep=2),
        ),
        tune_config=tune.TuneConfig(
            scheduler=pbt, metric="mean_accuracy", mode="max", num_samples=8, reuse_actors=True
        ),
        param_space={"lr": 0.0001, "some_other_factor": 1, "checkpoint_interval": PERTURBATION_INTERVAL},
    )


def pb2_example(tuner_class: Any, cap: int, storage: str) -> Any:
    """Ray's ``pb2_example.py``: PB2 over ``pbt_function``, every trial from
    one config, 30 iterations (its own stop; the target is not in reach)."""
    from ray.tune.schedulers.pb2 import PB2

    pb2 = PB2(
        time_attr="training_iteration",
        perturbation_interval=PERTURBATION_INTERVAL,
        hyperparam_bounds={"lr": [0.0001, 0.02]},
    )
    return tuner_class(
        pbt_function,
        run_config=tune.RunConfig(
            storage_path=storage,
            verbose=0,
            stop={"training_iteration": min(cap, PB2_ITERATIONS)},
            failure_config=tune.FailureConfig(fail_fast=True),
        ),
        tune_config=tune.TuneConfig(
            scheduler=pb2, metric="mean_accuracy", mode="max", num_samples=8, reuse_actors=True
        ),
        param_space={"lr": 0.0001, "some_other_factor": 1, "checkpoint_interval": PERTURBATION_INTERVAL},
    )


PB2_EXAMPLE = "pb2_example.py (PB2)"
PB2_ITERATIONS = 30
# The example's best accuracy spreads from about half to 1.5x its median from run to run, under either Tuner:
# ours' median is to be at least this much of Tune's.
PB2_TARGET = 0.8
EXAMPLES = {
    "pbt_example.py (class)": pbt_example,
    "pbt_function.py (function)": pbt_function_example,
    PB2_EXAMPLE: pb2_example,
}


def measure(example: str, tuner_class: Any, cap: int, storage: str) -> dict[str, Any]:
    started = time.perf_counter()
    results = EXAMPLES[example](tuner_class, cap, storage).fit()
    wall = time.perf_counter() - started
    errors = [result.error for result in results if result.error]
    if errors:  # Tune's pbt_function run can lose a checkpoint it clones (num_to_keep=2) and fail fast
        harness.log(f"{example} on {tuner_class.__module__}: {len(errors)} trials failed: {errors[0]}")
    last = [result.metrics.get("training_iteration", 0) for result in results]
    missing = math.nan if errors else None  # a failed run's sums are not the example's cost
    return {
        "errors": len(errors),
        "done": sum(bool(result.metrics.get("done")) and result.metrics["mean_accuracy"] > 200 for result in results),
        "iterations": missing or sum(last),
        "longest": missing or max(last),
        "best": max(result.metrics.get("mean_accuracy", 0.0) for result in results),
        "wall": missing or wall,
    }


def _verdict(all_done: bool, ratio: float) -> str:
    if math.isnan(ratio):
        return "no Tune run without a failed trial to compare with"
    return "met" if all_done and ratio <= 1.5 else "missed"


def _within(within: bool) -> str:
    return f"met (ours' median at least {PB2_TARGET}x Tune's)" if within else "missed"


def main() -> None:
    args = harness.parse(harness.parser(__doc__))
    cap = 1000 if args.full else 100
    storage = harness.out_dir(args, "bench_pbt")
    harness.start_ray(num_cpus=2)
    section = harness.Section("PBT as Ray Tune runs it: Ray's own PBT examples (`bench_pbt.py`)", args)
    section.text(
        "Ray's `pbt_example.py` and `pbt_function.py` from the installed Ray, configured as their `__main__` "
        f"(8 trials, `perturbation_interval=5`, `reuse_actors=True`, stop at `done` or {cap} iterations), on "
        "2 CPUs, interleaved. Target: every trial reaches `done` (accuracy above 200), in a sum of iterations "
        f"within 1.5x of Tune's. Ray's `pb2_example.py` (PB2 over `pbt_function`, {PB2_ITERATIONS} iterations) "
        f"cannot reach it: the median of its best accuracy is to be at least {PB2_TARGET}x Tune's."
    )
    rows, verdicts, every_run = [], [], {}
    for example in EXAMPLES:
        runs = harness.interleaved(
            {
                TUNE: lambda example=example: measure(example, tune.Tuner, cap, storage),
                OURS: lambda example=example: measure(example, Tuner, cap, storage),
            },
            args.repeats,
            label=example,
        )
        every_run.update({f"{example} {system}": system_runs for system, system_runs in runs.items()})
        for system in (TUNE, OURS):
            rows.append(
                [
                    example,
                    system,
                    harness.median_range(harness.values(runs[system], "errors"), digits=0),
                    harness.median_range(harness.values(runs[system], "done"), digits=0) + " of 8",
                    harness.median_range(harness.values(runs[system], "iterations"), digits=0),
                    harness.median_range(harness.values(runs[system], "longest"), digits=0),
                    harness.median_range(harness.values(runs[system], "best")),
                    harness.median_range(harness.values(runs[system], "wall")),
                ]
            )
        if example == PB2_EXAMPLE:  # a fixed 30 iterations: its figure is the best accuracy they reach
            tune_best, ours_best = harness.values(runs[TUNE], "best"), harness.values(runs[OURS], "best")
            within = harness.median(ours_best) >= PB2_TARGET * harness.median(tune_best)
            verdicts.append([example, f"best accuracy {harness.ratio(ours_best, tune_best)}", _within(within)])
            continue
        ratio = harness.median(
            harness.ratios(harness.values(runs[OURS], "iterations"), harness.values(runs[TUNE], "iterations"))
        )
        all_done = min(harness.values(runs[OURS], "done")) == 8
        verdicts.append(
            [
                example,
                harness.ratio(harness.values(runs[OURS], "iterations"), harness.values(runs[TUNE], "iterations")),
                _verdict(all_done, ratio),
            ]
        )
    section.table(
        [
            "example",
            "system",
            "failed trials",
            "trials at the target",
            "sum of last iterations",
            "longest trial",
            "best accuracy",
            "wall s",
        ],
        rows,
        [False, False, True, True, True, True, True, True],
    )
    section.table(
        ["example", "iterations (accuracy for PB2), ours / Tune", "target (all at it, within 1.5x; PB2: as Tune)"],
        verdicts,
        [False, True, False],
    )
    section.text(f"Load (1 min) at the runs' starts: {harness.loads(every_run)}.")
    section.emit()


if __name__ == "__main__":
    main()
