"""``python -m ray_stagetree.monitor PATH``: serve a study's web monitor.

`add_arguments` and `run` let another command line (a ``stagetree monitor``
subcommand) offer the same options."""

from __future__ import annotations

import argparse
import sys
import time

from ray_stagetree._extras import MONITOR_MODULES, MissingExtraError, require_all
from ray_stagetree.monitor.options import add_arguments


def run(args: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Serve until Ctrl-C, once the study's folder is there (`wait_for_study`);
    a bad argument or a port in use is reported as ``parser``'s usage error.
    A missing library raises MissingExtraError naming the extra, before
    anything imports it."""
    require_all(MONITOR_MODULES, parser.prog, "monitor")
    from ray_stagetree.monitor.server import serve

    try:
        wait_for_study(args.path, args.wait)
        serve(args.path, args.host, args.port, metric=args.metric, mode=args.mode, verbose=args.verbose)
    except (ValueError, OSError) as error:
        parser.error(str(error))


def wait_for_study(path: str, wait_s: float, poll_s: float = 0.5) -> None:
    """Return once ``path`` (a path or an fsspec URL) is there, or after
    ``wait_s`` seconds: a monitor started right after ``stagetree run`` (or
    its ``--overwrite``, which deletes the folder first) waits for the study
    to appear, saying so once; what is still missing then is refused by the
    server, by name."""
    from ray_stagetree.planning.filesystems import resolve

    filesystem, root = resolve(path)
    if filesystem.exists(root) or wait_s <= 0:
        return
    print(f"waiting up to {wait_s:g}s for a study to appear in {path} (Ctrl-C stops)", flush=True)
    deadline = time.monotonic() + wait_s
    while not filesystem.exists(root) and time.monotonic() < deadline:
        time.sleep(poll_s)


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
