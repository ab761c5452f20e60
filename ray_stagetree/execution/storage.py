"""Durable checkpoint copies and the accounting that decides evictions.

Shared training prefixes are trained once and every trial forked from them
starts from their checkpoints, so a checkpoint is worth keeping exactly as
long as it saves recomputation. This module holds the parts of the checkpoint
store that need no Ray:

* **Durable copies.** `CheckpointStorage` writes payloads atomically under a
  Tune-style ``storage_path`` (any fsspec URL, or a given fsspec/pyarrow
  filesystem) and verifies size and checksum on every read. A missing or
  corrupt copy raises a `CheckpointUnavailableError` so the caller recomputes
  it instead of training on from damaged state. The checksum detects damage,
  not tampering (whoever rewrites a file can rewrite its checksum): payloads
  are authenticated by `execution.payload_auth`.
* **Eviction accounting.** `CheckpointCache` tracks what the object store
  holds and, when over budget, names the checkpoints whose loss costs least
  per byte freed: recompute seconds x expected reuse / size, as in Nectar
  (Gunda et al., OSDI 2010). It holds keys and numbers, never the objects.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
import os
import posixpath
import uuid
from collections.abc import Callable, Hashable, Iterable, Iterator
from typing import Any

import fsspec
import pyarrow.fs as pafs
from fsspec.implementations.local import LocalFileSystem

from ray_stagetree.execution.payload import checksum, tree_entries
from ray_stagetree.planning.filesystems import resolve
from ray_stagetree.validation import Int, Real, check

__all__ = [
    "CheckpointCache",
    "CheckpointCorruptError",
    "CheckpointMissingError",
    "CheckpointStorage",
    "CheckpointUnavailableError",
    "StoredCheckpoint",
]

# --------------------------------------------------------------------------
# Durable storage
# --------------------------------------------------------------------------


class CheckpointUnavailableError(RuntimeError):
    """A durable checkpoint copy cannot be used; the caller should recompute it."""


class CheckpointMissingError(CheckpointUnavailableError):
    """The durable copy does not exist."""


class CheckpointCorruptError(CheckpointUnavailableError):
    """The durable copy exists but its size or checksum is not what was written."""


@dataclasses.dataclass(frozen=True)
class StoredCheckpoint:
    """Where a payload was written and what it must read back as.

    Parameters
    ----------
    path:
        Path of the file inside the storage's filesystem (no URL scheme).
    size_bytes:
        Payload length.
    checksum:
        ``"sha256:<hex>"`` of the payload.
    """

    path: str
    size_bytes: int
    checksum: str


class CheckpointStorage:
    """Checkpoint payloads under a directory of any fsspec or pyarrow filesystem.

    Writes are atomic (temporary name, then move), and every read checks the
    size and checksum recorded at write time. Instances pickle (they travel to
    Ray tasks) as long as the filesystem does; note that ``memory://`` is a
    per-process store, so files written in one process are invisible in
    another.

    Parameters
    ----------
    storage_path:
        Root directory: a local path, ``file://...``, ``memory://...``,
        ``s3://...`` or any URL with an installed fsspec driver. With
        ``storage_filesystem`` given, a path inside that filesystem.
    storage_filesystem:
        Optional filesystem, as in Tune's ``RunConfig``: a
        ``pyarrow.fs.FileSystem`` (wrapped with fsspec's ``ArrowFSWrapper``)
        or an ``fsspec.AbstractFileSystem``.

    Examples
    --------
    >>> storage = CheckpointStorage("memory://doc-example")
    >>> stored = storage.write("checkpoints/a.ckpt", b"state")
    >>> storage.read(stored)
    b'state'
    """

    def __init__(self, storage_path: str, storage_filesystem: Any = None) -> None:
        if not isinstance(storage_path, str):
            raise TypeError(f"storage_path must be a str, got {type(storage_path).__name__}")
        self.storage_path = storage_path
        filesystem, root = resolve(storage_path, storage_filesystem)
        self.filesystem: fsspec.AbstractFileSystem = filesystem
        self.root: str = root.rstrip("/") if root.strip("/") else root

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.storage_path!r}, filesystem={type(self.filesystem).__name__})"

    def path(self, key: str) -> str:
        """Filesystem path of ``key`` (a relative, ``/``-separated name)."""
        parts = key.split("/") if isinstance(key, str) else None
        if not key or parts is None or key.startswith("/") or "\\" in key or any(p in ("", ".", "..") for p in parts):
            raise ValueError(f"key must be a relative '/'-separated path without empty, '.' or '..' parts, got {key!r}")
        if not self.root:
            return key
        return f"{self.root}/{key}" if self.root != "/" else f"/{key}"

    def write(self, key: str, data: bytes) -> StoredCheckpoint:
        """Write ``data`` to ``<storage_path>/<key>`` atomically.

        The bytes go to a temporary sibling first and are then moved into
        place, so a reader never sees a partial file under ``key`` (on object
        stores the move is a copy, but an upload is all-or-nothing anyway).

        Parameters
        ----------
        key:
            Relative path under the storage root, e.g. ``"checkpoints/n1_s10.ckpt"``.
        data:
            Payload bytes.

        Returns
        -------
        StoredCheckpoint
            The path, size and checksum that `read` verifies against.
        """
        data = bytes(data)
        target = self._atomically(key, lambda temporary: self.filesystem.pipe_file(temporary, data))
        return StoredCheckpoint(path=target, size_bytes=len(data), checksum=checksum(data))

    def write_chunks(self, key: str, chunks: Iterable[bytes]) -> str:
        """Write ``chunks`` one after another to ``<storage_path>/<key>``,
        atomically as `write`, never holding more than one of them: a file
        too big to build in memory first. Returns its path."""

        def stream(temporary: str) -> None:
            with self.filesystem.open(temporary, "wb") as file:
                for chunk in chunks:
                    file.write(chunk)

        return self._atomically(key, stream)

    def _atomically(self, key: str, put: Callable[[str], None]) -> str:
        """Run ``put`` on a temporary sibling of ``key``'s path, then move it
        into place; returns the path. A failed ``put`` leaves nothing behind."""
        target = self.path(key)
        parent = posixpath.dirname(target)
        if parent:
            self.filesystem.makedirs(parent, exist_ok=True)
        temporary = f"{target}.tmp-{uuid.uuid4().hex}"
        try:
            put(temporary)
            self.filesystem.mv(temporary, target)
        except BaseException:
            try:
                if self.filesystem.exists(temporary):
                    self.filesystem.rm_file(temporary)
            except Exception:  # the original error matters more
                pass
            raise
        return target

    def read(self, stored: StoredCheckpoint) -> bytes:
        """Read a payload and verify it against ``stored``.

        Raises
        ------
        CheckpointMissingError
            No file at ``stored.path``.
        CheckpointCorruptError
            The file's size or checksum differs from ``stored``.
        """
        self._check_inside(stored.path)
        try:
            data = self.filesystem.cat_file(stored.path)
        except FileNotFoundError as error:
            raise CheckpointMissingError(
                f"checkpoint {stored.path!r} is missing from {self.storage_path!r} "
                f"(expected {stored.size_bytes} bytes, {stored.checksum})"
            ) from error
        if len(data) != stored.size_bytes:
            raise CheckpointCorruptError(
                f"checkpoint {stored.path!r} is corrupt: expected {stored.size_bytes} bytes, found {len(data)}"
            )
        found = checksum(data)
        if found != stored.checksum:
            raise CheckpointCorruptError(
                f"checkpoint {stored.path!r} is corrupt: expected checksum {stored.checksum}, found {found}"
            )
        return data

    def _check_inside(self, path: str) -> None:
        """Refuse a local file whose real path (links resolved) is not inside
        the storage root: a checkpoint is only ever read from the experiment
        directory, whatever a link placed in it points to."""
        local = isinstance(self.filesystem, LocalFileSystem) or isinstance(
            getattr(self.filesystem, "fs", None), pafs.LocalFileSystem
        )
        if not local or not self.root:
            return
        root = os.path.realpath(self.root)
        real = os.path.realpath(path)
        if real != root and not real.startswith(root.rstrip(os.sep) + os.sep):
            raise CheckpointCorruptError(
                f"checkpoint {path!r} resolves to {real!r}, outside the experiment directory {root!r}; it is not read"
            )

    def read_key(self, key: str) -> bytes:
        """The bytes of ``<storage_path>/<key>``, unverified (files whose
        integrity the caller checks itself, such as a pickled study state).

        Raises
        ------
        CheckpointMissingError
            No file at ``key``.
        """
        try:
            return self.filesystem.cat_file(self.path(key))
        except FileNotFoundError as error:
            raise CheckpointMissingError(f"{key!r} is missing from {self.storage_path!r}") from error

    def write_text(self, key: str, text: str) -> str:
        """Write a text file (a trial's ``result.json``, ``params.json``)
        atomically; returns its path."""
        return self.write(key, text.encode()).path

    def upload_directory(self, local_path: str, key: str) -> str:
        """Copy a local directory to ``<storage_path>/<key>``; returns its path
        in the storage's own terms (as ``storage_path`` was given), which is
        what ``ray.tune.Checkpoint(path, storage_filesystem)`` expects."""
        target = self.path(key)
        for relative, source in tree_entries(local_path):
            destination = f"{target}/{relative}"
            if os.path.isdir(source):
                self.filesystem.makedirs(destination, exist_ok=True)
            else:
                self.filesystem.makedirs(posixpath.dirname(destination), exist_ok=True)
                self.filesystem.put_file(source, destination)
        self.filesystem.makedirs(target, exist_ok=True)
        protocol = fsspec.core.split_protocol(self.storage_path)[0]
        return f"{protocol}://{target}" if protocol and protocol != "file" else target

    def remove_folders(self, key: str, prefix: str, keep: Iterable[str]) -> list[str]:
        """Remove the folders directly under ``<storage_path>/<key>`` whose
        names start with ``prefix``, except those named in ``keep``; returns
        the names removed (none when ``key`` does not exist)."""
        return self._remove_entries(key, "directory", prefix, keep)

    def remove_files(self, key: str, keep: Iterable[str]) -> list[str]:
        """Remove the files directly under ``<storage_path>/<key>`` not named
        in ``keep``; returns the names removed (none when ``key`` does not exist)."""
        return self._remove_entries(key, "file", "", keep)

    def _remove_entries(self, key: str, kind: str, prefix: str, keep: Iterable[str]) -> list[str]:
        target, keep = self.path(key), set(keep)
        try:
            entries = self.filesystem.ls(target, detail=True)
        except FileNotFoundError:
            return []
        removed = []
        for entry in entries:
            name = posixpath.basename(entry["name"].rstrip("/"))
            if entry["type"] == kind and name.startswith(prefix) and name not in keep:
                self.filesystem.rm(f"{target}/{name}", recursive=kind == "directory")
                removed.append(name)
        return removed

    def delete(self, stored: StoredCheckpoint) -> None:
        """Delete the file of ``stored``; a file already gone is not an error."""
        try:
            self.filesystem.rm_file(stored.path)
        except FileNotFoundError:
            pass


# --------------------------------------------------------------------------
# Eviction accounting
# --------------------------------------------------------------------------


def _check_size(name: str, value: Any) -> int:
    return int(check(name, value, Int(low=0)))


def _check_amount(name: str, value: Any) -> float:
    return float(check(name, value, Real(low=0)))


@dataclasses.dataclass
class _Entry:
    size_bytes: int
    recompute_seconds: float
    expected_reuse: float
    pinned: bool
    resident: bool
    last_used: int

    @property
    def density(self) -> float:
        """Benefit per byte of keeping the entry in memory."""
        if self.size_bytes == 0:
            return math.inf
        return self.recompute_seconds * self.expected_reuse / self.size_bytes


class CheckpointCache:
    """Memory accounting for checkpoints, and which to evict when over budget.

    Each entry is known by an opaque hashable key and is either resident (in
    the object store, counted against the budget) or evicted (durable copy
    only, still known so it can be reloaded with `mark_resident`).
    `evictions` names resident, unpinned entries in order of increasing
    benefit density ``recompute_seconds * expected_reuse / size_bytes`` --
    entries nobody will reuse first, least recently used first among equals
    -- until the resident total fits the budget. It changes nothing; the
    caller drops the objects and calls `mark_evicted`.

    Parameters
    ----------
    budget_bytes:
        Bytes the resident entries may hold. ``0`` keeps nothing in memory
        beyond pinned entries.

    Examples
    --------
    >>> cache = CheckpointCache(budget_bytes=100)
    >>> cache.add("a", 60, recompute_seconds=10.0, expected_reuse=1)
    >>> cache.add("b", 60, recompute_seconds=50.0, expected_reuse=1)
    >>> cache.evictions()
    ['a']
    """

    def __init__(self, budget_bytes: int) -> None:
        self.budget_bytes = budget_bytes
        self._entries: dict[Hashable, _Entry] = {}
        self._resident_bytes = 0
        self._clock = itertools.count()

    @property
    def budget_bytes(self) -> int:
        """Bytes the resident entries may hold (settable; validated)."""
        return self._budget_bytes

    @budget_bytes.setter
    def budget_bytes(self, value: int) -> None:
        self._budget_bytes = _check_size("budget_bytes", value)

    def _entry(self, key: Hashable) -> _Entry:
        try:
            return self._entries[key]
        except KeyError:
            raise KeyError(f"checkpoint {key!r} is not in the cache") from None

    def add(
        self,
        key: Hashable,
        size_bytes: int,
        recompute_seconds: float,
        expected_reuse: float,
        pinned: bool = False,
    ) -> None:
        """Track a checkpoint that has just been put in memory.

        Parameters
        ----------
        key:
            Any hashable identifier; must not be tracked already.
        size_bytes:
            Bytes it holds in memory (int >= 0).
        recompute_seconds:
            Seconds to recompute it if it were lost (>= 0).
        expected_reuse:
            How many future trials are expected to start from it (>= 0).
        pinned:
            Never evict while pinned, e.g. while a batch is loading it or a
            live request needs it and it has no durable copy yet.
        """
        if key in self._entries:
            raise ValueError(f"checkpoint {key!r} is already in the cache; use update()")
        entry = _Entry(
            size_bytes=_check_size("size_bytes", size_bytes),
            recompute_seconds=_check_amount("recompute_seconds", recompute_seconds),
            expected_reuse=_check_amount("expected_reuse", expected_reuse),
            pinned=bool(pinned),
            resident=True,
            last_used=next(self._clock),
        )
        self._entries[key] = entry
        self._resident_bytes += entry.size_bytes

    def update(
        self,
        key: Hashable,
        *,
        recompute_seconds: float | None = None,
        expected_reuse: float | None = None,
        pinned: bool | None = None,
    ) -> None:
        """Change the given fields of a tracked checkpoint; ``None`` leaves one as is."""
        entry = self._entry(key)
        if recompute_seconds is not None:
            entry.recompute_seconds = _check_amount("recompute_seconds", recompute_seconds)
        if expected_reuse is not None:
            entry.expected_reuse = _check_amount("expected_reuse", expected_reuse)
        if pinned is not None:
            entry.pinned = bool(pinned)

    def remove(self, key: Hashable) -> None:
        """Forget a checkpoint entirely (deleted, lost, or no longer needed)."""
        entry = self._entries.pop(key, None)
        if entry is None:
            raise KeyError(f"checkpoint {key!r} is not in the cache")
        if entry.resident:
            self._resident_bytes -= entry.size_bytes

    def touch(self, key: Hashable) -> None:
        """Record a use of ``key``; among equal densities the least recently used goes first."""
        self._entry(key).last_used = next(self._clock)

    def mark_evicted(self, key: Hashable) -> None:
        """The checkpoint left memory but can be reloaded; stop counting its bytes.

        Raises
        ------
        ValueError
            The entry is pinned.
        """
        entry = self._entry(key)
        if entry.pinned:
            raise ValueError(f"checkpoint {key!r} is pinned and must not be evicted")
        if entry.resident:
            entry.resident = False
            self._resident_bytes -= entry.size_bytes

    def mark_resident(self, key: Hashable) -> None:
        """The checkpoint was reloaded into memory; count its bytes again."""
        entry = self._entry(key)
        if not entry.resident:
            entry.resident = True
            self._resident_bytes += entry.size_bytes
        entry.last_used = next(self._clock)

    def is_resident(self, key: Hashable) -> bool:
        """Whether ``key`` is currently counted as in memory."""
        return self._entry(key).resident

    def is_pinned(self, key: Hashable) -> bool:
        """Whether ``key`` is currently pinned."""
        return self._entry(key).pinned

    @property
    def resident_bytes(self) -> int:
        """Bytes held by resident entries, pinned ones included."""
        return self._resident_bytes

    def over_budget(self) -> int:
        """Bytes by which the resident entries exceed the budget (0 when within it)."""
        return max(0, self._resident_bytes - self.budget_bytes)

    def evictions(self) -> list[Hashable]:
        """Keys to evict, lowest benefit density first, until within budget.

        Pinned entries are never chosen and zero-byte entries are skipped
        (evicting them frees nothing), so the list may fall short of the
        budget when only those remain. Returns ``[]`` when within budget.
        """
        excess = self.over_budget()
        if excess == 0:
            return []
        candidates = [
            (key, entry)
            for key, entry in self._entries.items()
            if entry.resident and not entry.pinned and entry.size_bytes > 0
        ]
        candidates.sort(key=lambda item: (item[1].expected_reuse > 0, item[1].density, item[1].last_used))
        chosen: list[Hashable] = []
        for key, entry in candidates:
            if excess <= 0:
                break
            chosen.append(key)
            excess -= entry.size_bytes
        return chosen

    def __contains__(self, key: object) -> bool:
        return key in self._entries

    def __len__(self) -> int:
        return len(self._entries)

    def __iter__(self) -> Iterator[Hashable]:
        return iter(list(self._entries))

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(budget_bytes={self.budget_bytes}, entries={len(self)}, "
            f"resident_bytes={self.resident_bytes})"
        )
