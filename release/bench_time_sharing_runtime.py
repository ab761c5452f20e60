"""Time-sharing on the Ray runtime: more trials than workers, the Hermes paper's metric.

The example's 1-D CNN on MNIST-1D (`examples/mnist1d_study.py`, generated
offline), 16 jobs on 2 workers of one CPU: constant learning rates {1e-4,
3e-4, 1e-3, 3e-3 (slow), 0.05, 0.1 (good), 1.0, 2.0 (too large to train)} x
batch size {128, 256}, ``--epochs`` epochs each. As in the paper (section
4.1.2), the jobs enter the queue in a random order: ``--repeats`` orders
(seeded), and in each order the policies run one after another in one
process:

* ``"critical_path"`` (the default, no time-sharing: each job runs to its end;
  with nothing shared, in the order jobs arrive),
* ``FifoPolicy()``,
* ``RoundRobinPolicy(quantum_s=3 x Q)``,
* ``SlaqPolicy(quantum_s=3 x Q)``,
* ``HermesPolicy(quantum_s=Q)``,

the time-sharing ones on the test loss the jobs report (Q is ``--quantum``:
the paper's 10 s quanta against its 30 s for round robin and SLAQ, scaled so
that a job lasts several quanta: at the defaults 16 epochs of about 0.3 s;
with shorter jobs, e.g. 8 epochs of 4,000 samples, a job ends within its
first quantum, nothing is pre-empted, and only one job of 16 reaches the
target, so the figure times one job's place in the queue). The paper's
metric (section 4.2): the *good* jobs' mean time to 90% of the optimal,
here of the best accuracy any job reaches (training is deterministic, so
every policy trains the same curves; a good job is one whose curve reaches
it), from ``fit()`` as the driver's callback sees results. Printed per
policy as median [range] over the orders, and each policy's time over
Hermes's in the same order (the paper's normalised execution time); round
robin's and Hermes's pre-emptions cost a checkpoint saved and loaded each,
which the times include.

    python release/bench_time_sharing_runtime.py --full    # 5 orders x 5 policies, 16 jobs x 16 epochs
    python release/bench_time_sharing_runtime.py --quick   # 1 order, FIFO and Hermes, 4 jobs x 2 epochs (CI smoke test)
"""

from __future__ import annotations

import os
import random
import sys
import tempfile
import time
from typing import Any

from ray import tune

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
sys.path.insert(0, EXAMPLES)

import harness  # noqa: E402
import mnist1d_study as example  # noqa: E402

from ray_stagetree import FifoPolicy, HermesPolicy, RoundRobinPolicy, SlaqPolicy, Tuner  # noqa: E402

LRS = (1e-4, 3e-4, 1e-3, 3e-3, 0.05, 0.1, 1.0, 2.0)
BATCH_SIZES = (128, 256)
GOOD_FRACTION = 0.9  # "at least 90% of the optimal"


JOBS = [(lr, batch_size) for lr in LRS for batch_size in BATCH_SIZES]
QUICK_JOBS = [job for job, (lr, _) in enumerate(JOBS) if lr in (1e-4, 0.1)]


def job_hparams(config: dict[str, Any], epoch: int) -> dict[str, Any]:
    """Job ``config["job"]``'s hyper-parameters: the jobs are one grid over
    their index, so that the order they enter the queue is the grid's."""
    lr, batch_size = JOBS[config["job"]]
    return {"lr": lr, "batch_size": batch_size}


class Accuracies(tune.Callback):
    """When (seconds since ``started``) each job reported each accuracy."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.rows: list[tuple[float, int, float]] = []

    def on_trial_result(self, iteration, trials, trial, result, **info):
        self.rows.append((time.monotonic() - self.started, result["config"]["job"], result["accuracy"]))

    def first_reaching(self, target: float) -> dict[int, float]:
        """Each job's first time at ``target`` or above (jobs that never reach it are absent)."""
        firsts: dict[int, float] = {}
        for seconds, job, accuracy in self.rows:
            if accuracy >= target:
                firsts.setdefault(job, seconds)
        return firsts


def run(policy: Any, data: Any, order: list[int], epochs: int, storage: str) -> dict[str, Any]:
    times = Accuracies()
    grid = Tuner(
        tune.with_resources(tune.with_parameters(example.train_mnist1d, data=data, hparams_at=job_hparams), {"cpu": 1}),
        param_space={"job": tune.grid_search(order), "seed": 0},
        tune_config=tune.TuneConfig(metric="accuracy", mode="max"),
        run_config=tune.RunConfig(
            storage_path=storage, stop={"training_iteration": epochs}, callbacks=[times], verbose=0
        ),
        execution_policy=policy,
    ).fit()
    if grid.errors:
        raise RuntimeError(f"{policy}: trials failed: {grid.errors[0]}")
    best = {result.config["job"]: float(result.metrics_dataframe["accuracy"].max()) for result in grid}
    return {"wall": time.monotonic() - times.started, "best": best, "times": times}


def main() -> None:
    parser = harness.parser(__doc__, full_repeats=5)
    parser.add_argument("--quantum", type=float, default=1.0, help="Hermes's quantum in seconds (default 1)")
    parser.add_argument("--epochs", type=int, default=16, help="epochs per job (--full)")
    parser.add_argument("--samples", type=int, default=20000, help="MNIST-1D samples (--full)")
    args = harness.parse(parser)
    if not args.quantum > 0 or args.epochs < 2 or args.samples < 100:
        parser.error(
            f"--quantum > 0, --epochs >= 2, --samples >= 100; got {args.quantum}, {args.epochs}, {args.samples}"
        )
    section = harness.Section("Time-sharing workers on the Ray runtime (`bench_time_sharing_runtime.py`)", args)
    # The workers import the example's trainable by name, as the driver does.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [EXAMPLES, os.environ.get("PYTHONPATH")]))
    harness.start_ray(num_cpus=2)
    jobs = QUICK_JOBS if args.quick else list(range(len(JOBS)))
    epochs, samples = (2, 500) if args.quick else (args.epochs, args.samples)
    data = example.make_data(num_samples=samples)
    policies = {
        "critical_path": lambda: "critical_path",
        "fifo": FifoPolicy,
        "round_robin": lambda: RoundRobinPolicy(metric="loss", mode="min", quantum_s=3 * args.quantum),
        "slaq": lambda: SlaqPolicy(metric="loss", mode="min", quantum_s=3 * args.quantum),
        "hermes": lambda: HermesPolicy(metric="loss", mode="min", quantum_s=args.quantum),
    }
    if (
        args.quick
    ):  # the smoke test runs the two ends; the others are the tests' (tests/runtime/control/test_time_shared_study.py)
        policies = {name: policies[name] for name in ("fifo", "hermes")}
    orders = [random.Random(seed).sample(jobs, len(jobs)) for seed in range(args.repeats)]
    with tempfile.TemporaryDirectory() as storage:

        def in_each_order(make: Any) -> Any:
            pending = iter(orders)  # repeat k runs order k, whichever the policy
            return lambda: run(make(), data, next(pending), epochs, storage)

        systems = {name: in_each_order(make) for name, make in policies.items()}
        runs = harness.interleaved(systems, args.repeats, "time sharing")
    optimal = max(accuracy for outcomes in runs.values() for run in outcomes for accuracy in run["best"].values())
    target = GOOD_FRACTION * optimal
    good = sorted(
        {job for outcomes in runs.values() for run in outcomes for job, acc in run["best"].items() if acc >= target}
    )
    figures: dict[str, list[float]] = {}
    for name, outcomes in runs.items():
        figures[name] = []
        for run_ in outcomes:
            firsts = run_["times"].first_reaching(target)
            reached = [firsts[job] for job in good if job in firsts]
            figures[name].append(sum(reached) / len(reached) if len(reached) == len(good) else float("nan"))
    section.text(
        f"{len(jobs)} jobs x {epochs} epochs on 2 workers, {samples:,} MNIST-1D samples; {args.repeats} random"
        f" job orders, the {len(policies)} policies interleaved in each; Hermes's quantum {args.quantum} s, round"
        f" robin's and SLAQ's {3 * args.quantum} s; load {harness.loads(runs)} during the runs. Optimal: the best"
        f" accuracy any job reached, {optimal:.4f}; target 90% of it, {target:.4f}; good jobs (their curves reach"
        f" it): {len(good)} of {len(jobs)} ("
        + ", ".join(f"lr {JOBS[job][0]:g} bs {JOBS[job][1]}" for job in good)
        + ")."
    )
    hermes = figures["hermes"]
    section.table(
        ["policy", "good jobs' mean time to target (s)", "over Hermes's, same order", "study wall (s)"],
        [
            [
                name,
                harness.median_range(figures[name]),
                harness.ratio(figures[name], hermes),
                harness.median_range(harness.values(outcomes, "wall")),
            ]
            for name, outcomes in runs.items()
        ],
    )
    baselines = [name for name in policies if name != "hermes"]
    section.text("Per order: where the good jobs entered the queue, and each policy's time over Hermes's.")
    section.table(
        ["order", f"good jobs' places in the queue (of {len(jobs)})", *(f"{name} / hermes" for name in baselines)],
        [
            [
                repeat + 1,
                ", ".join(str(place) for place in sorted(order.index(job) + 1 for job in good)),
                *(f"{figures[name][repeat] / hermes[repeat]:.2f}x" for name in baselines),
            ]
            for repeat, order in enumerate(orders)
        ],
    )
    section.text(
        "Paper (Hermes, section 4.2, four CNNs on ImageNet): Hermes 2.08x, 1.92x, 4.04x and 3.39x faster on"
        " average than the other policies. `critical_path` and FIFO run each job to its end in the queue's"
        " order, so their times depend on where the good jobs sit in it: where they sit early, those policies"
        " run them to the target at once, before time-sharing has given the others a quantum each, and can be"
        " ahead of Hermes (a ratio under 1.00x above); a metric of the *first* job to reach the best accuracy"
        " (this benchmark's earlier one) favours them further. Time-sharing pays off over orders, not in each."
    )
    section.emit()


if __name__ == "__main__":
    main()
