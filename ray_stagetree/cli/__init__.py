"""``stagetree``: run, submit, plan and inspect studies described by job specs.

One function per subcommand (`running.run`, `plan.plan`, ...), each taking
the parsed arguments and returning the exit code; `SUBCOMMANDS` lists them, so
a new one is a function and an entry there.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable
from typing import Any

from ray_stagetree._extras import MissingExtraError
from ray_stagetree._version import __version__
from ray_stagetree.cli import plan, reading, running
from ray_stagetree.cli.common import EXIT_CODES, FAILED, INTERRUPTED, USAGE, CommandError
from ray_stagetree.jobs.errors import SpecError
from ray_stagetree.monitor.options import add_arguments as add_monitor_arguments

SUBCOMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "run": running.run,
    "submit": running.submit,
    "plan": plan.plan,
    "status": reading.status,
    "show": reading.show,
    "ls": reading.ls,
    "restore": running.restore,
    "monitor": reading.monitor,
}


def parser() -> argparse.ArgumentParser:
    """The ``stagetree`` argument parser, one sub-parser per subcommand."""
    main = argparse.ArgumentParser(
        prog="stagetree",
        description="Run, submit, plan and inspect ray_stagetree studies described by a job spec (YAML or JSON).",
        epilog=EXIT_CODES,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    main.add_argument("--version", action="version", version=f"stagetree (ray_stagetree) {__version__}")
    commands = main.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def command(name: str, help: str) -> argparse.ArgumentParser:
        return commands.add_parser(
            name, help=help, description=help, epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter
        )

    def ray_options(sub: argparse.ArgumentParser) -> None:
        sub.add_argument(
            "--address",
            help="Ray cluster to join ('local' starts a new one); default: RAY_ADDRESS, "
            "else the latest `ray start` on this machine, else a local Ray",
        )
        sub.add_argument("--num-cpus", type=int, help="CPUs of a Ray started locally (default: every core)")

    def experiment_options(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("--storage-path", help="where the experiment folder goes (overrides run_config.storage_path)")
        sub.add_argument("--name", help="the experiment folder's name (overrides run_config.name)")
        again = sub.add_mutually_exclusive_group()
        again.add_argument(
            "--resume",
            action="store_true",
            help="if the folder holds this study already, continue it (as `stagetree restore`); else start it",
        )
        again.add_argument(
            "--overwrite",
            action="store_true",
            help="if the folder holds an experiment already, delete it and start again",
        )

    run = command("run", "run the study a spec describes, here")
    run.add_argument("spec", help="the job spec (.yaml, .yml or .json)")
    experiment_options(run)
    ray_options(run)

    submit = command(
        "submit",
        "run the study on a Ray cluster through Ray Jobs (working directory and "
        "requirements.txt shipped as its runtime environment)",
    )
    submit.add_argument("spec", help="the job spec, inside the working directory")
    submit.add_argument("--address", required=True, help="the cluster's Ray Jobs address, e.g. http://head:8265")
    submit.add_argument("--working-dir", default=".", help="folder shipped to the cluster (default: this one)")
    submit.add_argument(
        "--requirements",
        help="pip requirements file for the job (default: requirements.txt in "
        "the working directory, when there is one)",
    )
    submit.add_argument("--python", default="python", help="the Python command on the cluster (default: python)")
    submit.add_argument("--no-wait", action="store_true", help="return once submitted instead of following the logs")
    experiment_options(submit)

    plan = command(
        "plan", "dry run: trials, merge rate, the stage tree (text, and --draw for a picture), estimated worker time"
    )
    plan.add_argument("spec", help="the job spec")
    plan.add_argument("--horizon", type=_positive_int, help="iterations per trial, when the spec sets none")
    plan.add_argument(
        "--samples", type=_positive_int, help="trials to plan for a searcher or num_samples=-1 (default: num_samples)"
    )
    plan.add_argument(
        "--seconds-per-iteration",
        type=_positive_float,
        default=1.0,
        help="cost of one iteration for the estimate (default: 1)",
    )
    plan.add_argument(
        "--cost-from", metavar="EXPERIMENT", help="fit the cost model to the timings of an ended study instead"
    )
    plan.add_argument("--workers", type=_positive_int, default=1, help="workers for the wall-time bound (default: 1)")
    plan.add_argument(
        "--draw", metavar="FILE", type=_picture_path, help="also draw the stage tree to FILE (.svg, .png or .pdf)"
    )
    plan.add_argument("--max-lines", type=_positive_int, default=200, help="stages drawn as text (default: 200)")
    plan.add_argument("--json", action="store_true", help="figures as JSON instead of text")

    for name, help in (
        ("status", "how a study stands: trials by status, what was trained, the best result"),
        ("show", "a study's trials table, then its status"),
    ):
        sub = command(name, help)
        sub.add_argument(
            "path",
            nargs="?",
            help="the experiment folder (local path or URI; default: the latest one under --storage-path)",
        )
        sub.add_argument("--storage-path", help="where to look for the latest experiment (default: ~/ray_results)")
        sub.add_argument("--metric", help="metric ranking the trials (default: the spec's)")
        sub.add_argument("--mode", choices=("min", "max"), help="whether the metric is minimised or maximised")
        if name == "show":
            sub.add_argument("--json", action="store_true", help="the trials as JSON")

    ls = command("ls", "the experiments in a storage folder")
    ls.add_argument("storage_path", nargs="?", help="folder holding experiments (default: ~/ray_results)")

    restore = command("restore", "continue a study that stopped (Ctrl-C, a lost driver) from its experiment folder")
    restore.add_argument("path", help="the experiment folder")
    restore.add_argument("--spec", help="the job spec (default: the copy `stagetree run` saved in the folder)")
    restore.add_argument(
        "--resume-errored", action="store_true", help="run errored trials again from their latest checkpoint"
    )
    restore.add_argument("--restart-errored", action="store_true", help="start errored trials' results over")
    restore.add_argument("--no-resume-unfinished", action="store_true", help="end unfinished trials where they stood")
    ray_options(restore)

    monitor = command(
        "monitor",
        "serve a live web page of a study (running or ended): trials, learning curves, "
        "stage tree, workers; Ctrl-C stops it",
    )
    add_monitor_arguments(monitor)
    monitor.set_defaults(subparser=monitor)  # the monitor reports a bad port or path as its usage error
    return main


def _positive(kind: type, what: str) -> Callable[[str], Any]:
    """An argparse type: ``kind(text)``, refused unless > 0, naming the value."""

    def parse(text: str) -> Any:
        try:
            value = kind(text)
        except ValueError:
            value = 0
        if not value > 0:
            raise argparse.ArgumentTypeError(f"must be {what}, got {text!r}")
        return value

    return parse


_positive_int = _positive(int, "an int >= 1")
_positive_float = _positive(float, "a number > 0")


def _picture_path(text: str) -> str:
    if os.path.splitext(text)[1].lower() not in (".svg", ".png", ".pdf"):
        raise argparse.ArgumentTypeError(f"must end in .svg, .png or .pdf, got {text!r}")
    return text


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``stagetree`` console script; returns the exit code."""
    args = parser().parse_args(argv)
    try:
        return SUBCOMMANDS[args.command](args)
    except SpecError as error:
        print(f"stagetree: error: {error}", file=sys.stderr)
        return USAGE
    except CommandError as error:
        print(f"stagetree: error: {error}", file=sys.stderr)
        return error.code
    except MissingExtraError as error:
        print(f"stagetree: error: {error}", file=sys.stderr)
        return FAILED
    except KeyboardInterrupt:
        print("stagetree: interrupted", file=sys.stderr)
        return INTERRUPTED
