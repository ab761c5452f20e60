"""A study's end, for its trials' checkpoints: each finished trial's final
checkpoint is checked before the study ends (a lost or damaged one is
trained again, at most `FINAL_RETRAINS` times), then the checkpoints each
trial keeps (Tune's ``CheckpointConfig``) are exported into its folder as
``Result.checkpoint`` and ``Result.best_checkpoints``; and the loop's end
(`LoopEnd`), which does so for each of its studies.

Ray-free: the controller passes the checkpoint store's calls (they return
awaitables) and reopens the trials to train again.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import Any

from ray_stagetree.execution.sealed_storage import WriteFailed
from ray_stagetree.execution.storage import CheckpointUnavailableError
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
    if len(refused) > 1:  # one line a trial: the study's warning names every trial it concerns
        refused = [f"{refused[0]} (and {len(refused) - 1} more of the trial's checkpoints)"]
    return TrialExport(
        kept=_ids(kept),
        best=tuple(best),
        refused=tuple(refused),
        complete=len(written) == len(kept),
    )


class LoopEnd:
    """How a batch loop (`batch_loop.BatchLoop`) ends, once nothing runs and
    no study is unfinished: the finished trials' final checkpoints are
    verified (`retrain_lost_finals`), storage that refused checkpoints is
    asked for the snapshot (the loop pauses while it refuses, as
    mid-study), then each study ends (`StudyTrials.finalize`) and the plan
    and a last snapshot are saved. A plan service's loop never ends: it
    ends each study on its own (`finalize_study`).

    ``studies`` and ``nodes`` are the loop's (`studies.Studies`, `studies.NodeConfigs`);
    ``snapshots`` its `snapshots.Snapshots` (or `snapshots.NoSnapshots`)."""

    def __init__(
        self, plan: Any, store: Any, snapshots: Any, studies: Any, nodes: Any, plan_path: str, filesystem: Any
    ) -> None:
        self._plan = plan
        self._store = store
        self._snapshots = snapshots
        self._studies = studies
        self._nodes = nodes
        self._plan_path = plan_path  # where the plan is saved (Parquet)
        self._filesystem = filesystem  # RunConfig.storage_filesystem

    async def may_end(self) -> bool:
        """Whether the loop ends now. Not while trials were reopened to train
        a lost final checkpoint again, nor while storage refuses the snapshot
        of a study whose checkpoints it refused: they are only in memory."""
        if await self._final_checkpoints_lost():
            return False
        if self._store.unstored and await self._snapshots.ask_storage():
            if self._snapshots.refused_since is None:
                self._store.rewrite_unstored(self._plan)  # storage is back
            return False
        return True

    async def _final_checkpoints_lost(self) -> bool:
        lost = False
        for study in list(self._studies.values()):
            if study.finalized is not False:
                continue
            reopened = await retrain_lost_finals(
                study.trials.values(),
                lambda node_id, iteration: self._store.verify(self._plan, self._plan.nodes[node_id], iteration),
                functools.partial(self._reopen, study),
                study.feed.warn,
            )
            lost = reopened or lost
        return lost

    def _reopen(self, study: Any, state: TrialState) -> None:
        """A finished trial's request opens again where it ended (its final checkpoint is to be trained again)."""
        state.node = self._plan.reopen(state.trial_id).node
        self._nodes.configure(state.node, state, study)

    async def finalize(self) -> None:
        """The loop's end: each study's end, the plan and a last snapshot saved."""
        ends = {study: await study.finalize() for study in list(self._studies.values()) if study.finalized is False}
        plan_refused = self.save_plan()
        await self._snapshots.save_now()
        for study, unwritten in ends.items():
            study.warn_unwritten(unwritten + ([plan_refused] if plan_refused else []))

    def finalize_soon(self, study: Any) -> None:
        """End ``study`` on a loop that goes on (a plan service's), in the
        background and once: while its end is being written (``finalized``
        is None) the loop asks again at every turn, and a second end
        beside the first would write every trial's checkpoints again, into
        the folders the first is writing."""
        if study.finalized is False:
            study.finalized = None
            asyncio.ensure_future(self.finalize_study(study))

    async def finalize_study(self, study: Any) -> None:
        """One study's end on a loop that goes on (a plan service's)."""
        unwritten = await study.finalize()
        study.finalized = True
        plan_refused = self.save_plan()
        study.warn_unwritten(unwritten + ([plan_refused] if plan_refused else []))

    def save_plan(self) -> str | None:
        """Persist the plan (Parquet); what went wrong, or None."""
        try:
            self._plan.save(self._plan_path, self._filesystem)
        except Exception as error:  # each fsspec backend raises its own errors
            return f"the search plan could not be written ({type(error).__name__}: {error})"
        return None
