"""``stagetree status``, ``show``, ``ls`` and ``monitor``: how studies stand,
read from their experiment folders."""

from __future__ import annotations

import argparse
import json

from ray_stagetree.cli.common import (
    OK,
    CommandError,
    default_storage,
    latest_experiment,
    number,
    open_experiment,
    print_best,
    print_table,
)

#: What ``stagetree status`` says of a study, by the state its status file records.
STATES = {
    "ended": "ended",
    "running": "running (or its driver died: stagetree restore continues it)",
    "interrupted": "interrupted (stagetree restore continues it)",
    "failed": "stopped by an error (stagetree restore continues it)",
}


def status(args: argparse.Namespace) -> int:
    from ray_stagetree.jobs.experiments import age

    experiment = open_experiment(args.path) if args.path else latest_experiment(args.storage_path)
    counts = experiment.counts()
    state = STATES.get(experiment.state or "", "running, or stopped before its end (stagetree restore continues it)")
    print(f"{experiment.path}: {state}; last update {age(experiment.last_update)}")
    print("trials: " + (", ".join(f"{count} {status}" for status, count in sorted(counts.items())) or "none yet"))
    trained = experiment.trained()
    if trained:
        # Unique iterations: a `run` line's "executed" also counts what a restore trained again.
        print(f"trained {trained[0]} unique iterations in {trained[1]:.1f} worker-seconds")
    print_best(experiment, args)
    return OK


def show(args: argparse.Namespace) -> int:
    from ray_stagetree.jobs.experiments import config_text

    experiment = open_experiment(args.path) if args.path else latest_experiment(args.storage_path)
    args.path = experiment.path  # the status that follows is this experiment's
    metric, mode = experiment.metric_and_mode(args.metric, args.mode)
    if args.json:
        print(
            json.dumps(
                {
                    "path": experiment.path,
                    "ended": experiment.ended,
                    "metric": metric,
                    "mode": mode,
                    "trials": [
                        {
                            "trial": trial.dirname,
                            "status": trial.status,
                            "iterations": trial.iterations,
                            "config": trial.config,
                            "last_result": trial.last,
                            "error": trial.error,
                        }
                        for trial in experiment.trials
                    ],
                },
                indent=2,
                default=str,
            )
        )
        return OK
    rows = [
        (
            trial.dirname,
            trial.status,
            str(trial.iterations),
            number(trial.last.get(metric)),
            trial.error or config_text(trial.config),
        )
        for trial in experiment.trials
    ]
    print_table(["trial", "status", "iter", metric or "metric", "config (or error)"], rows)
    return status(args)


def ls(args: argparse.Namespace) -> int:
    from ray_stagetree.jobs.experiments import age, list_experiments
    from ray_stagetree.planning.lifecycle import ERROR

    storage = args.storage_path or default_storage()
    try:
        experiments = list_experiments(storage)
    except FileNotFoundError as error:
        raise CommandError(str(error)) from None
    rows = []
    for experiment in experiments:
        metric, mode = experiment.metric_and_mode()
        best = experiment.best(metric, mode)
        counts = experiment.counts()
        rows.append(
            (
                experiment.path.rstrip("/").rsplit("/", 1)[-1],
                "ended" if experiment.ended else "not ended",
                str(len(experiment.trials)),
                str(counts.get(ERROR, 0)),
                f"{metric}={number(best.last[metric])}" if best else "-",
                age(experiment.last_update),
            )
        )
    if not rows:
        print(f"no ray_stagetree experiments in {storage}")
        return OK
    print_table(["experiment", "state", "trials", "errors", "best", "updated"], rows)
    return OK


def monitor(args: argparse.Namespace) -> int:
    from ray_stagetree.monitor.__main__ import run

    run(args, args.subparser)
    return OK
