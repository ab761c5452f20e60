"""A conditional search space searched by HyperOpt, written the way Ray
Tune's ``hyperopt_conditional_search_space_example.py`` is written, but with
Tune's own search-space API: ``tune.choice`` over dicts, one of which holds a
nested parameter (``mult`` only exists when the activation is "relu").

The trainable reads the nested keys, and the best config is read back nested
(``config["activation"]["activation"]``). The only change from vanilla Tune
is the Tuner import:

    python hyperopt_conditional_search_space.py            # ray_stagetree.Tuner
    python hyperopt_conditional_search_space.py --vanilla  # ray.tune.Tuner

Requires HyperOpt (``pip install hyperopt``).
"""

import argparse

import ray
from ray import tune
from ray.tune.search import ConcurrencyLimiter
from ray.tune.search.hyperopt import HyperOptSearch

from ray_stagetree import Tuner

STEPS = 10
NUM_SAMPLES = 8  # below HyperOpt's n_initial_points: seeded random suggestions


def evaluation_fn(step, width, height, mult=1):
    return (0.1 + width * step / 100) ** (-1) + height * 0.1 * mult


def easy_objective(config):
    activation = config["activation"]["activation"]
    mult = config["activation"].get("mult", 1)
    width, height = config["width"], config["height"]
    for step in range(config["steps"]):
        # Iterative training function - can be any arbitrary training procedure
        intermediate_score = evaluation_fn(step, width, height, mult)
        tune.report({"iterations": step, "mean_loss": intermediate_score, "activation": activation})


config_space = {
    "activation": tune.choice(
        [
            {"activation": "relu", "mult": tune.uniform(1, 2)},
            {"activation": "tanh"},
        ]
    ),
    "width": tune.uniform(0, 20),
    "height": tune.uniform(-100, 100),
    "steps": STEPS,
}


def main(tuner_cls, storage_path=None):
    """Run the study with ``tuner_cls``; returns ((best config, best
    mean_loss), ResultGrid)."""
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False)

    algo = HyperOptSearch(random_state_seed=1234)
    algo = ConcurrencyLimiter(algo, max_concurrent=2)
    tuner = tuner_cls(
        easy_objective,
        tune_config=tune.TuneConfig(
            metric="mean_loss",
            mode="min",
            search_alg=algo,
            num_samples=NUM_SAMPLES,
        ),
        run_config=tune.RunConfig(
            name="hyperopt_conditional_example",
            storage_path=storage_path,
            stop={"training_iteration": STEPS},
            verbose=0,
        ),
        param_space=config_space,
    )
    results = tuner.fit()
    best = results.get_best_result()
    return (best.config, best.metrics["mean_loss"]), results


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--vanilla", action="store_true", help="run with ray.tune.Tuner")
    args = parser.parse_args()
    (config, loss), results = main(tune.Tuner if args.vanilla else Tuner)
    print("Best hyperparameters found were: ", config)
    print("Best activation:", config["activation"]["activation"], "mean_loss", loss)
