"""Restore after a killed driver, against Ray Tune, side by side in one run.

A study of learning-rate sequences (a grid whose trials share prefixes; the
trainable checkpoints every iteration, as Tune's examples do) runs once
uninterrupted, then again in a driver process that is killed with SIGKILL
once it has executed half the uninterrupted run's iterations, and is then
continued with ``Tuner.restore``. The same for ``ray.tune.Tuner`` and
``ray_stagetree.Tuner``. Every executed iteration
appends a line to a log, so the counts are exact:

* executed before the kill, and after the restore;
* lost: executed in all, minus the uninterrupted run's executed iterations
  (work the kill cost; what never reached storage, trained again);
* the final metrics of every trial equal the uninterrupted run's.

    python release/bench_restore.py --full     # 3 repeats (about 10 minutes on 2 idle CPUs)
    python release/bench_restore.py --quick    # smaller study, ray_stagetree only (CI smoke test)
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

import harness
import ray
from ray import tune

import ray_stagetree
from ray_stagetree import MultiStep

SECONDS_PER_ITERATION = 0.1


def accumulate(config: dict[str, Any]) -> None:
    """State carried through checkpoints; one log line per executed iteration."""
    x, iteration = 0.0, 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as path, open(f"{path}/state.json") as file:
            x, iteration = json.load(file)
    while True:
        iteration += 1
        lr = config["lr"].value(iteration - 1) if hasattr(config["lr"], "value") else config["lr"]
        x = 0.9 * x + lr * iteration
        time.sleep(SECONDS_PER_ITERATION)
        with open(config["log"], "a") as log:
            log.write("1\n")
        with tempfile.TemporaryDirectory() as path:
            with open(f"{path}/state.json", "w") as file:
                json.dump([x, iteration], file)
            tune.report({"x": x}, checkpoint=tune.Checkpoint.from_directory(path))


TUNE_EVERY_STEP = "Ray Tune, snapshot every step"
SYSTEMS = {"Ray Tune": tune.Tuner, TUNE_EVERY_STEP: tune.Tuner, "ray_stagetree": ray_stagetree.Tuner}
#: The killed driver's environment. Tune saves its experiment state (what
#: `Tuner.restore` reads) at most every 10 s by default ("auto": max(10 s,
#: 19 x a save's time)); 0 saves it at every step of its loop, its best for restore.
DRIVER_ENV = {TUNE_EVERY_STEP: {"TUNE_GLOBAL_CHECKPOINT_S": "0"}}


def _tuner(system: str, storage: str, name: str, log: str, milestones: list[int], horizon: int) -> Any:
    return SYSTEMS[system](
        tune.with_resources(accumulate, {"cpu": 1}),
        param_space={"lr": tune.grid_search([MultiStep(1.0, [m], 0.5) for m in milestones]), "log": log},
        tune_config=tune.TuneConfig(metric="x", mode="max"),
        run_config=tune.RunConfig(name=name, storage_path=storage, stop={"training_iteration": horizon}, verbose=0),
    )


def _finals(grid: Any) -> dict[str, float]:
    return {repr(result.config["lr"]): round(result.metrics["x"], 9) for result in grid}


def _lines(path: str) -> int:
    try:
        with open(path) as file:
            return sum(1 for _ in file)
    except FileNotFoundError:
        return 0


def drive(system: str, storage: str, name: str, log: str, milestones: str, horizon: str) -> None:
    """The killed driver: run or continue the study (in a subprocess)."""
    ray.init(address=os.environ["BENCH_RAY_ADDRESS"], include_dashboard=False, configure_logging=False)
    path = f"{storage}/{name}"
    tuner_class = SYSTEMS[system]
    if tuner_class.can_restore(path):
        tuner = tuner_class.restore(path, tune.with_resources(accumulate, {"cpu": 1}))
    else:
        tuner = _tuner(system, storage, name, log, json.loads(milestones), int(horizon))
    tuner.fit()


def compare(system: str, storage: str, milestones: list[int], horizon: int) -> dict[str, Any]:
    run = f"{system}-{uuid.uuid4().hex[:8]}"  # each repeat its own experiments and logs
    reference_log = f"{storage}/{run}-reference.log"
    reference = _finals(_tuner(system, storage, f"{run}-reference", reference_log, milestones, horizon).fit())
    name, log = f"{run}-killed", f"{storage}/{run}-killed.log"
    command = [sys.executable, __file__, "--drive", system, storage, name, log, json.dumps(milestones), str(horizon)]
    driver = subprocess.Popen(command, env={**os.environ, **DRIVER_ENV.get(system, {})})
    while _lines(log) < _lines(reference_log) / 2 and driver.poll() is None:  # half the work done
        time.sleep(0.02)
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    time.sleep(3)  # Ray ends the dead driver's actors
    before = _lines(log)
    path = f"{storage}/{name}"
    restored = SYSTEMS[system].restore(path, tune.with_resources(accumulate, {"cpu": 1})).fit()
    executed = _lines(log)
    return {
        "reference": _lines(reference_log),
        "before": before,
        "after": executed - before,
        "lost": executed - _lines(reference_log),
        "equal": _finals(restored) == reference,
    }


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--drive", nargs=6, help=argparse.SUPPRESS)
    if "--drive" in sys.argv:
        drive(*parser.parse_args().drive)
        return
    args = harness.parse(parser)
    section = harness.Section("Restore after a killed driver (`bench_restore.py`)", args)
    milestones, horizon = ([2, 4], 6) if args.quick else ([3, 6, 9, 12, 15, 18], 24)
    section.text(
        f"{len(milestones)} trials x {horizon} iterations x {SECONDS_PER_ITERATION} s, checkpoint every iteration;"
        " the driver SIGKILLed after half the iterations, then `Tuner.restore`. Iterations: uninterrupted run,"
        " executed before the kill, after the restore, and lost (executed twice). Ray Tune at its defaults saves"
        ' the experiment state `Tuner.restore` reads at most every 10 s (its "auto" period, max(10 s, 19 x a'
        " save's time)): a driver killed before its first save restores nothing and trains every trial again;"
        f" `{TUNE_EVERY_STEP}` sets `TUNE_GLOBAL_CHECKPOINT_S=0` in the killed driver, Tune's best for restore."
        " ray_stagetree, by default, snapshots its study as often as that costs its controller at most 5% of its"
        " time."
    )
    harness.start_ray(num_cpus=2)
    os.environ["BENCH_RAY_ADDRESS"] = ray.get_runtime_context().gcs_address
    systems = ["ray_stagetree"] if args.quick else list(SYSTEMS)  # the smoke test skips Tune's slow start-ups
    with tempfile.TemporaryDirectory(prefix="bench_restore_") as storage:
        runs = harness.interleaved(
            {system: functools.partial(compare, system, storage, milestones, horizon) for system in systems},
            args.repeats,
            "restore",
        )
    section.table(
        ["system", "uninterrupted", "before kill", "after restore", "lost", "same results in every repeat"],
        [
            [
                system,
                harness.median_range(harness.values(outcomes, "reference"), 0),
                harness.median_range(harness.values(outcomes, "before"), 0),
                harness.median_range(harness.values(outcomes, "after"), 0),
                harness.median_range(harness.values(outcomes, "lost"), 0),
                "yes" if all(outcome["equal"] for outcome in outcomes) else "NO",
            ]
            for system, outcomes in runs.items()
        ],
    )
    section.emit()
    ray.shutdown()
    if not all(outcome["equal"] for outcomes in runs.values() for outcome in outcomes):
        raise SystemExit("the restored study's results differ from the uninterrupted run's")


if __name__ == "__main__":
    main()
