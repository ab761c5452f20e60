"""Trainables as Ray Tune users write them share stages: three frameworks
against Ray Tune at its best, side by side in one run.

Each study runs on ``ray.tune.Tuner(reuse_actors=True)`` (Tune's fastest:
one process per worker, not per trial) and on ``ray_stagetree.Tuner``,
interleaved ``--repeats`` times on one local Ray instance, one worker per
CPU but one (the one left runs the driver side of either system):

1. **PyTorch, as Tune's docs write it**: a function trainable that reads
   ``config["lr"]`` once, steps a ``torch.optim.lr_scheduler.MultiStepLR``
   built from ``param_space``'s constants, and reports a checkpoint each
   epoch (Tune's side); ported as ``docs/guides/porting.md`` says (ours):
   the scheduler's arguments moved into ``param_space`` with
   ``from_torch(MultiStepLR, ...)``, the trainable still reading
   ``config["lr"]`` as a number and restarted from its checkpoint where
   the value changes. The example's 1-D CNN on MNIST-1D.
2. **PyTorch Lightning**: ``examples/lightning_study.py`` (a
   ``LightningModule``, Tune's ``TuneReportCheckpointCallback`` pattern);
   Tune runs the same script (`for_ray_tune`).
3. **Hugging Face Trainer**: ``examples/transformers_study.py`` (a small
   BERT, ``RayTrainReportCallback``), likewise.

Printed per study and system, median [range] over the repeats: wall time,
worker-seconds (Tune: each trial's start to completion; ray_stagetree:
each stage batch's dispatch to completion) and iterations executed; then
Tune's / ray_stagetree's worker-seconds and wall time against the merge
rate (trial-by-trial iterations over unique ones). The target: the
worker-seconds ratio at least 0.9x the merge rate.

    python release/bench_frameworks.py --full    # 3 repeats (about 15 min on 2 CPUs)
    python release/bench_frameworks.py --quick   # 1 repeat, tiny studies (CI smoke test)
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import torch
from ray import tune
from torch.utils.data import DataLoader, TensorDataset

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "examples")
sys.path.insert(0, EXAMPLES)

import harness  # noqa: E402
import lightning_study  # noqa: E402
import mnist1d_study  # noqa: E402
import transformers_study  # noqa: E402

from ray_stagetree import Tuner  # noqa: E402
from ray_stagetree.sequences import from_torch  # noqa: E402

WORKERS = max(1, (os.cpu_count() or 1) - 1)
TUNE, OURS = "Ray Tune, reuse_actors=True", "ray_stagetree"
#: Each study's size: --full, and --quick.
SIZES = {
    "full": {"torch": (16, 20000), "lightning": (16, 20000), "transformers": (16, 4000)},
    "quick": {"torch": (4, 500), "lightning": (4, 400), "transformers": (4, 300)},
}
MILESTONES, GAMMAS = ("half", "three quarters"), (0.1, 0.2, 0.3)


def reads_numbers(config: dict[str, Any], data: Any, epochs: int) -> None:
    """A Tune trainable as Tune's docs write one: its hyper-parameters read
    once, a torch scheduler inside when ``param_space`` gives its arguments,
    a checkpoint each epoch, restored from ``tune.get_checkpoint()`` (the
    learning rate set after loading the optimizer, as Ray's PBT examples do)."""
    torch.set_num_threads(1)
    torch.manual_seed(0)
    (x_train, y_train), (x_test, y_test) = data
    model = mnist1d_study.CNN()
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    scheduler = None
    if "milestones" in config:
        scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, config["milestones"], config["gamma"])
    loader = DataLoader(
        TensorDataset(x_train, y_train), batch_size=128, shuffle=True, generator=torch.Generator().manual_seed(0)
    )
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder:
            state = torch.load(os.path.join(folder, "state.pt"))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        if scheduler is not None:
            scheduler.load_state_dict(state["scheduler"])
        else:
            for group in optimizer.param_groups:
                group["lr"] = config["lr"]
        start = state["epoch"]
    for epoch in range(start, epochs):
        model.train()
        for inputs, targets in loader:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(inputs), targets).backward()
            optimizer.step()
        if scheduler is not None:
            scheduler.step()
        model.eval()
        with torch.no_grad():
            accuracy = (model(x_test).argmax(1) == y_test).float().mean().item()
        with tempfile.TemporaryDirectory() as folder:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1}
            if scheduler is not None:
                state["scheduler"] = scheduler.state_dict()
            torch.save(state, os.path.join(folder, "state.pt"))
            tune.report({"accuracy": accuracy}, checkpoint=tune.Checkpoint.from_directory(folder))


def milestones(epochs: int) -> list[list[int]]:
    return [[epochs // 2], [3 * epochs // 4]]


def run_torch(on_ray_tune: bool, epochs: int, num_samples: int, storage: str, callbacks: list) -> tuple[Any, float]:
    """Study 1: Tune's side gets the scheduler's arguments, ours the same schedules as sequences."""
    if on_ray_tune:
        space = {"lr": 0.1, "milestones": tune.grid_search(milestones(epochs)), "gamma": tune.grid_search(GAMMAS)}
    else:
        schedules = [
            from_torch(torch.optim.lr_scheduler.MultiStepLR, 0.1, milestones=steps, gamma=gamma)
            for steps in milestones(epochs)
            for gamma in GAMMAS
        ]
        space = {"lr": tune.grid_search(schedules)}
    trainable = tune.with_parameters(reads_numbers, data=mnist1d_study.make_data(num_samples), epochs=epochs)
    tuner_class = tune.Tuner if on_ray_tune else Tuner
    tuner = tuner_class(
        trainable,
        param_space=space,
        tune_config=tune.TuneConfig(metric="accuracy", mode="max", **({"reuse_actors": True} if on_ray_tune else {})),
        run_config=tune.RunConfig(
            storage_path=storage, stop={"training_iteration": epochs}, verbose=0, callbacks=callbacks
        ),
    )
    started = time.perf_counter()
    results = tuner.fit()
    return results, time.perf_counter() - started


def run_lightning(on_ray_tune: bool, epochs: int, num_samples: int, storage: str, callbacks: list):
    return lightning_study.run(on_ray_tune, epochs, num_samples, storage, callbacks=callbacks)


def run_transformers(on_ray_tune: bool, iterations: int, num_samples: int, storage: str, callbacks: list):
    return transformers_study.run(on_ray_tune, iterations, num_samples, storage, callbacks=callbacks)


STUDIES: dict[str, tuple[str, Callable[..., tuple[Any, float]]]] = {
    "torch": ("1. PyTorch, a torch scheduler ported to param_space", run_torch),
    "lightning": ("2. PyTorch Lightning", run_lightning),
    "transformers": ("3. Hugging Face Trainer", run_transformers),
}


def measure(study: str, on_ray_tune: bool, size: tuple[int, int], storage: str) -> dict[str, Any]:
    """One run of ``study`` on one system: its figures."""
    occupancy = harness.TrialOccupancy()
    results, wall = STUDIES[study][1](on_ray_tune, *size, storage, [occupancy] if on_ray_tune else [])
    errors = [str(result.error) for result in results if result.error]
    if errors:
        raise RuntimeError(f"{study} on {TUNE if on_ray_tune else OURS}: {len(errors)} trials failed: {errors[0]}")
    if on_ray_tune:
        executed = sum(len(result.metrics_dataframe) for result in results)
        return {"wall": wall, "worker_seconds": occupancy.seconds, "executed": executed}
    return {
        "wall": wall,
        "worker_seconds": results.worker_seconds,
        "executed": results.iterations_executed,
        "merge_rate": results.trial_by_trial_iterations / results.unique_iterations,
    }


def main() -> None:
    args = harness.parse(harness.parser(__doc__))
    sizes = SIZES["full" if args.full else "quick"]
    storage = harness.out_dir(args, "bench_frameworks")
    os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [EXAMPLES, os.environ.get("PYTHONPATH")]))
    harness.start_ray(num_cpus=WORKERS)
    section = harness.Section(
        "Tune trainables as written, against Ray Tune: PyTorch, Lightning, Hugging Face (`bench_frameworks.py`)", args
    )
    section.text(
        f"Each study on `ray.tune.Tuner(reuse_actors=True)` and on `ray_stagetree.Tuner`, interleaved, "
        f"{WORKERS} worker(s). Worker-seconds: Tune's trials start to completion; ours, stage batches "
        "dispatch to completion. Merge rate: trial-by-trial iterations over unique ones. Target: Tune's "
        "worker-seconds over ours at least 0.9x the merge rate."
    )
    rows, verdicts, every_run = [], [], {}
    for study, (title, _) in STUDIES.items():
        runs = harness.interleaved(
            {
                TUNE: lambda study=study: measure(study, True, sizes[study], storage),
                OURS: lambda study=study: measure(study, False, sizes[study], storage),
            },
            args.repeats,
            label=study,
        )
        every_run.update({f"{study} {system}": system_runs for system, system_runs in runs.items()})
        merge = harness.median(harness.values(runs[OURS], "merge_rate"))
        work = harness.ratios(
            harness.values(runs[TUNE], "worker_seconds"), harness.values(runs[OURS], "worker_seconds")
        )
        epochs, samples = sizes[study]
        for system in (TUNE, OURS):
            rows.append(
                [
                    f"{title} ({epochs} iterations, {samples} samples)",
                    system,
                    harness.median_range(harness.values(runs[system], "wall")),
                    harness.median_range(harness.values(runs[system], "worker_seconds")),
                    harness.median_range(harness.values(runs[system], "executed"), digits=0),
                ]
            )
        met = harness.median(work) >= 0.9 * merge
        verdicts.append(
            [
                title,
                f"{merge:.2f}",
                harness.ratio(
                    harness.values(runs[TUNE], "worker_seconds"), harness.values(runs[OURS], "worker_seconds")
                ),
                harness.ratio(harness.values(runs[TUNE], "wall"), harness.values(runs[OURS], "wall")),
                f"{harness.median(work) / merge:.2f}x of it: {'met' if met else 'missed'}",
            ]
        )
    section.table(
        ["study", "system", "wall s", "worker-seconds", "iterations executed"], rows, [False, False, True, True, True]
    )
    section.table(
        ["study", "merge rate", "worker-seconds, Tune / ours", "wall, Tune / ours", "target 0.9x merge rate"],
        verdicts,
        [False, True, True, True, False],
    )
    section.text(f"Load (1 min) at the runs' starts: {harness.loads(every_run)}.")
    section.emit()


if __name__ == "__main__":
    main()
