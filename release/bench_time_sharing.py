"""The Hermes paper's comparison (section 4.2) on simulated GPUs.

Bins of 16 jobs (bin type 1: 4 good, 12 bad; bin type 2: 12 good, 4 bad)
of each of the paper's four CNNs, Table 1's hyper-parameters, on 4
simulated GPUs, under Hermes's convergence priority (10 s quanta doubling at
50/75/90% loss drops), FIFO, round robin and SLAQ (30 s quanta), the same
bins for every policy. Prints the good jobs' average time to reach 90% of
the optimal accuracy, each baseline's time over Hermes's, and per model the
mean of those ratios next to the paper's average speedups (2.08, 1.92,
4.04, 3.39). Workload and cost model: `ray_stagetree.simulation.time_sharing_study`.

    python release/bench_time_sharing.py            # 5 bins of each type per model (about 2 minutes)
    python release/bench_time_sharing.py --quick    # one bin of each type, GoogleNet only (CI smoke test)
"""

from __future__ import annotations

import argparse
import time

from ray_stagetree import FifoPolicy, HermesPolicy, RoundRobinPolicy, SlaqPolicy
from ray_stagetree.simulation.time_sharing_study import MODELS, compare

PAPER_SPEEDUP = {"googlenet": 2.08, "vgg16": 1.92, "vgg19": 4.04, "resnet50": 3.39}
POLICIES = {
    "hermes": lambda: HermesPolicy(metric="loss", mode="min"),
    "fifo": FifoPolicy,
    "round_robin": RoundRobinPolicy,
    "slaq": lambda: SlaqPolicy(metric="loss", mode="min"),
}
BASELINES = ("fifo", "round_robin", "slaq")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="one bin of each type, GoogleNet only")
    parser.add_argument("--draws", type=int, default=5, help="bins of each type per model (default 5)")
    args = parser.parse_args()
    models = MODELS[:1] if args.quick else MODELS
    draws = 1 if args.quick else args.draws
    started = time.perf_counter()
    times = compare(POLICIES, models, draws=draws)
    print(f"average seconds to 90% of the optimal accuracy: bin 1's good jobs, bin 2's 4 best ({draws} bins each)\n")
    print("| model | bin | " + " | ".join(POLICIES) + " | " + " | ".join(f"{b} / hermes" for b in BASELINES) + " |")
    print("| --- | ---: |" + " ---: |" * (len(POLICIES) + len(BASELINES)))
    for model in models:
        for bin_type in (1, 2):
            row = [times[model.name, bin_type, name] for name in POLICIES]
            ratios = [times[model.name, bin_type, b] / times[model.name, bin_type, "hermes"] for b in BASELINES]
            print(
                f"| {model.name} | {bin_type} | "
                + " | ".join(f"{t:.1f}" for t in row)
                + " | "
                + " | ".join(f"{r:.2f}x" for r in ratios)
                + " |"
            )
    print("\n| model | mean baseline / hermes (3 baselines x 2 bins) | paper's average speedup |")
    print("| --- | ---: | ---: |")
    for model in models:
        ratios = [
            times[model.name, bin_type, b] / times[model.name, bin_type, "hermes"]
            for bin_type in (1, 2)
            for b in BASELINES
        ]
        print(f"| {model.name} | {sum(ratios) / len(ratios):.2f}x | {PAPER_SPEEDUP[model.name]:.2f}x |")
    print(f"\n({time.perf_counter() - started:.0f} s)")


if __name__ == "__main__":
    main()
