"""A Ray Tune + Hugging Face ``Trainer`` study that shares stages.

A small BERT, built from a ``BertConfig`` (nothing is downloaded), learns
to tell whether a token occurs in generated token sequences.
The trainable is written as Ray's Transformers guide writes one:
``TrainingArguments`` from ``config`` (``learning_rate=config["learning_rate"]``),
``RayTrainReportCallback`` reporting each save with its checkpoint, and
``trainer.train(resume_from_checkpoint=...)`` from the checkpoint
``tune.get_checkpoint()`` gives. What differs from a Ray Tune script:
the ``Tuner`` import, the learning-rate schedule (moved from
``lr_scheduler_type`` into ``param_space`` as sequences, with
``lr_scheduler_type="constant"``), and the callback's import. Each save
(every `STEPS_PER_ITERATION` optimizer steps) is one iteration, and trials
share their step groups until their schedules part: the callback sets
each group's learning rate, so a trial continues live where its schedule
steps, and a forked trial resumes at the same batch of the same epoch with
the Trainer's own random states. (On ray_stagetree, Ray's own callback
does the same: a script importing it shares as written. Under
``ray.tune.Tuner`` Ray 2.60's reports to Ray Train, which a Tune trial
refuses; ray_stagetree's reports to Tune there.) ``--compare`` runs the
same script on ``ray.tune.Tuner``.

    pip install -e ".[examples,transformers]"
    python examples/transformers_study.py            # about a minute on 2 CPUs
    python examples/transformers_study.py --compare  # also the same trials on ray.tune.Tuner
"""

import argparse
import contextlib
import os
import tempfile
import time

import numpy as np
import torch
from ray import tune
from transformers import BertConfig, BertForSequenceClassification, Trainer, TrainingArguments, set_seed

from ray_stagetree import Exponential, MultiStep, Tuner, Warmup, for_ray_tune, init_ray
from ray_stagetree.searchers.variants import tune_grid
from ray_stagetree.trainables.transformers import RayTrainReportCallback

ITERATIONS = 8
STEPS_PER_ITERATION = 10
VOCABULARY, LENGTH = 32, 16


class TokenCounts(torch.utils.data.Dataset):
    """Random token sequences; the label says whether token 1 occurs in the sequence."""

    def __init__(self, num_samples: int, seed: int):
        tokens = np.random.default_rng(seed).integers(0, VOCABULARY, size=(num_samples, LENGTH))
        self.tokens = torch.tensor(tokens)
        self.labels = (self.tokens == 1).any(1).long()

    def __len__(self):
        return len(self.labels)

    def __getitem__(self, index):
        return {"input_ids": self.tokens[index], "labels": self.labels[index]}


def make_data(num_samples: int = 2000):
    return TokenCounts(num_samples, seed=0), TokenCounts(500, seed=1)


def accuracy(prediction):
    return {"accuracy": float((prediction.predictions.argmax(-1) == prediction.label_ids).mean())}


def tiny_bert(seed: int):
    """A two-layer BERT classifier, built from its config: nothing is downloaded."""
    set_seed(seed)
    return BertForSequenceClassification(
        BertConfig(
            vocab_size=VOCABULARY,
            hidden_size=32,
            num_hidden_layers=2,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=LENGTH,
            num_labels=2,
        )
    )


@contextlib.contextmanager
def training_arguments(config, iterations=ITERATIONS):
    """The Trainer's arguments from ``config``: an evaluation and a save (one
    iteration) every `STEPS_PER_ITERATION` steps, into a temporary folder."""
    with tempfile.TemporaryDirectory() as output_dir:
        yield TrainingArguments(
            output_dir=output_dir,
            learning_rate=config["learning_rate"],
            weight_decay=config["weight_decay"],
            lr_scheduler_type="constant",
            per_device_train_batch_size=config["batch_size"],
            max_steps=iterations * STEPS_PER_ITERATION,
            eval_strategy="steps",
            eval_steps=STEPS_PER_ITERATION,
            save_strategy="steps",
            save_steps=STEPS_PER_ITERATION,
            logging_steps=STEPS_PER_ITERATION,
            seed=config["seed"],
            use_cpu=True,
            report_to="none",
            disable_tqdm=True,
        )


def train_transformers(config, data, iterations=ITERATIONS):
    torch.set_num_threads(1)
    model = tiny_bert(config["seed"])
    with training_arguments(config, iterations) as args:
        train_set, test_set = data
        trainer = Trainer(
            model=model,
            args=args,
            train_dataset=train_set,
            eval_dataset=test_set,
            compute_metrics=accuracy,
            callbacks=[RayTrainReportCallback()],
        )
        checkpoint = tune.get_checkpoint()
        if checkpoint:
            with checkpoint.as_directory() as folder:
                trainer.train(resume_from_checkpoint=os.path.join(folder, RayTrainReportCallback.CHECKPOINT_NAME))
        else:
            trainer.train()


def param_space(iterations: int = ITERATIONS):
    """Step decays at half the step groups (three factors) or three quarters
    (two), and a warm-up into an exponential decay: the step decays of a
    batch size train their first half once."""
    return {
        "learning_rate": tune.grid_search(
            [MultiStep(3e-3, [iterations // 2], gamma) for gamma in (0.1, 0.3, 0.5)]
            + [MultiStep(3e-3, [3 * iterations // 4], gamma) for gamma in (0.1, 0.3)]
            + [Warmup(1e-3, 2, Exponential(3e-3, 0.8))]
        ),
        "batch_size": tune.grid_search([16, 32]),
        "weight_decay": 0.01,
        "seed": 0,
    }


def run(
    on_ray_tune=False,
    iterations=ITERATIONS,
    num_samples=2000,
    storage_path=None,
    space=None,
    stage_sharing=True,
    callbacks=(),
):
    """The study (``space``: `param_space` by default) on ``ray_stagetree.Tuner``, or on ``ray.tune.Tuner`` at its
    fastest (``reuse_actors=True``; the grid in the form its variant
    generator takes, `tune_grid`, and the config's sequences as their
    values, `for_ray_tune`); its results and wall time."""
    space, data = param_space(iterations) if space is None else space, make_data(num_samples)
    run_config = tune.RunConfig(
        storage_path=storage_path, stop={"training_iteration": iterations}, verbose=0, callbacks=list(callbacks)
    )
    if on_ray_tune:
        tuner = tune.Tuner(
            tune.with_parameters(for_ray_tune(train_transformers), data=data, iterations=iterations),
            param_space=tune_grid(space),
            tune_config=tune.TuneConfig(metric="eval_accuracy", mode="max", reuse_actors=True),
            run_config=run_config,
        )
    else:
        tuner = Tuner(
            tune.with_parameters(train_transformers, data=data, iterations=iterations),
            param_space=space,
            tune_config=tune.TuneConfig(metric="eval_accuracy", mode="max"),
            run_config=run_config,
            stage_sharing=stage_sharing,
        )
    started = time.perf_counter()
    results = tuner.fit()
    return results, time.perf_counter() - started


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--compare", action="store_true", help="also run the trials on ray.tune.Tuner")
    parser.add_argument(
        "--iterations", type=int, default=ITERATIONS, help=f"step groups per trial (default {ITERATIONS}; >= 4)"
    )
    parser.add_argument("--storage-path", help="where results go (default ~/ray_results)")
    args = parser.parse_args()
    if args.iterations < 4:
        parser.error(
            f"--iterations must be >= 4 (the schedules step at half and three quarters), got {args.iterations}"
        )
    init_ray(include_dashboard=False)
    results, seconds = run(iterations=args.iterations, storage_path=args.storage_path)
    best = results.get_best_result()
    print(f"\n{len(results)} trials, {results.num_errors} errors, {seconds:.1f} s")
    print(f"best accuracy {best.metrics['eval_accuracy']:.4f}")
    print(
        f"step groups executed: {results.iterations_executed}; trial by trial, as Ray Tune runs them: "
        f"{results.trial_by_trial_iterations} ({results.trial_by_trial_iterations / results.iterations_executed:.2f}x)"
    )
    if args.compare:
        baseline, baseline_seconds = run(on_ray_tune=True, iterations=args.iterations, storage_path=args.storage_path)
        print(
            f"ray.tune.Tuner (reuse_actors=True): {baseline_seconds:.1f} s ({baseline_seconds / seconds:.2f}x "
            f"ray_stagetree's time); best accuracy {baseline.get_best_result().metrics['eval_accuracy']:.4f}"
        )


if __name__ == "__main__":
    main()
