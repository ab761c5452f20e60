"""Trainables of the data-parallel tests (imported by name on the ranks)."""

from __future__ import annotations

import os
import tempfile

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from ray_stagetree import get_checkpoint, get_hparams, report
from ray_stagetree.trainables.torch import ResumableLoader, apply_hparams

SAMPLES = 40


def _data() -> torch.utils.data.TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, 3, generator=generator)
    y = x @ torch.tensor([[1.0], [-2.0], [0.5]]) + 0.1 * torch.randn(SAMPLES, 1, generator=generator)
    return torch.utils.data.TensorDataset(torch.arange(SAMPLES), x, y)


def ddp_regression(config):
    """A linear model trained with DDP over a sharded `ResumableLoader`;
    each iteration reports the loss, every sample index the ranks trained on
    (gathered), and a draw from each rank's torch generator (their RNG
    states must survive checkpoints). ``config["die_at"]``: rank 1 kills its
    process at that iteration once (a flag file marks it done)."""
    rank = dist.get_rank()
    torch.manual_seed(1 + rank)  # each rank its own stream: a checkpoint must bring every one back
    model = torch.nn.Linear(3, 1)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    loader = ResumableLoader(_data(), batch_size=get_hparams()["batch_size"], seed=0)
    checkpoint = get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as path:
            state = torch.load(os.path.join(path, "state.pt"), weights_only=True)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        loader.load_state_dict(state["loader"])
    while True:
        hparams = get_hparams()
        apply_hparams(optimizer, {"lr": hparams["lr"]})
        loader.set_batch_size(hparams["batch_size"])
        seen, loss = [], torch.zeros(())
        for index, x, y in loader.take(2):
            seen += index.tolist()
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(ddp(x), y)
            loss.backward()
            optimizer.step()
        iteration = ray_stagetree_iteration() + 1
        flag = config.get("die_at")
        if flag and rank == 1 and iteration == flag[1] and not os.path.exists(flag[0]):
            open(flag[0], "w").close()
            os._exit(1)
        everyone: list = [None] * dist.get_world_size()
        dist.all_gather_object(everyone, (seen, float(loss.detach()), float(torch.rand(()))))
        metrics = {
            "loss": sum(part[1] for part in everyone) / len(everyone),
            "seen": sorted(i for part in everyone for i in part[0]),
            "draws": [part[2] for part in everyone],
            "rank": rank,
            "world_size": dist.get_world_size(),
        }
        with tempfile.TemporaryDirectory() as path:
            if rank == 0:
                state = {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "loader": loader.state_dict(),
                }
                torch.save(state, os.path.join(path, "state.pt"))
            report(metrics, checkpoint=ray_checkpoint(path) if rank == 0 else None)


def ray_stagetree_iteration() -> int:
    from ray_stagetree.runtime.workers.session import get_iteration

    return get_iteration()


def ray_checkpoint(path: str):
    from ray import tune

    return tune.Checkpoint.from_directory(path)


def unsharded_batches(batch_sizes: list[int]) -> list[list[int]]:
    """The sample indices one unsharded loader hands out, two batches per
    iteration, at each iteration's batch size."""
    loader = ResumableLoader(_data(), batch_size=batch_sizes[0], seed=0, num_replicas=1, rank=0)
    seen = []
    for batch_size in batch_sizes:
        loader.set_batch_size(batch_size)
        seen.append(sorted(i for index, _, _ in loader.take(2) for i in index.tolist()))
    return seen


def v2_train_loop(config):
    """Ray Train v2's train_loop_per_worker: hyper-parameters from its
    train_loop_config, a checkpoint per epoch through ray.train.report."""
    import json

    import ray.train

    context = ray.train.get_context()
    state = {"epoch": 0, "weight": 1.0}
    checkpoint = ray.train.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as path, open(os.path.join(path, "state.json")) as file:
            state = json.load(file)
    while state["epoch"] < config["epochs"]:
        state["epoch"] += 1
        state["weight"] *= 1 - config["lr"]
        with tempfile.TemporaryDirectory() as path:
            with open(os.path.join(path, "state.json"), "w") as file:
                json.dump(state, file)
            metrics = {"loss": state["weight"], "lr": config["lr"], "world_size": context.get_world_size()}
            checkpoint = ray.train.Checkpoint.from_directory(path)
            ray.train.report(metrics, checkpoint=checkpoint, checkpoint_dir_name=f"epoch_{state['epoch']}")


def v2_driver_function(config):
    """Ray's Train v2 + Tune pattern: a trial builds a TorchTrainer and calls
    its fit(); TuneReportCallback passes the workers' reports on to Tune."""
    import ray.train
    from ray.train import ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.tune.integration.ray_train import TuneReportCallback

    workers = config.get("workers", 1)
    if config.get("report_first"):  # a result before the Train run: no stage worker grows into its group
        ray.tune.report({"warmed_up": True})
    TorchTrainer(
        v2_train_loop,
        train_loop_config={"lr": config["lr"], "epochs": config["epochs"]},
        scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 0.25}),
        run_config=ray.train.RunConfig(
            name=f"train_{ray.tune.get_context().get_trial_id()}",
            storage_path=config.get("train_storage"),
            callbacks=[TuneReportCallback()],
        ),
    ).fit()
