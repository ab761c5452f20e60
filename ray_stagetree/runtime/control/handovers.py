"""Checkpoints stage workers are handing over, and workers stopped only once
they have (Ray).

The loop asks a worker for each checkpoint with `StageWorker.take_checkpoint`:
the call's return value is the payload, an object the controller owns, which
outlives the worker only once the call has returned. A worker the loop stops
mid-study (retired to make room for one of another shape, or broken) is
stopped once those calls are in; killed before, it would take the
checkpoints with it, and their stages would be trained again.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from typing import Any

import ray

#: How long a worker being stopped is given to hand over the checkpoints asked of it.
HANDOVER_WAIT_S = 60.0
#: How often a worker being stopped is looked at meanwhile.
HANDOVER_POLL_S = 0.05


class Handovers:
    """The checkpoints each stage worker was asked for and may not have
    handed over yet; ``stop`` stops a worker (`spec.WorkerSpec.stop`)."""

    def __init__(self, stop: Callable[[Any], None]) -> None:
        self._stop = stop
        self._pending: dict[Any, list[Any]] = {}
        self._stopping: set[asyncio.Future] = set()  # kept referenced until they end

    def take(self, worker: Any, key: str) -> Any:
        """Ask ``worker`` for the checkpoint in its outbox under ``key``: the reference to its payload."""
        ref = worker.take_checkpoint.remote(key)
        self._pending[worker] = [*_unsettled(self._pending.get(worker, [])), ref]
        return ref

    def stop(self, worker: Any) -> None:
        """Stop ``worker`` once it handed over what it was asked for (a dead
        worker's calls fail at once), or after `HANDOVER_WAIT_S`."""
        pending = self._pending.pop(worker, [])
        if not _unsettled(pending):
            self._stop(worker)
            return
        stopping = asyncio.ensure_future(self._stop_once_handed_over(worker, pending))
        self._stopping.add(stopping)
        stopping.add_done_callback(self._stopping.discard)

    async def _stop_once_handed_over(self, worker: Any, pending: list[Any]) -> None:
        deadline = time.monotonic() + HANDOVER_WAIT_S
        while pending and time.monotonic() < deadline:
            await asyncio.sleep(HANDOVER_POLL_S)  # ray.wait would block the loop: its batches go on meanwhile
            pending = _unsettled(pending)
        self._stop(worker)


def _unsettled(refs: list[Any]) -> list[Any]:
    """Those of ``refs`` whose calls have not returned (nor failed); their objects stay where they are."""
    if not refs:
        return []
    _, unsettled = ray.wait(refs, num_returns=len(refs), timeout=0, fetch_local=False)
    return unsettled
