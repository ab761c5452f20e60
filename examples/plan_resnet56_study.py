"""Plan the Hippo paper's ResNet56 study (Table 2) and run it on 4 simulated GPUs.

The 120 trials of the grid tune learning-rate, batch-size and momentum
sequences; many agree on a prefix (the same warm-up, the same lr until the
first milestone). ray_stagetree merges them into a search plan, cuts the shared
prefixes into stages, and the critical-path policy batches them onto workers.
The simulation drives the real planner with one time unit per epoch.

    python examples/plan_resnet56_study.py
"""

import time

from ray_stagetree import merge_rate
from ray_stagetree.planning import SearchPlan, build_stage_tree
from ray_stagetree.searchers import generate_trials
from ray_stagetree.simulation.paper_spaces import RESNET56_HORIZON, resnet56_space
from ray_stagetree.simulation.simulator import Simulation

WORKERS = 4


def plan_study(trials, share=True):
    plan = SearchPlan()
    for index, config in enumerate(trials):
        # A share key per trial keeps every trial in its own tree: trial-by-trial.
        plan.add_trial(f"trial_{index}", config, RESNET56_HORIZON, share_key="study" if share else f"trial_{index}")
    return plan


def main():
    started = time.perf_counter()
    trials = generate_trials(resnet56_space())
    print(f"{len(trials)} trials of {RESNET56_HORIZON} epochs, e.g. lr = {trials[7]['lr']!r}")
    print(f"merge rate: {merge_rate(trials, RESNET56_HORIZON):.2f}")

    plan = plan_study(trials)
    tree = build_stage_tree(plan)
    print(
        f"search plan: {len(plan.nodes)} nodes in {len(plan.roots)} trees; stage tree: {len(tree.stages)} stages, "
        f"{tree.iterations} unique epochs of {plan.total_iterations()} requested"
    )

    print(f"\nsimulated on {WORKERS} workers, 1 time unit per epoch:")
    print(f"{'execution':<24} {'makespan':>9} {'/ bound':>8} {'GPU-epochs':>11} {'batches':>8}")
    results = {}
    for name, policy, share in (
        ("trial by trial", "critical_path", False),
        ("stages, BFS", "bfs", True),
        ("stages, THR", "thr", True),
        ("stages, critical path", "critical_path", True),
    ):
        result = Simulation(workers=WORKERS).run(plan_study(trials, share), policy)
        results[name] = result
        print(
            f"{name:<24} {result.makespan:>9.0f} {result.makespan_ratio:>8.2f} "
            f"{result.worker_seconds:>11.0f} {result.batches:>8}"
        )
    baseline, shared = results["trial by trial"], results["stages, critical path"]
    print(
        f"\nstage sharing: {baseline.makespan / shared.makespan:.2f}x faster end to end, "
        f"{baseline.worker_seconds / shared.worker_seconds:.2f}x fewer GPU-epochs "
        f"({time.perf_counter() - started:.1f} s wall)"
    )


if __name__ == "__main__":
    main()
