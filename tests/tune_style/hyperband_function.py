"""Synchronous HyperBand on a function trainable with a finite loop, written
the way Ray Tune's ``hyperband_function_example.py`` is written.

Some trials train for fewer steps than HyperBand's ``max_t`` (their loop
ends, the function returns and the trial is done); HyperBand pauses the others
at its rungs and resumes them from their checkpoint when it promotes them.
The only change from vanilla Tune is the Tuner import:

    python hyperband_function.py            # ray_stagetree.Tuner
    python hyperband_function.py --vanilla  # ray.tune.Tuner
"""

import argparse
import json
import os
import tempfile

import numpy as np
import ray
from ray import tune
from ray.tune import Checkpoint
from ray.tune.schedulers import HyperBandScheduler

from ray_stagetree import Tuner

MAX_T = 9


def train_func(config):
    step = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir, open(os.path.join(checkpoint_dir, "checkpoint.json")) as f:
            step = json.load(f)["timestep"] + 1

    for timestep in range(step, config["steps"]):
        v = np.tanh(float(timestep) / config.get("width", 1))
        v *= config.get("height", 1)

        # Checkpoint every step: HyperBand pauses trials at its rungs and
        # resumes the ones it promotes from their latest checkpoint.
        with tempfile.TemporaryDirectory() as temp_checkpoint_dir:
            with open(os.path.join(temp_checkpoint_dir, "checkpoint.json"), "w") as f:
                json.dump({"timestep": timestep}, f)
            tune.report(
                {"episode_reward_mean": float(v), "timestep": timestep},
                checkpoint=Checkpoint.from_directory(temp_checkpoint_dir),
            )


def main(tuner_cls, storage_path=None):
    """Run the study with ``tuner_cls``; returns ((best config, best
    episode_reward_mean), ResultGrid)."""
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False)

    # HyperBand early stopping, configured with `episode_reward_mean` as the
    # objective and `training_iteration` as the time unit.
    hyperband = HyperBandScheduler(max_t=MAX_T)

    tuner = tuner_cls(
        train_func,
        run_config=tune.RunConfig(
            name="hyperband_function_example",
            storage_path=storage_path,
            stop={"training_iteration": MAX_T},
            verbose=0,
        ),
        tune_config=tune.TuneConfig(
            metric="episode_reward_mean",
            mode="max",
            scheduler=hyperband,
        ),
        param_space={
            "height": tune.grid_search([10.0, 40.0, 70.0, 100.0]),
            # trials of 5 steps return before max_t
            "steps": tune.grid_search([5, MAX_T]),
            "width": 4.0,
        },
    )
    results = tuner.fit()
    best = results.get_best_result()
    return (best.config, best.metrics["episode_reward_mean"]), results


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--vanilla", action="store_true", help="run with ray.tune.Tuner")
    args = parser.parse_args()
    (config, reward), results = main(tune.Tuner if args.vanilla else Tuner)
    print("Best hyperparameters found were: ", config, "episode_reward_mean", reward)
