"""The checkpoint store: write-behind, eviction, reload, corruption."""

import asyncio
import os

import pytest
import ray
from trainables_for_tests import CorruptsEveryWrite

from ray_stagetree.execution.payload import CheckpointPayload
from ray_stagetree.execution.storage import CheckpointStorage, CheckpointUnavailableError
from ray_stagetree.planning import SearchPlan, build_stage_tree
from ray_stagetree.runtime.control.checkpoint_store import CheckpointStore


def add_checkpoint(store, plan, node, iteration):
    payload = CheckpointPayload(step=iteration, rng={}, directory=None, state={"weights": list(range(1000))})
    store.add(plan, node, iteration, ray.put(payload), size_bytes=8000)


def finish_writes(store, plan):
    for write in store.pending_writes:
        asyncio.run(store.finish_write(plan, write))


def store_writing_checkpoint(tmp_path, budget, filesystem=None):
    """A store with one checkpoint added, its durable copy being written."""
    plan = SearchPlan()
    node = plan.add_trial("a", {"lr": 0.1}, 20).node
    store = CheckpointStore(CheckpointStorage(str(tmp_path), filesystem), budget_bytes=budget)
    add_checkpoint(store, plan, node, 10)
    return plan, node, store


def store_with_checkpoint(tmp_path, budget, filesystem=None):
    plan, node, store = store_writing_checkpoint(tmp_path, budget, filesystem)
    finish_writes(store, plan)
    return plan, node, store


def test_durable_copy_is_recorded_and_kept_in_memory_within_budget(tmp_path, ray_session):
    plan, node, store = store_with_checkpoint(tmp_path, budget=10**9)
    info = node.checkpoints[10]
    assert store.in_memory(node, 10) and info.checksum.startswith("sha256:")
    assert os.path.exists(tmp_path / info.path), "the plan records the key relative to the experiment directory"


def test_evicted_checkpoint_reloads_from_storage(tmp_path, ray_session):
    plan, node, store = store_with_checkpoint(tmp_path, budget=0)
    assert not store.in_memory(node, 10), "over budget: dropped from memory"
    ref = asyncio.run(store.handle(plan, node, 10))
    assert ray.get(ref).state == {"weights": list(range(1000))}
    assert store.in_memory(node, 10)


@pytest.mark.parametrize("damage", ["corrupt", "delete"])
def test_a_corrupt_or_missing_copy_is_detected_and_retrained(tmp_path, ray_session, damage):
    plan, node, store = store_with_checkpoint(tmp_path, budget=0)
    path = tmp_path / node.checkpoints[10].path
    if damage == "corrupt":
        with open(path, "r+b") as file:
            file.seek(100)
            file.write(b"\x00\xff")
    else:
        os.remove(path)
    with pytest.raises(CheckpointUnavailableError, match="corrupt" if damage == "corrupt" else "missing"):
        asyncio.run(store.handle(plan, node, 10))
    assert 10 not in node.checkpoints, "never used silently"
    (stage,) = build_stage_tree(plan).stages
    assert stage.start == 0, "the stage retrains from the start"


def test_a_stored_checkpoint_leaves_memory_as_soon_as_a_new_one_takes_its_place(tmp_path, ray_session):
    plan, node, store = store_with_checkpoint(tmp_path, budget=8000)  # room for one
    assert store.in_memory(node, 10)
    add_checkpoint(store, plan, node, 15)
    assert not store.in_memory(node, 10), "evicted before the new one's durable copy lands: memory stays in budget"
    assert store.in_memory(node, 15), "kept until its own copy is stored"
    finish_writes(store, plan)
    assert store.in_memory(node, 15) and node.checkpoints[15].path is not None


def test_retrying_a_refused_copy_holds_no_batch_back(tmp_path, ray_session):
    plan, node, store = store_writing_checkpoint(tmp_path, budget=0, filesystem=CorruptsEveryWrite())
    (first,) = store.pending_writes
    assert asyncio.run(store.finish_write(plan, first)) is True, "a first refusal changes the study: a snapshot asks"
    assert store.in_memory(node, 10) and node.checkpoints[10].path is None, "kept in memory, not lost"
    assert not store.writes_behind()
    store.rewrite_unstored(plan)  # as after a snapshot the storage accepted
    assert len(store.pending_writes) == 1
    assert not store.writes_behind(), "the retry frees no memory: waiting for it would stall the study"
    store.rewrite_unstored(plan)
    (retry,) = store.pending_writes
    assert asyncio.run(store.finish_write(plan, retry)) is False, "refused again: nothing changed, no snapshot"
    assert store.in_memory(node, 10) and store.unstored == {(node.node_id, 10)}
