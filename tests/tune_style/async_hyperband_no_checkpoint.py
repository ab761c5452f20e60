"""Asynchronous HyperBand (ASHA) on a function trainable that never
checkpoints, written the way Ray Tune's ``async_hyperband_example.py`` is
written: a finite ``for step in range(config["steps"])`` loop reporting with
``tune.report(metrics)`` only, and ``num_samples`` random configurations
(sampled from a seeded generator, so both Tuners try the same ones).

ASHA only ever stops trials (it never pauses them), so nothing has to be
resumed. The only change from vanilla Tune is the Tuner import:

    python async_hyperband_no_checkpoint.py            # ray_stagetree.Tuner
    python async_hyperband_no_checkpoint.py --vanilla  # ray.tune.Tuner
"""

import argparse

import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler
from ray.tune.search import BasicVariantGenerator

from ray_stagetree import Tuner

MAX_T = 20
NUM_SAMPLES = 10


def evaluation_fn(step, width, height):
    return (0.1 + width * step / 100) ** (-1) + height * 0.1


def easy_objective(config):
    width, height = config["width"], config["height"]
    for step in range(config["steps"]):
        # Iterative training function - can be any arbitrary training procedure
        intermediate_score = evaluation_fn(step, width, height)
        tune.report({"iterations": step, "mean_loss": intermediate_score})


def main(tuner_cls, storage_path=None):
    """Run the study with ``tuner_cls``; returns ((best config, best
    mean_loss), ResultGrid)."""
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False)

    scheduler = ASHAScheduler(
        time_attr="training_iteration",
        grace_period=2,  # Minimum training iterations before stopping
        max_t=MAX_T,  # Maximum training iterations
    )
    tuner = tuner_cls(
        easy_objective,
        run_config=tune.RunConfig(
            name="asynchyperband_test",
            storage_path=storage_path,
            stop={"training_iteration": 9999},  # the loop ends first
            verbose=0,
        ),
        tune_config=tune.TuneConfig(
            metric="mean_loss",
            mode="min",
            scheduler=scheduler,
            search_alg=BasicVariantGenerator(random_state=2024),
            num_samples=NUM_SAMPLES,
        ),
        param_space={
            "steps": MAX_T,
            "width": tune.uniform(10, 100),
            "height": tune.uniform(0, 100),
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
    print("Best hyperparameters found: ", config, "mean_loss", loss)
