"""Several overlapping studies on one plan service, side by side with running
them separately, in one run (Hippo section 6.2: multi-study).

K studies (``--studies``, 4 to 8) of the example's 1-D CNN on MNIST-1D draw
learning-rate and batch-size sequences from overlapping spaces, as the
paper's multi-study sets do: study i steps its learning rate down at
milestones i+2 and i+3 of a common pool (0.1, decayed 10x), with a constant
or a stepped-up batch size. Neighbouring studies therefore share a
milestone's trials outright and every study shares the 0.1 prefix. Four ways:

(a1) ``ray.tune.Tuner``, the studies one after another;
(a2) ``ray.tune.Tuner``, the studies at once, each from its own driver process;
(b)  ``ray_stagetree.Tuner`` without a plan service, one after another
     (sharing within each study only);
(c)  ``ray_stagetree.Tuner(plan_service=...)``, the studies at once, each
     from its own driver process, all attached to one service.

Printed: makespan (first study submitted to last one done), worker-seconds
(Tune: each trial's start to completion; stagetree: stage batches' dispatch
to completion), epochs executed, each study's best accuracy (equal in every
mode: training is deterministic and the service serves each study the
metrics it would have trained alone), the merge rate within studies and
across them (`kwise_merge_rate`), and the ratios (a)/(c), (b)/(c) next to
the paper's 6.77x GPU-hours and 3.53x end to end.

Then a small study's fixed cost: seconds from ``fit()`` to its first
iteration on a warm plan service (started, workers up) against a cold start
without one (target: under 0.5 s warm).

    python release/bench_multistudy.py               # 4 studies x 4 trials x 8 epochs (about 15 minutes on 2 CPUs)
    python release/bench_multistudy.py --studies 8   # the paper's S8-sized set
    python release/bench_multistudy.py --quick       # 2 studies, 3 epochs, mode (c) and the fixed cost (CI smoke test)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import ray
import torch
from ray import tune

RELEASE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, RELEASE)

import bench_tune  # noqa: E402  (the example, its Tune form and Tune's worker-seconds)

from ray_stagetree import MultiStep, Tuner, get_iteration, init_ray, kwise_merge_rate, merge_rate, report  # noqa: E402
from ray_stagetree.plan_service import PlanServiceConfig, shutdown, status  # noqa: E402
from ray_stagetree.searchers import generate_trials  # noqa: E402

example = bench_tune.example
METRIC, MODE = bench_tune.METRIC, bench_tune.MODE
SERVICE = "bench_multistudy"


def study_space(index: int, epochs: int) -> dict[str, Any]:
    """Study ``index``'s grid: two learning-rate milestones of the common
    pool (overlapping its neighbours'), two batch-size sequences."""
    milestones = [1 + (index + offset) % (epochs - 1) for offset in (1, 2)]
    return {
        "lr": tune.grid_search([MultiStep(0.1, [m], 0.1) for m in milestones]),
        "batch_size": tune.grid_search([128, MultiStep(values=(128, 256), milestones=[epochs // 2])]),
        "seed": 0,
    }


def stagetree_tuner(space, data, epochs, storage, name, service=None) -> Tuner:
    return Tuner(
        tune.with_resources(tune.with_parameters(example.train_mnist1d, data=data), {"cpu": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(metric=METRIC, mode=MODE),
        run_config=tune.RunConfig(storage_path=storage, name=name, stop={"training_iteration": epochs}, verbose=0),
        plan_service=service,
    )


def tune_tuner(space, data, epochs, storage, name, occupancy) -> tune.Tuner:
    trainable = tune.with_parameters(example.train_mnist1d, data=data, hparams_at=bench_tune.values_at)
    return tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}),
        param_space=bench_tune.declarative(space),
        tune_config=tune.TuneConfig(metric=METRIC, mode=MODE),
        run_config=tune.RunConfig(
            storage_path=storage, name=name, stop={"training_iteration": epochs}, verbose=0, callbacks=[occupancy]
        ),
    )


def run_one(system: str, index: int, epochs: int, samples: int, storage: str) -> dict[str, Any]:
    """One study in this process: its best accuracy, epochs and (Tune) worker-seconds."""
    data = example.make_data(num_samples=samples)
    space, name = study_space(index, epochs), f"{system}_{index}"
    occupancy = bench_tune.TrialOccupancy()
    if system == "tune":
        results = tune_tuner(space, data, epochs, storage, name, occupancy).fit()
        executed, seconds = sum(r.metrics["training_iteration"] for r in results), occupancy.seconds
    else:
        service = PlanServiceConfig(SERVICE) if system == "service" else None
        results = stagetree_tuner(space, data, epochs, storage, name, service).fit()
        executed, seconds = results.iterations_executed, results.worker_seconds
    if results.errors:
        raise RuntimeError(f"{system} study {index}: {results.errors[0]}")
    best = results.get_best_result(METRIC, MODE, scope="last").metrics[METRIC]
    return {"best": best, "epochs": executed, "worker_seconds": seconds}


def driver_main(arguments: dict[str, Any]) -> None:
    """A driver process of modes (a2) and (c): joins the benchmark's Ray."""
    ray.init(
        address=arguments["address"], namespace=arguments["namespace"], configure_logging=False, log_to_driver=False
    )
    result = run_one(
        arguments["system"], arguments["index"], arguments["epochs"], arguments["samples"], arguments["storage"]
    )
    with open(arguments["out"], "w") as file:
        json.dump(result, file)


def sequential(system: str, count: int, epochs: int, samples: int, storage: str) -> tuple[float, list[dict]]:
    started = time.perf_counter()
    runs = [run_one(system, index, epochs, samples, storage) for index in range(count)]
    return time.perf_counter() - started, runs


def concurrent(system: str, count: int, epochs: int, samples: int, storage: str) -> tuple[float, list[dict]]:
    """The studies submitted at once, each from its own driver process."""
    context = ray.get_runtime_context()
    started = time.perf_counter()
    drivers = []
    for index in range(count):
        out = os.path.join(storage, f"{system}_{index}.json")
        arguments = dict(
            address=context.gcs_address, namespace=context.namespace, system=system, index=index,
            epochs=epochs, samples=samples, storage=storage, out=out,
        )  # fmt: skip
        drivers.append((subprocess.Popen([sys.executable, __file__, "--driver", json.dumps(arguments)]), out))
    for process, _ in drivers:
        if process.wait() != 0:
            raise RuntimeError(f"a {system} driver failed with exit code {process.returncode}")
    wall = time.perf_counter() - started
    runs = []
    for _, out in drivers:
        with open(out) as file:
            runs.append(json.load(file))
    return wall, runs


def first_iteration(config):
    """Reports when its first iteration started (wall clock, this machine)."""
    while True:
        report({"started": time.time(), "iteration": get_iteration()})


def fixed_cost(storage: str, service: PlanServiceConfig | None) -> float:
    """Seconds from ``fit()`` to the first iteration of a one-trial study."""
    tuner = Tuner(
        first_iteration,
        param_space={"lr": 0.1, "run": uuid.uuid4().hex},  # a new trial each time: nothing answered from the plan
        run_config=tune.RunConfig(storage_path=storage, stop={"training_iteration": 1}, verbose=0),
        plan_service=service,
    )
    called = time.time()
    results = tuner.fit()
    return results[0].metrics["started"] - called


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument(
        "--quick",
        action="store_true",
        help="2 studies x 4 trials x 3 epochs, 500 samples, the plan service and the fixed cost only",
    )
    parser.add_argument("--studies", type=int, default=4, help="overlapping studies (4 to 8; 2 with --quick)")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument("--driver", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.driver:
        driver_main(json.loads(args.driver))
        return
    count, epochs, samples = (2, 3, 500) if args.quick else (args.studies, args.epochs, 4000)
    if not args.quick and not 4 <= count <= 8:
        parser.error(f"--studies must be 4 to 8, got {count}")
    if epochs < 3:
        parser.error(f"--epochs must be >= 3, got {epochs}")
    workers = os.cpu_count() or 1
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, python {platform.python_version()}, ray {ray.__version__},"
        f" torch {torch.__version__}; {count} studies x 4 trials x {epochs} epochs, {samples} MNIST-1D samples"
    )
    # Ray's workers and the driver processes import the example's module by name.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [bench_tune.EXAMPLES, os.environ.get("PYTHONPATH")]))
    init_ray(num_cpus=workers, include_dashboard=False, configure_logging=False, log_to_driver=False, namespace=SERVICE)
    spaces = [generate_trials(study_space(index, epochs)) for index in range(count)]
    within = sum(merge_rate(trials, epochs) * len(trials) for trials in spaces) / sum(map(len, spaces))
    across = kwise_merge_rate(spaces, epochs)
    with tempfile.TemporaryDirectory(prefix="bench_multistudy_") as storage:
        modes = {}
        if not args.quick:
            modes["(a1) Tune, one after another"] = sequential("tune", count, epochs, samples, storage)
            modes["(a2) Tune, at once"] = concurrent("tune", count, epochs, samples, storage)
            modes["(b) stagetree, one after another"] = sequential("alone", count, epochs, samples, storage)
        modes["(c) plan service, at once"] = concurrent("service", count, epochs, samples, storage)
        served = status(SERVICE)  # its workers' time and epochs, once for batches several studies share
        service_work, service_epochs = served["worker_seconds"], served["iterations"]
        # The first study of a trainable starts the service's workers for it; the next finds them warm.
        first = fixed_cost(storage, PlanServiceConfig(SERVICE, study_group="fixed_cost"))
        warm = min(fixed_cost(storage, PlanServiceConfig(SERVICE, study_group="fixed_cost")) for _ in range(3))
        shutdown(SERVICE)
        cold = fixed_cost(storage, None)
    print(f"\n{'mode':<34} {'makespan s':>10} {'worker-s':>9} {'epochs':>7}  best accuracy per study")
    for label, (wall, runs) in modes.items():
        service = label.startswith("(c)")
        work = service_work if service else sum(r["worker_seconds"] for r in runs)
        epochs_run = service_epochs if service else sum(r["epochs"] for r in runs)
        bests = " ".join(f"{r['best']:.4f}" for r in runs)
        print(f"{label:<34} {wall:>10.1f} {work:>9.1f} {epochs_run:>7d}  {bests}")
    service_wall, service_runs = modes["(c) plan service, at once"]
    print(f"\nmerge rate: {within:.2f} within each study, {across:.2f} across the {count} studies")
    for label, (wall, runs) in modes.items():
        if label.startswith("(c)"):
            continue
        work = sum(r["worker_seconds"] for r in runs)
        print(f"{label} / (c): worker-seconds {work / service_work:.2f}x, makespan {wall / service_wall:.2f}x")
    if not args.quick:
        _, alone_runs = modes["(b) stagetree, one after another"]
        same = all(a["best"] == c["best"] for a, c in zip(alone_runs, service_runs))
        print(f"each study's best accuracy on the service equals its own run's: {same}")
    print("paper (Hippo 6.2, multi-study against trial-based): 6.77x fewer GPU-hours, 3.53x end to end")
    print(
        f"\nfixed cost, fit() to the first iteration: warm service {warm:.2f} s (best of 3), the service's first"
        f" study of this trainable {first:.2f} s, cold start without a service {cold:.2f} s (target: warm under 0.5 s)"
    )
    ray.shutdown()


if __name__ == "__main__":
    main()
