"""A study's end for its trials' checkpoints (runtime.control.study_end and
TrialState's checkpoint path), without Ray: plan nodes and the checkpoint
store are fakes."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from ray import tune

from ray_stagetree.execution.sealed_storage import WriteFailed
from ray_stagetree.execution.storage import CheckpointUnavailableError
from ray_stagetree.planning.lifecycle import ERROR, PAUSED, RUNNING, TERMINATED
from ray_stagetree.runtime.control.study_end import FINAL_RETRAINS, export_kept_checkpoints, retrain_lost_finals
from ray_stagetree.runtime.control.trial_checkpoints import TrialCheckpoints
from ray_stagetree.runtime.control.trials import TrialState


def node(node_id: int, checkpoints: list[int], parent=None, fork_iteration: int = 0):
    return SimpleNamespace(
        node_id=node_id, checkpoints=dict.fromkeys(checkpoints), parent=parent, fork_iteration=fork_iteration
    )


def finished(trial_id: str, at, last: int, status: str = TERMINATED) -> TrialState:
    state = TrialState(trial_id=trial_id, config={}, name=f"name_{trial_id}", dirname=f"dir_{trial_id}")
    state.status, state.node = status, at
    state.rows = {i: {"training_iteration": i, "acc": i / 10} for i in range(1, last + 1)}
    return state


def test_a_trials_checkpoints_are_those_on_its_path_up_to_its_last_result():
    root = node(0, [2, 4, 6])
    branch = node(1, [5, 8], parent=root, fork_iteration=4)
    state = finished("a", branch, last=7)
    # The root's up to the fork (not 6: the branch left it at 4), then the branch's up to 7.
    assert [(n.node_id, at) for n, at in state.path_checkpoints()] == [(0, 2), (0, 4), (1, 5)]
    assert finished("b", branch, last=7, status=RUNNING).path_checkpoints() == []
    # Exploited at 2 (forked from the source's checkpoint there): up to 2 its own path's checkpoints, beside
    # its own results, as under Tune; the source's checkpoint at 2 is not its.
    exploited = finished("c", node(2, [3], parent=node(3, [2]), fork_iteration=2), last=3)
    exploited.earlier_paths, exploited.forked_at = ((node(4, [1, 2]), 0, 2),), 2
    assert [(n.node_id, at) for n, at in exploited.path_checkpoints()] == [(4, 1), (4, 2), (2, 3)]
    assert exploited.checkpoint_metrics(2) == exploited.rows[2] and exploited.checkpoint_metrics(3)["acc"] == 0.3
    # It had trained to 3 when the exploit took it back to 2: its result at 3 is the one trained after the
    # exploit, and so is its checkpoint at 3 (one, not the earlier path's beside it).
    ahead = finished("d", node(5, [3, 4], parent=node(6, [2]), fork_iteration=2), last=4)
    ahead.earlier_paths, ahead.forked_at = ((node(7, [1, 2, 3]), 0, 3),), 2
    assert [(n.node_id, at) for n, at in ahead.path_checkpoints()] == [(7, 1), (7, 2), (5, 3), (5, 4)]


def test_a_class_trainables_trial_shows_the_checkpoints_tune_saves_of_it():
    """The plan checkpointed the path at 1..6 (forks, decision points); Tune
    saves a class trainable every checkpoint_frequency-th iteration (2, 4),
    where a result asks (3), where it pauses (5, unless to take a PBT
    exploit), where PBT finds it a top trial, and at its end (6)."""
    population = SimpleNamespace(top_checkpoint=lambda trial_id: None, exploits=lambda trial_id: False)
    checkpoints = TrialCheckpoints(
        FakeStore(),
        None,
        SimpleNamespace(),
        each=True,  # nothing written as it is registered, nor exported: the rule alone
        checkpoint_config=tune.CheckpointConfig(checkpoint_frequency=2),
        trials={},
    )
    state = finished("a", node(0, [1, 2, 3, 4, 5, 6]), last=6, status=RUNNING)
    state.tune_saves = frozenset()
    for iteration in range(1, 6):
        state.status = PAUSED if iteration == 5 else RUNNING
        checkpoints.decided(state, iteration, {"should_checkpoint": iteration == 3}, population)
    assert state.tune_saves == {2, 3, 4, 5}
    state.status = TERMINATED
    checkpoints.ended(state)
    assert [at for _, at in state.path_checkpoints()] == [2, 3, 4, 5, 6]
    # Paused to take an exploit: Ray saves it not. A top trial at its perturbation: Ray saves it.
    state.status, state.tune_saves = PAUSED, frozenset()
    checkpoints.decided(state, 1, {}, SimpleNamespace(top_checkpoint=lambda trial_id: None, exploits=lambda t: True))
    checkpoints.decided(state, 3, {}, SimpleNamespace(top_checkpoint=lambda trial_id: 3, exploits=lambda t: False))
    assert state.tune_saves == {3}
    # A function trainable's (tune_saves None) shows every checkpoint on its path: each one it reported.
    assert [at for _, at in finished("b", node(1, [1, 2, 3]), last=3).path_checkpoints()] == [1, 2, 3]


def test_a_lost_final_checkpoint_is_checked_once_and_retrains_each_trial_ending_there():
    async def scenario():
        shared = node(0, [5])
        a, b = finished("a", shared, last=5), finished("b", shared, last=5)
        no_final = finished("c", node(1, [2]), last=3)  # its last result has no checkpoint: nothing to check
        verified, retrained, warnings = [], [], []

        async def verify(node_id, iteration):
            verified.append((node_id, iteration))
            raise CheckpointUnavailableError("checkpoint 5 failed its checksum")

        lost = await retrain_lost_finals([a, b, no_final], verify, retrained.append, warnings.append)
        assert lost and verified == [(0, 5)] and retrained == [a, b] and warnings == []
        assert a.final_retrains == 1

    asyncio.run(scenario())


def test_a_trial_ends_without_its_final_checkpoint_after_the_last_retrain():
    async def scenario():
        state = finished("a", node(0, [5]), last=5)
        retrained, warnings = [], []

        async def damaged(node_id, iteration):
            raise CheckpointUnavailableError("damaged")

        for _ in range(FINAL_RETRAINS):
            assert await retrain_lost_finals([state], damaged, retrained.append, warnings.append)
        assert not await retrain_lost_finals([state], damaged, retrained.append, warnings.append)
        assert len(retrained) == FINAL_RETRAINS and len(warnings) == 1
        assert f"found damaged {FINAL_RETRAINS} times in storage (damaged); it ends without it" in warnings[0]
        # Never checked again.
        assert not await retrain_lost_finals([state], damaged, retrained.append, warnings.append)
        assert len(warnings) == 1

        async def intact(node_id, iteration):
            return None

        assert not await retrain_lost_finals([finished("b", node(0, [5]), last=5)], intact, retrained.append, None)

    asyncio.run(scenario())


def test_the_kept_checkpoints_are_exported_and_what_storage_refused_is_reported():
    async def scenario():
        a = finished("a", node(0, [1, 2, 3]), last=3)
        b = finished("b", node(1, [4]), last=4)
        lost = finished("c", node(2, [2]), last=2)
        errored = finished("d", node(3, [1, 2]), last=2, status=ERROR)  # Tune keeps an errored trial's too
        running = finished("e", node(4, [1]), last=1, status=RUNNING)
        calls, removed = [], []

        async def export(at, iteration, folder):
            calls.append((at.node_id, iteration, folder))
            if folder.startswith("dir_b/"):
                return WriteFailed("permission denied")
            if folder.startswith("dir_c/"):
                return None  # lost meanwhile
            return f"/exp/{folder}"

        async def remove_others(trial_dir, keep):
            removed.append((trial_dir, keep))

        config = tune.CheckpointConfig(num_to_keep=1, checkpoint_score_attribute="acc", checkpoint_score_order="min")
        refused = await export_kept_checkpoints([a, b, lost, errored, running], export, remove_others, config)
        # The best by acc (min: the first) and always the latest, in folders numbered as Tune numbers
        # a trial's checkpoints: by position, from 0.
        assert calls == [
            (0, 1, "dir_a/checkpoint_000000"),
            (0, 3, "dir_a/checkpoint_000002"),
            (1, 4, "dir_b/checkpoint_000000"),
            (2, 2, "dir_c/checkpoint_000000"),
            (3, 1, "dir_d/checkpoint_000000"),
            (3, 2, "dir_d/checkpoint_000001"),
        ]
        assert refused == ["permission denied"]
        assert a.checkpoints == [
            ("/exp/dir_a/checkpoint_000000", a.rows[1]),
            ("/exp/dir_a/checkpoint_000002", a.rows[3]),
        ]
        assert a.best_checkpoints == [("/exp/dir_a/checkpoint_000000", a.rows[1])]
        assert b.checkpoints == b.best_checkpoints == [] and lost.checkpoints == [] and running.checkpoints == []
        assert [path for path, _ in errored.checkpoints] == [
            "/exp/dir_d/checkpoint_000000",
            "/exp/dir_d/checkpoint_000001",
        ]
        # Each trial's folder keeps only what it keeps now: an earlier run's other folders go.
        assert ("dir_a", ["checkpoint_000000", "checkpoint_000002"]) in removed and len(removed) == 4

    asyncio.run(scenario())


def test_what_storage_refused_is_one_line_a_trial():
    """A full disk refuses every folder of every trial: the study's warning
    shows its first three lines, so each trial gets one line, not each folder."""

    async def scenario():
        trials = [finished(name, node(index, [1, 2, 3]), last=3) for index, name in enumerate("abc")]

        async def export(at, iteration, folder):
            return WriteFailed(f"{folder!r} could not be written (no space left)")

        async def remove_others(trial_dir, keep):
            pass

        return await export_kept_checkpoints(trials, export, remove_others, None)

    assert asyncio.run(scenario()) == [
        f"'dir_{name}/checkpoint_000000' could not be written (no space left) (and 2 more of the trial's checkpoints)"
        for name in "abc"
    ]


def test_an_errored_trials_final_checkpoint_is_not_trained_again():
    async def scenario():
        errored = finished("a", node(0, [5]), last=5, status=ERROR)

        async def damaged(node_id, iteration):
            raise CheckpointUnavailableError("damaged")

        retrained = []
        assert not await retrain_lost_finals([errored], damaged, retrained.append, None)
        assert retrained == []

    asyncio.run(scenario())


class FakeStore:
    """`CheckpointStore`'s export calls, recorded."""

    def __init__(self) -> None:
        self.exported: list[str] = []

    async def export(self, plan, at, iteration, folder):
        self.exported.append(folder)
        return f"/exp/{folder}"

    async def remove_other_checkpoints(self, trial_dir, keep):
        return None


async def settle() -> None:
    """Let the tasks started run to their end (the fake store never waits)."""
    for _ in range(10):
        await asyncio.sleep(0)


def _trial_checkpoints(store: FakeStore) -> TrialCheckpoints:
    feed = SimpleNamespace(event=lambda *args, **kwargs: None)
    return TrialCheckpoints(
        store, plan=None, feed=feed, each=False, checkpoint_config=tune.CheckpointConfig(), trials={}
    )


def test_a_terminated_trials_checkpoints_are_written_then_not_at_the_studys_end():
    async def scenario():
        store = FakeStore()
        checkpoints = _trial_checkpoints(store)
        early = finished("a", node(0, [1, 2]), last=2)
        checkpoints.ended(early)
        await settle()  # the export runs beside the study, before its end
        assert store.exported == ["dir_a/checkpoint_000000", "dir_a/checkpoint_000001"]
        assert [path for path, _ in early.checkpoints] == [
            "/exp/dir_a/checkpoint_000000",
            "/exp/dir_a/checkpoint_000001",
        ]
        # At the end only the trials not written yet are.
        late = finished("b", node(1, [3]), last=3)
        assert await checkpoints.at_end([early, late]) == []
        assert store.exported[2:] == ["dir_b/checkpoint_000000"]

    asyncio.run(scenario())


def test_a_trials_checkpoints_wait_for_its_final_one_and_are_written_again_if_what_it_keeps_changed():
    async def scenario():
        store = FakeStore()
        checkpoints = _trial_checkpoints(store)
        at = node(0, [1])
        state = finished("a", at, last=2)  # its result at 2 is in; the checkpoint at 2 comes after it
        checkpoints.ended(state)
        await settle()
        assert store.exported == []
        at.checkpoints[2] = None
        checkpoints.saved(state, at, 2)
        await settle()
        assert store.exported == ["dir_a/checkpoint_000000", "dir_a/checkpoint_000001"]
        # Trained again after a longer path (a final checkpoint found lost at the end, say): written again.
        at.checkpoints[3] = None
        state.rows[3] = {"training_iteration": 3, "acc": 0.3}
        await checkpoints.at_end([state])
        assert store.exported[2:] == [
            "dir_a/checkpoint_000000",
            "dir_a/checkpoint_000001",
            "dir_a/checkpoint_000002",
        ]

    asyncio.run(scenario())


class Storage:
    """The loop's checkpoint store and snapshots as `LoopEnd` asks them:
    ``unstored`` checkpoints storage refused; ``refuses`` the snapshot."""

    def __init__(self, unstored: bool, refuses: bool) -> None:
        self.unstored, self.refuses = unstored, refuses
        self.refused_since: float | None = None
        self.asked = self.rewritten = 0

    async def ask_storage(self) -> bool:
        self.asked += 1
        self.refused_since = 1.0 if self.refuses else None
        return True

    def rewrite_unstored(self, plan) -> None:
        self.rewritten += 1


def test_a_loop_ends_only_once_storage_took_the_checkpoints_it_refused():
    from ray_stagetree.runtime.control.study_end import LoopEnd

    def may_end(storage: Storage) -> bool:
        end = LoopEnd(SimpleNamespace(), storage, storage, {}, None, "/exp/plan", None)
        return asyncio.run(end.may_end())

    assert may_end(Storage(unstored=False, refuses=True))  # nothing refused: storage is not asked
    refusing = Storage(unstored=True, refuses=True)
    assert not may_end(refusing) and (refusing.asked, refusing.rewritten) == (1, 0)  # it pauses, as mid-study
    back = Storage(unstored=True, refuses=False)
    assert not may_end(back) and back.rewritten == 1  # the refused checkpoints are written before the end


def test_a_study_on_a_loop_that_goes_on_ends_once_however_often_the_loop_asks():
    """A plan service's loop asks at every turn whether a study whose
    trials are all done ends: only the first ask starts its end, also while
    that end is still writing the trials' checkpoints."""
    from ray_stagetree.runtime.control.study_end import LoopEnd

    class Study:
        finalized: bool | None = False
        ends = 0

        async def finalize(self) -> list[str]:
            self.ends += 1
            await asyncio.sleep(0.01)  # the writes: the loop turns meanwhile
            return []

        def warn_unwritten(self, unwritten: list[str]) -> None:
            assert unwritten == []

    class Plan:
        def save(self, path, filesystem) -> None:
            pass

    async def scenario() -> Study:
        study = Study()
        end = LoopEnd(Plan(), None, None, {}, None, "/exp/plan", None)
        for _ in range(5):
            end.finalize_soon(study)
            await asyncio.sleep(0)
        assert study.finalized is None  # being ended
        while study.finalized is not True:
            end.finalize_soon(study)
            await asyncio.sleep(0.002)
        return study

    assert asyncio.run(scenario()).ends == 1
