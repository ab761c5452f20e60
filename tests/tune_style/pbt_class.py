"""Population based training of a class trainable, written the way Ray Tune's
``pbt_example.py`` is written: a ``tune.Trainable`` that checkpoints to a
directory (``save_checkpoint`` writes a file and returns None,
``load_checkpoint`` reads it back) and takes PBT's new config through
``reset_config`` (``reuse_actors=True``).

Toy problem: the accuracy grows by ``1 / q_err`` per step, where
``q_err >= 1`` is how far (as a ratio) the learning rate is from the optimal
one, so no trial gains more than a point per step. The only change from
vanilla Tune is the Tuner import:

    python pbt_class.py            # ray_stagetree.Tuner
    python pbt_class.py --vanilla  # ray.tune.Tuner
"""

import argparse
import json
import os
import random
import time

import ray
from ray import tune
from ray.tune.schedulers import PopulationBasedTraining

from ray_stagetree import Tuner

OPTIMAL_LR = 0.01
PERTURBATION_INTERVAL = 4
TRAINING_ITERATIONS = 16


class PBTBenchmarkExample(tune.Trainable):
    def setup(self, config):
        self.lr = config["lr"]
        self.accuracy = 0.0

    def step(self):
        time.sleep(0.1)  # so that the population trains (and perturbs) side by side
        q_err = max(self.lr, OPTIMAL_LR) / min(self.lr, OPTIMAL_LR)
        self.accuracy += 1.0 / q_err
        return {"mean_accuracy": self.accuracy, "cur_lr": self.lr, "q_err": q_err}

    def save_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "state.json"), "w") as f:
            json.dump({"accuracy": self.accuracy, "lr": self.lr}, f)

    def load_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "state.json")) as f:
            self.accuracy = json.load(f)["accuracy"]

    def reset_config(self, new_config):
        # A reused actor starts a trial afresh (PBT then restores the
        # checkpoint it exploits), so reset the state as setup() does.
        self.lr = new_config["lr"]
        self.accuracy = 0.0
        self.config = new_config
        return True


def main(tuner_cls, storage_path=None):
    """Run the study with ``tuner_cls``; returns ((best config, best
    mean_accuracy), ResultGrid)."""
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False)

    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=PERTURBATION_INTERVAL,
        hyperparam_mutations={
            # distribution for resampling
            "lr": lambda: random.uniform(0.0001, 0.02),
            # allow perturbations within this set of categorical values
            "some_other_factor": [1, 2],
        },
    )
    tuner = tuner_cls(
        PBTBenchmarkExample,
        run_config=tune.RunConfig(
            name="pbt_class_api_example",
            storage_path=storage_path,
            stop={"training_iteration": TRAINING_ITERATIONS},
            verbose=0,
            checkpoint_config=tune.CheckpointConfig(
                checkpoint_frequency=PERTURBATION_INTERVAL,
                checkpoint_score_attribute="mean_accuracy",
                num_to_keep=4,
            ),
        ),
        tune_config=tune.TuneConfig(
            scheduler=pbt,
            metric="mean_accuracy",
            mode="max",
            reuse_actors=True,
        ),
        param_space={
            "lr": tune.grid_search([0.0003, 0.002, OPTIMAL_LR, 0.05]),
            # perturbed, but has no effect on the training
            "some_other_factor": 1,
        },
    )
    results = tuner.fit()
    best = results.get_best_result()
    return (best.config, best.metrics["mean_accuracy"]), results


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--vanilla", action="store_true", help="run with ray.tune.Tuner")
    args = parser.parse_args()
    (config, accuracy), results = main(tune.Tuner if args.vanilla else Tuner)
    print("Best hyperparameters found were: ", config, "mean_accuracy", accuracy)
