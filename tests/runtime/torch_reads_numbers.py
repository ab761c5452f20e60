"""A Ray Tune trainable as Tune's documentation writes one: it reads its
hyper-parameters once, as numbers (``SGD(lr=config["lr"])``,
``DataLoader(batch_size=config["batch_size"])``), shuffles with a
``torch.Generator`` of its own, restores from ``tune.get_checkpoint()`` as
Tune's PBT needs (setting the learning rate after loading the optimizer's
state, as Ray's PBT examples do) and reports a checkpoint every epoch.
Only the schedule moved: ``lr`` is a `MultiStep` in ``param_space``.
"""

import os
import tempfile

import torch
from ray import tune
from torch.utils.data import DataLoader, TensorDataset

from ray_stagetree import MultiStep

EPOCHS = 6


def data():
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(96, 8, generator=generator)
    y = (x @ torch.randn(8, 1, generator=generator)).squeeze(1) + 0.1 * torch.randn(96, generator=generator)
    return TensorDataset(x, y)


def train_fn(config):
    torch.manual_seed(config.get("seed", 0))
    shuffle = torch.Generator()
    shuffle.manual_seed(1)
    loader = DataLoader(data(), batch_size=config["batch_size"], shuffle=True, generator=shuffle)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=config["lr"], momentum=0.9)
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder:
            state = torch.load(os.path.join(folder, "state.pt"))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        start = state["epoch"]
        for group in optimizer.param_groups:  # the value this run was started with
            group["lr"] = config["lr"]
    for epoch in range(start, EPOCHS):
        total = 0.0
        for x, y in loader:
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            loss.backward()
            optimizer.step()
            total += loss.item()
        with tempfile.TemporaryDirectory() as folder:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "epoch": epoch + 1}
            torch.save(state, os.path.join(folder, "state.pt"))
            tune.report(
                {"loss": total, "lr": optimizer.param_groups[0]["lr"]},
                checkpoint=tune.Checkpoint.from_directory(folder),
            )


PARAM_SPACE = {
    "lr": tune.grid_search([MultiStep(0.05, [2], 0.1), MultiStep(0.05, [2], 0.3), MultiStep(0.05, [4], 0.1)]),
    "batch_size": 16,
}


def main(tuner_class, storage_path, **tuner_options):
    tuner = tuner_class(
        train_fn,
        param_space=PARAM_SPACE,
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(storage_path=storage_path, stop={"training_iteration": EPOCHS}, verbose=0),
        **tuner_options,
    )
    return tuner.fit()
