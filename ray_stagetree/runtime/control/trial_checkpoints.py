"""A study's checkpoints in its trials' folders, and the driver told of
them: each as it is registered where a callback acts on it (Tune's
``on_trial_save`` / ``on_checkpoint`` moments), the kept ones as each
trial terminates and, for the others, at the study's end (`study_end`);
and, under ``num_to_keep``, those no trial keeps any more removed from
storage as the trials go on (`checkpoint_retention`)."""

from __future__ import annotations

import asyncio
import collections
import functools
from collections.abc import Iterable, Mapping
from typing import Any

from ray.tune.result import SHOULD_CHECKPOINT

from ray_stagetree.execution.retention import save_frequency, saves_at_end
from ray_stagetree.planning.lifecycle import ENDED, PAUSED, TERMINATED
from ray_stagetree.planning.plan import SearchPlan
from ray_stagetree.runtime.control.checkpoint_retention import unkept_checkpoints
from ray_stagetree.runtime.control.driver_feed import DriverFeed
from ray_stagetree.runtime.control.study_end import TrialExport, export_kept_checkpoints, export_trial_checkpoints
from ray_stagetree.runtime.control.trials import CHECKPOINT_DIR_NAME, TrialState, checkpoint_folder_name


class TrialCheckpoints:
    """Writes a study's checkpoints into its trials' folders through
    ``store`` (the loop's `CheckpointStore`) and tells ``feed``.

    ``each``: a callback wants every checkpoint as it is registered
    (`StudySpec.export_each_checkpoint`); else only the kept ones are
    written, at the end. ``trials``: the study's, by id."""

    def __init__(
        self,
        store: Any,
        plan: SearchPlan,
        feed: DriverFeed,
        each: bool,
        checkpoint_config: Any,
        trials: Mapping[str, TrialState],
    ) -> None:
        self._store = store
        self._plan = plan
        self._feed = feed
        self._each = each
        self._checkpoint_config = checkpoint_config
        self._trials = trials
        # num_to_keep: the checkpoints no trial keeps go, checked again once the trials
        # still training have registered about one more each (`_sweep`).
        self._retains = getattr(checkpoint_config, "num_to_keep", None) is not None
        self._registered = 0
        self._sweep_after = 1
        self._exporting: collections.Counter[tuple[int, int]] = collections.Counter()  # being written (`each`)
        # Each trial's latest checkpoint being written as registered, which announces it after the ones before.
        self._writes: dict[str, asyncio.Future] = {}
        # The kept checkpoints of the trials that terminated, being written or written (`ended`).
        self._exports: dict[str, asyncio.Future[TrialExport]] = {}
        self._ending = False  # `at_end` writes what is left: no trial starts its own writes beside it

    def saved(self, state: TrialState, node: Any, iteration: int) -> None:
        """A checkpoint on the trial's path was registered at ``iteration``;
        a shared stage's belongs to every trial it serves. Where a callback
        wants each, it is written into the trial's folder, numbered as Tune
        numbers them, and announced once written."""
        if self._retains:
            self._registered += 1
            if self._registered >= self._sweep_after:
                self._sweep()
        if iteration not in state.rows:  # not a result of its: it ended before, or the stage serves others there
            return
        if not state.shows_checkpoint(iteration):  # the runtime's own, where Tune would not have saved the trial
            return
        named = state.rows[iteration].get(CHECKPOINT_DIR_NAME)  # a function's report (else a class's save)
        folder = f"{state.dirname}/{named or checkpoint_folder_name(state.saves)}"
        state.saves += 1
        if self._each:
            earlier = self._writes.get(state.trial_id)
            self._writes[state.trial_id] = asyncio.ensure_future(self._write(state, node, iteration, folder, earlier))
        else:
            self.ended(state)  # a terminated trial's final checkpoint may come after its last result

    async def _write(
        self, state: TrialState, node: Any, iteration: int, folder: str, earlier: asyncio.Future | None
    ) -> None:
        """Write the checkpoint; announce it after the trial's earlier ones, in the order they were registered."""
        self._exporting[node.node_id, iteration] += 1
        try:
            path = await self._store.export(self._plan, node, iteration, folder)
        finally:
            self._exporting -= collections.Counter({(node.node_id, iteration): 1})
        if earlier is not None:
            await earlier
        if isinstance(path, str):  # None: lost meanwhile; WriteFailed: the study's end writes it again
            state.announced_checkpoints |= {path}
            self._feed.event("checkpoint", state, path=path, iteration=iteration)

    def _sweep(self) -> None:
        """Remove the checkpoints no trial keeps any more (`checkpoint_retention`),
        but for those being written into a trial's folder: the next sweep asks again."""
        for node, iteration in unkept_checkpoints(self._trials, self._plan, self._checkpoint_config):
            if (node.node_id, iteration) not in self._exporting:
                self._store.discard(self._plan, node, iteration)
        self._registered = 0
        self._sweep_after = max(1, sum(state.status not in ENDED for state in self._trials.values()))

    def decided(self, state: TrialState, iteration: int, row: dict[str, Any], population: Any) -> None:
        """Where Tune saves a class trainable after this result (`TrialState.tune_saves`):
        every ``checkpoint_frequency``-th iteration, where the result asks
        (``should_checkpoint``), where its scheduler paused it (not to take
        a PBT exploit), and where PBT (``population``, or None) found it a
        top trial. Its end: `ended`."""
        every = save_frequency(self._checkpoint_config)
        if (
            (every > 0 and iteration % every == 0)
            or row.get(SHOULD_CHECKPOINT)
            or (state.status == PAUSED and not (population is not None and population.exploits(state.trial_id)))
            or (population is not None and population.top_checkpoint(state.trial_id) == iteration)
        ):
            state.note_tune_save(iteration)

    def asked(self, state: TrialState, iteration: int) -> bool:
        """Whether a callback asked for the trial's checkpoint at ``iteration``
        (`DriverFeed.asked_at`): Tune saves it there."""
        if not self._feed.asked_at(state.trial_id, iteration):
            return False
        state.note_tune_save(iteration)
        return True

    def ended(self, state: TrialState) -> None:
        """Once the trial terminated and its checkpoint at its last result is
        in (at a batch's end it comes after the result), what it keeps is
        written into its folder, beside the training that goes on, rather
        than with every other trial's at the study's end, where the writes
        would be all the study does. Where a callback wants each checkpoint,
        they are written as they come already. Tune saves a class trainable
        at its end unless ``checkpoint_at_end=False``."""
        if state.status == TERMINATED and saves_at_end(self._checkpoint_config):
            state.note_tune_save(max(state.rows, default=0))
        if self._each or self._ending or state.trial_id in self._exports or state.final_checkpoint() is None:
            return
        self._exports[state.trial_id] = asyncio.ensure_future(
            export_trial_checkpoints(state, *self._export_calls(), self._checkpoint_config)
        )

    def _export_calls(self) -> tuple[Any, Any]:
        return functools.partial(self._store.export, self._plan), self._store.remove_other_checkpoints

    async def at_end(self, trials: Iterable[TrialState]) -> list[str]:
        """The kept checkpoints into the trials' folders (`study_end`): those
        of trials that terminated were written then, and are written again
        only where what a trial keeps changed since (its final checkpoint was
        trained again) or a write failed. Each trial's final one is announced
        unless it was as it came; what storage refused, as messages."""
        trials = list(trials)
        self._ending = True
        await asyncio.gather(*self._writes.values())
        exports = dict(zip(self._exports, await asyncio.gather(*self._exports.values())))
        self._exports = {}
        again = [
            state
            for state in trials
            if state.trial_id not in exports or not exports[state.trial_id].still_kept(state, self._checkpoint_config)
        ]
        unwritten = await export_kept_checkpoints(again, *self._export_calls(), self._checkpoint_config)
        if self._retains:
            self._sweep()  # their copies go with the study's last snapshot
        for state in trials:
            if state.checkpoints and state.checkpoints[-1][0] not in state.announced_checkpoints:
                self._feed.event("checkpoint", state, path=state.checkpoints[-1][0])
        return unwritten
