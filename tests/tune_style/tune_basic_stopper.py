"""Grid search over a function trainable with an endless loop, ended by a
``ray.tune.stopper`` object instead of a ``stop`` dict, written the way Ray
Tune's ``tune_basic_example.py`` and its stopping guide write it.

``CombinedStopper(MaximumIterationStopper, TrialPlateauStopper)``: a trial
stops once its ``mean_loss`` has plateaued, or after ``MAX_ITER`` iterations.
Which stopper ends a trial depends only on its own (deterministic) curve, so
both Tuners run every trial for the same number of iterations. The only
change from vanilla Tune is the Tuner import:

    python tune_basic_stopper.py            # ray_stagetree.Tuner
    python tune_basic_stopper.py --vanilla  # ray.tune.Tuner
"""

import argparse

import ray
from ray import tune
from ray.tune.stopper import CombinedStopper, MaximumIterationStopper, TrialPlateauStopper

from ray_stagetree import Tuner

MAX_ITER = 30


def evaluation_fn(step, width, height):
    return (0.1 + width * step / 100) ** (-1) + height * 0.1


def easy_objective(config):
    width, height = config["width"], config["height"]
    step = 0
    while True:  # the stopper ends the trial
        intermediate_score = evaluation_fn(step, width, height)
        tune.report({"iterations": step, "mean_loss": intermediate_score})
        step += 1


def main(tuner_cls, storage_path=None):
    """Run the study with ``tuner_cls``; returns ((best config, best
    mean_loss), ResultGrid)."""
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False)

    stopper = CombinedStopper(
        MaximumIterationStopper(max_iter=MAX_ITER),
        TrialPlateauStopper(metric="mean_loss", std=0.05, num_results=4, grace_period=4),
    )
    tuner = tuner_cls(
        easy_objective,
        run_config=tune.RunConfig(
            name="tune_basic_stopper_example",
            storage_path=storage_path,
            stop=stopper,
            verbose=0,
        ),
        tune_config=tune.TuneConfig(metric="mean_loss", mode="min"),
        param_space={
            # width 1 never plateaus before MAX_ITER; wider curves flatten sooner
            "width": tune.grid_search([1.0, 10.0, 50.0]),
            "height": tune.grid_search([-10.0, 10.0]),
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
