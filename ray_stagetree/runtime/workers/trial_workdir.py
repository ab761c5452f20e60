"""A stage worker in the working directory of its batch's trial, as Tune's
trainable actor changes into its trial's (`execution.working_dirs`); with
``SyncConfig(sync_artifacts=True)`` the folder's files go to the trial's
folder in storage when Tune's report would sync them, and as the batch ends."""

from __future__ import annotations

import logging
import math
import os
import time

from ray_stagetree.execution import working_dirs
from ray_stagetree.execution.batches import BatchSpec
from ray_stagetree.trial_schedulers.ray_fields import ray_artifacts_folder

logger = logging.getLogger(__name__)

#: The trial working directory this process is in, while a batch runs in one.
_current: str | None = None
#: When this process last synced each trial folder to storage (`time.monotonic`), by folder.
_uploaded: dict[str, float] = {}
#: The studies (`WorkingDir.root`) this process kept files of where trials fork: removed at `close`.
_kept_roots: set[str] = set()


def current() -> str | None:
    """The trial working directory this process is in, while a batch runs in one."""
    return _current


def _changes_directory(spec: BatchSpec) -> bool:
    return spec.working_dir is not None and working_dirs.changes_directory()


def enter(spec: BatchSpec, seed: bool = True) -> None:
    """Change into ``spec``'s trial working directory (``seed``: a new one
    starts from the files kept where the batch starts; a data-parallel
    group's other ranks only join it). Files that cannot be copied (a
    socket, a full disk) are logged, never the batch's failure."""
    global _current
    if not _changes_directory(spec):
        return
    assert spec.working_dir is not None
    artifacts = ray_artifacts_folder()
    try:
        _current = working_dirs.enter(spec.working_dir, artifacts, spec.source_point if seed else None)
    except OSError as error:
        logger.warning("%r's working directory misses files of where it forks: %s", spec.trial_name, error)
        _current = working_dirs.enter(spec.working_dir, artifacts, None)


def reported(spec: BatchSpec, node_id: int, iteration: int, fork: bool, saved: bool) -> None:
    """The batch reported ``iteration`` of node ``node_id``, with a checkpoint
    (``saved``) or not: keep the folder's files where trials ``fork`` (a
    failure is logged, never the batch's: a forking trial then starts with
    an empty folder), and sync them where ``SyncConfig(sync_artifacts=True)``
    asks, as Tune's report does: at each checkpoint
    (``sync_artifacts_on_checkpoint``), else once ``sync_period`` passed
    since the last sync (the first report syncs)."""
    if not _changes_directory(spec):
        return
    working_dir = spec.working_dir
    assert working_dir is not None
    if fork:
        _kept_roots.add(working_dir.root)
        try:
            working_dirs.keep(working_dir, ray_artifacts_folder(), (node_id, iteration))
        except OSError as error:  # a full disk
            logger.warning("the files of %r's working directory were not kept: %s", spec.trial_name, error)
    if not working_dir.upload:  # (most studies: no work at a report without a fork)
        return
    last = _uploaded.get(working_dir.folder, -math.inf)
    if (saved and working_dir.upload_at_checkpoints) or time.monotonic() - last >= working_dir.upload_period_s:
        _upload(spec, ray_artifacts_folder())


def leave(spec: BatchSpec, reached: int, upload: bool = True) -> None:
    """Back to the worker's own directory once the batch reached iteration
    ``reached``; ``upload``: its files go to the trial's folder where
    ``SyncConfig(sync_artifacts=True)`` asks. Its end was kept as the
    checkpoint the plan needs there (`reported`)."""
    global _current
    if not _changes_directory(spec):
        return
    assert spec.working_dir is not None
    artifacts = ray_artifacts_folder()
    working_dirs.leave(artifacts)
    _current = None
    if upload and spec.working_dir.upload and reached > spec.start:
        _upload(spec, artifacts)


def close() -> None:
    """The study is over: the files kept where its trials forked go (its
    trials' own folders stay, as Tune's do)."""
    if _kept_roots:
        artifacts = ray_artifacts_folder()
        for root in _kept_roots:
            working_dirs.drop_kept(root, artifacts)
        _kept_roots.clear()


def _upload(spec: BatchSpec, artifacts: str) -> None:
    """The folder's files into the trial's folder in storage; a failure is
    logged, never the batch's (its training stands)."""
    assert spec.working_dir is not None
    if spec.reported_storage is None:
        return
    _uploaded[spec.working_dir.folder] = time.monotonic()
    try:
        storage = spec.reported_storage.storage
        storage.upload_directory(os.path.join(artifacts, spec.working_dir.folder), spec.working_dir.trial_folder)
    except Exception as error:  # each fsspec backend raises its own
        logger.warning("the working directory of %r was not synced to storage: %s", spec.trial_name, error)
