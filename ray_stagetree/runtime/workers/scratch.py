"""One folder per worker process for the temporary folders its batches make
(a checkpoint unpacked for the trainable, the last checkpoint it reported, a
class trainable's save).

`StageWorker.close` removes it whole when the study ends, so a batch that
never reached its own clean-up (a trainable still parked, a batch running
when the study was stopped) leaves no copy of a model in the node's
temporary folder. A worker process that was killed (the time budget, a
broken worker, a lost driver) cannot remove its own: the next worker to
start on the host removes the folders of processes that are gone
(`reap`).
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import tempfile

PREFIX = "stagetree_worker_"
_folder: str | None = None


def mkdtemp(prefix: str) -> str:
    """A new folder under this process's scratch folder (made on first use)."""
    global _folder
    if _folder is None or not os.path.isdir(_folder):
        # The host in the name: processes of another host (or container) sharing the folder are not judged by pid.
        _folder = tempfile.mkdtemp(prefix=f"{PREFIX}{os.getpid()}_{_host()}_")
    return tempfile.mkdtemp(prefix=prefix, dir=_folder)


def remove() -> None:
    """Remove this process's scratch folder and everything in it."""
    global _folder
    if _folder is not None:
        shutil.rmtree(_folder, ignore_errors=True)
        _folder = None


def reap() -> list[str]:
    """Remove the scratch folders of this host's worker processes that no
    longer run; the folders removed."""
    if os.name != "posix":  # os.kill(pid, 0) tests a process only on POSIX
        return []
    removed, host = [], _host()
    for path in glob.glob(os.path.join(tempfile.gettempdir(), f"{PREFIX}*")):
        parts = os.path.basename(path)[len(PREFIX) :].split("_", 2)  # pid, host, mkdtemp's suffix
        if len(parts) == 3 and parts[1] == host and parts[0].isdigit() and not process_exists(int(parts[0])):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def process_exists(pid: int) -> bool:
    """Whether process ``pid`` runs on this host (POSIX)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: it exists
        return True
    return True


def _host() -> str:
    """This host's name as folder names hold it: without "_", which separates their parts."""
    return socket.gethostname().replace("_", "-")
