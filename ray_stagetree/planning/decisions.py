"""What a hosted trial scheduler tells the controller about a trial.

The controller (`ray_stagetree.runtime.control.controller`) and the simulator
(`ray_stagetree.simulation.simulated_study`) act on these and nothing else,
whichever scheduler family decided.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ray_stagetree.planning._deprecated import renamed_attributes

# Equal to Ray's ``TrialScheduler.CONTINUE`` / ``STOP`` / ``PAUSE``: the
# adapters that feed Ray's own object pass its answers through unchanged.
CONTINUE = "CONTINUE"  #: the request moves on to the trial's next decision point
STOP = "STOP"  #: nothing more is requested for the trial
PAUSE = "PAUSE"  #: the request ends here; the scheduler resumes the trial later


@renamed_attributes(step="iteration")
@dataclass(frozen=True)
class Exploit:
    """PBT: replace the trial's future with ``source``'s path up to ``iteration``,
    then ``values`` (flattened hyper-parameter names -> explored values).
    ``perturbed``: what Tune appends to the trial's experiment tag for the
    explored config (``@perturbed[lr=0.0100]``), empty where none is shown."""

    source: str
    iteration: int
    values: dict[str, Any]
    perturbed: str = ""


#: One of the words above, or an `Exploit`.
Decision = str | Exploit
