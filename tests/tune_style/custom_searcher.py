"""A custom search algorithm, written the way Ray Tune's docs write one: a
``Searcher`` subclass that proposes a fixed list of configurations and then
returns ``Searcher.FINISHED`` from ``suggest`` (as BayesOptSearch does when
it is done), so ``num_samples=-1`` runs exactly that list.

The only change from vanilla Tune is the Tuner import:

    python custom_searcher.py            # ray_stagetree.Tuner
    python custom_searcher.py --vanilla  # ray.tune.Tuner
"""

import argparse

import ray
from ray import tune
from ray.tune.search import Searcher

from ray_stagetree import Tuner

STEPS = 6

CANDIDATES = [
    {"width": 2.0, "height": 10.0},
    {"width": 8.0, "height": 30.0},
    {"width": 4.0, "height": -20.0},
    {"width": 1.0, "height": 5.0},
    {"width": 16.0, "height": 50.0},
]


class ListSearcher(Searcher):
    """Suggests each configuration of a fixed list once, then says it is done."""

    def __init__(self, configs, metric=None, mode=None):
        super().__init__(metric=metric, mode=mode)
        self._configs = list(configs)

    def suggest(self, trial_id):
        if not self._configs:
            return Searcher.FINISHED
        return self._configs.pop(0)

    def on_trial_complete(self, trial_id, result=None, error=False):
        pass


def evaluation_fn(step, width, height):
    return (0.1 + width * step / 100) ** (-1) + height * 0.1


def easy_objective(config):
    width, height = config["width"], config["height"]
    for step in range(STEPS):
        # Iterative training function - can be any arbitrary training procedure
        intermediate_score = evaluation_fn(step, width, height)
        tune.report({"iterations": step, "mean_loss": intermediate_score})


def main(tuner_cls, storage_path=None):
    """Run the study with ``tuner_cls``; returns ((best config, best
    mean_loss), ResultGrid)."""
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=2, include_dashboard=False, configure_logging=False)

    tuner = tuner_cls(
        easy_objective,
        tune_config=tune.TuneConfig(
            metric="mean_loss",
            mode="min",
            search_alg=ListSearcher(CANDIDATES),
            num_samples=-1,  # until the searcher returns FINISHED
        ),
        run_config=tune.RunConfig(
            name="custom_searcher_example",
            storage_path=storage_path,
            stop={"training_iteration": STEPS},
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
