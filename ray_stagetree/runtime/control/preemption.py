"""Pre-emption of running batches by a time-sharing execution policy
(`planning.time_sharing`): when a batch's quantum is over and other work
comes first, the study controller's reply to its next report makes it
checkpoint one iteration later and stop there.

Ray-free: the controller asks it at each report of a running batch, and
forgets a batch when it ends.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from ray_stagetree.execution.batches import FlushReply


class Preemption:
    """Where each pre-empted batch stops, and whether the study still
    time-shares its workers.

    Parameters
    ----------
    plan:
        The study's `planning.plan.SearchPlan`.
    warn:
        Where a warning for the driver goes.
    clock:
        Seconds now, for the policy's quanta (``time.monotonic``).
    """

    def __init__(self, plan: Any, warn: Callable[[str], None], clock: Callable[[], float] = time.monotonic) -> None:
        self._plan = plan
        self._warn = warn
        self._clock = clock
        self._yield_at: dict[int, int] = {}  # batch id -> where a pre-empted batch stops for other work
        self.off = False  # the trainable keeps no checkpoint where a pre-emption needs one

    def reply(
        self, policy: Any, batch_id: int, node_id: int, iteration: int, can_checkpoint: bool
    ) -> FlushReply | None:
        """The reply to a batch that ``policy`` pre-empts at its report of
        ``iteration`` on ``node_id``, None for the others. It trains one
        more iteration, for which ``should_checkpoint()`` is True in advance
        (a trainable that saves only then still saves there), and stops; its
        requests go back to the plan, resumed from there by priority. A
        trainable that reports no checkpoint there would retrain what the
        batch trained: its batches go on, and the study stops time-sharing."""
        if self.off:
            return None
        plan = self._plan
        at = self._yield_at.get(batch_id)
        if at is not None and iteration >= at and not can_checkpoint:
            self.off = True
            del self._yield_at[batch_id]
            self._warn(
                f"execution_policy={policy!r} pre-empts batches at a checkpoint, but the trainable reported "
                f"none at iteration {iteration} (should_checkpoint() was True): pre-empted trials would train again "
                "from their last checkpoint, so this study no longer time-shares its workers"
            )
            return None
        if at is None:
            if not policy.at_boundary(plan, batch_id, plan.nodes[node_id], iteration, self._clock()):
                return None
            at = self._yield_at[batch_id] = iteration + 1
        needed = plan.needed_until(batch_id)
        saves = [point for _, point in plan.checkpoints_needed(batch_id)] + [at]
        return FlushReply(saves, min(at, needed[1]) if needed is not None else 0, plan.batch_segments(batch_id)[-1][2])

    def ended(self, batch_id: int) -> None:
        """The batch ended (its outcome was read)."""
        self._yield_at.pop(batch_id, None)
