"""``python -m ray_stagetree.monitor PATH``: serve a study's web monitor.

`add_arguments` and `run` let another command line (a ``stagetree monitor``
subcommand) offer the same options."""

from __future__ import annotations

import argparse

from ray_stagetree.monitor.server import DEFAULT_PORT, serve


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The monitor's options, on ``parser``."""
    parser.add_argument("path", help="the study's experiment directory (a path or a URI)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free one)")
    parser.add_argument("--metric", default=None, help="metric to rank trials by (default: the first reported)")
    parser.add_argument("--mode", choices=("min", "max"), default="min", help="whether lower or higher is better")


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Serve until Ctrl-C; a bad argument, a missing directory or a port in
    use is reported as ``parser``'s usage error."""
    try:
        serve(args.path, args.host, args.port, metric=args.metric, mode=args.mode)
    except (ValueError, OSError) as error:
        parser.error(str(error))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m ray_stagetree.monitor",
        description="Serve a live web page of a ray_stagetree study: trials, learning curves, stage tree, workers.",
    )
    add_arguments(parser)
    run(parser.parse_args(argv), parser)


if __name__ == "__main__":
    main()
