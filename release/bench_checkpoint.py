"""Checkpoint-path benchmark: object-store hand-off and fsspec spill/reload of
10 MB, 100 MB and 1 GB checkpoint states, next to a plain memory copy and a
plain file write/read of the same bytes.

Every path below is the library's own code where one exists:

* memory copy       ``bytearray(data)``: the baseline for the in-memory paths.
* put+get           ``ray.get(ray.put(data))`` in the driver.
* hand-off          the runtime's path: a real `StageWorker` actor runs a
                    function trainable that saves a torch state file and
                    reports it as a ``ray.tune.Checkpoint``; the worker packs
                    it into its outbox, and the caller (the driver standing in
                    for the controller, which is equally the owner) times
                    ``ray.get(worker.take_checkpoint.remote(key))``: pickling
                    in the worker, the copy into the object store and the
                    caller's deserialization.
* file write/read   ``open(...).write(data)`` + close / ``open(...).read()``:
                    the baselines for the storage paths.
* spill / reload    ``CheckpointStorage(<temp dir>).write(key, data)`` and
                    ``.read(stored)`` on the local filesystem through fsspec;
                    both include the SHA-256 checksum (computed on write,
                    verified on read) and the write its temp-name + rename.
* spill task /      the runtime's `StorageIO` actor of
  reload task       `ray_stagetree.runtime.control.checkpoint_store`, end to end: its ``write``
                    fetches the payload from the object store, pickles it and
                    spills it (sealed with an HMAC); its ``reload`` reads, verifies and unpickles it
                    and puts it back, and the caller gets it.
* pack / unpack     `pack_directory` / `unpack_directory` of a directory
                    holding one torch state file of the size.

No path calls fsync: the plain write and the spill both stop at close (and
rename), and reads hit the page cache right after the write, so the storage
columns measure the software path, not the disk. Sizes are decimal (1 MB =
10**6 bytes); MB/s is bytes / median seconds over the repeats. Ratios are of
times: how many times longer a path takes than its baseline (1.0 = as fast).
Small sizes measure per-call latency (a Ray call costs milliseconds) and
buffers the allocator reuses; throughput is read from 100 MB up. Every copy
into fresh memory pays page faults, so memcpy is a copy-with-allocation,
like the copies the checkpoint paths make.

    python release/bench_checkpoint.py             # 10 MB, 100 MB, 1 GB
    python release/bench_checkpoint.py --quick     # 1 MB, 1 repeat (CI smoke test)
    python release/bench_checkpoint.py --sizes 100 --repeats 5
"""

from __future__ import annotations

import gc
import logging
import os
import platform
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from typing import Any

import fsspec
import harness
import numpy as np
import ray
import ray.cloudpickle
import torch

from ray_stagetree.execution.batches import BatchSpec, FlushReply
from ray_stagetree.execution.payload import pack_directory, unpack_directory
from ray_stagetree.execution.sealed_storage import SealedStorage
from ray_stagetree.execution.storage import CheckpointStorage
from ray_stagetree.planning.config import TrialConfig
from ray_stagetree.runtime.control.checkpoint_store import StudyStorage, storage_io
from ray_stagetree.runtime.workers.worker import StageWorker

MB = 10**6
OBJECT_STORE_BYTES = 4 * 2**30  # room for a 1 GB object in flight plus one not yet freed
STATE_FILE = "model.pt"

# Columns of the throughput table, in order: (key, header).
COLUMNS = [
    ("memcpy", "memcpy"),
    ("put_get", "put+get"),
    ("handoff", "hand-off"),
    ("file_write", "f.write"),
    ("spill", "spill"),
    ("file_read", "f.read"),
    ("reload", "reload"),
    ("spill_task", "spill tk"),
    ("reload_task", "reload tk"),
    ("pack", "pack"),
    ("unpack", "unpack"),
]
# Ratios of times: (header, path, baseline).
RATIOS = [
    ("hand-off/memcpy", "handoff", "memcpy"),
    ("put+get/memcpy", "put_get", "memcpy"),
    ("spill/f.write", "spill", "file_write"),
    ("reload/f.read", "reload", "file_read"),
    ("spill tk/f.write", "spill_task", "file_write"),
    ("reload tk/f.read", "reload_task", "file_read"),
]


def save_state(directory: str, size: int) -> None:
    """A torch state file of about ``size`` bytes (one uint8 tensor, random so
    that nothing downstream could shortcut zero pages)."""
    weights = torch.randint(0, 256, (size,), dtype=torch.uint8)
    torch.save({"weights": weights}, os.path.join(directory, STATE_FILE))


def checkpointing_trainable(config: dict) -> None:
    """Function trainable for the hand-off: one iteration, one checkpoint of a
    torch state of ``config["state_bytes"]`` bytes, reported the Tune way."""
    from ray.tune import Checkpoint

    from ray_stagetree import report

    with tempfile.TemporaryDirectory() as directory:
        save_state(directory, config["state_bytes"])
        report({"loss": 0.0}, checkpoint=Checkpoint.from_directory(directory))


def timed(action: Callable[[], Any]) -> tuple[float, Any]:
    """Seconds ``action`` takes, and its result (held until the clock stops,
    so freeing a big result is not counted)."""
    start = time.perf_counter()
    result = action()
    return time.perf_counter() - start, result


class ControllerStub:
    """The part of `StudyController` a worker talks to during a batch: it
    takes the worker's flushes and notes which checkpoints wait in its outbox."""

    def __init__(self) -> None:
        self.checkpoints: list[tuple[int, int, str, int]] = []

    def worker_report(self, outcome: Any) -> FlushReply:
        self.checkpoints.extend(outcome.checkpoints)
        # Checkpoint the batch's end (the iteration just reported), end it there, no continuation.
        end = outcome.records[-1][1] if outcome.records else 0
        return FlushReply([end], end, end)

    def take_notes(self) -> list[tuple[int, int, str, int]]:
        notes, self.checkpoints = self.checkpoints, []
        return notes


class Runtime:
    """A real stage worker and the runtime's storage tasks, driven from here as
    the controller would drive them."""

    def __init__(self, storage: CheckpointStorage) -> None:
        self.storage = storage
        self.io = storage_io()  # as the controller starts it
        self.study = StudyStorage.of(SealedStorage(storage, os.urandom(32)))
        self.controller = ray.remote(ControllerStub).options(num_cpus=0).remote()
        actor = ray.remote(StageWorker).options(max_concurrency=2)  # as the controller starts it
        self.worker = actor.remote(ray.cloudpickle.dumps(checkpointing_trainable), self.controller)
        self._batches = 0

    def checkpoint_in_outbox(self, size: int) -> tuple[str, int]:
        """Run a one-iteration batch that leaves a checkpoint in the worker's
        outbox (untimed); returns its outbox key and payload size."""
        self._batches += 1
        config = {"state_bytes": size}
        spec = BatchSpec(
            self._batches,
            config,
            segments=[(0, 0, 1)],
            save_iterations={1},
            trial_config=TrialConfig.from_config(config),
        )
        outcome = ray.get(self.worker.run_batch.remote(spec))
        if outcome.error:
            raise RuntimeError(outcome.error)
        # A batch's last checkpoint comes back with its outcome, the others with flushes.
        [(_, _, key, payload_bytes)] = ray.get(self.controller.take_notes.remote()) + outcome.checkpoints
        return key, payload_bytes

    def measure(self, size: int, key: str) -> dict[str, float]:
        """Seconds for hand-off, spill task and reload task of one checkpoint."""
        outbox_key, payload_bytes = self.checkpoint_in_outbox(size)
        seconds: dict[str, float] = {"payload_bytes": payload_bytes}

        start = time.perf_counter()
        ref = self.worker.take_checkpoint.remote(outbox_key)
        payload = ray.get(ref)
        seconds["handoff"] = time.perf_counter() - start
        assert len(payload.directory) == payload_bytes
        del payload  # the caller's copy; the object store keeps the one the spill task reads

        start = time.perf_counter()
        stored = ray.get(self.io.write.remote(self.study, key, ref))
        seconds["spill_task"] = time.perf_counter() - start
        del ref

        start = time.perf_counter()
        verdict, reloaded = self.io.reload.remote(self.study, stored, key)
        assert ray.get(verdict) is None
        payload = ray.get(reloaded)
        seconds["reload_task"] = time.perf_counter() - start
        assert len(payload.directory) == payload_bytes
        del payload, reloaded, verdict
        self.storage.delete(stored)
        return seconds


def measure_local(data: bytes, storage: CheckpointStorage, scratch: str, key: str) -> dict[str, float]:
    """Seconds for the driver-side paths on ``data``: memory copy, put+get,
    plain file write/read and the storage's spill/reload."""
    seconds: dict[str, float] = {}
    # [0]: each copy is dropped before the next path runs, so none of them
    # times its allocations against a heap already holding an extra copy.
    seconds["memcpy"] = timed(lambda: bytearray(data))[0]
    seconds["put_get"] = timed(lambda: ray.get(ray.put(data)))[0]

    plain = os.path.join(scratch, "plain.bin")

    def file_write() -> None:
        with open(plain, "wb") as handle:
            handle.write(data)

    def file_read() -> bytes:
        with open(plain, "rb") as handle:
            return handle.read()

    seconds["file_write"] = timed(file_write)[0]
    seconds["file_read"] = timed(file_read)[0]
    os.remove(plain)

    seconds["spill"], stored = timed(lambda: storage.write(key, data))
    seconds["reload"] = timed(lambda: storage.read(stored))[0]
    storage.delete(stored)
    return seconds


def measure_pack(size: int, scratch: str) -> dict[str, float]:
    """Seconds for `pack_directory` / `unpack_directory` of a directory
    holding one torch state file of ``size`` bytes."""
    source = os.path.join(scratch, "state")
    target = os.path.join(scratch, "restored")
    os.makedirs(source)
    save_state(source, size)
    try:
        seconds: dict[str, float] = {}
        seconds["pack"], archive = timed(lambda: pack_directory(source))
        seconds["unpack"] = timed(lambda: unpack_directory(archive, target))[0]
        return seconds
    finally:
        shutil.rmtree(source, ignore_errors=True)
        shutil.rmtree(target, ignore_errors=True)


def bench_size(size: int, repeats: int, runtime: Runtime, scratch: str) -> tuple[dict[str, float], int]:
    """Median seconds per path for ``size`` bytes, and the hand-off payload size."""
    samples: dict[str, list[float]] = {}
    payload_bytes = 0
    data = np.random.default_rng(size).bytes(size)
    for repeat in range(repeats):
        key = f"checkpoints/bench_{size}_{repeat}.ckpt"
        rounds = [
            measure_local(data, runtime.storage, scratch, key),
            runtime.measure(size, key),
            measure_pack(size, scratch),
        ]
        for result in rounds:
            for name, value in result.items():
                if name == "payload_bytes":
                    payload_bytes = int(value)
                else:
                    samples.setdefault(name, []).append(value)
        gc.collect()
    del data
    gc.collect()
    return {name: statistics.median(values) for name, values in samples.items()}, payload_bytes


def label(size: int) -> str:
    return f"{size // 1000**3} GB" if size >= 1000**3 else f"{size // MB} MB"


def print_machine(scratch: str) -> None:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as handle:
            cpu = next((line.split(":", 1)[1].strip() for line in handle if line.startswith("model name")), cpu)
    except OSError:
        pass
    print(
        f"machine: {platform.platform()}, {cpu}, {os.cpu_count()} CPUs; python {platform.python_version()}, "
        f"ray {ray.__version__}, torch {torch.__version__}, fsspec {fsspec.__version__}"
    )
    print(
        f"storage: {scratch} (local fsspec), object store {OBJECT_STORE_BYTES / 2**30:.0f} GiB; "
        f"load average {os.getloadavg()[0]:.2f} (other work on the CPUs skews the numbers)"
    )


LEGEND = """\
MB = 10**6 bytes. memcpy = bytearray(data); put+get = ray.get(ray.put(data)) in the driver;
hand-off = ray.get(StageWorker.take_checkpoint.remote(key)) of a packed torch checkpoint (payload B bytes);
f.write / f.read = plain open+write+close / open+read: no fsync, page cache warm;
spill / reload = CheckpointStorage.write / .read on a local path, SHA-256 included;
spill tk / reload tk = the runtime's StorageIO.write / .reload actor calls end to end (object store fetch,
pickle, storage; storage, unpickle, put back, get); pack / unpack = pack_directory / unpack_directory."""


def main() -> None:
    parser = harness.parser(__doc__)
    parser.add_argument("--sizes", type=int, nargs="+", default=None, help="sizes in MB, overriding the defaults")
    parser.add_argument("--dir", default=None, help="directory for the file and storage paths (default: a temp dir)")
    args = harness.parse(parser)
    section = harness.Section("Checkpoint path (`bench_checkpoint.py`)", args)
    sizes = [1 * MB] if args.quick else [10 * MB, 100 * MB, 1000 * MB]
    if args.sizes:
        sizes = [megabytes * MB for megabytes in args.sizes]
    repeats = args.repeats

    scratch = tempfile.mkdtemp(prefix="bench_checkpoint_", dir=args.dir)
    with section.verbatim():
        print_machine(scratch)
    harness.start_ray(num_cpus=2, object_store_memory=OBJECT_STORE_BYTES, logging_level=logging.WARNING)
    try:
        runtime = Runtime(CheckpointStorage(os.path.join(scratch, "storage")))
        # Warm-up: start the actor and the task worker, import everything once.
        bench_size(1000, 1, runtime, scratch)

        with section.verbatim():
            measure(sizes, repeats, runtime, scratch)
    finally:
        ray.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)
    section.text(LEGEND.replace("\n", " "))
    section.emit()


def measure(sizes: list[int], repeats: int, runtime: Runtime, scratch: str) -> None:
    """Each path's throughput per size, and their time ratios, as text tables."""
    print(f"\nMB/s, median of {repeats} run(s)")
    print(f"{'size':>6} {'payload B':>13}" + "".join(f" {header:>9}" for _, header in COLUMNS))
    results: list[tuple[int, dict[str, float]]] = []
    for size in sizes:
        seconds, payload_bytes = bench_size(size, repeats, runtime, scratch)
        throughputs = "".join(f" {size / seconds[name] / MB:>9.0f}" for name, _ in COLUMNS)
        print(f"{label(size):>6} {payload_bytes:>13,}{throughputs}", flush=True)
        results.append((size, seconds))

    print("\ntime ratios (path / baseline; 1.0 = as fast as the baseline)")
    print(f"{'size':>6}" + "".join(f" {header:>16}" for header, _, _ in RATIOS))
    for size, seconds in results:
        print(f"{label(size):>6}" + "".join(f" {seconds[p] / seconds[b]:>16.2f}" for _, p, b in RATIOS))


if __name__ == "__main__":
    main()
