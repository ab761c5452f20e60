"""Population based training of a toy function trainable, written the way Ray
Tune's ``pbt_function.py`` example is written.

The trainable reads ``config["lr"]`` as a plain float, checkpoints with
``tune.report(metrics, checkpoint=...)`` and restores with
``tune.get_checkpoint()`` when PBT exploits another trial. The only change
from vanilla Tune is the Tuner import:

    python pbt_function.py            # ray_stagetree.Tuner
    python pbt_function.py --vanilla  # ray.tune.Tuner
"""

import argparse
import json
import os
import tempfile

import ray
from ray import tune
from ray.tune import Checkpoint
from ray.tune.schedulers import PopulationBasedTraining

from ray_stagetree import Tuner

OPTIMAL_LR = 0.01
PERTURBATION_INTERVAL = 4
TRAINING_ITERATIONS = 12


def pbt_function(config):
    """Toy problem: the accuracy grows by ``1 / q_err`` per step, where
    ``q_err >= 1`` says how far (as a ratio) the learning rate is from the
    optimal one. Only ``lr == OPTIMAL_LR`` gains a full point per step, so the
    best trial, and its accuracy, are the same however PBT explores the rest."""
    lr = max(config["lr"], 1e-4)
    checkpoint_interval = config.get("checkpoint_interval", 1)

    accuracy = 0.0
    # Steps count from 1 so that checkpoints fall on the perturbation points
    # (training_iteration == step), as in Tune's example.
    step = 1
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as checkpoint_dir, open(os.path.join(checkpoint_dir, "checkpoint.json")) as f:
            state = json.load(f)
        accuracy = state["acc"]
        step = state["step"] + 1

    while True:  # RunConfig(stop=...) ends the trial
        q_err = max(lr, OPTIMAL_LR) / min(lr, OPTIMAL_LR)
        accuracy += 1.0 / q_err
        metrics = {
            "mean_accuracy": accuracy,
            "cur_lr": lr,
            "lr_type": type(config["lr"]).__name__,  # what the trainable was handed
            "q_err": q_err,
        }
        if step % checkpoint_interval == 0:
            with tempfile.TemporaryDirectory() as tempdir:
                with open(os.path.join(tempdir, "checkpoint.json"), "w") as f:
                    json.dump({"acc": accuracy, "step": step}, f)
                tune.report(metrics, checkpoint=Checkpoint.from_directory(tempdir))
        else:
            tune.report(metrics)
        step += 1


def main(tuner_cls, storage_path=None):
    """Run the study with ``tuner_cls``; returns ((best config, best
    mean_accuracy), ResultGrid)."""
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False)

    pbt = PopulationBasedTraining(
        time_attr="training_iteration",
        perturbation_interval=PERTURBATION_INTERVAL,
        hyperparam_mutations={"lr": tune.uniform(0.0001, 0.02)},
        # Rank the whole population at the same iteration, so which trial is
        # best does not depend on how the trials happened to be scheduled.
        synch=True,
    )
    tuner = tuner_cls(
        pbt_function,
        run_config=tune.RunConfig(
            name="pbt_function_example",
            storage_path=storage_path,
            verbose=0,
            stop={"training_iteration": TRAINING_ITERATIONS},
            checkpoint_config=tune.CheckpointConfig(checkpoint_score_attribute="mean_accuracy", num_to_keep=4),
        ),
        tune_config=tune.TuneConfig(
            scheduler=pbt,
            metric="mean_accuracy",
            mode="max",
            reuse_actors=True,
        ),
        param_space={
            "lr": tune.grid_search([0.0003, 0.001, 0.003, 0.01, 0.03, 0.1]),
            "checkpoint_interval": PERTURBATION_INTERVAL,
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
