"""A small study for the restore tests, and the driver the kill-and-restore
stress test runs in a subprocess (``python -c "import restore_study;
restore_study.main(path, address, results_file)"``).

Its trainable carries state through its checkpoints (``x`` depends on every
earlier iteration), so a restore that resumed from the wrong checkpoint, or
skipped or repeated an iteration, changes the final metrics.
"""

from __future__ import annotations

import json
import os
import signal
import tempfile
import time

from ray import tune

from ray_stagetree import MultiStep, Tuner, get_hparams, report
from ray_stagetree.planning.config import tabular
from ray_stagetree.runtime.workers.context import FLUSH_SECONDS

HORIZON = 12
SECONDS_PER_ITERATION = 0.05
#: How long the trial that interrupts the driver waits before it reports
#: again: far longer than the driver takes to freeze the study.
INTERRUPT_GRACE_S = 5.0


def accumulate(config):
    x, start = 0.0, 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as path, open(f"{path}/state.json") as file:
            x, start = json.load(file)
    flag = config.get("fail_flag")  # a file: while it exists, the trial fails at iteration fail_at
    iteration = start
    while True:
        iteration += 1
        if iteration == config.get("fail_at") and flag and os.path.exists(flag):
            raise RuntimeError(f"failing at iteration {iteration} while {flag} exists")
        interrupt_driver_once(config.get("interrupt"), iteration)
        hold_while_flagged(config.get("hold"), iteration)
        hparams = get_hparams()
        x = x * hparams["decay"] + hparams["lr"] * iteration
        time.sleep(SECONDS_PER_ITERATION)
        with tempfile.TemporaryDirectory() as path:
            with open(f"{path}/state.json", "w") as file:
                json.dump([x, iteration], file)
            report({"x": x, "resumed_from": start}, checkpoint=tune.Checkpoint.from_directory(path))


def interrupt_driver_once(interrupt: dict | None, iteration: int) -> None:
    """``interrupt`` = {"at": iteration, "pid": the driver's, "flag": a file}:
    the first trial to reach ``at`` while the flag exists removes it and
    sends the driver SIGUSR1 (Ctrl-C, for ``fit()``), then waits, so the
    study is interrupted part way, whatever the machine's speed."""
    if not interrupt or iteration != interrupt["at"]:
        return
    try:
        os.remove(interrupt["flag"])
    except FileNotFoundError:
        return
    os.kill(interrupt["pid"], signal.SIGUSR1)
    time.sleep(INTERRUPT_GRACE_S)


def hold_while_flagged(hold: dict | None, iteration: int) -> None:
    """``hold`` = {"at": iteration, "flag": a file}: a trial reaching ``at``
    waits while the flag exists, so that a test acts part way through the
    study, whatever the machine's speed. The iteration before takes longer
    than the worker's flush interval, so that the results before ``at``
    reach the controller before the wait (a worker sends them with a later
    report, a checkpoint or the batch's end)."""
    if not hold or not os.path.exists(hold["flag"]):
        return
    if iteration == hold["at"] - 1:
        time.sleep(FLUSH_SECONDS + 0.1)
    while iteration == hold["at"] and os.path.exists(hold["flag"]):
        time.sleep(0.05)


def param_space(
    fail_at: int | None = None, fail_flag: str | None = None, interrupt: dict | None = None, hold: dict | None = None
) -> dict:
    space = {
        "lr": tune.grid_search([MultiStep(1.0, [milestone], 0.5) for milestone in (3, 6, 9)]),
        "decay": tune.grid_search([0.9, MultiStep(values=(0.9, 0.8), milestones=[7])]),
    }
    if fail_at is not None:
        space["fail_at"], space["fail_flag"] = fail_at, fail_flag
    if interrupt is not None:
        space["interrupt"] = interrupt
    if hold is not None:
        space["hold"] = hold
    return space


def build_tuner(
    storage_path: str,
    name: str,
    fail_at: int | None = None,
    fail_flag: str | None = None,
    interrupt: dict | None = None,
    hold: dict | None = None,
    checkpoint_config: tune.CheckpointConfig | None = None,
    **tune_config,
) -> Tuner:
    return Tuner(
        accumulate,
        param_space=param_space(fail_at, fail_flag, interrupt, hold),
        tune_config=tune.TuneConfig(metric="x", mode="max", **tune_config),
        run_config=tune.RunConfig(
            name=name,
            storage_path=storage_path,
            stop={"training_iteration": HORIZON},
            checkpoint_config=checkpoint_config,
            verbose=0,
        ),
    )


def key(config: dict) -> str:
    """A trial's identity across runs (trial ids differ between two studies),
    sequences in their declarative form (the fixture's reference was keyed so)."""
    return json.dumps({name: repr(tabular(config[name])) for name in ("lr", "decay")}, sort_keys=True)


def summary(grid) -> dict:
    """Per trial: its id, final metrics and the training iterations it reported."""
    return {
        key(result.config): {
            "trial_id": result.metrics["trial_id"],
            "x": result.metrics.get("x"),
            "done": bool(result.metrics.get("done")),
            "iterations": [row["training_iteration"] for row in result.metrics_dataframe.to_dict("records")],
        }
        for result in grid
    }


def main(storage_path: str, name: str, address: str, results_file: str) -> None:
    """Run or continue the study; write its summary once every trial is done."""
    import ray

    ray.init(address=address, include_dashboard=False, configure_logging=False)
    path = f"{storage_path}/{name}"
    tuner = Tuner.restore(path, accumulate) if Tuner.can_restore(path) else build_tuner(storage_path, name)
    grid = tuner.fit()
    results = summary(grid)
    if all(trial["done"] for trial in results.values()):
        with open(results_file, "w") as file:
            json.dump(results, file)
