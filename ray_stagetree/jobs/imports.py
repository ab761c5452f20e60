"""Python objects a job spec names by import path.

``module:attribute`` imports ``module`` (the spec's folder comes first on
``sys.path``, so a module beside the spec is found); ``path/to/script.py:attribute``
loads that file (relative to the spec's folder). Either way, code that lives
beside the spec rather than in an installed package is registered with
cloudpickle to travel by value, so Ray workers can run it even where the
spec's folder is not on their path (a cluster joined by address).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
from types import ModuleType
from typing import Any

from ray import cloudpickle


def load_object(reference: str, base_dir: str) -> Any:
    """The object ``reference`` names, found from ``base_dir`` (the spec's folder).

    Raises ImportError, naming the reference and what was tried, when the
    module or the attribute is missing."""
    module_part, _, attribute = reference.rpartition(":")
    module = _load_script(module_part, base_dir) if module_part.endswith(".py") else _import(module_part, base_dir)
    value: Any = module
    for name in attribute.split("."):
        if not hasattr(value, name):
            raise ImportError(f"{reference!r}: {module_part!r} has no attribute {attribute!r}")
        value = getattr(value, name)
    return value


def _import(name: str, base_dir: str) -> ModuleType:
    if base_dir not in sys.path:
        sys.path.insert(0, base_dir)
    try:
        module = importlib.import_module(name)
    except ModuleNotFoundError as error:
        raise ImportError(
            f"{name!r} cannot be imported ({error}); looked in the spec's folder {base_dir!r} and on sys.path"
        ) from None
    _travel_by_value(module, base_dir)
    return module


def _load_script(path: str, base_dir: str) -> ModuleType:
    path = os.path.normpath(os.path.join(base_dir, os.path.expanduser(path)))
    if not os.path.isfile(path):
        raise ImportError(f"script {path!r} does not exist")
    name = "stagetree_script_" + os.path.splitext(os.path.basename(path))[0]
    if name in sys.modules and getattr(sys.modules[name], "__file__", None) == path:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    return module


def _travel_by_value(module: ModuleType, base_dir: str) -> None:
    """Modules from the spec's folder are not installed: workers get their code."""
    file = getattr(module, "__file__", None)
    if file and os.path.abspath(file).startswith(os.path.abspath(base_dir) + os.sep):
        cloudpickle.register_pickle_by_value(module)
