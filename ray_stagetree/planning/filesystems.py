"""Where a study's files live: the one storage backend protocol.

Every file the project writes (the plan's tables, checkpoint payloads, trial
folders) goes through an ``fsspec.AbstractFileSystem``: `resolve` turns a
URL, or Tune's ``storage_filesystem`` (a ``pyarrow.fs.FileSystem`` or an
fsspec one) and a path inside it, into that filesystem and its path. A URL
whose fsspec driver is not installed (``s3://`` without s3fs, ``gs://``
without gcsfs) is opened with pyarrow's own filesystem, as Tune opens it.
`arrow_filesystem` is the adapter back for the readers whose API takes only
pyarrow (Parquet, Tune's ``Checkpoint``); a pyarrow filesystem given by the
user comes back as itself. A new backend needs nothing here: any installed
fsspec driver is one.
"""

from __future__ import annotations

import os
from typing import Any

import fsspec
import pyarrow as pa
import pyarrow.fs as pafs
from fsspec.implementations.arrow import ArrowFSWrapper


def is_local(path: str, storage_filesystem: Any = None) -> bool:
    """Whether ``path`` is on this machine's disk: neither a URL nor a path
    inside a given ``storage_filesystem``."""
    return "://" not in path and storage_filesystem is None


def absolute_path(path: str, storage_filesystem: Any = None) -> str:
    """A local path made absolute (``~`` expanded); URLs, and paths inside a
    given ``storage_filesystem``, as they are."""
    if not is_local(path, storage_filesystem):
        return path
    return os.path.abspath(os.path.expanduser(path))


def is_filesystem(value: Any) -> bool:
    """Whether ``value`` is a filesystem `resolve` takes: pyarrow's or fsspec's."""
    return isinstance(value, (pafs.FileSystem, fsspec.AbstractFileSystem))


def resolve(url: str, storage_filesystem: Any = None) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem and path of ``url``: a local path or any fsspec URL,
    or, with ``storage_filesystem``, a path inside that filesystem.

    Raises
    ------
    TypeError
        ``storage_filesystem`` is neither pyarrow's nor fsspec's.

    Examples
    --------
    >>> filesystem, path = resolve("memory://studies/a")
    >>> type(filesystem).__name__, path
    ('MemoryFileSystem', '/studies/a')
    """
    if storage_filesystem is None:
        try:
            return fsspec.core.url_to_fs(url)
        except ImportError as missing_driver:
            resolved = _pyarrow_resolve(url)
            if resolved is None:
                raise missing_driver  # neither knows the scheme: fsspec's error names the package to install
            return resolved
    if not is_filesystem(storage_filesystem):
        raise TypeError(
            "storage_filesystem must be a pyarrow.fs.FileSystem, an fsspec.AbstractFileSystem or None, "
            f"got {type(storage_filesystem).__name__}"
        )
    filesystem = (
        ArrowFSWrapper(storage_filesystem) if isinstance(storage_filesystem, pafs.FileSystem) else storage_filesystem
    )
    return filesystem, filesystem._strip_protocol(url)


def _pyarrow_resolve(url: str) -> tuple[fsspec.AbstractFileSystem, str] | None:
    """``url`` opened by pyarrow's own filesystems (S3, GCS, HDFS, ...), as
    Tune's storage opens it; None when pyarrow does not know its scheme."""
    try:
        filesystem, path = pafs.FileSystem.from_uri(url)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None
    return ArrowFSWrapper(filesystem), path


def arrow_filesystem(filesystem: Any) -> pafs.FileSystem:
    """``filesystem`` as pyarrow opens files: a pyarrow one (or one `resolve`
    wrapped) as it is, an fsspec one wrapped."""
    if isinstance(filesystem, pafs.FileSystem):
        return filesystem
    if isinstance(filesystem, ArrowFSWrapper):
        return filesystem.fs
    return pafs.PyFileSystem(pafs.FSSpecHandler(filesystem))
