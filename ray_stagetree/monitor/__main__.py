"""``python -m ray_stagetree.monitor PATH``: serve a study's web monitor."""

from __future__ import annotations

import argparse

from ray_stagetree.monitor.server import DEFAULT_PORT, serve


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m ray_stagetree.monitor",
        description="Serve a live web page of a ray_stagetree study: trials, learning curves, stage tree, workers.",
    )
    parser.add_argument("path", help="the study's experiment directory (a path or a URI)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free one)")
    parser.add_argument("--metric", default=None, help="metric to rank trials by (default: the first reported)")
    parser.add_argument("--mode", choices=("min", "max"), default="min", help="whether lower or higher is better")
    args = parser.parse_args(argv)
    try:
        serve(args.path, args.host, args.port, metric=args.metric, mode=args.mode)
    except (ValueError, OSError) as error:  # a bad argument, no such directory, a port in use
        parser.error(str(error))


if __name__ == "__main__":
    main()
