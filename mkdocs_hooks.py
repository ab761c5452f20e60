"""MkDocs hooks: the `stagetree` command's reference page, written from its
own argument parser (so it cannot drift from ``--help``), docstring examples
shown without the doctest directives that keep them out of the test run,
and a layout that
lets the API reference (mkdocstrings, which reads the source
without importing it) find ``ray_stagetree.searchers`` and
``ray_stagetree.trainables``.

setup.cfg installs those two from the top-level folders ``searchers/`` and
``trainables/`` (``package_dir``), which a reader of the source tree cannot
know. Before the build, ``build/api_src/ray_stagetree/`` is laid out as the
installed package: a copy of each module and a link to each subpackage of ``ray_stagetree/`` plus
``searchers`` and ``trainables``. mkdocs.yml points mkdocstrings there.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import sys
from pathlib import Path
from typing import Any

from mkdocs.structure.files import File, Files

ROOT = Path(__file__).resolve().parent
VIEW = ROOT / "build" / "api_src"
MAPPED = {"searchers": ROOT / "searchers", "trainables": ROOT / "trainables"}


def lay_out_package(view: Path = VIEW) -> Path:
    """The installed package's layout, as links into the checkout."""
    package = view / "ray_stagetree"
    if view.exists():
        shutil.rmtree(view)
    package.mkdir(parents=True)
    entries = {entry.name: entry for entry in (ROOT / "ray_stagetree").iterdir() if entry.name != "__pycache__"}
    entries.update(MAPPED)
    for name, target in entries.items():
        if target.is_dir():
            os.symlink(target, package / name, target_is_directory=True)
        else:  # a copy: the reader takes a module's folder from where its file really lies
            shutil.copy2(target, package / name)
    return view


# Laid out when MkDocs loads this file, before the plugins read their
# configuration: mkdocstrings takes its search paths as they are then, and
# leaves out one that does not exist yet (a clean checkout's first build).
lay_out_package()


CLI_PAGE = "api/cli.md"


def cli_reference() -> str:
    """Every ``stagetree`` subcommand's ``--help``, as the terminal prints it."""
    os.environ["COLUMNS"] = "80"  # argparse wraps to the terminal: the page must not depend on it
    if str(ROOT) not in sys.path:  # this checkout's command, whichever one pip installed
        sys.path.insert(0, str(ROOT))
    from ray_stagetree.cli import parser

    top = parser()
    (commands,) = [action for action in top._actions if isinstance(action, argparse._SubParsersAction)]
    parts = [
        "# The `stagetree` command\n",
        "Written from the command's own parser at each build: what `--help` prints. "
        "The [job specs and the `stagetree` command](../guides/cli.md) guide shows them at work.\n",
        f"```text\n{top.format_help().rstrip()}\n```\n",
    ]
    for name, sub in commands.choices.items():
        parts.append(f"## stagetree {name}\n\n```text\n{sub.format_help().rstrip()}\n```\n")
    return "\n".join(parts)


def on_files(files: Files, config: Any, **kwargs: Any) -> Files:
    files.append(File.generated(config, CLI_PAGE, content=cli_reference()))
    return files


#: A doctest directive at the end of an example's line (``# doctest: +SKIP``):
#: for the test run, not the reader.
DOCTEST_DIRECTIVE = re.compile(r"[ \t]*# doctest: [+-][A-Z_]+(?:, *[+-][A-Z_]+)*")


def on_page_content(html: str, **kwargs: Any) -> str:
    return DOCTEST_DIRECTIVE.sub("", html)
