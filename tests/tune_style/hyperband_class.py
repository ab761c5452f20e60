"""Synchronous HyperBand on a class trainable, written the way Ray Tune's
``hyperband_example.py`` is written (its ``MyTrainableClass``: a
``tune.Trainable`` whose ``save_checkpoint`` returns a dict and whose
``load_checkpoint`` takes that dict back).

HyperBand pauses trials at its rungs and resumes the ones it promotes from
their checkpoint, so every reported ``timestep`` equals the trial's
``training_iteration`` only if the restores carried the state over. The only
change from vanilla Tune is the Tuner import:

    python hyperband_class.py            # ray_stagetree.Tuner
    python hyperband_class.py --vanilla  # ray.tune.Tuner
"""

import argparse

import numpy as np
import ray
from ray import tune
from ray.tune.schedulers import HyperBandScheduler

from ray_stagetree import Tuner

MAX_T = 9


class MyTrainableClass(tune.Trainable):
    """Example agent whose learning curve is a sigmoid: "width" sets the
    slope and "height" the maximum reward reached."""

    def setup(self, config):
        self.timestep = 0

    def step(self):
        self.timestep += 1
        v = np.tanh(float(self.timestep) / self.config.get("width", 1))
        v *= self.config.get("height", 1)
        return {"episode_reward_mean": float(v), "timestep": self.timestep}

    def save_checkpoint(self, checkpoint_dir):
        return {"timestep": self.timestep}

    def load_checkpoint(self, checkpoint):
        self.timestep = checkpoint["timestep"]


def main(tuner_cls, storage_path=None):
    """Run the study with ``tuner_cls``; returns ((best config, best
    episode_reward_mean), ResultGrid)."""
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False)

    hyperband = HyperBandScheduler(time_attr="training_iteration", max_t=MAX_T)

    tuner = tuner_cls(
        MyTrainableClass,
        run_config=tune.RunConfig(
            name="hyperband_class_example",
            storage_path=storage_path,
            stop={"training_iteration": MAX_T},
            verbose=0,
        ),
        tune_config=tune.TuneConfig(
            metric="episode_reward_mean",
            mode="max",
            scheduler=hyperband,
        ),
        param_space={"width": tune.grid_search([5, 40]), "height": tune.grid_search([20, 60, 100])},
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
