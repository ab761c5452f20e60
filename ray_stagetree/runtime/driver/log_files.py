"""Tune's default loggers, their files written a batch of results at a time.

Tune's ``JsonLoggerCallback``, ``CSVLoggerCallback`` and ``TBXLoggerCallback``
flush every file at every result, and the TensorBoard one also fsyncs it
(tensorboardX's ``RecordWriter.flush``) and pickles each scalar through a
process queue: about 1.5 ms a result on the driver, more than the rest of
the study's path costs. The classes here are those loggers (subclasses,
Tune's own code for each result where it is cheap) writing the same files,
``result.json``, ``progress.csv``, ``params.json``, ``params.pkl`` and
``events.out.tfevents.*``, with one flush per batch (`flush_batch`) that
`runtime.driver.log_thread.LogThread` calls after each poll's results:

* result.json lines are encoded by ``json.dumps`` (C), the text Tune's
  ``json.dump`` writes (its pure-Python path);
* TensorBoard events are Tune's (one event per scalar, tensorboardX's
  summaries for everything else), framed into TFRecords at the flush,
  their CRC32C computed for the whole batch at once (`crc32c_many`):
  tensorboardX computes it in pure Python one byte at a time unless a
  native ``crc32c`` is installed.

tensorboardX imports torch (190 MB of the driver's memory) only to
recognise torch tensors; the loggers never meet one, so it is imported
with torch hidden unless torch is already loaded (`_import_tensorboardx`).
"""

from __future__ import annotations

import functools
import json
import os
import socket
import struct
import sys
import time
from typing import Any

import numpy as np
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback, TBXLoggerCallback
from ray.tune.logger.tensorboardx import VALID_SUMMARY_TYPES
from ray.tune.result import TIME_TOTAL_S, TIMESTEPS_TOTAL, TRAINING_ITERATION
from ray.tune.utils import flatten_dict

from ray_stagetree.runtime.control.messages import SCHEDULE_KEY
from ray_stagetree.trial_schedulers.ray_fields import json_encoder_class

#: Tune's encoder of result.json lines, looked up once: a line is written at every result.
RESULT_ENCODER = json_encoder_class()


class _BatchFlushed:
    """A trial's open text file whose ``flush()`` (Tune's, at every result)
    waits for `flush_now` (once per batch)."""

    def __init__(self, file: Any) -> None:
        self._file = file
        self.write = file.write
        self.close = file.close

    def flush(self) -> None:
        """Deferred to `flush_now`."""

    def flush_now(self) -> None:
        self._file.flush()


class JsonLogger(JsonLoggerCallback):
    """Tune's ``JsonLoggerCallback`` (params.json, params.pkl, result.json)
    flushed once per batch."""

    def log_trial_start(self, trial: Any) -> None:
        super().log_trial_start(trial)
        self._trial_files[trial] = _BatchFlushed(self._trial_files[trial])

    def log_trial_result(self, iteration: int, trial: Any, result: dict[str, Any]) -> None:
        if trial not in self._trial_files:
            self.log_trial_start(trial)
        # The line json.dump writes, through the C encoder json.dumps uses.
        self._trial_files[trial].write(json.dumps(result, cls=RESULT_ENCODER) + "\n")

    def flush_batch(self) -> None:
        for file in self._trial_files.values():
            file.flush_now()


class CSVLogger(CSVLoggerCallback):
    """Tune's ``CSVLoggerCallback`` (progress.csv) flushed once per batch."""

    def _setup_trial(self, trial: Any) -> None:
        super()._setup_trial(trial)
        self._trial_files[trial] = _BatchFlushed(self._trial_files[trial])

    def flush_batch(self) -> None:
        for file in self._trial_files.values():
            file.flush_now()


class TBXLogger(TBXLoggerCallback):
    """Tune's ``TBXLoggerCallback`` (events.out.tfevents.*: a scalar per
    numeric metric, histograms, images, hparams at the trial's end) written
    by `BatchSummaryWriter`, flushed once per batch."""

    def __init__(self) -> None:
        # Not Tune's __init__: it imports tensorboardX with torch.
        _import_tensorboardx()
        self._summary_writer_cls = BatchSummaryWriter
        self._trial_writer: dict[Any, Any] = {}
        self._trial_result: dict[Any, dict] = {}

    def log_trial_result(self, iteration: int, trial: Any, result: dict[str, Any]) -> None:
        """Tune's, its loop over scalars made cheap (NaN found by ``x != x``,
        not NumPy's ``isnan`` per scalar; one event head per result): a result
        holding a list or an array (histograms, images, videos) takes Tune's
        own path."""
        if trial not in self._trial_writer:
            self.log_trial_start(trial)
        if SCHEDULE_KEY in result:  # PBT's schedules: the config, which TensorBoard leaves out (the others log it)
            result = {key: value for key, value in result.items() if key != SCHEDULE_KEY}
        kept = {key: value for key, value in result.items() if key not in _NOT_IN_TENSORBOARD}
        flat = flatten_dict(kept, delimiter="/") if any(isinstance(value, dict) for value in kept.values()) else kept
        if any(isinstance(value, (list, np.ndarray)) for value in flat.values()):
            super().log_trial_result(iteration, trial, result)
            return
        # Tune's filter: its scalar types, NaN left out (x != x only for NaN).
        valid = {
            _TUNE_TAG + attr: value for attr, value in flat.items() if isinstance(value, _SCALARS) and value == value
        }
        step = result.get(TIMESTEPS_TOTAL) or result[TRAINING_ITERATION]
        self._trial_writer[trial].add_scalars(valid, step)
        self._trial_result[trial] = valid

    def flush_batch(self) -> None:
        for writer in self._trial_writer.values():
            writer.flush_batch()


# What Tune's TBXLoggerCallback leaves out of TensorBoard, and how it names and picks the rest.
_NOT_IN_TENSORBOARD = frozenset(["config", "pid", "timestamp", TIME_TOTAL_S, TRAINING_ITERATION])
_TUNE_TAG = "ray/tune/"
_SCALARS = tuple(VALID_SUMMARY_TYPES)


def _import_tensorboardx() -> None:
    """Import tensorboardX (ImportError without it), without torch unless
    torch is already loaded: tensorboardX's only use of it is telling torch
    tensors apart, which Tune's loggers never hand it."""
    if "tensorboardX" in sys.modules or "torch" in sys.modules:
        import tensorboardX  # noqa: F401
    else:
        sys.modules["torch"] = None  # type: ignore[assignment]  # makes `import torch` raise ImportError
        try:
            import tensorboardX  # noqa: F401
        finally:
            del sys.modules["torch"]


@functools.cache
def _summary_writer_class() -> type:
    from tensorboardX import SummaryWriter
    from tensorboardX.summary import _clean_tag

    clean_tag = functools.lru_cache(maxsize=4096)(_clean_tag)

    class _BatchSummaryWriter(SummaryWriter):
        """tensorboardX's ``SummaryWriter`` writing into an `EventFile`: its
        ``flush()`` (Tune's, at every result) waits for `flush_batch`, and
        ``add_scalar`` encodes Tune's event without building protobufs."""

        def _get_file_writer(self) -> Any:
            if self.file_writer is None:
                self.file_writer = EventFile(self.logdir)
                self.all_writers = {self.logdir: self.file_writer}
            return self.file_writer

        def add_scalar(self, tag: str, scalar_value: Any, global_step: Any = None, walltime: Any = None, **_: Any):
            self._get_file_writer().add_scalars({clean_tag(tag): scalar_value}, global_step, walltime)

        def add_scalars(self, values: dict[str, Any], global_step: Any = None) -> None:
            """``add_scalar`` for each of ``values`` (tag: value), at one step and time."""
            self._get_file_writer().add_scalars({clean_tag(tag): value for tag, value in values.items()}, global_step)

        def flush(self) -> None:
            """Deferred to `flush_batch`."""

        def flush_batch(self) -> None:
            if self.file_writer is not None:
                self.file_writer.flush()

    return _BatchSummaryWriter


def BatchSummaryWriter(logdir: str, **options: Any) -> Any:  # noqa: N802  (a class's face for Tune's logger)
    """A tensorboardX ``SummaryWriter`` on ``logdir`` writing in batches."""
    return _summary_writer_class()(logdir, **options)


class EventFile:
    """One TensorBoard event file (tensorboardX's ``FileWriter`` face:
    ``add_event``, ``add_summary``, ``flush``, ``close``): events are kept
    encoded until `flush`, which frames and writes them all."""

    def __init__(self, logdir: str) -> None:
        self.logdir = logdir
        # tensorboardX's name for it: events.out.tfevents.<seconds>.<host>
        name = f"events.out.tfevents.{str(time.time())[:10]}.{socket.gethostname()}"
        self._file = open(os.path.join(logdir, name), "ab")  # noqa: SIM115  (closed by close())
        self._pending: list[bytes] = [_event_head(time.time(), None) + _string_field(3, b"brain.Event:2")]
        self._tags: dict[str, bytes] = {}

    def get_logdir(self) -> str:
        return self.logdir

    def add_scalars(self, values: dict[str, Any], step: Any, walltime: float | None = None) -> None:
        """For each tag and value, the event tensorboardX's ``add_scalar``
        writes: a summary of one ``simple_value`` (float32) under the tag."""
        event_head = _event_head(time.time() if walltime is None else walltime, step)
        for tag, value in values.items():
            head = self._tags.get(tag)
            if head is None:
                head = self._tags[tag] = _string_field(1, tag.encode())
            summary_value = head + b"\x15" + struct.pack("<f", float(value))
            summary = b"\x0a" + _varint(len(summary_value)) + summary_value
            self._pending.append(event_head + b"\x2a" + _varint(len(summary)) + summary)

    def add_event(self, event: Any, step: Any = None, walltime: float | None = None) -> None:
        event.wall_time = time.time() if walltime is None else walltime
        if step is not None:
            event.step = int(step)
        self._pending.append(event.SerializeToString())

    def add_summary(self, summary: Any, global_step: Any = None, walltime: float | None = None) -> None:
        from tensorboardX.proto.event_pb2 import Event

        self.add_event(Event(summary=summary), global_step, walltime)

    def flush(self) -> None:
        if not self._pending:
            return
        events, self._pending = self._pending, []
        heads = [struct.pack("<Q", len(event)) for event in events]
        head_crcs, event_crcs = crc32c_many(heads), crc32c_many(events)
        self._file.write(
            b"".join(
                head + struct.pack("<I", _masked(head_crc)) + event + struct.pack("<I", _masked(event_crc))
                for head, head_crc, event, event_crc in zip(heads, head_crcs, events, event_crcs)
            )
        )
        self._file.flush()

    def close(self) -> None:
        self.flush()
        self._file.close()


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # negative int64s as protobuf writes them
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _string_field(number: int, data: bytes) -> bytes:
    return _varint(number << 3 | 2) + _varint(len(data)) + data


def _event_head(wall_time: float, step: Any) -> bytes:
    """An ``Event``'s ``wall_time`` (field 1, double) and ``step`` (field 2, int64; left out when 0 or None)."""
    head = b"\x09" + struct.pack("<d", wall_time)
    return head + b"\x10" + _varint(int(step)) if step else head


def _masked(crc: int) -> int:
    """TFRecord's masked CRC."""
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


# -- CRC32C (Castagnoli), many messages at once ------------------------------------

_POLYNOMIAL = 0x82F63B78  # reflected


def _step_table() -> np.ndarray:
    table = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        table = np.where(table & 1, (table >> 1) ^ np.uint32(_POLYNOMIAL), table >> 1).astype(np.uint32)
    return table


_STEP = _step_table()
# _SHIFTED[k][b]: what byte b contributes to the (zero-initial) CRC with k bytes after it.
_SHIFTED = _STEP[np.newaxis]
#: Longer messages (images, videos) are left to tensorboardX: the table grows with the length.
_LONGEST = 4096


def _shifted(length: int) -> np.ndarray:
    global _SHIFTED
    have = len(_SHIFTED)
    if have < length:
        rows = [_SHIFTED[-1]]
        for _ in range(max(length, 2 * have) - have):
            rows.append(_STEP[rows[-1] & 0xFF] ^ (rows[-1] >> 8))
        _SHIFTED = np.vstack([_SHIFTED, *rows[1:]])
    return _SHIFTED


def crc32c_many(messages: list[bytes]) -> list[int]:
    """The CRC32C of each message. CRC is affine in the message: the
    zero-initial CRC is the XOR of each byte's contribution at its distance
    from the end (a table row per distance), and the standard initial value
    and final XOR add a constant of the length. Messages of one length are
    computed in one NumPy operation."""
    by_length: dict[int, list[int]] = {}
    for index, message in enumerate(messages):
        by_length.setdefault(len(message), []).append(index)
    crcs = [0] * len(messages)
    for length, indices in by_length.items():
        if not 4 <= length <= _LONGEST:  # the constant below needs 4 bytes
            from tensorboardX.crc32c import crc32c

            for index in indices:
                crcs[index] = crc32c(messages[index])
            continue
        shifted = _shifted(length)
        data = np.frombuffer(b"".join(messages[index] for index in indices), dtype=np.uint8).reshape(-1, length)
        distances = np.arange(length - 1, -1, -1)
        linear = np.bitwise_xor.reduce(shifted[distances, data], axis=1)
        # The initial 0xFFFFFFFF is XORed into the first 4 bytes; the final XOR is 0xFFFFFFFF.
        constant = int(np.bitwise_xor.reduce(shifted[distances[:4], 0xFF])) ^ 0xFFFFFFFF
        for index, value in zip(indices, linear.tolist()):
            crcs[index] = value ^ constant
    return crcs


#: Tune's default logger classes and the batched class that writes each one's files.
BATCHED = {JsonLoggerCallback: JsonLogger, CSVLoggerCallback: CSVLogger, TBXLoggerCallback: TBXLogger}
