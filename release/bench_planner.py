"""Planning-core benchmark: plan, build the stage tree and order stage batches
for 1k, 10k and 100k trials drawn from the Hippo paper's ResNet56 space
(Table 2), with randomised milestones, periods and rates so that trials share
some prefixes and not others, as in a real study.

Prints, per size: seconds for each phase, peak traced memory, merge rate, and
the growth of time and memory against the previous size (1.0 per 10x would be
linear). Target: 10,000 trials planned and batched in under 1 second.

Then a whole study's dispatch loop, as the runtime drives the planner: 2
workers, each batch dispatched, answered (metrics, the checkpoints the plan
asks for) and released in turn; milliseconds of planner time per trial,
with the stage tree kept between dispatches (only the units a change
touched are rebuilt) and, at the smallest size, rebuilt at every dispatch
as before. Two studies: independent one-iteration trials (a plan root
each), and two-iteration trials that all share iteration 0 (one root,
branching from its checkpoint).

    python release/bench_planner.py            # 1k, 10k, 100k
    python release/bench_planner.py --quick    # 100, 1k; dispatch loop at 100, 500; 1 repeat (CI smoke test)
"""

from __future__ import annotations

import contextlib
import gc
import io
import math
import platform
import random
import statistics
import time
import tracemalloc
from typing import Any

import harness

from ray_stagetree import Cosine, CriticalPathPolicy, CyclicLR, Exponential, MultiStep, Warmup
from ray_stagetree.planning import CheckpointInfo, SearchPlan, build_stage_tree

HORIZON = 120  # ResNet56 studies of Table 1: max=120 epochs
WORKERS = 40  # the paper's cluster


def resnet56_trial(rnd: random.Random) -> dict:
    """One draw from Table 2's space, parameters randomised around its values."""
    milestones = sorted(rnd.sample([60, 80, 90, 100, 110, 135], 2))
    warmup = rnd.choice([5, 10])
    family = rnd.randrange(5)
    if family == 0:
        lr = MultiStep(0.1, milestones, rnd.choice([0.1, 0.2]))
    elif family == 1:
        lr = Warmup(0.01, warmup, MultiStep(0.1, milestones, 0.1))
    elif family == 2:
        lr = Warmup(0.01, warmup, Exponential(0.1, rnd.choice([0.9, 0.95, 0.97])))
    elif family == 3:
        lr = Warmup(0.01, warmup, Cosine(0.1, 0.0, rnd.choice([10, 20, 30]), rnd.choice([1, 2])))
    else:
        lr = CyclicLR(0.001, rnd.choice([0.05, 0.1]), rnd.choice([10, 20]))
    return {
        "lr": lr,
        "batch_size": rnd.choice([128, MultiStep(values=(128, 256), milestones=[rnd.choice([50, 70, 90])])]),
        "momentum": rnd.choice([0.9, MultiStep(values=(0.7, 0.8, 0.9), milestones=[40, 80])]),
        "weight_decay": rnd.choice([1e-4, 1e-3]),
        "optimizer": rnd.choice(["adam", "sgd", "sgd_momentum"]),
    }


def run(configs: list[dict]) -> dict:
    timings = {}
    start = time.perf_counter()
    plan = SearchPlan()
    plan.add_trials((f"trial_{index}", config, HORIZON) for index, config in enumerate(configs))
    timings["plan"] = time.perf_counter() - start

    start = time.perf_counter()
    tree = build_stage_tree(plan)
    timings["stage_tree"] = time.perf_counter() - start

    start = time.perf_counter()
    policy = CriticalPathPolicy()
    batches = policy.order(tree)
    timings["policy"] = time.perf_counter() - start

    timings["total"] = sum(timings.values())
    # Dispatch to 40 idle workers: what the runtime does at start (it builds
    # its own fresh stage tree, so it is reported apart from the total).
    start = time.perf_counter()
    dispatched = policy.select(plan, WORKERS)
    timings["select"] = time.perf_counter() - start
    return {
        "timings": timings,
        "nodes": len(plan.nodes),
        "stages": len(tree.stages),
        "batches": len(batches),
        "dispatched": len(dispatched),
        "merge_rate": plan.total_iterations() / plan.unique_iterations(),
    }


# Dispatch-loop studies: (a trial's config from a random draw, its horizon).
LOOP_STUDIES = {
    "independent": (lambda x: {"x": x}, 1),
    "one root": (lambda x: {"x": MultiStep(values=(0.5, x), milestones=[1])}, 2),
}


def study_loop(trials: int, study: str, rebuild_every_dispatch: bool = False) -> float:
    """Planner seconds per trial for a study of ``trials`` trials shaped as
    ``LOOP_STUDIES[study]`` on 2 workers, dispatched and completed in turn."""
    rnd = random.Random(0)
    plan, policy = SearchPlan(), CriticalPathPolicy()
    policy.local_priorities = not rebuild_every_dispatch
    config, horizon = LOOP_STUDIES[study]
    plan.add_trials((f"t{i}", config(rnd.random()), horizon) for i in range(trials))
    started = time.perf_counter()
    running = []
    while True:
        running += policy.select(plan, 2 - len(running))
        if not running:
            return (time.perf_counter() - started) / trials
        batch = running.pop(0)
        for node, start, stop in batch.segments:
            for iteration in range(start + 1, stop + 1):
                plan.record_metrics(node.node_id, iteration, {"y": 0.0})
            plan.record_timing(node.node_id, start, stop, 0.01 + rnd.random() * 1e-3)
        for node, iteration in plan.checkpoints_needed(batch.batch_id):
            plan.record_checkpoint(node.node_id, iteration, CheckpointInfo(path=f"{node.node_id}/{iteration}"))
        plan.release_batch(batch.batch_id)


def peak_memory(configs: list[dict]) -> int:
    gc.collect()
    tracemalloc.start()
    run(configs)
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return peak


def main() -> None:
    parser = harness.parser(__doc__, quick_repeats=1, full_repeats=3)
    parser.add_argument("--seed", type=int, default=0)
    args = harness.parse(parser)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        report(args)
    section = harness.Section("Planner at scale (`bench_planner.py`)", args)
    section.text(
        "The planning core alone (no Ray): plan, stage tree and execution policy for ResNet56-style studies of"
        " growing size, medians of the repeats, and the dispatch loop's planner time per trial."
    )
    section.text("```\n" + printed.getvalue().strip("\n") + "\n```")
    section.emit()


def report(args: Any) -> None:
    sizes = [100, 1_000] if args.quick else [1_000, 10_000, 100_000]

    print(f"machine: {platform.processor() or platform.machine()}, python {platform.python_version()}")
    header = (
        f"{'trials':>8} {'plan s':>8} {'tree s':>8} {'policy s':>8} {'total s':>8} {'select s':>8}"
        f" {'peak MiB':>9} {'nodes':>7} {'stages':>7} {'merge':>6} {'t growth':>8} {'mem growth':>10}"
    )
    print(header)
    previous = None
    for size in sizes:
        rnd = random.Random(args.seed)
        configs = [resnet56_trial(rnd) for _ in range(size)]
        runs = [run(configs) for _ in range(args.repeats)]
        result = runs[0]
        t = {phase: statistics.median(r["timings"][phase] for r in runs) for phase in result["timings"]}
        memory = peak_memory(configs)
        growth = mem_growth = ""
        if previous is not None:
            factor = math.log10(size / previous[0])
            growth = f"{math.log10(t['total'] / previous[1]) / factor:.2f}"
            mem_growth = f"{math.log10(memory / previous[2]) / factor:.2f}"
        print(
            f"{size:>8} {t['plan']:>8.3f} {t['stage_tree']:>8.3f} {t['policy']:>8.3f} {t['total']:>8.3f}"
            f" {t['select']:>8.3f} {memory / 2**20:>9.1f} {result['nodes']:>7} {result['stages']:>7}"
            f" {result['merge_rate']:>6.2f} {growth:>8} {mem_growth:>10}"
        )
        previous = (size, t["total"], memory)
    print(f"medians of {args.repeats} runs; total = plan + stage tree + policy (all stage batches ordered);")
    print(f"select = dispatching {WORKERS} workers from a fresh stage tree, as the runtime does")
    print("growth: log10(ratio of totals) per decade of trials; 1.00 is linear")
    print("target: 10,000 trials planned and batched in under 1 s")

    loop_sizes = [100, 500] if args.quick else sizes
    for study in LOOP_STUDIES:
        print(f"\ndispatch loop, {study}: 2 workers, planner ms per trial")
        rebuilt = study_loop(loop_sizes[0], study, rebuild_every_dispatch=True)
        print(f"{loop_sizes[0]:>8} trials, stage tree rebuilt at every dispatch: {rebuilt * 1e3:8.3f}")
        kept = [study_loop(size, study) for size in loop_sizes]
        for size, per_trial in zip(loop_sizes, kept):
            print(f"{size:>8} trials, stage tree kept between dispatches: {per_trial * 1e3:8.3f}")
        print(f"kept vs rebuilt at {loop_sizes[0]} trials: {rebuilt / kept[0]:.1f}x less planner time per trial")
        print(f"per-trial time at {loop_sizes[-1]} / at {loop_sizes[0]} trials: {kept[-1] / kept[0]:.2f} (linear: 1.0)")


if __name__ == "__main__":
    main()
