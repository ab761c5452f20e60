"""What a stage worker's reports tell the user once per study, and count:
a report without the checkpoint it was asked for, and trainables that
restart where a config value they hold fixed changes. Ray-free."""

from __future__ import annotations

import collections
from collections.abc import Callable

from ray_stagetree.execution.batches import BatchOutcome


class WorkerNotices:
    """The once-per-study warnings a loop's worker reports call for, through ``warn``."""

    def __init__(self, warn: Callable[[str], None]) -> None:
        self._warn = warn
        self._warned_missing_checkpoint = False
        # Restarts where a config value the trainable holds fixed changed, by key (the progress line's mode).
        self.restarts: collections.Counter[str] = collections.Counter()

    def heard(self, outcome: BatchOutcome) -> None:
        if outcome.missing_checkpoints and not self._warned_missing_checkpoint:
            self._warned_missing_checkpoint = True
            self._warn(
                f"iteration {outcome.missing_checkpoints[0]} needs a checkpoint (should_checkpoint() was True) but "
                "report() got none. Trials that branch off a shared prefix will train it again, and a paused "
                "trial holds its worker's memory until resumed (its trainable waits, parked): pass "
                "checkpoint=tune.Checkpoint.from_directory(...) to report() where should_checkpoint() is True "
                "(this warning is shown once per study)"
            )
        keys = [key for _, changed in outcome.restarts for key in changed]
        if keys and not self.restarts:
            iteration, changed = outcome.restarts[0]
            names = ", ".join(f"config[{key!r}]" for key in changed)
            self._warn(
                f"the trainable reads {names} from its config, where it stays as it was when the trainable started, "
                f"so trials restart from the checkpoint they report where it changes (first at iteration "
                f"{iteration}), as Tune's PBT restarts a trial; stages are still shared. A trainable that reads "
                "get_hparams() each iteration continues live instead (this message is shown once per study)"
            )
        self.restarts.update(keys)
