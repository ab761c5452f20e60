"""What a study is, as the Tuner validated it: `WorkerSpec`, what each
stage worker needs, `LoopSpec`, what the batch loop runs on besides, and
`StudySpec`, the study's trials and their loop.

Both travel to the controller's actor (or a plan service's) pickled; the
worker's part is the same for every worker of a study, or of a shared plan.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

import ray

from ray_stagetree.execution.parking import PARKED_PER_WORKER
from ray_stagetree.execution.scaling import Scaling
from ray_stagetree.execution.working_dirs import WorkingDir
from ray_stagetree.planning.filesystems import is_local
from ray_stagetree.runtime.control.worker_shapes import Shape
from ray_stagetree.runtime.workers.remote import remote_once
from ray_stagetree.runtime.workers.worker import CLOSE_WAIT_S, PeerWorker, StageWorker

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem
    from pyarrow.fs import FileSystem
    from ray.tune import CheckpointConfig, Stopper
    from ray.tune.schedulers import TrialScheduler

    from ray_stagetree.planning.policies import ExecutionPolicy
    from ray_stagetree.runtime.control.experiment_state import Restore
    from ray_stagetree.runtime.control.trials import TrialInfo, TrialState
    from ray_stagetree.runtime.workers.reproducibility import Reproducibility
    from ray_stagetree.searchers.sources import SearcherSource, VariantSource


@dataclass
class WorkerSpec:
    """What a stage worker runs, and on what.

    Parameters
    ----------
    trainable:
        The user's trainable, cloudpickled; unpickled by each worker.
    options:
        The worker actor's Ray options (``num_cpus``, ``num_gpus``,
        ``resources``, ``memory``): one trial's resources (``tune.with_resources``).
    reproducibility:
        ``Tuner(reproducible=True)``: how workers seed each batch; None otherwise.
    """

    trainable: bytes
    options: dict[str, Any] = field(default_factory=dict)
    reproducibility: Reproducibility | None = None
    # ``Tuner(scaling_config=...)``: each worker is a group of ranks (`execution.scaling`); ``options``
    # are then one rank's. None: one process per worker.
    scaling: Scaling | None = None

    @property
    def resources(self) -> dict[str, float]:
        """One trial's resources, by Ray's names (``{"CPU": 1.0, "GPU": 0.5}``)."""
        return dict(Shape.from_options(self.options).amounts)

    def start(self, controller: Any, shape: Shape | None = None) -> Any:
        """A stage worker actor running the trainable for ``controller`` (the
        actor its reports go to), or a `WorkerGroup` with ``scaling``. It
        starts at once: a process that imports the trainable's modules,
        which takes seconds. A ``shape`` other than the study's holds other
        resources (a trial a ``ResourceChangingScheduler`` gave them)."""
        if self.scaling is not None:
            return WorkerGroup.start(self, controller, self.scaling)
        options = self.options if shape is None or shape == Shape.from_options(self.options) else shape.options()
        actor = remote_once(StageWorker).options(max_concurrency=3, **options)
        return actor.remote(self.trainable, controller)

    @staticmethod
    def close(workers: list[Any]) -> list[Any]:
        """Ask ``workers`` (and a group's ranks) to end their parked
        trainables and remove their temporary folders (`StageWorker.close`),
        waiting a second longer than they take: those that answered (one
        that does not, busy or gone, is killed with what it holds)."""
        calls = {
            w: [a.close.remote() for a in ([w.leader, *w.peers] if isinstance(w, WorkerGroup) else [w])]
            for w in workers
        }
        every = [ref for refs in calls.values() for ref in refs]
        answered = set(ray.wait(every, num_returns=len(every), timeout=CLOSE_WAIT_S + 1)[0])
        return [worker for worker, refs in calls.items() if answered.issuperset(refs)]

    @staticmethod
    def stop(worker: Any, closed: bool = False) -> None:
        """Kill a worker `start` started (a group's ranks, and free its
        placement group). Mid-study a lone worker first stops the ranks it
        grew for a Train v2 trainer, whose placement group Ray would keep as
        long as the job; one `close` reached did so already."""
        if isinstance(worker, WorkerGroup):
            worker.stop()
            return
        if not closed:
            ray.wait([worker.shed_group.remote()], timeout=SHED_WAIT_S)
        ray.kill(worker)


#: How long stopping a stage worker waits for it to remove the ranks it grew (a dead one never answers).
SHED_WAIT_S = 2.0


def live_nodes() -> list[dict[str, float]]:
    """The resources of each node Ray's control store holds alive."""
    return [node["Resources"] for node in ray.nodes() if node["Alive"]]


class WorkerGroup:
    """A data-parallel stage worker: rank 0's actor, which the controller
    calls as any stage worker, its peers, and the placement group that
    holds them all (`runtime.workers.group`)."""

    def __init__(self, leader: Any, peers: list[Any], placement_group: Any) -> None:
        self.leader = leader
        self.peers = peers
        self.placement_group = placement_group

    @classmethod
    def start(cls, spec: WorkerSpec, controller: Any, scaling: Scaling) -> WorkerGroup:
        """Reserve one placement group of the group's bundles and start a rank
        in each: it starts once Ray can place every rank, never in part."""
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        group = placement_group(scaling.bundles(), strategy=scaling.placement_strategy)

        def in_bundle(index: int) -> dict[str, Any]:
            strategy = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index)
            return {**spec.options, "scheduling_strategy": strategy}

        peers = [
            remote_once(PeerWorker).options(max_concurrency=2, **in_bundle(rank)).remote(spec.trainable)
            for rank in range(1, scaling.num_workers)
        ]
        leader = (
            remote_once(StageWorker)
            .options(max_concurrency=3, **in_bundle(0))
            .remote(spec.trainable, controller, peers, scaling.backend)
        )
        return cls(leader, peers, group)

    @property
    def run_batch(self) -> Any:
        return self.leader.run_batch

    @property
    def take_checkpoint(self) -> Any:
        return self.leader.take_checkpoint

    @property
    def release(self) -> Any:
        return self.leader.release

    @property
    def pid(self) -> Any:
        return self.leader.pid

    def stop(self) -> None:
        from ray.util.placement_group import remove_placement_group

        for actor in [self.leader, *self.peers]:
            ray.kill(actor)
        remove_placement_group(self.placement_group)


@dataclass
class LoopSpec:
    """What a batch loop (`batch_loop.BatchLoop`) runs on: its stage workers,
    its plan's storage and checkpoints, its execution policy, its snapshots."""

    worker: WorkerSpec
    experiment_path: str  # the plan's folder: plan/, checkpoints/ and the snapshot are written there
    storage_filesystem: FileSystem | AbstractFileSystem | None = None  # RunConfig.storage_filesystem
    num_workers: int = 1
    policy: str | ExecutionPolicy = "critical_path"  # a name in planning.policies.POLICIES, or the policy
    checkpoint_budget_bytes: int = 2 * 1024**3
    parked_per_worker: int = PARKED_PER_WORKER  # paused trainables with no checkpoint a worker keeps alive
    state_period_s: float | None = None  # seconds between snapshots; None: as often as their cost allows
    storage_wait_s: float = 600.0  # seconds the study pauses while storage refuses its snapshot, then goes on without
    # The experiment's key, which seals stored checkpoints (execution.payload_auth); never written to storage.
    payload_key: bytes | None = field(default=None, repr=False)
    trust_storage: bool = False  # RAY_STAGETREE_TRUST_STORAGE: read stored checkpoints that do not verify
    stall_warning_s: float = 60.0  # the progress names a batch's trials after this long without a report

    @property
    def experiment_name(self) -> str:
        """The experiment folder's name (the last part of ``experiment_path``)."""
        return self.experiment_path.rstrip("/").rsplit("/", 1)[-1]


@dataclass
class StudySpec:
    """One study's trials (`study_trials.StudyTrials`) and the loop they run
    on (``loop``), as the Tuner validated them on the driver (`runtime.driver.run`)."""

    loop: LoopSpec
    trial_source: VariantSource | SearcherSource
    horizon: int | None  # None: open-ended trials, ended by stop criteria, schedulers or the trainable
    horizon_is_max_t: bool = False  # the horizon is the scheduler's max_t, not a stop criterion
    max_concurrent_trials: int | None = None
    # Admitted trials that may wait for a worker at once (Tune's pending trials; the trial source's
    # `pending_limit`): a searcher hears results between suggestions. None: no limit (variants).
    max_pending_trials: int | None = None
    stage_sharing: bool = True
    # -- failures (FailureConfig; runtime.control.failures)
    max_failures: float = 0  # math.inf: FailureConfig(max_failures=-1), no limit
    fail_fast: bool | str = False  # True or "raise" stop the study at the first error
    restore_retries: int = 0  # TUNE_RESTORE_RETRY_NUM: failed checkpoint loads retried before one counts as a failure
    # -- what ends trials and ranks results
    stop_thresholds: dict[str, float] = field(default_factory=dict)
    stopper: Stopper | None = None  # a stop function arrives wrapped in Tune's FunctionStopper
    # Each trial's own resources from its config (a class's default_resource_request, a with_resources
    # function), as Tune asks them per trial; None: every trial holds the study's (the first trial's).
    trial_request: Callable[[dict[str, Any]], Any] | None = None
    scheduler: TrialScheduler | None = None  # hosted by trial_schedulers.host.SchedulerHost
    metric: str | None = None
    mode: Literal["min", "max"] | None = None
    # Tune's strict metric check (TUNE_DISABLE_STRICT_METRIC_CHECKING not 1): a result without a metric the
    # metric, the scheduler or the searcher expects stops the study.
    strict_metrics: bool = True
    time_budget_s: float | None = None
    checkpoint_config: CheckpointConfig | None = None
    # Tune saves a class trainable itself (CheckpointConfig, a result's should_checkpoint, a scheduler's pause
    # or PBT's top trials): its trials show those saves only (`TrialState.tune_saves`). A function's show
    # every checkpoint it reported.
    class_trainable: bool = False
    # A callback's on_checkpoint wants each checkpoint in the trial's folder as it is registered (Tune's moment),
    # not only the kept ones at the end: each is exported into every trial folder it serves.
    export_each_checkpoint: bool = False
    # A callback may ask for a checkpoint at a class trainable's result (Tune's SHOULD_CHECKPOINT): the
    # trainable waits for the driver's answer to each (`DriverFeed.had_all`).
    callbacks_ask_checkpoints: bool = False
    # TuneConfig(reuse_actors=True) with a class trainable: a worker keeps the object of its last batch and
    # resets it for the next (`BatchSpec.reuse_object`), as Tune reuses an actor for the next trial.
    reuse_objects: bool = False
    # RunConfig(log_to_file=...): the files of a trial's folder that take its stdout and its stderr (one file for
    # both where the names are equal); None: the output goes only where Ray shows workers' output.
    log_files: tuple[str | None, str | None] | None = None
    # Where trials' working directories go on the workers (`execution.working_dirs`), under the Ray session's
    # artifacts folder: ``<fit's timestamp>/<experiment folder>``, as Tune's. "": the workers stay where they are.
    working_dirs: str = ""
    sync_artifacts: bool = False  # SyncConfig(sync_artifacts=True): their files go to the trials' folders
    sync_artifacts_on_checkpoint: bool = True  # at each checkpoint too, not only as each batch ends
    sync_period_s: float = 300.0  # else at a report once this long passed since the last sync, as Tune syncs
    # -- what it continues
    resume: bool = False  # continue the plan saved under the loop's experiment_path/plan
    restore: Restore | None = None  # continue a study's snapshot (Tuner.restore)
    # -- names, as Tune gives them
    trainable_name: str = "trainable"
    trial_name_creator: Callable[[TrialInfo], str] | None = None  # TuneConfig's hooks
    trial_dirname_creator: Callable[[TrialInfo], str] | None = None
    # The config paths a grid or random search draws, for Tune's experiment tag in folder names
    # (None: a searcher's trials, tagged with every value, as Tune tags them).
    tuned_paths: frozenset[tuple[str, ...]] | None = None

    def batch_trial(self, owner: TrialState | None) -> dict[str, Any]:
        """The `BatchSpec` fields of the trial a batch is named after (``owner``,
        who configured its deepest node): a class trainable's ``trial_id`` /
        ``trial_name``, ``get_trial_dir()``, its working directory (`execution.working_dirs`)."""
        experiment_name = self.loop.experiment_name
        if owner is None:
            return {"experiment_name": experiment_name}
        local = is_local(self.loop.experiment_path, self.loop.storage_filesystem)
        working = None
        if self.working_dirs:
            upload, at_checkpoints = self.sync_artifacts, self.sync_artifacts and self.sync_artifacts_on_checkpoint
            working = WorkingDir(self.working_dirs, owner.dirname, upload, at_checkpoints, self.sync_period_s)
        return {
            "trial_id": owner.trial_id,
            "trial_name": owner.name,
            "experiment_name": experiment_name,
            "trial_dir": f"{self.loop.experiment_path}/{owner.dirname}" if local else "",
            "working_dir": working,
        }
