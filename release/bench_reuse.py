"""A class trainable whose ``setup`` is costly (it loads data), with and
without ``TuneConfig(reuse_actors=True)``, against Ray Tune, side by side
in one run.

Tune's reason for ``reuse_actors``: a reused actor gets its next trial
through ``reset_config`` instead of a new object's ``setup``. ray_stagetree
does the same with a worker's object from one stage batch to its next (a
trial's path is trained as several batches: without reuse, each batch sets
up anew). The study: a grid of learning-rate sequences that share prefixes
(the trainable reads ``self.config["lr"]`` as a number, as a Tune script
does), ``setup`` sleeping ``--setup`` seconds and appending a line to a log,
so the count of setups is exact; every system must give every trial the
same final value.

    python release/bench_reuse.py --full     # 3 repeats (about 4 minutes on 2 idle CPUs)
    python release/bench_reuse.py --quick    # a small study, 1 repeat (a smoke test)
"""

from __future__ import annotations

import functools
import os
import tempfile
import time
import uuid
from typing import Any

import harness
import ray
from ray import tune

import ray_stagetree
from ray_stagetree import MultiStep

STEP_S = 0.05


class LoadsData(tune.Trainable):
    """``setup`` costs ``config["setup_s"]`` (a dataset loaded); ``reset_config`` starts a new trial's state."""

    def setup(self, config: dict[str, Any]) -> None:
        time.sleep(config["setup_s"])
        with open(config["log"], "a") as log:
            log.write("setup\n")
        self.x = 0.0

    def step(self) -> dict[str, float]:
        time.sleep(STEP_S)
        lr = self.config["lr"]
        self.x += lr.value(self.iteration) if hasattr(lr, "value") else lr  # Tune's config holds the sequence
        return {"x": self.x}

    def save_checkpoint(self, checkpoint_dir: str) -> dict[str, float]:
        return {"x": self.x}

    def load_checkpoint(self, checkpoint: dict[str, float]) -> None:
        self.x = checkpoint["x"]

    def reset_config(self, new_config: dict[str, Any]) -> bool:
        self.x = 0.0
        return True


SYSTEMS = {
    "Ray Tune": (tune.Tuner, False),
    "Ray Tune, reuse_actors": (tune.Tuner, True),
    "ray_stagetree": (ray_stagetree.Tuner, False),
    "ray_stagetree, reuse_actors": (ray_stagetree.Tuner, True),
}


def run(system: str, lrs: list[Any], horizon: int, setup_s: float, storage: str) -> dict[str, Any]:
    tuner_class, reuse = SYSTEMS[system]
    log = os.path.join(storage, f"setups_{uuid.uuid4().hex}")
    tuner = tuner_class(
        LoadsData,
        param_space={"lr": tune.grid_search(lrs), "log": log, "setup_s": setup_s},
        tune_config=tune.TuneConfig(reuse_actors=reuse),
        run_config=tune.RunConfig(storage_path=storage, stop={"training_iteration": horizon}, verbose=0),
    )
    started = time.perf_counter()
    results = tuner.fit()
    wall = time.perf_counter() - started
    if results.errors:
        raise RuntimeError(f"{system}: {results.errors[0]}")
    with open(log) as file:
        setups = len(file.read().split())
    finals = tuple(sorted(round(result.metrics["x"], 9) for result in results))
    return {"wall": wall, "setups": setups, "finals": finals}


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--setup", type=float, default=0.5, help="seconds a setup takes (default 0.5)")
    args = harness.parse(parser)
    if not args.setup >= 0:
        parser.error(f"--setup must be >= 0, got {args.setup}")
    milestones, gammas, horizon = ([3], [0.1, 0.5], 6) if args.quick else ([4, 8], [0.1, 0.3, 0.5, 0.7], 12)
    lrs = [MultiStep(0.1, [m], g) for m in milestones for g in gammas]
    section = harness.Section("A class trainable with a costly setup: `reuse_actors` (`bench_reuse.py`)", args)
    harness.start_ray(num_cpus=2)
    # Each fit as a script's one fit: on workers of its own, as Tune's (not on those the last fit kept).
    os.environ["RAY_STAGETREE_KEEP_WORKERS_S"] = "0"
    with tempfile.TemporaryDirectory(prefix="bench_reuse_") as storage:
        cases = {name: functools.partial(run, name, lrs, horizon, args.setup, storage) for name in SYSTEMS}
        runs = harness.interleaved(cases, args.repeats, "reuse")
    finals = {figures["finals"] for name in runs for figures in runs[name]}
    if len(finals) != 1:
        raise RuntimeError(f"the systems' trials ended at different values: {finals}")
    section.text(
        f"{len(lrs)} trials of `MultiStep(0.1, [m], gamma)` sequences (m in {milestones}, gamma in {gammas}) x"
        f" {horizon} iterations of {STEP_S:g} s on 2 workers, a `ray.tune.Trainable` whose `setup` takes"
        f" {args.setup:g} s; interleaved, median [range] over {args.repeats} repeat(s), load {harness.loads(runs)}."
        " Every run gave every trial the same final value."
    )
    section.table(
        ["system", "wall s", "setups"],
        [
            [
                name,
                harness.median_range(harness.values(r, "wall"), 1),
                harness.median_range(harness.values(r, "setups"), 0),
            ]
            for name, r in runs.items()
        ],
    )
    walls = {name: harness.values(r, "wall") for name, r in runs.items()}
    section.text(
        f"ray_stagetree, reuse_actors / Ray Tune, reuse_actors (Tune at its best): wall"
        f" **{harness.ratio(walls['Ray Tune, reuse_actors'], walls['ray_stagetree, reuse_actors'])}** less;"
        f" reuse_actors in ray_stagetree: {harness.ratio(walls['ray_stagetree'], walls['ray_stagetree, reuse_actors'])}"
        " less wall than a new object per stage batch."
    )
    section.emit()
    ray.shutdown()


if __name__ == "__main__":
    main()
