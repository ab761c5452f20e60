"""Ray Tune's private fields, read through one accessor with a clear error.

Hosting a scheduler on the plan means reading state Ray keeps private:
ASHA's rungs, HyperBand's bracket milestones, PBT's settings and explore
function. Those names are not Ray's API and may change in any release, so
the adapters read them only through `ray_field`: a Ray upgrade that drops
one fails where it is read, naming the field, the scheduler and the Ray
versions the adapter was tested against, rather than with a bare
``AttributeError`` deep in a study, or silently through a ``getattr``
default that would size requests wrongly.
"""

from __future__ import annotations

import types
from typing import Any

#: The Ray versions whose private fields the adapters were tested against.
TESTED_WITH: tuple[str, ...] = ("2.60",)


class RayFieldMissing(RuntimeError):
    """A private field a scheduler adapter reads is not on this Ray's object."""


def ray_field(owner: Any, name: str, scheduler: Any, tested_with: tuple[str, ...] = TESTED_WITH) -> Any:
    """``owner``'s attribute ``name``, a private field of Ray Tune read on
    behalf of the hosted ``scheduler`` (``owner`` is the scheduler, one of
    its brackets, or a module of Ray's)."""
    try:
        return getattr(owner, name)
    except AttributeError:
        import ray

        where = owner.__name__ if isinstance(owner, types.ModuleType) else type(owner).__name__
        raise RayFieldMissing(
            f"ray_stagetree hosts {type(scheduler).__name__} by reading {where}.{name}, a private field of "
            f"Ray Tune that Ray {ray.__version__} does not have; the adapter was tested against Ray "
            f"{', '.join(tested_with)}: install one of those, or update ray_stagetree.trial_schedulers for this Ray"
        ) from None
