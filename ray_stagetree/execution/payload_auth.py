"""Authenticated checkpoint payloads: an HMAC keyed by a per-experiment
secret that is kept outside the experiment directory.

Checkpoint payloads are pickles (a class trainable's state is any Python
object), and the plan's checksum only detects damage: whoever can write the
experiment directory can also write a matching checksum. So every payload is
sealed with HMAC-SHA256 over its storage key and bytes, under a key that
never enters storage, and a payload whose tag does not verify is refused
before anything unpickles it (the runtime then retrains that checkpoint).

The key of an experiment lives on the driver's machine, in
``~/.ray_stagetree/keys/<experiment id>`` (``RAY_STAGETREE_KEY_DIR`` moves
the folder), created with mode 0600 the first time the experiment runs. The
experiment id is a random name written into the experiment directory
(``stagetree_experiment_id``), so a moved or renamed directory finds its key;
rewriting the id only leads to a key that cannot verify what is there.

Without its key (another machine, a deleted key file), the experiment's
stored checkpoints cannot be authenticated: they are retrained, with a
warning that says so, unless ``RAY_STAGETREE_TRUST_STORAGE=1`` states that
the directory is trusted (then they are read as before: checksum only).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import uuid
from typing import Any

from ray_stagetree.execution.storage import CheckpointCorruptError, CheckpointStorage, CheckpointUnavailableError

#: File in the experiment directory naming the experiment's key (not the key).
ID_FILE = "stagetree_experiment_id"
KEY_DIR_ENV = "RAY_STAGETREE_KEY_DIR"
TRUST_ENV = "RAY_STAGETREE_TRUST_STORAGE"
_MAGIC = b"RSTSEAL1"
_TAG_BYTES = hashlib.sha256().digest_size
_ID_PATTERN = re.compile(r"[0-9a-f]{32}")


def key_dir() -> str:
    """Folder of the experiments' keys on this machine."""
    return os.path.expanduser(os.environ.get(KEY_DIR_ENV) or "~/.ray_stagetree/keys")


def trust_storage() -> bool:
    """Whether the user declared the experiment directory trusted
    (``RAY_STAGETREE_TRUST_STORAGE=1``): unauthenticated payloads are read."""
    return os.environ.get(TRUST_ENV, "").strip().lower() in ("1", "true", "yes")


def experiment_id(storage: CheckpointStorage) -> str:
    """The experiment's id, written into its directory on first use. An id
    that is not 32 hex digits (a rewritten file) is replaced, never used as
    a file name."""
    try:
        found = storage.read_key(ID_FILE).decode("ascii", "replace").strip()
    except CheckpointUnavailableError:
        found = ""
    if _ID_PATTERN.fullmatch(found):
        return found
    new = uuid.uuid4().hex
    storage.write(ID_FILE, new.encode())
    return new


def experiment_key(storage: CheckpointStorage) -> tuple[bytes, bool]:
    """(the experiment's key, whether it existed before this call). A new
    key is created when there is none: what this run writes is sealed with
    it, and what earlier runs wrote no longer verifies."""
    path = os.path.join(key_dir(), experiment_id(storage))
    try:
        with open(path, "rb") as file:
            key = file.read()
        if len(key) == 32:
            return key, True
    except FileNotFoundError:
        pass
    os.makedirs(key_dir(), mode=0o700, exist_ok=True)
    key = os.urandom(32)
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "wb") as file:
        file.write(key)
    return key, False


def existing_key(storage: CheckpointStorage) -> bytes | None:
    """The experiment's key when this machine holds it; creates nothing."""
    try:
        found = storage.read_key(ID_FILE).decode("ascii", "replace").strip()
        if not _ID_PATTERN.fullmatch(found):
            return None
        with open(os.path.join(key_dir(), found), "rb") as file:
            key = file.read()
    except (CheckpointUnavailableError, FileNotFoundError):
        return None
    return key if len(key) == 32 else None


def seal_record(key: bytes, name: str, record: dict[str, Any]) -> str:
    """An HMAC tag binding the JSON ``record`` stored under ``name`` to the
    experiment: a JSON file that names code to import (``stagetree_job.json``)
    is trusted like a sealed payload, never because it is in the folder."""
    return _tag(key, name, json.dumps(record, sort_keys=True).encode()).hex()


def verify_record(key: bytes | None, name: str, record: dict[str, Any], tag: Any) -> bool:
    """Whether ``tag`` is `seal_record`'s for ``record`` under ``key``."""
    return key is not None and isinstance(tag, str) and hmac.compare_digest(tag, seal_record(key, name, record))


def _tag(key: bytes, name: str, data: Any) -> bytes:
    mac = hmac.new(key, name.encode() + b"\0", hashlib.sha256)
    mac.update(data)
    return mac.digest()


def seal(key: bytes, name: str, data: bytes) -> bytes:
    """``data`` with a header authenticating it as the payload stored under
    ``name`` (a key relative to the experiment directory): a payload copied
    to another checkpoint's name does not verify either."""
    return _MAGIC + _tag(key, name, data) + data


def unseal(key: bytes | None, name: str, sealed: bytes, trusted: bool = False) -> memoryview:
    """The payload bytes of ``sealed``, after verifying its tag.

    Raises
    ------
    CheckpointCorruptError
        The tag is missing or does not verify (a payload not written under
        this experiment's key, or changed since), unless ``trusted``.
    """
    view = memoryview(sealed)
    header = len(_MAGIC) + _TAG_BYTES
    if bytes(view[: len(_MAGIC)]) == _MAGIC and len(view) >= header:
        data = view[header:]
        if key is not None and hmac.compare_digest(bytes(view[len(_MAGIC) : header]), _tag(key, name, data)):
            return data
        if trusted:
            return data
    elif trusted:
        return view
    raise CheckpointCorruptError(
        f"checkpoint {name!r} is not authenticated by this experiment's key (written by another run whose key "
        f"this machine lacks, or changed since it was written); it is not loaded. If the experiment directory "
        f"is trusted, copy its key into {key_dir()} or set {TRUST_ENV}=1"
    )
