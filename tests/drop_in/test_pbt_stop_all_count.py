"""Ray's pbt_convnet_example, shrunk: a class trainable with reset_config,
reuse_actors=True, a Stopper with stop_all and CheckpointConfig(num_to_keep=4)
under PBT. Every step() is counted (the ``counter`` fixture): what runs is what
the study reports, and what it says it executed."""

import os
import time

import numpy as np
import ray
from ray import tune
from ray.tune.schedulers import PopulationBasedTraining

from ray_stagetree import Tuner

MAX_ITER = 20


class Toy(tune.Trainable):
    def setup(self, config):
        self.accuracy, self.lr = 0.0, config["lr"]

    def step(self):
        ray.get(ray.get_actor(self.config["counter"]).add.remote(1))
        time.sleep(0.1)  # so that trials overlap and PBT exploits trials at different iterations
        self.accuracy += 0.01 * (1 - abs(self.lr - 0.3))
        return {"mean_accuracy": self.accuracy}

    def save_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "state"), "w") as file:
            file.write(str(self.accuracy))

    def load_checkpoint(self, checkpoint_dir):
        with open(os.path.join(checkpoint_dir, "state")) as file:
            self.accuracy = float(file.read())

    def reset_config(self, new_config):
        self.lr, self.config = new_config["lr"], new_config
        return True


class StopAtAccuracyOrIterations(tune.Stopper):
    """As the example's CustomStopper: a trial stops at MAX_ITER; every
    trial once one reaches the accuracy (here: never)."""

    def __init__(self):
        self.should_stop = False

    def __call__(self, trial_id, result):
        if result["mean_accuracy"] > 0.96:
            self.should_stop = True
        return self.should_stop or result["training_iteration"] >= MAX_ITER

    def stop_all(self):
        return self.should_stop


def test_pbt_with_reused_actors_and_a_stopper_executes_no_more_than_it_reports(tmp_path, counter):
    from trainables_for_tests import count_of

    grid = Tuner(
        Toy,
        param_space={"lr": tune.uniform(0.001, 1), "momentum": tune.uniform(0.001, 1), "counter": counter},
        tune_config=tune.TuneConfig(
            scheduler=PopulationBasedTraining(
                time_attr="training_iteration",
                perturbation_interval=5,
                hyperparam_mutations={"lr": lambda: np.random.uniform(0.0001, 1), "momentum": [0.8, 0.9, 0.99]},
            ),
            metric="mean_accuracy",
            mode="max",
            num_samples=4,
            reuse_actors=True,
        ),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path),
            name="pbt",
            stop=StopAtAccuracyOrIterations(),
            verbose=0,
            checkpoint_config=tune.CheckpointConfig(
                checkpoint_score_attribute="mean_accuracy", checkpoint_frequency=5, num_to_keep=4
            ),
        ),
    ).fit()
    assert grid.num_errors == 0
    assert all(result.metrics["training_iteration"] == MAX_ITER for result in grid)
    reported = sum(len(result.metrics_dataframe) for result in grid)
    # A trial that clones one whose checkpoint is behind it reports those
    # iterations again, as in Tune: reported may exceed 4 * MAX_ITER; what
    # ran never exceeds what was reported.
    assert count_of(counter) == grid.iterations_executed <= reported
