"""Checkpoints of a study: Ray objects owned by the controller, written behind
to fsspec storage, evicted from memory by cost-benefit, reloaded on demand.

Checkpoint bytes never pass through the driver or the controller's Python
heap: workers put them into the object store with the controller as owner,
and the study's `StorageIO` actor copies them to and from storage. The
store holds the references to the in-memory copies; the plan holds what
persists (`CheckpointInfo`: the durable copy's path, size, checksum) and is
the only writer of those records: the store tells it what changed.
"""

from __future__ import annotations

import asyncio
import logging
import os
import pickle
import posixpath
import tempfile
import threading
from collections import OrderedDict
from typing import Any, NamedTuple

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ray_stagetree.execution.payload import CheckpointPayload, write_directory
from ray_stagetree.execution.sealed_storage import SealedStorage, WriteFailed, with_retries
from ray_stagetree.execution.storage import (
    CheckpointCache,
    CheckpointStorage,
    CheckpointUnavailableError,
    StoredCheckpoint,
)
from ray_stagetree.planning.cost import recompute_seconds
from ray_stagetree.planning.plan import CheckpointInfo, PlanNode, SearchPlan
from ray_stagetree.runtime.workers.remote import remote_once

logger = logging.getLogger(__name__)


#: The folder of a study's stored checkpoints, in its experiment directory.
CHECKPOINTS = "checkpoints"
#: Storage calls in flight at once: enough to overlap file-system latency.
IO_THREADS = 4
#: The studies' storages a `StorageIO` keeps unpickled: its controller's
#: study, and ended ones' calls still in flight.
KEPT_STORAGES = 8


class StudyStorage(NamedTuple):
    """A study's `SealedStorage` as its `StorageIO` calls carry it: pickled
    once by the study's store, unpickled once by the actor (``token`` names
    it there)."""

    token: str
    pickled: bytes

    @classmethod
    def of(cls, sealed: SealedStorage) -> StudyStorage:
        return cls(os.urandom(8).hex(), ray.cloudpickle.dumps(sealed))


class StorageIO:
    """The storage I/O of a controller's studies in one threaded Ray actor:
    checkpoint write-behind, reloads, and the trial directories at the end,
    each sealed with its experiment's key (`execution.sealed_storage`).

    One long-lived process rather than a Ray task per write: every task that
    finds no idle worker process starts one (seconds of CPU on a small
    machine), and a study's end writes every trial at once. Each call names
    its study's `SealedStorage`, so a controller's next study uses the same
    process (`storage_io`), and one that dies is restarted and its calls
    retried. Payloads arrive as resolved objects (Ray passes a referenced
    checkpoint to the method directly), so their bytes never visit the
    driver or the controller.
    """

    def __init__(self) -> None:
        self._kept: OrderedDict[str, SealedStorage] = OrderedDict()
        self._lock = threading.Lock()

    def _sealed(self, study: StudyStorage) -> SealedStorage:
        """The study's storage, unpickled at its first call here: one
        filesystem object serves all its calls and threads, as it did when
        each study had a process of its own (a filesystem may keep state)."""
        with self._lock:
            sealed = self._kept.get(study.token)
            if sealed is None:
                sealed = self._kept[study.token] = pickle.loads(study.pickled)
                if len(self._kept) > KEPT_STORAGES:
                    self._kept.popitem(last=False)
            self._kept.move_to_end(study.token)
            return sealed

    def write(self, study: StudyStorage, key: str, payload: CheckpointPayload) -> StoredCheckpoint | WriteFailed:
        """`SealedStorage.write`."""
        return self._sealed(study).write(key, payload)

    @ray.method(num_returns=2)
    def reload(self, study: StudyStorage, stored: StoredCheckpoint, key: str) -> tuple[str | None, Any]:
        """(None, payload), or (the reason, None) when the copy under ``key``
        is lost, corrupt or not authenticated. Two returns, so the controller
        reads the verdict without the bytes."""
        try:
            return None, self._sealed(study).load(stored, key)
        except CheckpointUnavailableError as error:
            return str(error), None

    def check(self, study: StudyStorage, stored: StoredCheckpoint, key: str) -> str | None:
        """Why the copy under ``key`` is unusable, or None when it is intact."""
        try:
            self._sealed(study).unsealed(stored, key)
        except CheckpointUnavailableError as error:
            return str(error)
        return None

    def export_stored(
        self, study: StudyStorage, folder: str, stored: StoredCheckpoint, key: str
    ) -> tuple[str | None, str | WriteFailed | None]:
        """Copy a stored checkpoint into a trial's folder, storage to
        storage: (None, as `write_trial_checkpoint` returns), or (the reason,
        None) when it is lost, corrupt or not authenticated. The bytes never
        enter the object store."""
        try:
            payload = self._sealed(study).load(stored, key)
        except CheckpointUnavailableError as error:
            return str(error), None
        return None, self.write_trial_checkpoint(study, folder, payload)

    def delete(self, study: StudyStorage, stored: StoredCheckpoint) -> None:
        """Delete a stored checkpoint no trial keeps any more. Storage that
        refuses is logged, not raised: the plan has forgotten it already."""
        try:
            self._sealed(study).storage.delete(stored)
        except OSError as error:
            logger.warning("checkpoint %r was not removed: %s", stored.path, error)

    def remove_unreferenced(self, study: StudyStorage, keep: list[str]) -> int:
        """Remove the files in the study's ``checkpoints/`` not named in
        ``keep`` (the restored plan's); how many. Storage that refuses is
        logged: they are only disk."""
        try:
            return len(self._sealed(study).storage.remove_files(CHECKPOINTS, keep))
        except OSError as error:
            logger.warning("checkpoints no study names were not removed: %s", error)
            return 0

    def write_state(self, study: StudyStorage, key: str, data: bytes) -> None:
        """A study snapshot, written atomically (see `runtime.control.experiment_state`)."""
        self._sealed(study).storage.write(key, data)

    def write_trial_checkpoint(self, study: StudyStorage, folder: str, payload: CheckpointPayload) -> str | WriteFailed:
        """A checkpoint folder in a trial's folder (``<trial_dir>/checkpoint_000003``
        as Tune lays it out), and its path; `WriteFailed` when storage refuses
        it. (``params.json``, ``result.json`` and the other logs are the
        driver's loggers' alone: see `runtime.driver.callbacks`.)"""
        storage = self._sealed(study).storage
        return with_retries(lambda: self._upload(storage, folder, payload), f"checkpoint {folder!r}")

    @staticmethod
    def _upload(storage: CheckpointStorage, folder: str, payload: CheckpointPayload) -> str:
        with tempfile.TemporaryDirectory(prefix="stagetree_final_") as local:
            write_directory(payload, local)
            return storage.upload_directory(local, folder)

    def remove_other_checkpoints(self, study: StudyStorage, trial_dir: str, keep: list[str]) -> None:
        """Remove the ``checkpoint_*`` folders of a trial's folder not named in
        ``keep`` (an earlier run's, which ``num_to_keep`` no longer keeps, as
        Tune deletes them). Storage that refuses is logged, not raised: the
        kept checkpoints are written already."""
        try:
            self._sealed(study).storage.remove_folders(trial_dir, "checkpoint_", keep)
        except OSError as error:
            logger.warning("old checkpoints in %r were not removed: %s", trial_dir, error)


def storage_io() -> Any:
    """A `StorageIO` actor owned by the caller (a controller), on its node, so
    that losing a worker node does not lose it. Restarted when its process
    dies, its calls retried: a write was atomic (done, or never visible)."""
    here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
    return (
        remote_once(StorageIO)
        .options(num_cpus=0, max_concurrency=IO_THREADS, scheduling_strategy=here, max_restarts=-1, max_task_retries=-1)
        .remote()
    )


class CheckpointStore:
    """Parameters
    ----------
    storage:
        Durable storage under the experiment directory.
    budget_bytes:
        Object-store memory the study's checkpoints may hold; beyond it, the
        ones with the least recompute-cost x expected-reuse per byte are
        dropped from memory once their durable copy exists.
    secret:
        The experiment's key, which seals the durable copies
        (`execution.payload_auth`); None: a key for this store's lifetime only.
    trusted:
        Read stored payloads that do not verify (``RAY_STAGETREE_TRUST_STORAGE``).
    io:
        The `StorageIO` actor to do the storage calls (a controller keeps one
        for its studies); None: one of this store's own (`storage_io`).
    """

    def __init__(
        self,
        storage: CheckpointStorage,
        budget_bytes: int,
        secret: bytes | None = None,
        trusted: bool = False,
        io: Any = None,
    ) -> None:
        self.storage = storage
        self.cache = CheckpointCache(budget_bytes)
        # (node id, iteration) -> the reference of the in-memory copy, while there is one.
        self._handles: dict[tuple[int, int], Any] = {}
        self._writes: dict[Any, tuple[int, int, int]] = {}  # write -> (node id, iteration, bytes)
        # Kept in memory only: storage refused their durable copy. Written
        # again once a later write succeeds (storage is back).
        self.unstored: set[tuple[int, int]] = set()
        # Out of the plan, their durable copies deleted once a snapshot without them landed (`write_state`).
        self._discarded: list[StoredCheckpoint] = []
        self.io = io if io is not None else storage_io()
        #: What the `StorageIO` calls and the stage workers (the checkpoints a function reports,
        #: `execution.batches.BatchSpec`) write with.
        self.sealed = SealedStorage(storage, secret if secret is not None else os.urandom(32), trusted)
        self._study = StudyStorage.of(self.sealed)

    def write_state(self, key: str, data: bytes) -> Any:
        """Write a study snapshot (`StorageIO.write_state`); the call's
        reference, or, where checkpoints were discarded before it was taken,
        a future that deletes their durable copies once it landed: until
        then the snapshot a restore would continue from may name them."""
        write = self.io.write_state.remote(self._study, key, data)
        if not self._discarded:
            return write
        discarded, self._discarded = self._discarded, []
        return asyncio.ensure_future(self._delete_after(write, discarded))

    async def _delete_after(self, write: Any, discarded: list[StoredCheckpoint]) -> None:
        try:
            await write
        except Exception:  # refused: the next snapshot deletes them
            self._discarded += discarded
            raise
        await asyncio.gather(*(self.io.delete.remote(self._study, stored) for stored in discarded))

    @staticmethod
    def key(node_id: int, iteration: int) -> str:
        # "step": the name stored checkpoints had before the vocabulary rename; plans point at them.
        return f"{CHECKPOINTS}/node{node_id:06d}_step{iteration:07d}.ckpt"

    async def remove_unreferenced(self, plan: SearchPlan) -> None:
        """A restored study's start: remove the stored checkpoints its plan
        does not name, which the run it continues left behind (reported
        after its last snapshot, or discarded before their deletion), so
        that they do not stay for good."""
        keep = [posixpath.basename(info.path) for node in plan.nodes for info in node.checkpoints.values() if info.path]
        removed = await self.io.remove_unreferenced.remote(self._study, keep)
        if removed:
            logger.info("removed %d stored checkpoints the restored study does not name", removed)

    def add(self, plan: SearchPlan, node: PlanNode, iteration: int, ref: Any, size_bytes: int) -> None:
        """Register a worker's checkpoint (its metrics up to ``iteration`` are in
        the plan already) and start its durable copy."""
        key = (node.node_id, iteration)
        plan.record_checkpoint(node.node_id, iteration, CheckpointInfo(size_bytes=size_bytes))
        self._handles[key] = ref
        if key in self.cache:  # retrained after a loss
            self.cache.remove(key)
        reuse = self._reuse(plan, node, iteration)
        self.cache.add(key, size_bytes, recompute_seconds(node, iteration), reuse, pinned=True)
        self._write(node.node_id, iteration, ref, size_bytes)
        self.evict(plan)

    def add_stored(self, plan: SearchPlan, node: PlanNode, iteration: int, info: CheckpointInfo) -> bool:
        """Register a checkpoint its worker wrote to storage itself (one the
        function reported where the plan asked for none): durable only, as a
        restored plan's are, read into memory if a batch starts from it.
        False when the plan holds one there already (trained again), which
        it keeps."""
        if iteration in node.checkpoints:
            return False
        plan.record_checkpoint(node.node_id, iteration, info)
        return True

    def discard(self, plan: SearchPlan, node: PlanNode, iteration: int) -> None:
        """Remove a checkpoint no trial keeps any more (`checkpoint_retention`):
        out of the plan and memory now, its durable copy deleted after the
        next snapshot (`write_state`). One whose durable copy is being
        written stays until asked again."""
        point = (node.node_id, iteration)
        info = node.checkpoints.get(iteration)
        if info is None or any(written[:2] == point for written in self._writes.values()):
            return
        self._drop(plan, *point)
        self.unstored.discard(point)
        if info.path is not None:
            self._discarded.append(self._stored(info))

    def in_memory(self, node: PlanNode, iteration: int) -> bool:
        """Whether the checkpoint has an in-memory copy (else only a durable one)."""
        return (node.node_id, iteration) in self._handles

    def _write(self, node_id: int, iteration: int, ref: Any, size_bytes: int, retry: bool = False) -> None:
        write = self.io.write.remote(self._study, self.key(node_id, iteration), ref)
        # A retry's checkpoint stays in memory whatever becomes of the write
        # (storage refused it before): waiting for it frees nothing, so it
        # does not hold new batches back (`writes_behind`).
        self._writes[write] = (node_id, iteration, 0 if retry else size_bytes)

    @staticmethod
    def _reuse(plan: SearchPlan, node: PlanNode, iteration: int) -> float:
        return float(len(plan.trials_through(node, iteration)))

    @property
    def pending_writes(self) -> list[Any]:
        return list(self._writes)

    def writes_behind(self) -> bool:
        """Checkpoints whose durable copy is being written hold more memory
        than the budget: no new batch should start (and make more) until
        the writes catch up. Retries of refused copies do not count."""
        return sum(size for _, _, size in self._writes.values()) > self.cache.budget_bytes

    async def finish_write(self, plan: SearchPlan, write: Any) -> bool:
        """A durable copy landed: record it, unpin, and evict if over budget.
        False when the plan is as it was (storage refused the copy again)."""
        if write not in self._writes:  # finished by an interrupt's snapshot meanwhile
            return False
        node_id, iteration, _ = self._writes.pop(write)
        try:
            stored = await write
        except Exception as error:
            # The payload never arrived (its worker died first) or could not be
            # stored: forget it, so nothing starts from it; it is retrained.
            logger.warning("checkpoint of node %d iteration %d is lost: %s", node_id, iteration, error)
            self._drop(plan, node_id, iteration)
            return True
        info = plan.nodes[node_id].checkpoints.get(iteration)
        if info is None:  # dropped meanwhile
            return False
        if isinstance(stored, WriteFailed):
            if (node_id, iteration) not in self._handles:  # its in-memory copy went with its node: retrained
                self._drop(plan, node_id, iteration)
                return True
            # Storage refused it: the in-memory copy stays (pinned: nothing else holds it).
            # A first refusal changes the study (its next snapshot asks storage again); a retry refused does not.
            first = (node_id, iteration) not in self.unstored
            if first:
                logger.warning("%s; it is kept in memory until storage accepts it", stored.reason)
            self.unstored.add((node_id, iteration))
            return first
        self.unstored.discard((node_id, iteration))
        self.rewrite_unstored(plan)
        # The plan keeps the key, relative to the experiment directory, so a
        # study moved or renamed between runs still finds its checkpoints.
        plan.record_checkpoint(
            node_id, iteration, CheckpointInfo(self.key(node_id, iteration), stored.size_bytes, stored.checksum)
        )
        self.cache.update((node_id, iteration), pinned=False)
        self.evict(plan)
        return True

    def rewrite_unstored(self, plan: SearchPlan) -> None:
        """A write succeeded: storage is back; write again the checkpoints it
        refused before (they stay `unstored` until a copy lands)."""
        retrying = {(node_id, iteration) for node_id, iteration, _ in self._writes.values()}
        for node_id, iteration in sorted(self.unstored - retrying):
            info = plan.nodes[node_id].checkpoints.get(iteration)
            ref = self._handles.get((node_id, iteration))
            if info is not None and ref is not None and info.path is None:
                self._write(node_id, iteration, ref, info.size_bytes, retry=True)
            else:
                self.unstored.discard((node_id, iteration))

    def evict(self, plan: SearchPlan) -> None:
        if not self.cache.over_budget():
            # The trials' reuse of each checkpoint only ranks what to evict. Refreshed at every
            # checkpoint, it took a third of the controller's time on Ray's pbt_example (600 kept).
            return
        for key in list(self.cache):
            node = plan.nodes[key[0]]
            if self.cache.is_resident(key):
                self.cache.update(key, expected_reuse=self._reuse(plan, node, key[1]))
        for node_id, iteration in self.cache.evictions():
            info = plan.nodes[node_id].checkpoints.get(iteration)
            if info is not None and info.path is not None:
                self._handles.pop((node_id, iteration), None)
                self.cache.mark_evicted((node_id, iteration))

    def forget_copy(self, plan: SearchPlan, node: PlanNode, iteration: int) -> None:
        """The in-memory copy is lost (its node left the cluster): read the
        durable copy next time, or, without one, retrain the checkpoint."""
        info = node.checkpoints.get(iteration)
        key = (node.node_id, iteration)
        if info is None:
            return
        self._handles.pop(key, None)
        if info.path is None:
            plan.drop_checkpoint(node.node_id, iteration)
            if key in self.cache and not self.cache.is_pinned(key):  # pinned: finish_write forgets it
                self.cache.remove(key)
            return
        if key in self.cache:
            self.cache.update(key, pinned=False)
            self.cache.mark_evicted(key)

    async def handle(self, plan: SearchPlan, node: PlanNode, iteration: int) -> Any:
        """A reference to the checkpoint's payload, reloading an evicted one
        from storage. Raises `CheckpointUnavailableError` (after dropping it
        from the plan) when it is lost or corrupt: the caller replans."""
        info = self._info(node, iteration)
        key = (node.node_id, iteration)
        ref = self._handles.get(key)
        if ref is not None:
            self.cache.touch(key)
            return ref
        ref = self._handles[key] = await self._reload(plan, node, iteration)
        if key in self.cache:
            self.cache.mark_resident(key)
        else:  # a checkpoint of a restored plan, loaded for the first time
            self.cache.add(key, info.size_bytes, recompute_seconds(node, iteration), self._reuse(plan, node, iteration))
        return ref

    async def verify(self, plan: SearchPlan, node: PlanNode, iteration: int) -> None:
        """Raise as `handle` does when the checkpoint is no longer usable; an
        evicted one is checked in storage, without reading it into memory."""
        info = self._info(node, iteration)
        if not self.in_memory(node, iteration):
            self._raise_if(
                plan, node, iteration, await self.io.check.remote(self._study, self._stored(info), info.path)
            )

    async def export(self, plan: SearchPlan, node: PlanNode, iteration: int, folder: str) -> str | WriteFailed | None:
        """Write the checkpoint into ``folder`` (in a trial's folder) and
        return its path; None when it is lost, `WriteFailed` when
        storage refuses the copy. One in memory is written from there; an
        evicted one is copied storage to storage, so that a study's end
        never reads its checkpoints back into memory."""
        info = node.checkpoints.get(iteration)
        ref = self._handles.get((node.node_id, iteration))
        if info is not None and ref is not None:
            try:
                return await self.io.write_trial_checkpoint.remote(self._study, folder, ref)
            except ray.exceptions.ObjectLostError:
                self.forget_copy(plan, node, iteration)
                info = node.checkpoints.get(iteration)
        if info is None:
            return None
        problem, path = await self.io.export_stored.remote(self._study, folder, self._stored(info), info.path)
        try:
            self._raise_if(plan, node, iteration, problem)
        except CheckpointUnavailableError:
            return None
        return path

    async def remove_other_checkpoints(self, trial_dir: str, keep: list[str]) -> None:
        """Remove the ``checkpoint_*`` folders of ``trial_dir`` not in ``keep``."""
        await self.io.remove_other_checkpoints.remote(self._study, trial_dir, keep)

    async def _reload(self, plan: SearchPlan, node: PlanNode, iteration: int) -> Any:
        info = self._info(node, iteration)
        verdict, ref = self.io.reload.remote(self._study, self._stored(info), info.path)
        self._raise_if(plan, node, iteration, await verdict)
        return ref

    @staticmethod
    def _info(node: PlanNode, iteration: int) -> CheckpointInfo:
        info = node.checkpoints.get(iteration)
        if info is None:  # found lost since it was chosen (another batch or trial shares it)
            raise CheckpointUnavailableError(f"the checkpoint of node {node.node_id} at iteration {iteration} was lost")
        return info

    def _stored(self, info: CheckpointInfo) -> StoredCheckpoint:
        return StoredCheckpoint(path=self.storage.path(info.path), size_bytes=info.size_bytes, checksum=info.checksum)

    def _drop(self, plan: SearchPlan, node_id: int, iteration: int) -> None:
        """The checkpoint is gone for good: out of the plan (its stages
        retrain it), the memory accounting and the handles."""
        plan.drop_checkpoint(node_id, iteration)
        self._handles.pop((node_id, iteration), None)
        if (node_id, iteration) in self.cache:
            self.cache.remove((node_id, iteration))

    def _raise_if(self, plan: SearchPlan, node: PlanNode, iteration: int, problem: str | None) -> None:
        """A stored copy found lost or corrupt (``problem``) leaves the plan."""
        if problem is None:
            return
        self._drop(plan, node.node_id, iteration)
        raise CheckpointUnavailableError(problem)
