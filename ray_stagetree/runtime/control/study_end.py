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
from typing import Any

from ray_stagetree.execution.storage import CheckpointUnavailableError
from ray_stagetree.planning.lifecycle import TERMINATED
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
        points = state.path_checkpoints() if state.status == TERMINATED else []
        if points and points[-1][1] == max(state.rows) and state.final_retrains <= FINAL_RETRAINS:
            finals.setdefault((points[-1][0].node_id, points[-1][1]), []).append(state)
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
    """Export the checkpoints each ended trial keeps (`TrialState.exposed_checkpoints`
    under ``checkpoint_config``) through ``export(node, iteration,
    folder)``, all at once, into ``state.checkpoints`` and
    ``state.best_checkpoints``, then ``remove_others(trial_dir, kept
    folder names)`` (a restored study's trials drop what an earlier run
    kept and ``num_to_keep`` no longer does, as Tune does); what storage
    refused (`WriteFailed`'s reasons) is returned, and a checkpoint lost
    meanwhile (None) left out."""
    trials = list(trials)
    exported, best, kept_folders = [], {}, {}
    for state in trials:
        kept, best[state.trial_id] = state.exposed_checkpoints(checkpoint_config)
        if kept:
            kept_folders[state.dirname] = [folder for _, _, folder in kept]
            state.checkpoints = []  # a restored trial's earlier export is replaced
        exported += [(state, at, export(node, at, f"{state.dirname}/{folder}")) for node, at, folder in kept]
    paths = await asyncio.gather(*(write for _, _, write in exported))
    refused: list[str] = []
    written: dict[tuple[str, int], str] = {}
    for (state, iteration, _), path in zip(exported, paths):
        if isinstance(path, WriteFailed):
            refused.append(path.reason)
        elif path is not None:
            state.checkpoints.append((path, state.checkpoint_metrics(iteration)))
            written[state.trial_id, iteration] = path
    await asyncio.gather(*(remove_others(trial_dir, folders) for trial_dir, folders in kept_folders.items()))
    for state in trials:
        state.best_checkpoints = [
            (written[state.trial_id, iteration], state.checkpoint_metrics(iteration))
            for iteration in best[state.trial_id]
            if (state.trial_id, iteration) in written
        ]
    return refused
