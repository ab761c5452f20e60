"""Job specs: a study described in one YAML or JSON file, checked before
anything runs, and built into a `ray_stagetree.Tuner` (the ``stagetree``
command line runs them)."""

from ray_stagetree.jobs.domains import to_declarative, to_param_space
from ray_stagetree.jobs.errors import SpecError
from ray_stagetree.jobs.spec import JobSpec

__all__ = ["JobSpec", "SpecError", "to_param_space", "to_declarative"]
