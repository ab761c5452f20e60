"""What a checkpoint holds, and its forms: the one place that knows them.

A `CheckpointPayload` is what travels through the object store and is
written to storage: the iteration it was taken after, the RNG states, and
either a packed checkpoint directory or a class trainable's in-memory
state. Its forms:

* bytes in storage: `to_bytes` / `from_bytes` (a pickle, which the storage
  actor seals with the experiment's key, `execution.payload_auth`, before it
  is written, and verifies before `from_bytes` reads it);
* a trial's checkpoint folder, as Tune lays it out: `write_directory`;
* a checkpoint directory inside it: `pack_directory` / `unpack_directory`
  turn one into an uncompressed, deterministic tar archive and back (with
  safe extraction); `checksum` names stored bytes.
"""

from __future__ import annotations

import hashlib
import io
import os
import pickle
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from ray_stagetree.execution import stored_pickles

_CHECKSUM_ALGORITHM = "sha256"


@dataclass
class CheckpointPayload:
    """What a checkpoint holds in the object store and in storage."""

    # The iteration it was taken after. Payloads are pickled into storage:
    # the field keeps the name checkpoints were written with before the vocabulary rename.
    step: int
    rng: dict[str, Any]
    directory: bytes | None = None  # a packed ray.tune.Checkpoint directory
    state: Any = None  # or a StageTrainable.get_state() object
    # A data-parallel stage's (`execution.scaling`): the RNG states of ranks 1..N-1 (``rng`` is rank 0's).
    rank_rng: list[dict[str, Any]] | None = None


#: A payload's in-memory state, in its trial folder (`write_directory`).
STATE_FILE = "stage_state.pkl"


def size_of(payload: CheckpointPayload) -> int:
    if payload.directory is not None:
        return len(payload.directory)
    return len(pickle.dumps(payload.state, protocol=5))


def to_bytes(payload: CheckpointPayload) -> bytes:
    """The payload as stored (before sealing)."""
    return pickle.dumps(payload, protocol=5)


def from_bytes(data: bytes | memoryview) -> CheckpointPayload:
    """The payload `to_bytes` wrote. Only for bytes whose seal verified
    (`execution.payload_auth.unseal`): they were written by the experiment's
    own workers, so unpickling them runs nothing foreign."""
    return stored_pickles.loads(data)


def write_directory(payload: CheckpointPayload, path: str) -> None:
    """Lay the payload out in the local folder ``path`` as a trial's
    ``checkpoint_<step>/`` holds it: the trainable's checkpoint directory,
    or its in-memory state pickled into `STATE_FILE`."""
    if payload.directory is not None:
        unpack_directory(payload.directory, path)
        return
    with open(os.path.join(path, STATE_FILE), "wb") as file:
        pickle.dump(payload.state, file, protocol=5)


def checksum(data: bytes) -> str:
    """Checksum of ``data`` as ``"sha256:<hex digest>"``."""
    return f"{_CHECKSUM_ALGORITHM}:{hashlib.sha256(data).hexdigest()}"


def tree_entries(path: str, prefix: str = "", _inside: frozenset[str] = frozenset()) -> Iterator[tuple[str, str]]:
    """(archive name, local path) of everything under ``path``, depth first in
    name order, a directory just before its contents.

    Symbolic links are followed, as Tune's checkpoint upload (pyarrow's
    ``copy_files``) follows them: a linked file or folder is an entry like
    any other, and what it points to is what gets copied (a checkpoint that
    links its weights from elsewhere is kept whole, not dropped).

    Raises
    ------
    ValueError
        A link points to nothing, or to a folder it is inside of (followed,
        the tree would never end); the message names the link.
    """
    inside = _inside | {os.path.realpath(path)}
    with os.scandir(path) as scan:
        entries = sorted(scan, key=lambda entry: entry.name)
    for entry in entries:
        arcname = f"{prefix}{entry.name}"
        if entry.is_symlink():
            _check_link(entry.path, arcname, inside)
        yield arcname, entry.path
        if entry.is_dir():
            yield from tree_entries(entry.path, f"{arcname}/", inside)


def _check_link(link: str, arcname: str, inside: frozenset[str]) -> None:
    target = os.readlink(link)
    if not os.path.exists(link):
        raise ValueError(f"{arcname!r} is a symbolic link to {target!r}, which does not exist")
    if os.path.realpath(link) in inside:
        raise ValueError(f"{arcname!r} is a symbolic link to {target!r}, a folder it is inside of (a cycle)")


def pack_directory(path: str) -> bytes:
    """Pack the directory tree at ``path`` into an uncompressed tar archive.

    Entries are added in sorted order with owner and modification time
    cleared, so equal trees give equal bytes (and equal checksums). Empty
    subdirectories are kept. Symbolic links are followed (`tree_entries`):
    the archive holds what they point to, never a link.

    Parameters
    ----------
    path:
        A local directory, e.g. a ``ray.tune.Checkpoint``'s ``path``.

    Raises
    ------
    NotADirectoryError
        ``path`` is not a directory.
    ValueError
        The tree holds a special file (device, FIFO, socket), a link that
        points to nothing, or a link cycle; such entries cannot be copied,
        so they are refused here, naming them, rather than lost silently.
    """
    if not os.path.isdir(path):
        raise NotADirectoryError(f"cannot pack {path!r}: not a directory")
    buffer = io.BytesIO()
    # dereference: an entry's information is what a link points to (os.stat, not os.lstat).
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT, dereference=True) as archive:
        try:
            for arcname, full in tree_entries(path):
                _add(archive, arcname, full)
        except ValueError as error:
            raise ValueError(
                f"cannot pack {path!r}: {error}; checkpoint directories may hold only files and directories "
                "(or symbolic links to them)"
            ) from None
    return buffer.getvalue()


def _add(archive: tarfile.TarFile, arcname: str, full: str) -> None:
    mode = os.stat(full).st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise ValueError(f"{arcname!r} is a special file")
    info = archive.gettarinfo(full, arcname=arcname)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    if info.isfile():
        with open(full, "rb") as handle:
            archive.addfile(info, handle)
    else:
        archive.addfile(info)


def _check_member(member: tarfile.TarInfo) -> None:
    name = member.name
    if name.startswith("/") or name.startswith("\\"):
        raise ValueError(f"refusing to unpack checkpoint: absolute path {name!r} in archive")
    if ".." in name.replace("\\", "/").split("/"):
        raise ValueError(f"refusing to unpack checkpoint: {name!r} leaves the target directory ('..')")
    if not (member.isfile() or member.isdir()):
        kind = "link" if (member.issym() or member.islnk()) else "device or special file"
        raise ValueError(f"refusing to unpack checkpoint: {name!r} is a {kind}")


def unpack_directory(data: bytes, path: str) -> None:
    """Restore an archive made by `pack_directory` into ``path``.

    Every member is checked before anything is written: absolute names,
    ``..`` components, links and devices are refused. Extraction also uses
    tarfile's ``"data"`` filter where the Python version has it.

    Parameters
    ----------
    data:
        Archive bytes.
    path:
        Target directory; created if missing. Existing files with the same
        names are overwritten.

    Raises
    ------
    ValueError
        ``data`` is not a tar archive, or it holds an unsafe member.
    """
    try:
        archive = tarfile.open(fileobj=io.BytesIO(data), mode="r:")
    except tarfile.TarError as error:
        raise ValueError(f"cannot unpack checkpoint into {path!r}: not a tar archive ({error})") from error
    with archive:
        members = archive.getmembers()
        for member in members:
            _check_member(member)
        os.makedirs(path, exist_ok=True)
        if hasattr(tarfile, "data_filter"):
            try:
                archive.extractall(path, members=members, filter="data")
            except tarfile.FilterError as error:
                raise ValueError(f"refusing to unpack checkpoint into {path!r}: {error}") from error
        else:  # pragma: no cover - Python without extraction filters
            archive.extractall(path, members=members)
