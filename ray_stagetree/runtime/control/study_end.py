"""A study's end, for its trials' checkpoints: each finished trial's final
checkpoint is checked before the study ends (a lost or damaged one is
trained again, at most `FINAL_RETRAINS` times), then the checkpoints each
trial keeps (Tune's ``CheckpointConfig``) are exported into its folder as
``Result.checkpoint`` and ``Result.best_checkpoints``.

Ray-free: the controller passes the checkpoint store's calls (they return
awaitables) and reopens the trials to train again.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ray_stagetree.execution.storage import CheckpointUnavailableError
from ray_stagetree.runtime.control.checkpoint_store import WriteFailed
from ray_stagetree.runtime.control.trials import TrialState

logger = logging.getLogger(__name__)

#: Retrains of a trial's final checkpoint found damaged in storage, before it
#: ends without one (a storage that damages every file it keeps).
FINAL_RETRAINS = 2


async def retrain_lost_finals(
    trials: Iterable[TrialState],
    verify: Callable[[int, int], Awaitable[None]],
    retrain: Callable[[TrialState], None],
    warn: Callable[[str], None],
) -> bool:
    """``retrain`` the finished trials whose checkpoint at their last result
    is lost or corrupt (``verify(node_id, iteration)`` raises
    `CheckpointUnavailableError`); True if any. Each point is verified once
    (trials that end together share it), and a trial is retrained for it at
    most `FINAL_RETRAINS` times: storage that damages everything it keeps
    must not retrain it forever (it ends without it, with a warning)."""
    finals: dict[tuple[int, int], list[TrialState]] = {}
    for state in trials:
        final = state.final_checkpoint()
        if final is not None and state.final_retrains <= FINAL_RETRAINS:
            node, iteration = final
            finals.setdefault((node.node_id, iteration), []).append(state)
    lost = False
    for (node_id, iteration), states in finals.items():
        try:
            await verify(node_id, iteration)
        except CheckpointUnavailableError as error:
            for state in states:
                state.final_retrains += 1
                if state.final_retrains > FINAL_RETRAINS:
                    warn(
                        f"the final checkpoint of trial {state.name or state.trial_id} was found damaged "
                        f"{FINAL_RETRAINS} times in storage ({error}); it ends without it"
                    )
                    continue
                logger.warning("%s; training it again", error)
                retrain(state)
                lost = True
    return lost


async def export_kept_checkpoints(
    trials: Iterable[TrialState],
    export: Callable[[Any, int, str], Awaitable[str | WriteFailed | None]],
    remove_others: Callable[[str, list[str]], Awaitable[None]],
    checkpoint_config: Any,
) -> list[str]:
    """`export_trial_checkpoints` for every trial, all at once; what storage refused."""
    outcomes = await asyncio.gather(
        *(export_trial_checkpoints(state, export, remove_others, checkpoint_config) for state in trials)
    )
    return [reason for outcome in outcomes for reason in outcome.refused]


@dataclass(frozen=True)
class TrialExport:
    """What `export_trial_checkpoints` wrote of a trial: the checkpoints
    (node id, iteration, folder) and best iterations it kept then, and what
    storage refused."""

    kept: tuple[tuple[int, int, str], ...]
    best: tuple[int, ...]
    refused: tuple[str, ...]
    complete: bool
    """Every kept checkpoint written (none refused, none lost meanwhile)."""

    def still_kept(self, state: TrialState, checkpoint_config: Any) -> bool:
        """Whether this export wrote all that ``state`` keeps now (its final
        checkpoint may have been trained again since, a write may have failed)."""
        kept, best = state.exposed_checkpoints(checkpoint_config)
        return self.complete and (self.kept, self.best) == (_ids(kept), tuple(best))


def _ids(kept: list[tuple[Any, int, str]]) -> tuple[tuple[int, int, str], ...]:
    return tuple((node.node_id, at, folder) for node, at, folder in kept)


async def export_trial_checkpoints(
    state: TrialState,
    export: Callable[[Any, int, str], Awaitable[str | WriteFailed | None]],
    remove_others: Callable[[str, list[str]], Awaitable[None]],
    checkpoint_config: Any,
) -> TrialExport:
    """Export the checkpoints an ended trial keeps (`TrialState.exposed_checkpoints`
    under ``checkpoint_config``) through ``export(node, iteration, folder)``
    into ``state.checkpoints`` and ``state.best_checkpoints``, then
    ``remove_others(trial_dir, kept folder names)`` (a restored study's
    trials drop what an earlier run kept and ``num_to_keep`` no longer
    does, as Tune does); a checkpoint lost meanwhile (None) is left out."""
    kept, best = state.exposed_checkpoints(checkpoint_config)
    paths = await asyncio.gather(*(export(node, at, f"{state.dirname}/{folder}") for node, at, folder in kept))
    refused: list[str] = []
    written: dict[int, str] = {}
    for (_, iteration, _), path in zip(kept, paths):
        if isinstance(path, WriteFailed):
            refused.append(path.reason)
        elif path is not None:
            written[iteration] = path
    if kept:  # a restored trial's earlier export is replaced
        state.checkpoints = [(path, state.checkpoint_metrics(iteration)) for iteration, path in written.items()]
        await remove_others(state.dirname, [folder for _, _, folder in kept])
    state.best_checkpoints = [
        (written[iteration], state.checkpoint_metrics(iteration)) for iteration in best if iteration in written
    ]
    return TrialExport(
        kept=_ids(kept),
        best=tuple(best),
        refused=tuple(refused),
        complete=len(written) == len(kept),
    )
