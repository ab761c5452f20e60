"""A trainable's output for its trials' folders (``RunConfig(log_to_file=...)``).

Under Tune each trial's actor writes what its trainable prints, and Ray's
logger, into files of the trial's folder. Here a worker's process runs
batch after batch, of many trials: while a batch's trainable runs, what
its thread writes to ``sys.stdout`` and ``sys.stderr`` (still shown as
before) and what Ray's logger records from it are kept, and each of the
batch's outcomes carries them to the controller, which hands them to the
driver for every trial the batch serves (a shared stage's output belongs
to each of them, as its checkpoints do).
"""

from __future__ import annotations

import contextlib
import logging
import sys
import threading
from collections.abc import Iterator
from typing import Any

#: Characters of output one outcome carries at most; the rest is cut, and the cut said.
LIMIT = 1 << 20

#: Output printed while a plan point trained: ``(node id, iteration, [(stream, text), ...])``.
Tagged = tuple[int, int, list[tuple[str, str]]]

_local = threading.local()
_install_lock = threading.Lock()


class _Tee:
    """A standard stream that also keeps what a capturing thread writes."""

    def __init__(self, stream: Any, name: str) -> None:
        self._stream = stream
        self._name = name

    def write(self, text: str) -> int:
        chunks = getattr(_local, "chunks", None)
        if chunks is not None and text:
            chunks.append((self._name, text))
        return self._stream.write(text)

    def __getattr__(self, name: str) -> Any:  # flush, fileno, encoding, isatty, ...
        return getattr(self._stream, name)


class _RayLogRecords(logging.Handler):
    """Ray's logger's records, into the capturing thread's stderr (Tune adds such a handler to ``ray.logger``)."""

    def emit(self, record: logging.LogRecord) -> None:
        chunks = getattr(_local, "chunks", None)
        if chunks is not None:
            chunks.append(("stderr", self.format(record) + "\n"))


def _install() -> None:
    with _install_lock:
        if isinstance(sys.stdout, _Tee):
            return
        sys.stdout, sys.stderr = _Tee(sys.stdout, "stdout"), _Tee(sys.stderr, "stderr")
        handler = _RayLogRecords()
        handler.setFormatter(logging.Formatter("%(asctime)s\t%(levelname)s %(filename)s:%(lineno)s -- %(message)s"))
        logging.getLogger("ray").addHandler(handler)


@contextlib.contextmanager
def captured(chunks: list[tuple[str, str]]) -> Iterator[None]:
    """Keep in ``chunks`` (``(stream, text)``, stream "stdout" or "stderr")
    what this thread writes and logs until the block ends."""
    _install()
    _local.chunks = chunks
    try:
        yield
    finally:
        _local.chunks = None


def take(tagged: list[Tagged]) -> list[Tagged]:
    """The output kept so far, each part with the plan point ``(node id,
    iteration)`` it was printed at, at most `LIMIT` characters in all (the
    list is emptied in place: the thread goes on adding)."""
    taken: list[Tagged] = []
    kept = 0
    for node_id, iteration, chunks in tagged:
        part = []
        for stream, text in chunks:
            if kept + len(text) > LIMIT:
                part.append((stream, text[: LIMIT - kept] + f"\n[ray_stagetree: output past {LIMIT} characters cut]\n"))
                taken.append((node_id, iteration, part))
                tagged.clear()
                return taken
            part.append((stream, text))
            kept += len(text)
        taken.append((node_id, iteration, part))
    tagged.clear()
    return taken
