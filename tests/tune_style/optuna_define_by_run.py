"""Optuna's define-by-run search space, written the way Ray Tune's
``optuna_define_by_run_example.py`` is written: ``OptunaSearch(space=fn)``
where ``fn`` suggests the parameters on an Optuna trial, conditionally
(``mult`` only exists when the activation is "relu"), and returns the
constants. The sampler is seeded and ``NUM_SAMPLES`` stays below TPE's
``n_startup_trials``, so both Tuners are handed the same configurations.
The only change from vanilla Tune is the Tuner import:

    python optuna_define_by_run.py            # ray_stagetree.Tuner
    python optuna_define_by_run.py --vanilla  # ray.tune.Tuner

Requires Optuna (``pip install optuna``).
"""

import argparse
from typing import Any

import optuna
import ray
from ray import tune
from ray.tune.search import ConcurrencyLimiter
from ray.tune.search.optuna import OptunaSearch

from ray_stagetree import Tuner

STEPS = 5
NUM_SAMPLES = 8  # below TPESampler's n_startup_trials (10): seeded random suggestions


def evaluation_fn(step, width, height, mult=1):
    return (0.1 + width * step / 100) ** (-1) + height * 0.1 * mult


def easy_objective(config):
    width, height, mult = config["width"], config["height"], config.get("mult", 1)
    for step in range(config["steps"]):
        # Iterative training function - can be any arbitrary training procedure
        intermediate_score = evaluation_fn(step, width, height, mult)
        tune.report({"iterations": step, "mean_loss": intermediate_score})


def define_by_run_func(trial) -> dict[str, Any] | None:
    """Define-by-run function to create the search space: suggest on the
    Optuna ``trial`` (no computation here), return the constants."""
    activation = trial.suggest_categorical("activation", ["relu", "tanh"])
    trial.suggest_float("width", 0, 20)
    trial.suggest_float("height", -100, 100)
    # Define-by-run allows for conditional search spaces.
    if activation == "relu":
        trial.suggest_float("mult", 1, 2)
    # Return all constants in a dictionary.
    return {"steps": STEPS}


def main(tuner_cls, storage_path=None):
    """Run the study with ``tuner_cls``; returns ((best config, best
    mean_loss), ResultGrid)."""
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False)

    algo = OptunaSearch(
        space=define_by_run_func,
        metric="mean_loss",
        mode="min",
        sampler=optuna.samplers.TPESampler(seed=7),
    )
    algo = ConcurrencyLimiter(algo, max_concurrent=4)
    tuner = tuner_cls(
        easy_objective,
        tune_config=tune.TuneConfig(
            metric="mean_loss",
            mode="min",
            search_alg=algo,
            num_samples=NUM_SAMPLES,
        ),
        run_config=tune.RunConfig(
            name="optuna_define_by_run_example",
            storage_path=storage_path,
            verbose=0,
        ),
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
