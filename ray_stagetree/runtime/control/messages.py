"""The messages the controller sends home to the driver, typed: `Progress`
at each poll (`StudyController.progress`) and a `TrialSummary` per trial at
the study's end (`StudyController.results`, or from a snapshot for
``Tuner.get_results()`` of a restored Tuner). Messages to the workers are
dataclasses too (`execution.batches`)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Progress:
    """What happened since the last poll, and the study's figures."""

    #: Trials by status as the progress line shows them (RUNNING: a worker holds it).
    status: dict[str, int] = field(default_factory=dict)
    #: Iterations executed, requested (the plan's unique ones) and trial by trial.
    iterations: int = 0
    unique_iterations: int = 0
    total_iterations: int = 0
    worker_seconds: float = 0.0
    #: Seconds the controller spent on the study's snapshots.
    state_seconds: float = 0.0
    #: The new results, and the trials' lifecycle events (`DriverFeed.take`).
    rows: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    elapsed: float = 0.0
    #: Why the study stopped, when it failed as a whole.
    study_error: str | None = None
    warnings: list[str] = field(default_factory=list)
    #: PBT's exploit lines, logged where Ray's PBT logs them.
    scheduler_log: Sequence[str] = ()
    #: (trials, seconds) of running batches that reported nothing for a while.
    stalled: list[tuple[str, float]] = field(default_factory=list)
    #: Restarts where a held config value changed, by key.
    restarts: dict[str, int] = field(default_factory=dict)
    #: A study attached to a plan service: the service finalized it.
    done: bool = False


@dataclass
class TrialSummary:
    """What the driver makes a trial's ``ray.tune.Result`` from."""

    trial_id: str
    name: str
    dirname: str
    config: dict[str, Any]
    config_json: dict[str, Any]
    shown_config: dict[str, Any]
    status: str
    error: str | None
    error_pickle: bytes | None
    #: Its results (`PackedRows`: pickled but the last).
    rows: Sequence[dict[str, Any]]
    #: (path, metrics), oldest first; the last is ``Result.checkpoint``.
    checkpoints: list[tuple[str, dict[str, Any]]]
    best_checkpoints: list[tuple[str, dict[str, Any]]]
