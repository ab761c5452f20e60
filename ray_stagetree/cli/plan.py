"""``stagetree plan``: a dry run of a job spec (trials, merge rate, stage
tree, estimated cost), nothing trained."""

from __future__ import annotations

import argparse
import json
import sys

from ray_stagetree._extras import require
from ray_stagetree.cli.common import (
    OK,
    CommandError,
    load_spec,
    no_plan,
    open_experiment,
)
from ray_stagetree.validation import duration


def plan(args: argparse.Namespace) -> int:
    from ray_stagetree.jobs.dry_run import draw_picture, draw_text, dry_run
    from ray_stagetree.jobs.experiments import cost_model
    from ray_stagetree.planning.cost import CostModel

    if args.draw:  # before the dry run, not after it
        require("matplotlib", "stagetree plan --draw", "monitor")
    spec = load_spec(args.spec)
    cost = CostModel(default_seconds_per_iteration=args.seconds_per_iteration)
    calibration = f"{args.seconds_per_iteration:g} s per iteration"
    if args.cost_from:
        timed = open_experiment(args.cost_from).plan or no_plan(args.cost_from)
        try:
            cost = cost_model(timed)
        except ValueError as error:
            raise CommandError(f"--cost-from {args.cost_from!r}: {error}") from None
        calibration = f"seconds per iteration fitted to {args.cost_from}"
    try:
        result = dry_run(spec, cost, horizon=args.horizon, samples=args.samples)
    except (TypeError, ValueError) as error:  # a drawn trial's config is invalid, or no horizon
        raise CommandError(str(error)) from None
    if args.json:
        print(
            json.dumps(
                {
                    "trials": len(result.trials),
                    "horizon": result.horizon,
                    "sampled": result.sampled,
                    "merge_rate": result.merge_rate,
                    "unique_iterations": result.unique_iterations,
                    "trial_by_trial_iterations": result.total_iterations,
                    "stages": len(result.tree.stages),
                    "worker_hours": result.shared_seconds / 3600,
                    "trial_by_trial_worker_hours": result.trial_by_trial_seconds / 3600,
                    "makespan_bound_hours": result.makespan_bound(args.workers) / 3600,
                    "workers": args.workers,
                },
                indent=2,
            )
        )
    else:
        origin = (
            "drawn at random from the space (the searcher's own depend on results)"
            if result.sampled
            else "as the study draws them"
        )
        print(f"{len(result.trials)} trials of {result.horizon} iterations, {origin}")
        print(
            f"merge rate {result.merge_rate:.2f}: {result.unique_iterations} unique iterations, "
            f"{result.total_iterations} trial by trial"
        )
        print(f"stage tree: {len(result.tree.stages)} stages\n")
        print(draw_text(result.tree, args.max_lines))
        print(
            f"\nestimated worker time ({calibration}): {duration(result.shared_seconds)} with stage sharing, "
            f"{duration(result.trial_by_trial_seconds)} trial by trial"
        )
        print(
            f"on {args.workers} worker{'s' if args.workers != 1 else ''}: no schedule ends in under "
            f"{duration(result.makespan_bound(args.workers))}"
        )
    if args.draw:
        draw_picture(result.tree, args.draw, result.horizon)
        print(f"stage tree drawn in {args.draw}", file=sys.stderr if args.json else sys.stdout)
    return OK
