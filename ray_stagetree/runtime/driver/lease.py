"""One driver per experiment folder: a lease file that names it.

Two drivers running one study (two `Tuner.restore` calls, two `stagetree
restore`, or a fresh `fit()` into a folder a live driver uses) would both
train all that is left, into one folder, each overwriting the other's
snapshots. `fit()` therefore holds a lease in the experiment folder
(`LEASE_FILE`, JSON: host, pid, start time, last heartbeat) while it runs,
and a second driver is refused with a message naming the first.

A lease is live while its driver renews it: a thread rewrites its heartbeat
every `HEARTBEAT_S`. A crashed driver's lease does not block forever: it
is stale once its heartbeat is `STALE_S` old, and at once on the machine
that held it when no process has its pid. The file goes through the
experiment's storage (fsspec), so it works on object stores too; there,
acquiring is a write read back, not an atomic create: two drivers starting
within the same instant may both win (each refuses a driver that comes after).

Ray-free: `tests/runtime/driver/test_lease.py` runs it on a clock of its own.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

from ray_stagetree.execution.storage import CheckpointStorage, CheckpointUnavailableError
from ray_stagetree.runtime.workers.scratch import process_exists

logger = logging.getLogger(__name__)

LEASE_FILE = "stagetree_driver.json"
#: Seconds between a live driver's heartbeats.
HEARTBEAT_S = 15.0
#: A lease whose heartbeat is this old is a crashed driver's (6 heartbeats
#: missed; generous for clocks that differ between machines a little).
STALE_S = 90.0


class ExperimentInUseError(RuntimeError):
    """Another live driver holds the experiment folder's lease."""


@dataclass(frozen=True)
class Holder:
    """Who holds a lease, as its file says."""

    host: str
    pid: int
    started: float  # seconds since the epoch, the holder's clock
    heartbeat: float
    token: str  # tells a driver's own lease from another's (same host and pid: two Tuners in one process)

    def alive(self, now: float, stale_s: float) -> bool:
        """Whether the holder still runs: a recent heartbeat, and on this
        machine a process with its pid; in this process, a lease not let go
        (one storage refused to remove is not held)."""
        if now - self.heartbeat >= stale_s:
            return False
        if self.host != socket.gethostname():
            return True
        if self.pid == os.getpid():
            return self.token in _HELD
        return process_exists(self.pid)

    def describe(self) -> str:
        started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(self.started))
        return f"pid {self.pid} on host {self.host!r}, started {started}"


#: Tokens of the leases this process holds now.
_HELD: set[str] = set()


def read_holder(storage: CheckpointStorage) -> Holder | None:
    """The lease's holder, or None without a readable lease (a damaged file holds nothing)."""
    try:
        data = json.loads(storage.read_key(LEASE_FILE))
        return Holder(
            str(data["host"]), int(data["pid"]), float(data["started"]), float(data["heartbeat"]), str(data["token"])
        )
    except (CheckpointUnavailableError, ValueError, KeyError, TypeError):
        return None


def check_free(
    storage: CheckpointStorage, path: str, clock: Callable[[], float] = time.time, stale_s: float = STALE_S
) -> None:
    """Raise `ExperimentInUseError` when a live driver holds the lease of
    the experiment at ``path`` (another process's, or another Tuner's in this one)."""
    holder = read_holder(storage)
    if holder is not None and holder.alive(clock(), stale_s):
        raise ExperimentInUseError(_in_use_message(path, holder, clock(), stale_s))


def _in_use_message(path: str, holder: Holder, now: float, stale_s: float) -> str:
    return (
        f"the experiment {path!r} is in use by another driver ({holder.describe()}; its last heartbeat "
        f"{max(0.0, now - holder.heartbeat):.0f} s ago): two drivers would train the same trials into one folder. "
        f"Wait for it to end, or stop it; a driver that crashed lets go after {stale_s:.0f} s without a heartbeat "
        f"(at once on its own machine), or delete {LEASE_FILE} from the folder if you are sure it is gone"
    )


class DriverLease:
    """The experiment folder's lease, held from `acquire` to `release`
    (a context manager too), renewed by a daemon thread meanwhile."""

    def __init__(
        self,
        storage: CheckpointStorage,
        path: str,
        clock: Callable[[], float] = time.time,
        heartbeat_s: float = HEARTBEAT_S,
        stale_s: float = STALE_S,
    ) -> None:
        self.storage = storage
        self.path = path
        self._clock = clock
        self._heartbeat_s = heartbeat_s
        self._stale_s = stale_s
        self._token = uuid.uuid4().hex
        self._started = clock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> DriverLease:
        self.acquire()
        return self

    def __exit__(self, *exc_info: Any) -> None:
        self.release()

    def acquire(self) -> None:
        """Take the lease, or raise `ExperimentInUseError` naming its live holder."""
        check_free(self.storage, self.path, self._clock, self._stale_s)
        self.renew()
        holder = read_holder(self.storage)
        if holder is not None and holder.token != self._token:  # another driver wrote just after this one
            raise ExperimentInUseError(_in_use_message(self.path, holder, self._clock(), self._stale_s))
        _HELD.add(self._token)
        self._thread = threading.Thread(target=self._beat, name="stagetree-driver-lease", daemon=True)
        self._thread.start()

    def renew(self) -> None:
        """Write the lease with a heartbeat of now."""
        holder = Holder(socket.gethostname(), os.getpid(), self._started, self._clock(), self._token)
        self.storage.write(LEASE_FILE, json.dumps(asdict(holder)).encode())

    def _beat(self) -> None:
        refused = False  # warned once per outage
        while not self._stop.wait(self._heartbeat_s):
            holder = read_holder(self.storage)
            if holder is not None and holder.token != self._token:
                # This driver stalled past STALE_S (a suspended process) and another took the folder over:
                # renewing would take it back from a driver that runs.
                logger.warning(
                    "the lease of the experiment %r was taken over by another driver (%s) while this one did not "
                    "renew it: both drive the study now",
                    self.path,
                    holder.describe(),
                )
                return
            try:
                self.renew()
            except OSError as error:  # storage unavailable for a while: the next heartbeat tries again
                (logger.debug if refused else logger.warning)(
                    "could not renew the lease of the experiment %r: %s", self.path, error
                )
                refused = True
            else:
                refused = False

    def release(self) -> None:
        """Stop renewing, and remove the lease if it is still this driver's."""
        _HELD.discard(self._token)
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None
        holder = read_holder(self.storage)
        if holder is not None and holder.token == self._token:
            try:
                self.storage.filesystem.rm_file(self.storage.path(LEASE_FILE))
            except OSError:
                pass  # the lease goes stale on its own
