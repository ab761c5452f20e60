"""Optional features and the extra that installs each one's libraries.

A feature imports its library through `require` when it is first used, so
the package imports without it and a user who lacks it is told which extra
to install, not shown an ImportError from deep inside. A feature that would
fail late (the monitor of a study, once Ray has started) checks all of its
libraries up front with `require_all`.
"""

from __future__ import annotations

import importlib
from types import ModuleType

#: What the web monitor imports (the ``monitor`` extra): Flask serves the page on
#: werkzeug's server, matplotlib draws the curves.
MONITOR_MODULES = ("flask", "werkzeug", "matplotlib")


class MissingExtraError(ImportError):
    """An optional feature's library is not installed; the message names the extra."""


def require(module: str, feature: str, extra: str) -> ModuleType:
    """``module``, imported; MissingExtraError (an ImportError) naming ``feature``
    and the extra (``pip install "ray_stagetree[extra]"``) when it is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise MissingExtraError(
            f'{feature} needs {error.name or module}, which is not installed: pip install "ray_stagetree[{extra}]"'
        ) from error


def require_all(modules: tuple[str, ...], feature: str, extra: str) -> None:
    """Every one of ``modules`` importable, else `require`'s error for the first missing."""
    for module in modules:
        require(module, feature, extra)
