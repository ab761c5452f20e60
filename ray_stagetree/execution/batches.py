"""The messages between the controller and a stage worker: a `BatchSpec`
says what to train, a `BatchOutcome` carries back what was trained."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, NamedTuple

from ray_stagetree.execution.working_dirs import WorkingDir
from ray_stagetree.planning.config import TrialConfig
from ray_stagetree.planning.plan_records import CheckpointInfo

#: In a function trainable's result row from its worker: whether the report
#: came with a checkpoint. The controller turns it into Tune's
#: ``checkpoint_dir_name``, numbered per trial (`runtime.control.trials`).
REPORTED_CHECKPOINT = "_stagetree_reported_checkpoint"


def reported_checkpoint_key(node_id: int, iteration: int, batch_id: int) -> str:
    """Where the worker of batch ``batch_id`` stores a checkpoint the
    function reported at ``iteration`` of node ``node_id`` where the plan
    asked for none (relative to the experiment directory). Named by the
    batch, not as the plan names its own checkpoint of the point
    (`runtime.control.checkpoint_store.CheckpointStore.key`): a batch that
    trains the point again writes its own copy, and none overwrites a
    copy the plan recorded with its checksum."""
    return f"checkpoints/node{node_id:06d}_step{iteration:07d}.batch{batch_id}.ckpt"


@dataclass
class BatchSpec:
    batch_id: int
    config: dict[str, Any]
    segments: list[tuple[int, int, int]]  # (node_id, start, stop)
    save_iterations: set[int]
    # ``config``'s planning form (the plan node's, parsed once at admission): the worker reads
    # hyper-parameters by iteration from it and never parses the config again.
    trial_config: TrialConfig
    source: Any = None  # ObjectRef of a CheckpointPayload, or None for a fresh start
    # Flattened names the trainable reads from ``config`` as plain values: the
    # user gave plain values there, and PBT made them sequences.
    plain: frozenset[str] = frozenset()
    # The trial the deepest node was made for, as a class trainable's trial_id / trial_name.
    trial_id: str = "default"
    trial_name: str = "default"
    experiment_name: str = ""
    trial_dir: str = ""  # that trial's folder when the experiment path is local, else ""
    working_dir: WorkingDir | None = None  # that trial's working directory on the worker, as Tune's (None: stay)
    # (node id, iteration) of the checkpoint or parked batch it starts from: the files kept there seed a new
    # working directory. None: a fresh start.
    source_point: tuple[int, int] | None = None
    # A reproducible study's `runtime.workers.reproducibility.Reproducibility`: the worker seeds the batch with it.
    reproducibility: Any = None
    # The batch whose trainable waits parked on this worker at ``start``: this
    # batch continues it, live, instead of starting from a checkpoint.
    resumes: int | None = None
    # The study's storage (`execution.sealed_storage.SealedStorage`): the worker writes a checkpoint the
    # function reports where the plan asked for none there at once (Tune's report() persists every one
    # from the process that trains), not held in memory.
    reported_storage: Any = None
    # RunConfig(log_to_file=...): keep what the trainable prints for its trials' folders (`BatchOutcome.output`).
    log_to_file: bool = False
    # A driver's callback may ask for a checkpoint at any result (Tune's SHOULD_CHECKPOINT): a class
    # trainable waits for their answer after each iteration, as Tune's trainable waits for its driver.
    ask_callbacks: bool = False
    # TuneConfig(reuse_actors=True): a class trainable's object is kept for the worker's next batch, which
    # resets it (Trainable.reset), as Tune reuses an actor (`runtime.workers.class_trainables.KEPT`).
    reuse_object: bool = False

    @property
    def start(self) -> int:
        return self.segments[0][1]

    @property
    def stop(self) -> int:
        return self.segments[-1][2]

    def node_at(self, iteration: int) -> int:
        """The plan node that trains ``iteration`` (1-based: the
        ``training_iteration`` a report after it carries) on this batch's path."""
        for node_id, start, stop in self.segments:
            if start < iteration <= stop:
                return node_id
        raise ValueError(f"iteration {iteration} is outside batch {self.batch_id}")


@dataclass
class BatchOutcome:
    batch_id: int
    records: list[tuple[int, int, dict[str, Any]]] = field(default_factory=list)
    checkpoints: list[tuple[int, int, Any, int]] = field(default_factory=list)
    # (node id, iteration, its durable copy): reported checkpoints the worker stored itself (`reported_storage`).
    stored_checkpoints: list[tuple[int, int, CheckpointInfo]] = field(default_factory=list)
    seconds: float = 0.0
    error: str | None = None
    error_pickle: bytes | None = None  # the trainable's exception as Tune's Result.error, pickled (trial_errors)
    error_iteration: int | None = None
    error_node: int | None = None
    # (node id, iteration) of the checkpoint the trainable reported just before it raised: the
    # last of `checkpoints`, put only so that the trial resumes from it (Tune's retry /
    # resume_errored), or one of `stored_checkpoints` of this batch. None: no such checkpoint.
    error_checkpoint: tuple[int, int] | None = None
    error_in_restore: bool = False  # raised while loading the batch's starting checkpoint (TUNE_RESTORE_RETRY_NUM)
    error_retryable: bool = True  # False: the trainable's own code is wrong (`ReportError`), a retry repeats it
    returned_at: int | None = None  # the function trainable returned after this many iterations
    # It returned having reported nothing (`returned_at` 0): Tune's auto-filled keys of its process, which
    # Tune's last result of such a trial holds (its Result.metrics).
    returned_facts: dict[str, Any] | None = None
    # branch points where report() got no checkpoint the plan needed
    missing_checkpoints: list[int] = field(default_factory=list)
    can_checkpoint: bool = True  # the last report came with a checkpoint (or a class that saves one)
    source_lost: str | None = None  # the starting checkpoint's object is lost (its node left): why
    trainable_unloadable: bool = False  # the worker could not unpickle the trainable: no batch can run
    parked: bool = False  # the trainable waits, live, on its worker at the batch's end (`FlushReply.park`)
    # A rank of the worker's data-parallel group failed: the others may wait in a collective forever,
    # so the group runs no other batch (the controller stops it and starts a fresh one when needed).
    worker_broken: bool = False
    # Where the trainable restarted from its checkpoint because sequence values it holds fixed (by key) changed.
    restarts: list[tuple[int, tuple[str, ...]]] = field(default_factory=list)
    # What the trainable wrote to stdout and stderr, and Ray's logger (`BatchSpec.log_to_file`): (node id,
    # iteration it was printed in, [(stream, text)]).
    output: list[tuple[int, int, list[tuple[str, str]]]] = field(default_factory=list)
    # Seconds of ``seconds`` by phase (`runtime.workers.phases`): fetch, restore, train, save, report, the trainable's own.
    phases: dict[str, float] = field(default_factory=dict)


class FlushReply(NamedTuple):
    """The controller's answer to a worker's flush."""

    save_iterations: list[int]  # where to checkpoint
    needed: int  # where the batch may stop: no live trial needs more
    stop: int  # the batch's end, later than before where it continues live
    # At the batch's end: keep the trainable alive on the worker, waiting for
    # a batch that continues it (a paused trial that has no checkpoint).
    park: bool = False
