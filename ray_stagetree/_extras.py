"""Optional features and the extra that installs each one's libraries.

A feature imports its library through `require` when it is first used, so
the package imports without it and a user who lacks it is told which extra
to install, not shown an ImportError from deep inside.
"""

from __future__ import annotations

import importlib
from types import ModuleType


def require(module: str, feature: str, extra: str) -> ModuleType:
    """``module``, imported; ImportError naming ``feature`` and the extra
    (``pip install 'ray_stagetree[extra]'``) when it is not installed."""
    try:
        return importlib.import_module(module)
    except ImportError as error:
        raise ImportError(
            f"{feature} needs {error.name or module}, which is not installed: pip install 'ray_stagetree[{extra}]'"
        ) from error
