"""Several overlapping studies on one plan service, side by side with running
them separately, in one run (Hippo section 6.2: multi-study).

K studies (``--studies``, 4 to 8) of the example's 1-D CNN on MNIST-1D draw
learning-rate and batch-size sequences from overlapping spaces, as the
paper's multi-study sets do: study i steps its learning rate down at
milestones i+2 and i+3 of a common pool (0.1, decayed 10x), with a constant
or a stepped-up batch size. Neighbouring studies therefore share a
milestone's trials outright and every study shares the 0.1 prefix. Every
mode submits the studies at once, each from its own driver process (started,
its data loaded and its tuner built before any study is submitted), and the
modes run interleaved ``--repeats`` times:

(a)  ``ray.tune.Tuner`` at its defaults, and with ``reuse_actors=True``;
(b0) ``ray_stagetree.Tuner(stage_sharing=False)``: trial by trial;
(b)  ``ray_stagetree.Tuner`` without a plan service: sharing within each study only;
(c)  ``ray_stagetree.Tuner(plan_service=...)``, all attached to one service
     (a new one each run, so nothing is answered from an earlier run's plan).

Printed as median [range]: makespan (first study submitted to last one
done), worker-seconds (Tune: each trial's start to completion; stagetree:
stage batches' dispatch to completion; the service's own workers for (c)),
epochs executed, each study's best accuracy (equal in every mode: training
is deterministic and the service serves each study the metrics it would
have trained alone), the merge rate within studies and across them
(`kwise_merge_rate`), and the ratios against Tune at its best, (b)/(c) and
(b0)/(c) (in epochs the cross-study merge rate: the service's target) next
to the paper's 6.77x GPU-hours and 3.53x end to end.

Then a small study's fixed cost: seconds from ``fit()`` to its first
iteration on a warm plan service (started, workers up) against a cold start
without one (target: under 0.5 s warm).

    python release/bench_multistudy.py --full        # 4 studies x 4 trials x 8 epochs, 3 repeats
    python release/bench_multistudy.py --studies 8   # the paper's S8-sized set
    python release/bench_multistudy.py --quick       # 2 studies, 3 epochs, modes (b) and (c), the fixed cost (CI smoke test)
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
import uuid
from typing import Any

import ray
import torch
from ray import tune

RELEASE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, RELEASE)

import bench_tune  # noqa: E402  (the example, its Tune form and Tune's worker-seconds)
import harness  # noqa: E402

from ray_stagetree import MultiStep, Tuner, get_iteration, kwise_merge_rate, merge_rate, report  # noqa: E402
from ray_stagetree.plan_service import PlanServiceConfig, shutdown, status  # noqa: E402
from ray_stagetree.searchers import generate_trials  # noqa: E402
from ray_stagetree.searchers.variants import tune_grid  # noqa: E402

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


#: The modes, each the studies submitted at once from their own driver processes.
TUNE_DEFAULT, TUNE_REUSE = "(a) Ray Tune, defaults", "(a) Ray Tune, reuse_actors=True"
ALONE, WITHIN, SERVICE_MODE = (
    "(b0) ray_stagetree, sharing off",
    "(b) ray_stagetree, no plan service",
    "(c) ray_stagetree, one plan service",
)
SYSTEMS = {TUNE_DEFAULT: "tune", TUNE_REUSE: "tune_reuse", ALONE: "alone", WITHIN: "within", SERVICE_MODE: "service"}


def stagetree_tuner(space, data, epochs, storage, name, service=None, sharing=True) -> Tuner:
    return Tuner(
        tune.with_resources(tune.with_parameters(example.train_mnist1d, data=data), {"cpu": 1}),
        param_space=space,
        tune_config=tune.TuneConfig(metric=METRIC, mode=MODE),
        run_config=tune.RunConfig(storage_path=storage, name=name, stop={"training_iteration": epochs}, verbose=0),
        plan_service=service,
        stage_sharing=sharing,
    )


def tune_tuner(space, data, epochs, storage, name, occupancy, reuse) -> tune.Tuner:
    trainable = tune.with_parameters(example.train_mnist1d, data=data, hparams_at=bench_tune.values_at)
    return tune.Tuner(
        tune.with_resources(trainable, {"cpu": 1}),
        param_space=tune_grid(space),
        tune_config=tune.TuneConfig(metric=METRIC, mode=MODE, reuse_actors=reuse),
        run_config=tune.RunConfig(
            storage_path=storage, name=name, stop={"training_iteration": epochs}, verbose=0, callbacks=[occupancy]
        ),
    )


def run_one(
    system: str, index: int, epochs: int, data_path: str, storage: str, service: str | None = None, go: str = ""
) -> dict[str, Any]:
    """One study in this process: its best accuracy, epochs and (Tune)
    worker-seconds. With ``go``, ready (data loaded, tuner built) once
    ``go + ".ready.<index>"`` exists; ``fit()`` once ``go`` exists."""
    data = torch.load(data_path)
    space, name = study_space(index, epochs), f"{system}_{index}_{uuid.uuid4().hex[:6]}"
    occupancy = harness.TrialOccupancy()
    if system.startswith("tune"):
        tuner: Any = tune_tuner(space, data, epochs, storage, name, occupancy, reuse=system == "tune_reuse")
    else:
        config = PlanServiceConfig(service) if system == "service" else None
        tuner = stagetree_tuner(space, data, epochs, storage, name, config, sharing=system != "alone")
    if go:
        open(f"{go}.ready.{index}", "w").close()
        while not os.path.exists(go):
            time.sleep(0.005)
    results = tuner.fit()
    if system.startswith("tune"):
        executed, seconds = sum(r.metrics["training_iteration"] for r in results), occupancy.seconds
    else:
        executed, seconds = results.iterations_executed, results.worker_seconds
    if results.errors:
        raise RuntimeError(f"{system} study {index}: {results.errors[0]}")
    best = results.get_best_result(METRIC, MODE, scope="last").metrics[METRIC]
    return {"best": best, "epochs": executed, "worker_seconds": seconds}


def driver_main(arguments: dict[str, Any]) -> None:
    """A driver process: joins the benchmark's Ray, runs one study."""
    ray.init(
        address=arguments["address"], namespace=arguments["namespace"], configure_logging=False, log_to_driver=False
    )
    result = run_one(
        arguments["system"],
        arguments["index"],
        arguments["epochs"],
        arguments["data"],
        arguments["storage"],
        arguments["service"],
        arguments["go"],
    )
    with open(arguments["out"], "w") as file:
        json.dump(result, file)


def concurrent(system: str, count: int, epochs: int, data_path: str, storage: str) -> dict[str, Any]:
    """The studies submitted at once, each from its own driver process: the
    makespan, worker-seconds (a service's: its workers' own, once for
    batches several studies share), epochs and each study's best accuracy.
    A service is new for each run, so no run is answered from an earlier one's plan."""
    context = ray.get_runtime_context()
    service = f"{SERVICE}_{uuid.uuid4().hex[:8]}" if system == "service" else None
    go = os.path.join(storage, f"go_{uuid.uuid4().hex[:8]}")
    drivers = []
    for index in range(count):
        out = os.path.join(storage, f"{system}_{index}_{uuid.uuid4().hex[:6]}.json")
        arguments = dict(
            address=context.gcs_address, namespace=context.namespace, system=system, index=index,
            epochs=epochs, data=data_path, storage=storage, out=out, service=service, go=go,
        )  # fmt: skip
        drivers.append((subprocess.Popen([sys.executable, __file__, "--driver", json.dumps(arguments)]), out))
    # Every driver started, imported and loaded its data before any study is
    # submitted: their start-up would otherwise take CPU from the first
    # studies' epochs (on 2 CPUs, 1.0 s instead of 0.55 s), the more of the
    # run the shorter it is.
    while not all(os.path.exists(f"{go}.ready.{index}") for index in range(count)):
        for process, _ in drivers:
            if process.poll() is not None:
                raise RuntimeError(f"a {system} driver failed with exit code {process.returncode}")
        time.sleep(0.01)
    started = time.perf_counter()
    open(go, "w").close()
    for process, _ in drivers:
        if process.wait() != 0:
            raise RuntimeError(f"a {system} driver failed with exit code {process.returncode}")
    wall = time.perf_counter() - started
    runs = []
    for _, out in drivers:
        with open(out) as file:
            runs.append(json.load(file))
    figures = {
        "wall": wall,
        "worker_seconds": sum(run["worker_seconds"] for run in runs),
        "epochs": sum(run["epochs"] for run in runs),
        "bests": [run["best"] for run in runs],
    }
    if service is not None:
        served = status(service)
        figures["worker_seconds"], figures["epochs"] = served["worker_seconds"], served["iterations"]
        shutdown(service)
    return figures


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
    parser = harness.parser(__doc__)
    parser.add_argument("--studies", type=int, default=4, help="overlapping studies (4 to 8; 2 with --quick)")
    parser.add_argument("--epochs", type=int, default=8)
    parser.add_argument(
        "--samples",
        type=int,
        default=20_000,
        # As bench_tune.py: epochs of about 0.3 s, so a stage's restore and set-up
        # (tens of milliseconds) weigh in worker-seconds about as they would on a GPU.
        help="MNIST-1D samples (--full; default 20,000, as bench_tune.py)",
    )
    parser.add_argument(
        "--modes",
        default=None,
        help="comma-separated modes: a (Tune's defaults), ar (reuse_actors=True), b0, b, c (default all; b,c with --quick)",
    )
    parser.add_argument("--driver", help=argparse.SUPPRESS)
    if "--driver" in sys.argv:
        driver_main(json.loads(parser.parse_args().driver))
        return
    args = harness.parse(parser)
    count, epochs, samples = (2, 3, 500) if args.quick else (args.studies, args.epochs, args.samples)
    if not args.quick and not 4 <= count <= 8:
        parser.error(f"--studies must be 4 to 8, got {count}")
    if epochs < 3:
        parser.error(f"--epochs must be >= 3, got {epochs}")
    workers = os.cpu_count() or 1
    section = harness.Section("Multi-study: overlapping studies on one plan service (`bench_multistudy.py`)", args)
    # Ray's workers and the driver processes import the example's module by name.
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [bench_tune.EXAMPLES, os.environ.get("PYTHONPATH")]))
    harness.start_ray(num_cpus=workers, namespace=SERVICE)
    spaces = [generate_trials(study_space(index, epochs)) for index in range(count)]
    within = sum(merge_rate(trials, epochs) * len(trials) for trials in spaces) / sum(map(len, spaces))
    across = kwise_merge_rate(spaces, epochs)
    # (b) already shares within each study: the most (c) saves over it is the epochs (b) trains, the studies'
    # unique iterations, over the unique iterations of them all.
    bound = across * sum(len(trials) / merge_rate(trials, epochs) for trials in spaces) / sum(map(len, spaces))
    by_letter = {"a": [TUNE_DEFAULT], "ar": [TUNE_REUSE], "b0": [ALONE], "b": [WITHIN], "c": [SERVICE_MODE]}
    letters = args.modes.split(",") if args.modes else (["b", "c"] if args.quick else list(by_letter))
    if set(letters) - set(by_letter) or not {"b", "c"} <= set(letters):
        parser.error(f"--modes takes a, ar, b0, b and c, and needs b and c; got {args.modes!r}")
    modes = [mode for letter in by_letter if letter in letters for mode in by_letter[letter]]
    with tempfile.TemporaryDirectory(prefix="bench_multistudy_") as storage:
        # Generated once and loaded by every driver: generating it in each (seconds of CPU) would
        # compete with the first studies' training, unlike the studies' own work.
        data_path = os.path.join(storage, "mnist1d.pt")
        torch.save(example.make_data(num_samples=samples), data_path)
        systems = {
            mode: functools.partial(concurrent, SYSTEMS[mode], count, epochs, data_path, storage) for mode in modes
        }
        runs = harness.interleaved(systems, args.repeats, "multistudy")
        # The first study of a trainable starts the service's workers for it; the next finds them warm.
        first = fixed_cost(storage, PlanServiceConfig(SERVICE, study_group="fixed_cost"))
        warm = min(fixed_cost(storage, PlanServiceConfig(SERVICE, study_group="fixed_cost")) for _ in range(3))
        shutdown(SERVICE)
        cold = fixed_cost(storage, None)
    section.text(
        f"{count} studies x 4 trials x {epochs} epochs of the example's 1-D CNN on {samples:,} MNIST-1D samples,"
        f" {workers} workers; study i steps its learning rate down at milestones i+2 and i+3 of a common pool, so"
        " neighbouring studies share trials outright and all share the 0.1 prefix. Every mode submits the studies"
        " at once, each from its own driver process (which loads the data, generated once, and builds its tuner"
        " before any study is submitted); a plan service is new for each run. Makespan: the studies submitted to"
        " the last one done; worker-seconds as in"
        " `bench_tune.py` (the service's: its workers', once for"
        f" batches several studies share). Load {harness.loads(runs)} during the runs; median [range] over the"
        " repeats, modes interleaved."
    )
    section.table(
        ["mode", "makespan s", "worker-s", "epochs executed", "best accuracy per study (first run)"],
        [
            [
                mode,
                harness.median_range(harness.values(outcomes, "wall")),
                harness.median_range(harness.values(outcomes, "worker_seconds")),
                harness.median_range(harness.values(outcomes, "epochs"), 0),
                " ".join(f"{best:.4f}" for best in outcomes[0]["bests"]),
            ]
            for mode, outcomes in runs.items()
        ],
        right=[False, True, True, True, False],
    )
    service = runs[SERVICE_MODE]
    rows = [["merge rate", f"{within:.2f} within each study, **{across:.2f}** across the {count} studies"]]
    for key, label in (("worker_seconds", "worker-s"), ("wall", "makespan")):
        ours = harness.values(service, key)
        if TUNE_DEFAULT in runs or TUNE_REUSE in runs:
            best = harness.fastest(runs, (TUNE_DEFAULT, TUNE_REUSE), key)
            rows.append(
                [f"{label}, Tune at its best ({best[4:]}) / (c)", harness.ratio(harness.values(runs[best], key), ours)]
            )
        no_service = harness.values(runs[WITHIN], key)
        rows.append(
            [
                f"{label}, no service / service: (b) / (c)",
                f"**{harness.ratio(no_service, ours)}**"
                + (
                    f" (in epochs at most {bound:.2f}: (b) shares within each study)" if key == "worker_seconds" else ""
                ),
            ]
        )
        if ALONE in runs:
            alone = harness.values(runs[ALONE], key)
            # Trial by trial, every study trains its every trial: in epochs, (b0) / (c) is the cross-study merge rate.
            target = (
                f" (target >= cross-study merge rate {across:.2f}:"
                f" {'met' if harness.median(harness.ratios(alone, ours)) >= across else 'NOT met'})"
            )
            rows.append(
                [
                    f"{label}, no service and no sharing / service: (b0) / (c)",
                    f"**{harness.ratio(alone, ours)}**" + (target if key == "worker_seconds" else ""),
                ]
            )
            rows.append([f"{label}, sharing only: (b0) / (b)", harness.ratio(alone, no_service)])
            if key == "worker_seconds":
                # Above 1, the service's stages cost more per epoch than whole trials (checkpoint restores and
                # saves at each stage's ends): the worker-s ratio then falls short of the merge rate.
                per_epoch = {mode: [o[key] / o["epochs"] for o in runs[mode]] for mode in (SERVICE_MODE, ALONE)}
                rows.append(
                    [
                        "worker-s per epoch executed, (c) / (b0)",
                        harness.ratio(per_epoch[SERVICE_MODE], per_epoch[ALONE]),
                    ]
                )
    if len(runs) > 2:
        same = all(run["bests"] == runs[WITHIN][0]["bests"] for outcomes in runs.values() for run in outcomes)
        rows.append(["each study's best accuracy equal in every mode and run", "yes" if same else "no"])
    section.table(["figure", "median [range] of per-repeat ratios"], rows)
    section.text(
        "Paper (Hippo 6.2, multi-study against trial-based): 6.77x fewer GPU-hours, 3.53x end to end.",
        "",
        f"Fixed cost, `fit()` to the first iteration of a one-trial study: warm service {warm:.2f} s (best of 3),"
        f" the service's first study of this trainable {first:.2f} s, cold start without a service {cold:.2f} s"
        " (target: warm under 0.5 s).",
    )
    section.emit()
    ray.shutdown()


if __name__ == "__main__":
    main()
