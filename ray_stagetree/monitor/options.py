"""The monitor's command-line options, shared by ``python -m
ray_stagetree.monitor`` and ``stagetree monitor`` (light: no Flask)."""

from __future__ import annotations

import argparse

#: The port `serve` listens on unless told otherwise.
DEFAULT_PORT = 8277

#: Seconds the command line waits for a study's folder to appear (a monitor
#: started with, or right after, ``stagetree run``) before it gives up.
DEFAULT_WAIT_S = 60.0


def _seconds(text: str) -> float:
    value = float(text)
    if not value >= 0:
        raise argparse.ArgumentTypeError(f"must be a number of seconds >= 0, got {text!r}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The monitor's options, on ``parser``."""
    parser.add_argument("path", help="the study's experiment directory (a path or a URI)")
    parser.add_argument("--host", default="127.0.0.1", help="address to listen on (default: this machine only)")
    parser.add_argument(
        "--port", type=int, default=DEFAULT_PORT, help=f"port (default {DEFAULT_PORT}; 0: any free one)"
    )
    parser.add_argument(
        "--metric", default=None, help="metric to rank trials by (default: the study's, else the first reported)"
    )
    parser.add_argument(
        "--mode",
        choices=("min", "max"),
        default=None,
        help="whether lower or higher is better (default: the study's, else min)",
    )
    parser.add_argument(
        "--verbose", action="store_true", help="log every HTTP request to the terminal (default: quiet)"
    )
    parser.add_argument(
        "--wait",
        type=_seconds,
        default=DEFAULT_WAIT_S,
        metavar="SECONDS",
        help=f"wait this long for the study's folder to appear (default {DEFAULT_WAIT_S:g}; 0: not at all)",
    )
