"""``python -m ray_stagetree.monitor PATH``: serve a study's web monitor.

`add_arguments` and `run` let another command line (a ``stagetree monitor``
subcommand) offer the same options."""

from __future__ import annotations

import argparse
import sys

from ray_stagetree._extras import MONITOR_MODULES, MissingExtraError, require_all
from ray_stagetree.monitor.options import add_arguments


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Serve until Ctrl-C; a bad argument, a missing directory or a port in
    use is reported as ``parser``'s usage error. A missing library raises
    MissingExtraError naming the extra, before anything imports it."""
    require_all(MONITOR_MODULES, parser.prog, "monitor")
    from ray_stagetree.monitor.server import serve

    try:
        serve(args.path, args.host, args.port, metric=args.metric, mode=args.mode, verbose=args.verbose)
    except (ValueError, OSError) as error:
        parser.error(str(error))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m ray_stagetree.monitor",
        description="Serve a live web page of a ray_stagetree study: trials, learning curves, stage tree, workers.",
    )
    add_arguments(parser)
    try:
        run(parser.parse_args(argv), parser)
    except MissingExtraError as error:
        sys.exit(f"{parser.prog}: error: {error}")


if __name__ == "__main__":
    main()
