"""The checkpoint store: write-behind, eviction, reload, corruption."""

import asyncio
import os

import pytest
import ray

from ray_stagetree.execution.payload import CheckpointPayload
from ray_stagetree.execution.storage import CheckpointStorage, CheckpointUnavailableError
from ray_stagetree.planning import SearchPlan, build_stage_tree
from ray_stagetree.runtime.control.checkpoint_store import CheckpointStore


def store_with_checkpoint(tmp_path, budget):
    plan = SearchPlan()
    node = plan.add_trial("a", {"lr": 0.1}, 20).node
    store = CheckpointStore(CheckpointStorage(str(tmp_path)), budget_bytes=budget)
    payload = CheckpointPayload(step=10, rng={}, directory=None, state={"weights": list(range(1000))})
    store.add(plan, node, 10, ray.put(payload), size_bytes=8000)
    (write,) = store.pending_writes
    asyncio.run(store.finish_write(plan, write))
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
