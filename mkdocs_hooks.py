"""MkDocs hook: let the API reference (mkdocstrings, which reads the source
without importing it) find ``ray_stagetree.searchers`` and
``ray_stagetree.trainables``.

setup.cfg installs those two from the top-level folders ``searchers/`` and
``trainables/`` (``package_dir``), which a reader of the source tree cannot
know. Before the build, ``build/api_src/ray_stagetree/`` is laid out as the
installed package: a copy of each module and a link to each subpackage of ``ray_stagetree/`` plus
``searchers`` and ``trainables``. mkdocs.yml points mkdocstrings there.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

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


def on_config(config: Any, **kwargs: Any) -> Any:
    lay_out_package()
    return config
