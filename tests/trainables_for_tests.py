"""Small deterministic trainables for runtime tests (numpy only, fast), and
the faults they meet."""

import json
import os
import random
import signal
import tempfile
import time

import numpy as np
import ray
from fsspec.implementations.local import LocalFileSystem
from ray import tune

from ray_stagetree import get_checkpoint, get_hparams, get_iteration, report, should_checkpoint
from ray_stagetree.trainables import StageTrainable


def count_step(config):
    counter = config.get("counter")
    if counter:
        ray.get(ray.get_actor(counter).add.remote(1))


def flag_once(config, iteration):
    if iteration == config.get("flag_at") and not os.path.exists(config["flag"] + ".done"):
        open(config["flag"], "w").close()
        open(config["flag"] + ".done", "w").close()


def die_once(config, iteration):
    if iteration == config.get("die_after") and not os.path.exists(config["marker"]):
        open(config["marker"], "w").close()
        os._exit(1)


def sum_of_lr(config):
    """Adds up ``lr`` through its checkpoints (every iteration reports one);
    ``config["sleep"]`` seconds per iteration; counted (`count_step`); the
    first trial to reach iteration ``config["flag_at"]`` creates the file
    ``config["flag"]``, once (a fault the test switches on mid-study); once
    (the file ``config["marker"]``), its process exits right after reporting
    iteration ``config["die_after"]``."""
    checkpoint = get_checkpoint()
    total, iteration = 0.0, 0
    if checkpoint:
        with checkpoint.as_directory() as path, open(f"{path}/state.json") as file:
            total, iteration = json.load(file)
    while True:
        die_once(config, iteration)
        iteration += 1
        count_step(config)
        flag_once(config, iteration)
        time.sleep(config.get("sleep", 0.0))
        total += get_hparams()["lr"]
        with tempfile.TemporaryDirectory() as path:
            with open(f"{path}/state.json", "w") as file:
                json.dump([total, iteration], file)
            report({"total": total}, checkpoint=tune.Checkpoint.from_directory(path))


def restored_step() -> int:
    """The step the batch's checkpoint holds; 0 on a fresh start."""
    checkpoint = get_checkpoint()
    if not checkpoint:
        return 0
    with checkpoint.as_directory() as folder, open(os.path.join(folder, "step.json")) as file:
        return json.load(file)


def report_step(metrics: dict, step: int) -> None:
    """Report ``metrics`` with a checkpoint holding ``step``."""
    with tempfile.TemporaryDirectory() as folder:
        with open(os.path.join(folder, "step.json"), "w") as file:
            json.dump(step, file)
        report(metrics, checkpoint=tune.Checkpoint.from_directory(folder))


def count_of(name):
    """Iterations counted by the Counter actor ``name``."""
    return ray.get(ray.get_actor(name).get.remote())


@ray.remote(num_cpus=0)
class Counter:
    def __init__(self):
        self.value = 0

    def add(self, amount):
        self.value += amount

    def get(self):
        return self.value


def noisy_descent(config):
    """w <- w - lr * (w + noise); the noise comes from the global RNGs, so the
    result is only reproducible if RNG state travels with checkpoints."""
    random.seed(0)
    np.random.seed(0)
    weights = np.ones(4)
    checkpoint = get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as path:
            with open(os.path.join(path, "state.json")) as file:
                weights = np.array(json.load(file)["weights"])
    while True:
        lr = get_hparams()["lr"]
        noise = np.random.normal(size=4) * 0.01 + random.random() * 0.001
        weights = weights - lr * (weights + noise)
        count_step(config)
        explode = config.get("explode_at")
        if explode is not None and get_iteration() + 1 == explode:
            raise ValueError("exploded on purpose")
        die = config.get("die_once_at")
        if die is not None and get_iteration() + 1 == die and not os.path.exists(config["marker"]):
            open(config["marker"], "w").close()
            os._exit(1)
        metrics = {"loss": float(np.sum(weights**2)), "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
        metrics["signal"] = int(get_iteration() + 1 >= config.get("signal_at", 10**9))
        time.sleep(config.get("sleep", 0))
        if should_checkpoint():
            with tempfile.TemporaryDirectory() as path:
                with open(os.path.join(path, "state.json"), "w") as file:
                    json.dump({"weights": weights.tolist()}, file)
                report(metrics, checkpoint=tune.Checkpoint.from_directory(path))
        else:
            report(metrics)


class NoisyDescent(StageTrainable):
    def setup(self, config):
        np.random.seed(0)
        self.weights = np.ones(4)
        self.lr = None
        self.updates = []

    def update_hparams(self, changed):
        self.updates.append((self.iteration, dict(changed)))
        self.lr = self.hparams["lr"]

    def step(self):
        count_step(self.config)
        self.weights = self.weights - self.lr * (self.weights + np.random.normal(size=4) * 0.01)
        return {"loss": float(np.sum(self.weights**2)), "updates": len(self.updates)}

    def get_state(self):
        return {"weights": self.weights.copy()}

    def set_state(self, state):
        self.weights = state["weights"]


class SavesItsStep(tune.Trainable):
    """A plain Tune class trainable, as in Ray's
    ``custom_checkpointing_with_callback.py``: it reads ``config["lr"]`` as
    a number, and its checkpoint holds the step it was saved at."""

    def setup(self, config):
        self.steps = 0
        self.lr = config["lr"]

    def step(self):
        self.steps += 1
        return {"loss": 1.0 / (self.steps * self.lr)}

    def save_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "steps.json"), "w") as file:
            json.dump(self.steps, file)

    def load_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "steps.json")) as file:
            self.steps = json.load(file)


def fit_under_a_budget(fit, enough, budgets=(8, 40)):
    """``fit(time_budget_s)`` with the first of ``budgets``, and again with
    the next while ``enough(grid)`` is false. A budget counts the workers'
    start, as Tune's does, and a loaded machine can stretch that start past
    a short budget. The tests' bounds hold whatever the budget; the short
    one keeps a test short where the machine allows it."""
    for budget in budgets:
        grid = fit(budget)
        if enough(grid):
            break
    return grid


def ray_processes(title: str) -> list[int]:
    """The pids of this Ray session's processes whose title starts with ``title``."""
    raylet = ray._private.worker.global_worker.node.all_processes["raylet"][0].process.pid
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as file:
                command = file.read().decode(errors="replace")
            with open(f"/proc/{entry}/stat") as file:
                parent = int(file.read().rsplit(")", 1)[1].split()[1])
        except OSError:
            continue
        if command.startswith(title) and parent == raylet:
            found.append(int(entry))
    return found


def kill_ray_processes(title: str) -> int:
    """SIGKILL this Ray session's processes whose title starts with ``title``."""
    found = ray_processes(title)
    for pid in found:
        os.kill(pid, signal.SIGKILL)
    return len(found)


class CorruptsEveryWrite(LocalFileSystem):
    """A local filesystem that stores every checkpoint with a byte flipped
    (each write then fails the store's read-back check)."""

    def pipe_file(self, path, value, **kwargs):
        if "/checkpoints/" in path:
            value = value[:-1] + bytes([value[-1] ^ 0xFF])
        super().pipe_file(path, value, **kwargs)
