"""Checkpoint payloads in durable storage, sealed with the experiment's key.

`SealedStorage` writes a payload in its byte form (`execution.payload`),
sealed with an HMAC under the experiment's key (`execution.payload_auth`),
and reads it back before it counts as stored; it loads only what verifies,
so a payload placed in storage by anyone without the key is refused,
whatever checksum the plan's table claims for it. The study's storage
actor (`runtime.control.checkpoint_store.StorageIO`) is one; a stage worker
holds another for the checkpoints a function reports where the plan asked
for none, and writes them itself, as Tune's ``report()`` persists each one
from the process that trains.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from ray_stagetree.execution.payload import CheckpointPayload, from_bytes, to_bytes
from ray_stagetree.execution.payload_auth import seal, unseal
from ray_stagetree.execution.storage import CheckpointStorage, StoredCheckpoint

#: Tries of one write, with a doubling pause from `RETRY_PAUSE_S` between them.
WRITE_ATTEMPTS = 3
RETRY_PAUSE_S = 0.2


@dataclasses.dataclass(frozen=True)
class WriteFailed:
    """What a write that storage refused every time returns: why."""

    reason: str


def with_retries(write: Any, what: str) -> Any:
    """``write()``'s result, or `WriteFailed` after `WRITE_ATTEMPTS` errors
    (transient ones, such as a store's throttling, pass on a retry)."""
    pause = RETRY_PAUSE_S
    for attempt in range(1, WRITE_ATTEMPTS + 1):
        try:
            return write()
        except Exception as error:  # each fsspec backend raises its own errors
            if attempt == WRITE_ATTEMPTS:
                return WriteFailed(f"{what} could not be written ({type(error).__name__}: {error})")
            time.sleep(pause)
            pause *= 2
    raise AssertionError("unreachable")


class SealedStorage:
    """Payloads under ``storage``, sealed with ``secret``; ``trusted``:
    load stored payloads that do not verify (``RAY_STAGETREE_TRUST_STORAGE``)."""

    def __init__(self, storage: CheckpointStorage, secret: bytes, trusted: bool = False) -> None:
        self.storage = storage
        self._secret = secret
        self._trusted = trusted

    def write(self, key: str, payload: CheckpointPayload) -> StoredCheckpoint | WriteFailed:
        """Store a checkpoint and read it back: a copy that cannot be read
        back as written (a full disk, a flaky store) is written again, and
        after `WRITE_ATTEMPTS` reported as `WriteFailed`, not raised, so the
        caller keeps its copy in memory instead of forgetting it."""
        data = seal(self._secret, key, to_bytes(payload))
        return with_retries(lambda: self._write_verified(key, data), f"checkpoint {key!r}")

    def _write_verified(self, key: str, data: bytes) -> StoredCheckpoint:
        stored = self.storage.write(key, data)
        self.storage.read(stored)  # raises CheckpointUnavailableError when damaged on the way
        return stored

    def load(self, stored: StoredCheckpoint, key: str) -> CheckpointPayload:
        """The payload stored under ``key``; raises `CheckpointUnavailableError`
        when it is lost, corrupt or not authenticated."""
        return from_bytes(self.unsealed(stored, key))

    def unsealed(self, stored: StoredCheckpoint, key: str) -> memoryview:
        """The payload's bytes under ``key``, verified, not unpickled; raises
        `CheckpointUnavailableError` when they are lost, corrupt or not authenticated."""
        return unseal(self._secret, key, self.storage.read(stored), self._trusted)
