"""Job specs: a study described in one YAML or JSON file, checked before
anything runs, and built into a `ray_stagetree.Tuner` (the ``stagetree``
command line runs them).

Names load on first use: `SpecError` and the schema need no Ray, so a
command that only reports a bad spec, or prints its help, starts fast.
"""

from ray_stagetree.jobs.errors import SpecError

_LAZY = {
    "JobSpec": "ray_stagetree.jobs.spec",
    "to_param_space": "ray_stagetree.jobs.domains",
    "to_declarative": "ray_stagetree.jobs.domains",
}


def __getattr__(name: str):
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'ray_stagetree.jobs' has no attribute {name!r}")


__all__ = ["JobSpec", "SpecError", "to_param_space", "to_declarative"]
