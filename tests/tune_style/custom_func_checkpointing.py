"""A function trainable that writes its own checkpoints, written the way Ray
Tune's ``custom_func_checkpointing.py`` is written: it reports with
``tune.report(metrics, checkpoint=Checkpoint.from_directory(dir))`` at
every step, resumes from ``tune.get_checkpoint()`` when it is handed one, and
the best result's ``checkpoint`` holds its last ``checkpoint.json``.

The only change from vanilla Tune is the Tuner import:

    python custom_func_checkpointing.py            # ray_stagetree.Tuner
    python custom_func_checkpointing.py --vanilla  # ray.tune.Tuner
"""

import argparse
import json
import os
import tempfile

import ray
from ray import tune
from ray.tune import Checkpoint

from ray_stagetree import Tuner

STEPS = 10


def evaluation_fn(step, width, height):
    return (0.1 + width * step / 100) ** (-1) + height * 0.1


def train_func(config):
    step = 0
    width, height = config["width"], config["height"]

    # Restore from the last checkpoint, if there is one
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir:
            with open(os.path.join(checkpoint_dir, "checkpoint.json")) as f:
                state = json.load(f)
            step = state["step"] + 1

    for current_step in range(step, config["steps"]):
        intermediate_score = evaluation_fn(current_step, width, height)
        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            with open(os.path.join(temp_checkpoint_dir, "checkpoint.json"), "w") as f:
                json.dump({"step": current_step, "mean_loss": intermediate_score}, f)
            tune.report(
                {"iterations": current_step, "mean_loss": intermediate_score},
                checkpoint=Checkpoint.from_directory(temp_checkpoint_dir),
            )


def main(tuner_cls, storage_path=None):
    """Run the study with ``tuner_cls``; returns ((best config, best
    mean_loss), ResultGrid)."""
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False)

    tuner = tuner_cls(
        train_func,
        run_config=tune.RunConfig(
            name="custom_func_checkpointing_example",
            storage_path=storage_path,
            stop={"training_iteration": STEPS},
            verbose=0,
        ),
        tune_config=tune.TuneConfig(metric="mean_loss", mode="min"),
        param_space={
            "steps": STEPS,
            "width": tune.grid_search([10, 55, 100]),
            "height": tune.grid_search([10.0, 40.0]),
        },
    )
    results = tuner.fit()
    best = results.get_best_result()
    return (best.config, best.metrics["mean_loss"]), results


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--vanilla", action="store_true", help="run with ray.tune.Tuner")
    args = parser.parse_args()
    (config, loss), results = main(tune.Tuner if args.vanilla else Tuner)
    print("Best hyperparameters found were: ", config, "mean_loss", loss)
    print("Best checkpoint: ", results.get_best_result().checkpoint)
