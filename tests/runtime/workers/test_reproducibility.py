"""Reproducible studies end to end: a rerun reports bit-identical metrics,
shared stages agree with trials trained alone, repeats train each
configuration under its own seed and are summarised per configuration."""

import math
import random
import tempfile

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from ray import tune  # noqa: E402

from ray_stagetree import MultiStep, Tuner, get_checkpoint, get_hparams, report  # noqa: E402

HORIZON = 4


def unseeded_training(config):
    """Never seeds anything itself: torch initialises the model, NumPy draws
    the data, Python's `random` the label noise, torch the dropout masks."""
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Linear(16, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    checkpoint = get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as path:
            model.load_state_dict(torch.load(f"{path}/model.pt", weights_only=True))
    while True:
        for group in optimizer.param_groups:
            group["lr"] = get_hparams()["lr"]
        x = torch.from_numpy(np.random.normal(size=(64, 8))).float()
        y = x.sum(dim=1, keepdim=True) + random.gauss(0.0, 0.1)
        loss = torch.nn.functional.mse_loss(model(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        with tempfile.TemporaryDirectory() as path:
            torch.save(model.state_dict(), f"{path}/model.pt")
            report({"loss": loss.item()}, checkpoint=tune.Checkpoint.from_directory(path))


def study(tmp_path, name, **options):
    space = {"lr": tune.grid_search([MultiStep(0.05, [2], 0.1), MultiStep(0.05, [2], 0.5)])}
    tuner = Tuner(
        unseeded_training,
        param_space=space,
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(
            name=name, storage_path=str(tmp_path), stop={"training_iteration": HORIZON}, verbose=0
        ),
        **options,
    )
    return tuner.fit()


def curves(grid):
    """Every trial's losses by its configuration (the decay after iteration 2) and seed."""
    return {(r.config["lr"].gamma, r.config.get("seed")): r.metrics_dataframe["loss"].tolist() for r in grid}


@pytest.mark.long
def test_reproducible_reruns_are_bit_identical_and_shared_stages_equal_trials_alone(tmp_path, ray_session):
    first = study(tmp_path, "first", reproducible=True, seed=7, repeats=2)
    again = study(tmp_path, "again", reproducible=True, seed=7, repeats=2)
    alone = study(tmp_path, "alone", reproducible=True, seed=7, repeats=2, stage_sharing=False)

    assert len(first) == 4 and not first.errors
    assert sorted(r.config["seed"] for r in first) == [7, 7, 8, 8]
    # Compared with ==: bit-identical floats, not approximately equal ones.
    assert curves(first) == curves(again) == curves(alone)
    # Repeats never share (their seeds differ from iteration 0); the two
    # configurations of one seed share their first 2 iterations.
    assert first.iterations_executed == 2 * (2 + 2 * 2) < alone.iterations_executed == 4 * HORIZON
    # Different seeds train differently.
    by_seed = curves(first)
    assert by_seed[0.1, 7] != by_seed[0.1, 8]

    frame = first.get_repeats_dataframe()
    assert len(frame) == 2 and frame["num_repeats"].tolist() == [2, 2]
    for _, row in frame.iterrows():
        losses = [curve[-1] for (gamma, _), curve in by_seed.items() if gamma == row["config/lr/gamma"]]
        assert row["loss_mean"] == pytest.approx(np.mean(losses))
        assert row["loss_std"] == pytest.approx(np.std(losses, ddof=1))
        assert sorted(row["seeds"]) == [7, 8] and row["num_errors"] == 0


def test_without_reproducible_the_same_configuration_trains_differently(tmp_path, ray_session):
    # The control: two trials of one configuration, trained apart, unseeded:
    # NumPy's and Python's generators start from the OS's entropy.
    tuner = Tuner(
        unseeded_training,
        param_space={"lr": MultiStep(0.05, [2], 0.1)},
        tune_config=tune.TuneConfig(num_samples=2),
        run_config=tune.RunConfig(storage_path=str(tmp_path), stop={"training_iteration": 2}, verbose=0),
        stage_sharing=False,
    )
    first, second = (result.metrics_dataframe["loss"].tolist() for result in tuner.fit())
    assert not any(map(math.isnan, first)) and first != second
