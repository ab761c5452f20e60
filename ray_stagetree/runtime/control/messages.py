"""The messages the controller sends home to the driver, typed: `Progress`
at each poll (`StudyController.progress`) and a `TrialSummary` per trial at
the study's end (`StudyController.results`, or from a snapshot for
``Tuner.get_results()`` of a restored Tuner). Messages to the workers are
dataclasses too (`execution.batches`)."""

from __future__ import annotations

import pickle
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple, overload

import ray
from ray.tune.error import TuneError


class StudyError(TuneError, RuntimeError):
    """What ``fit()`` raises when the study stopped as a whole
    (`Progress.study_error`): Tune's ``TuneError``, as Tune's ``fit()``
    raises when its run fails, and a ``RuntimeError``."""


@dataclass
class Progress:
    """What happened since the last poll, and the study's figures."""

    #: Trials by status as the progress line shows them (RUNNING: a worker holds it).
    status: dict[str, int] = field(default_factory=dict)
    #: The trials whose status, as shown, changed since the last poll: (folder, status) by trial id.
    statuses: dict[str, tuple[str, str]] = field(default_factory=dict)
    #: Iterations executed, requested (the plan's unique ones) and trial by trial.
    iterations: int = 0
    unique_iterations: int = 0
    total_iterations: int = 0
    worker_seconds: float = 0.0
    #: ``worker_seconds`` of ended batches by phase (`runtime.workers.phases`), summed over the plan's runs.
    phase_seconds: dict[str, float] = field(default_factory=dict)
    #: Seconds the controller spent on the study's snapshots.
    state_seconds: float = 0.0
    #: The new results, and the trials' lifecycle events (`DriverFeed.take`).
    rows: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    #: The rows fed so far, these included: what the driver's `CallbackAnswer` says its callbacks had.
    rows_through: int = 0
    elapsed: float = 0.0
    #: Why the study stopped, when it failed as a whole.
    study_error: str | None = None
    warnings: list[str] = field(default_factory=list)
    #: PBT's exploit lines, logged where Ray's PBT logs them.
    scheduler_log: Sequence[str] = ()
    #: PBT's exploits as Ray's policy files log them: (trial id, source id, Ray's row, tags in it).
    pbt_policy: Sequence[tuple[str, str, list[Any]]] = ()
    #: What trainables printed for their trials' folders (``log_to_file``): (trial id, [(file name, text)]).
    output: list[tuple[str, list[tuple[str, str]]]] = field(default_factory=list)
    #: (trials, seconds) of running batches that reported nothing for a while.
    stalled: list[tuple[str, float]] = field(default_factory=list)
    #: Restarts where a held config value changed, by key.
    restarts: dict[str, int] = field(default_factory=dict)
    #: A study attached to a plan service: the service finalized it.
    done: bool = False


class CallbackAnswer(NamedTuple):
    """The driver's answer to a poll whose rows its callbacks had: the rows
    fed up to ``rows_through`` (`Progress.rows_through`), and the (trial
    id, iteration) results where a callback asked for a checkpoint
    (``result[SHOULD_CHECKPOINT] = True``)."""

    rows_through: int
    asked: list[tuple[str, int]]


#: The key of the rows of a trial PBT changed that holds its config with PBT's schedules as
#: sequences (`shown_config`); the driver's TensorBoard logger leaves it out, as it does the config.
SCHEDULE_KEY = "config_schedule"

#: The key of a row at an iteration the trial reported before (`StudyTrials`): a failed trial's retry
#: reports it again, and so does a PBT trial its exploit took back to an earlier checkpoint. The
#: driver logs it, where it skips rows it has logged, and takes the key out.
REPORTED_AGAIN = "_stagetree_reported_again"


def tagged(result: dict[str, Any], experiment_tag: str) -> dict[str, Any]:
    """A result as a Tune trial keeps it (``Trial.update_last_result``): with
    its experiment tag, which Tune adds after its loggers and callbacks had
    the result: ``Result.metrics`` has it; ``result.json``,
    ``progress.csv``, ``metrics_dataframe`` and the checkpoints' metrics
    do not."""
    return {**result, "experiment_tag": experiment_tag} if experiment_tag else result


class PackedRows(Sequence):
    """A trial's result rows as its summary carries them to the driver:
    pickled in one piece, but for the last (``Result.metrics``), and read
    whole when read (``Result.metrics_dataframe``, Tune's metric analysis).
    As dicts, 10,000 trials of 5 rows held 90 MB of the driver's memory at
    the study's end, its peak; pickled, about a fifth."""

    def __init__(self, rows: list[dict[str, Any]]) -> None:
        self._length = len(rows)
        self.last = rows[-1] if rows else None
        self._earlier = ray.cloudpickle.dumps(rows[:-1], protocol=5) if len(rows) > 1 else None

    def unpacked(self) -> list[dict[str, Any]]:
        earlier = [] if self._earlier is None else pickle.loads(self._earlier)
        return earlier if self.last is None else [*earlier, self.last]

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> dict[str, Any]: ...
    @overload
    def __getitem__(self, index: slice) -> list[dict[str, Any]]: ...
    def __getitem__(self, index: int | slice) -> dict[str, Any] | list[dict[str, Any]]:
        if isinstance(index, int) and self.last is not None and index in (-1, self._length - 1):
            return self.last
        return self.unpacked()[index]

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.unpacked())


@dataclass
class TrialSummary:
    """What the driver makes a trial's ``ray.tune.Result`` from."""

    trial_id: str
    name: str
    dirname: str
    config: dict[str, Any]
    config_json: dict[str, Any]
    shown_config: dict[str, Any]
    experiment_tag: str
    status: str
    error: str | None
    error_pickle: bytes | None
    #: Its results (`PackedRows`: pickled but the last).
    rows: Sequence[dict[str, Any]]
    #: (path, metrics), oldest first; the last is ``Result.checkpoint``.
    checkpoints: list[tuple[str, dict[str, Any]]]
    best_checkpoints: list[tuple[str, dict[str, Any]]]
    #: Its ``Result.metrics`` where it has no rows: Tune's bookkeeping of a function that returned having
    #: reported nothing (`TrialState.returned_result`), else None.
    returned_result: dict[str, Any] | None = None
    #: What it asked for from its config (`TrialState.resources`), a ``PlacementGroupFactory``; None: the study's.
    resources: Any = None
