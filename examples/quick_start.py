"""The quick start: a Tune function trainable with learning-rate sequences.

Three trials whose learning-rate schedules agree until their first decay:
the epochs they share train once. Runs in about 15 s on a laptop CPU:

    python examples/quick_start.py
"""

import os
import tempfile

import torch
from ray import tune

from ray_stagetree import MultiStep, Tuner, get_checkpoint, get_hparams, report


def train(config):
    torch.manual_seed(0)  # the same data for every trial
    x = torch.linspace(-1, 1, 256).unsqueeze(1)
    y = 3 * x + 0.5 + 0.1 * torch.randn_like(x)
    model = torch.nn.Linear(1, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    checkpoint = get_checkpoint()  # where this stage starts from, or None
    if checkpoint:
        with checkpoint.as_directory() as path:
            state = torch.load(os.path.join(path, "state.pt"))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    while True:  # the runtime ends the function at the horizon
        for group in optimizer.param_groups:
            group["lr"] = get_hparams()["lr"]  # this epoch's value of the trial's sequence
        for _ in range(10):
            optimizer.zero_grad()
            loss = torch.nn.functional.mse_loss(model(x), y)
            loss.backward()
            optimizer.step()
        with tempfile.TemporaryDirectory() as path:
            torch.save(
                {"model": model.state_dict(), "optimizer": optimizer.state_dict()}, os.path.join(path, "state.pt")
            )
            report({"loss": loss.item()}, checkpoint=tune.Checkpoint.from_directory(path))


def main(storage_path=None):
    tuner = Tuner(
        train,
        # Three learning-rate schedules that agree until their first decay: those epochs train once.
        param_space={"lr": tune.grid_search([MultiStep(0.5, [m], 0.1) for m in (4, 8, 12)])},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(stop={"training_iteration": 16}, storage_path=storage_path),
    )
    results = tuner.fit()
    best = results.get_best_result()
    print(f"best: lr={best.config['lr']!r}, loss {best.metrics['loss']:.4f}")
    print(f"epochs trained: {results.iterations_executed}; trial by trial: {results.trial_by_trial_iterations}")
    return results


if __name__ == "__main__":
    main()
