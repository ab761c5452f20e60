"""Time-sharing on the Ray runtime: more trials than workers, side by side.

The example's 1-D CNN on MNIST-1D (`examples/mnist1d_study.py`, generated
offline), 16 trials on 2 workers of one CPU: constant learning rates
{1e-4, 3e-4, 1e-3, 3e-3 (slow), 0.05, 0.1 (good), 1.0, 2.0 (too large to
train)} x batch size {128, 256}, 16 epochs each, listed so that the good
ones are neither first nor last. The same study runs under four execution
policies, one after the other in one process:

* ``"critical_path"`` (default, no time-sharing: each trial runs to its end;
  with no shared prefixes, FIFO in the order trials arrive),
* ``FifoPolicy()``,
* ``RoundRobinPolicy(quantum_s=3 x Q)``,
* ``HermesPolicy(quantum_s=Q)`` (convergence priority on the test loss).

Q is 2 s (the paper's 10 s quanta against its 30 s for round robin, scaled
to epochs of about half a second here). The target is the best accuracy the
FIFO run reached; printed per policy: the wall time (from ``fit()``, as the
driver's callback sees results) at which some trial first reaches it, the
time all 4 good trials have reached 95% of it, the study's wall time, and
the times over Hermes's.

    python release/bench_time_sharing_runtime.py           # about 5 minutes on 2 CPUs
    python release/bench_time_sharing_runtime.py --quick   # FIFO and Hermes only, 4 trials, 3 epochs, small data (CI smoke test)
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import tempfile
import time

from ray import tune

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
sys.path.insert(0, EXAMPLES)

import mnist1d_study as example  # noqa: E402

from ray_stagetree import FifoPolicy, HermesPolicy, RoundRobinPolicy, Tuner, init_ray  # noqa: E402

GOOD_LRS = (0.05, 0.1)
LRS = (1e-4, 1.0, 3e-4, 0.05, 1e-3, 2.0, 0.1, 3e-3)


class FirstTimes(tune.Callback):
    """When (seconds since ``started``) each reported accuracy arrived."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.rows: list[tuple[float, str, float, float]] = []

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.rows.append((time.monotonic() - self.started, trial.trial_id, result["config"]["lr"], result["accuracy"]))

    def first_reaching(self, target: float) -> float:
        return min((t for t, _, _, accuracy in self.rows if accuracy >= target), default=float("nan"))

    def all_good_reaching(self, target: float, good_trials: int) -> float:
        firsts: dict[str, float] = {}
        for t, trial, lr, accuracy in self.rows:
            if lr in GOOD_LRS and accuracy >= target:
                firsts.setdefault(trial, t)
        return max(firsts.values()) if len(firsts) == good_trials else float("nan")


def run(policy, data, lrs, epochs: int, storage: str):
    times = FirstTimes()
    grid = Tuner(
        tune.with_resources(tune.with_parameters(example.train_mnist1d, data=data), {"cpu": 1}),
        param_space={"lr": tune.grid_search(list(lrs)), "batch_size": tune.grid_search([128, 256]), "seed": 0},
        tune_config=tune.TuneConfig(metric="accuracy", mode="max"),
        run_config=tune.RunConfig(
            name=f"time_sharing_{policy if isinstance(policy, str) else policy.name}",
            storage_path=storage,
            stop={"training_iteration": epochs},
            callbacks=[times],
            verbose=0,
        ),
        execution_policy=policy,
    ).fit()
    wall = time.monotonic() - times.started
    best = max(r.metrics_dataframe["accuracy"].max() for r in grid)
    return times, wall, best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="4 trials, 3 epochs, small data")
    parser.add_argument("--quantum", type=float, default=2.0, help="Hermes's quantum in seconds (default 2)")
    args = parser.parse_args()
    # The workers import the example's trainable by name, as the driver does.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [EXAMPLES, os.environ.get("PYTHONPATH")]))
    init_ray(num_cpus=2, include_dashboard=False, configure_logging=False, log_to_driver=False)
    lrs, epochs, samples = ((1e-4, 0.1), 3, 1000) if args.quick else (LRS, 16, 10000)
    data = example.make_data(num_samples=samples)
    policies = {
        "critical_path": "critical_path",
        "fifo": FifoPolicy(),
        "round_robin": RoundRobinPolicy(quantum_s=3 * args.quantum),
        "hermes": HermesPolicy(quantum_s=args.quantum),
    }
    if args.quick:  # the smoke test runs the two ends; the others are the tests' (tests/runtime/test_time_sharing.py)
        policies = {name: policies[name] for name in ("fifo", "hermes")}
    runs = {}
    with tempfile.TemporaryDirectory() as storage:
        for name, policy in policies.items():
            runs[name] = run(policy, data, lrs, epochs, storage)
            print(f"{name}: {runs[name][1]:.1f} s, best accuracy {runs[name][2]:.4f}", flush=True)
    target = runs["fifo"][2]
    print(f"\n{2 * len(lrs)} trials x {epochs} epochs on 2 workers; target = FIFO's best accuracy {target:.4f}\n")
    print(
        "| policy | to target (s) | all good trials to 95% of it (s) | study (s) | to target / hermes | good / hermes |"
    )
    print("| --- | ---: | ---: | ---: | ---: | ---: |")
    good_trials = 2 * sum(1 for lr in lrs if lr in GOOD_LRS)
    hermes = runs["hermes"][0]
    hermes_first, hermes_good = hermes.first_reaching(target), hermes.all_good_reaching(0.95 * target, good_trials)
    for name, (times, wall, _) in runs.items():
        first, good = times.first_reaching(target), times.all_good_reaching(0.95 * target, good_trials)
        print(
            f"| {name} | {_seconds(first)} | {_seconds(good)} | {wall:.1f} | {_ratio(first, hermes_first)} "
            f"| {_ratio(good, hermes_good)} |"
        )


def _seconds(value: float) -> str:
    return "not reached" if math.isnan(value) else f"{value:.1f}"


def _ratio(value: float, hermes: float) -> str:
    return "-" if math.isnan(value) or math.isnan(hermes) else f"{value / hermes:.2f}x"


if __name__ == "__main__":
    main()
