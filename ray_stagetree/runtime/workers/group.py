"""Data-parallel stage batches: one batch trained by a worker group of N ranks.

Rank 0 is the stage worker the controller talks to (`worker.StageWorker`,
given its peers); ranks 1..N-1 are `PeerWorker` actors in the same
placement group (`control.spec.WorkerSpec.start`). For each batch rank 0
hands every peer the same `BatchSpec`, and each rank runs the same trainable
with the same config and hyper-parameters, with ``torch.distributed`` set
up among them (gloo on CPUs, NCCL on GPUs; ``MASTER_ADDR`` / ``MASTER_PORT``
from rank 0), as Ray Train's ``TorchTrainer`` runs ``train_loop_per_worker``.

Only rank 0 speaks to the controller. Every ``report`` is a meeting point:
rank 0 decides, after its own flush, whether this iteration is checkpointed,
where the batch ends and where checkpoints are wanted next, and broadcasts
that (`RankGroup.lead` / `RankGroup.follow`, over a gloo group of its own,
so the user's collectives on the default group are untouched); at a
checkpoint every rank sends rank 0 its RNG states, which ride in the stage
checkpoint (``CheckpointPayload.rank_rng``), and a rank resuming from it gets
its own back. So all ranks end a batch at the same iteration, and a
checkpoint restores the whole group exactly.

A rank that fails ends the group: its batch fails (a rank that raised, with
that rank's error; a rank that died, as any dead worker) and the controller
starts a fresh group for the next batch, since the others may be waiting in
a collective that will never complete.
"""

from __future__ import annotations

import datetime
import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import ray

from ray_stagetree.execution.batches import BatchOutcome, BatchSpec
from ray_stagetree.execution.payload import CheckpointPayload
from ray_stagetree.execution.rng import capture_rng_state
from ray_stagetree.execution.scaling import Scaling, actor_options
from ray_stagetree.runtime.workers.context import BatchEnd, StageContext, check_picklable

#: How long a rank waits for the others (the process group's timeout): a rank stuck
#: longer than this in a collective fails its batch rather than hang the study.
COLLECTIVE_TIMEOUT_S = 1800


@dataclass(frozen=True)
class RankInfo:
    """One rank's place in its group, as Ray Train's context gives it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    node_rank: int
    master_addr: str
    master_port: int
    backend: str


def rank_infos(node_ids: list[str], master_addr: str, master_port: int, backend: str) -> list[RankInfo]:
    """Each rank's `RankInfo`, from the node each rank runs on (rank 0's first)."""
    nodes = list(dict.fromkeys(node_ids))  # in order of first appearance: rank 0's node is node 0
    infos = []
    for rank, node in enumerate(node_ids):
        on_node = [other for other, other_node in enumerate(node_ids) if other_node == node]
        infos.append(
            RankInfo(
                rank=rank,
                world_size=len(node_ids),
                local_rank=on_node.index(rank),
                local_world_size=len(on_node),
                node_rank=nodes.index(node),
                master_addr=master_addr,
                master_port=master_port,
                backend=backend,
            )
        )
    return infos


def free_port() -> int:
    """A TCP port free on this node now, for the group's rendezvous."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("", 0))
        return int(probe.getsockname()[1])


#: How long a stage worker growing into a trainer's group (`Peers.grow`) waits for Ray to place its other ranks.
PLACEMENT_WAIT_S = 120.0


class GroupUnplaceable(RuntimeError):
    """The cluster cannot place the other ranks of a trainer's group."""


#: The start of the name of each placement group a stage worker grows (`Peers.grow`).
GROWN_NAME = "ray_stagetree_grown_ranks"


class Peers:
    """Ranks 1..N-1 of a group whose rank 0 is this process (a stage
    worker), and where each rank runs, known at their first batch."""

    def __init__(
        self, actors: list[Any], backend: str, placement_group: Any = None, scaling: Scaling | None = None
    ) -> None:
        self.actors = actors
        self.backend = backend
        # When rank 0 started them (`grow`): the peers' own placement group, and the shape they were grown for.
        self.placement_group = placement_group
        self.scaling = scaling
        self._infos: list[RankInfo] | None = None

    @classmethod
    def grow(cls, scaling: Scaling, start_peer: Callable[[dict[str, Any]], Any]) -> Peers:
        """Ranks 1..N-1 of ``scaling``'s group for a stage worker that becomes
        its rank 0 (a Train v2 trainer asked for N workers, `train_runs`):
        one placement group of their N-1 bundles, placed whole within
        `PLACEMENT_WAIT_S` or `GroupUnplaceable`, and ``start_peer(options)``
        called with each rank's Ray actor options. The actors go with this
        worker; the placement group, which Ray keeps as long as the job,
        goes with `stop` (`StageWorker.shed_group`, called before the worker is)."""
        from ray.util.placement_group import placement_group, remove_placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        bundles = scaling.bundles()[1:]
        name = f"{GROWN_NAME}:{uuid.uuid4().hex}"  # Ray refuses a name a live placement group holds
        group = placement_group(bundles, strategy=scaling.placement_strategy, name=name)
        ready, _ = ray.wait([group.ready()], timeout=PLACEMENT_WAIT_S)
        if not ready:
            remove_placement_group(group)
            raise GroupUnplaceable(
                f"the trainer's other {len(bundles)} worker(s) ({scaling.resources} each, "
                f"{scaling.placement_strategy}) found no room in the cluster within {PLACEMENT_WAIT_S:g} s: the "
                "study's stage workers and other trials' groups hold it. As Ray Tune's docs advise for Train runs "
                "inside trials, limit TuneConfig(max_concurrent_trials=...) so that each running trial's trainer "
                "fits, or give the study the trainer's shape with "
                "Tuner(driver_function, scaling_config=ScalingConfig(num_workers=...))"
            )
        actors = [
            start_peer(
                {
                    **actor_options(bundle),
                    "scheduling_strategy": PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=index),
                }
            )
            for index, bundle in enumerate(bundles)
        ]
        return cls(actors, scaling.backend, group, scaling)

    def rank_infos(self) -> list[RankInfo]:
        """Every rank's `RankInfo`, rank 0's (this process's) first."""
        if self._infos is None:
            nodes = ray.get([actor.node_id.remote() for actor in self.actors])
            here = ray.get_runtime_context().get_node_id()
            self._infos = rank_infos([here, *nodes], ray.util.get_node_ip_address(), free_port(), self.backend)
        return self._infos

    def start(self, spec: BatchSpec) -> dict[Any, int]:
        """Every peer trains ``spec`` too: their runs, to their ranks."""
        return {actor.run_rank.remote(spec, info): info.rank for actor, info in zip(self.actors, self.rank_infos()[1:])}

    def close(self, timeout: float) -> None:
        ray.wait([actor.close.remote() for actor in self.actors], num_returns=len(self.actors), timeout=timeout)

    def stop(self) -> None:
        """End grown peers (they go, their placement group with them) and
        this process's place in their group, so it may join another."""
        from ray.util.placement_group import remove_placement_group

        for actor in self.actors:
            ray.kill(actor)
        remove_placement_group(self.placement_group)
        leave()


_control_group: Any = None  # this process's gloo group for RankGroup's messages
_joined: RankInfo | None = None  # the group this process joined (once: a process group lives as long as it)


def join(info: RankInfo) -> Any:
    """Set up ``torch.distributed`` for this rank (once per process) and
    return the gloo group `RankGroup` talks over."""
    global _control_group, _joined
    import torch
    import torch.distributed as dist

    if _joined is not None:
        if _joined != info:
            raise RuntimeError(f"this process already is rank {_joined.rank} of another group: {_joined}")
        return _control_group
    os.environ.update(
        MASTER_ADDR=info.master_addr,
        MASTER_PORT=str(info.master_port),
        RANK=str(info.rank),
        WORLD_SIZE=str(info.world_size),
        LOCAL_RANK=str(info.local_rank),
        LOCAL_WORLD_SIZE=str(info.local_world_size),
        NODE_RANK=str(info.node_rank),
    )
    if info.backend == "nccl" and torch.cuda.is_available():
        torch.cuda.set_device(0)  # Ray shows each rank its own GPU as device 0
    dist.init_process_group(
        backend=info.backend,
        init_method=f"tcp://{info.master_addr}:{info.master_port}",
        rank=info.rank,
        world_size=info.world_size,
        timeout=datetime.timedelta(seconds=COLLECTIVE_TIMEOUT_S),
    )
    _control_group = None if info.backend == "gloo" else dist.new_group(backend="gloo")
    _joined = info
    return _control_group


def leave() -> None:
    """Leave the group this process joined (`join`), if any."""
    global _control_group, _joined
    if _joined is not None:
        import torch.distributed as dist

        dist.destroy_process_group()
        _control_group, _joined = None, None


@dataclass(frozen=True)
class Verdict:
    """What rank 0 decided at a report, once its flushes are done; every rank follows it."""

    stop: int  # the batch's last iteration, as of now
    save_iterations: frozenset[int]  # where checkpoints are wanted next (`should_checkpoint`)
    path_stop: int  # where the batch's path ends: further than it was when the batch continues live
    restart: bool = False  # a plain value changes here: every rank restarts from this iteration's checkpoint


class RankGroup:
    """A rank's side of its group's meetings at each report: first whether
    the iteration is checkpointed (then every rank's RNG states go to rank
    0), then, once rank 0 heard the controller, the `Verdict`. Rank 0 passes
    its decisions; the other ranks pass None and get them."""

    def __init__(self, info: RankInfo) -> None:
        self.info = info
        self._channel: Any = None

    def connect(self) -> None:
        self._channel = join(self.info)

    def _broadcast(self, value: Any) -> Any:
        import torch.distributed as dist

        box = [value]
        dist.broadcast_object_list(box, src=0, group=self._channel)
        return box[0]

    def checkpoint(self, wanted: bool | None) -> list[dict[str, Any]]:
        """Whether this iteration is checkpointed; if so rank 0 gets the other
        ranks' RNG states (rank 1's first), the others an empty list."""
        if not self._broadcast(wanted):
            return []
        import torch.distributed as dist

        gathered: list[Any] | None = [None] * self.info.world_size if self.info.rank == 0 else None
        dist.gather_object(capture_rng_state(), gathered, dst=0, group=self._channel)
        return gathered[1:] if gathered is not None else []

    def lead(
        self, stop: int, save_iterations: frozenset[int], path_stop: int, restart: CheckpointPayload | None
    ) -> None:
        """Rank 0: the `Verdict`, and the checkpoint every rank restarts from
        where a plain value changes."""
        self._broadcast(Verdict(stop, save_iterations, path_stop, restart is not None))
        if restart is not None:
            self._broadcast(restart)

    def follow(self) -> Verdict:
        """Ranks 1..N-1: rank 0's `Verdict`."""
        return self._broadcast(None)

    def restart_payload(self) -> CheckpointPayload:
        """Ranks 1..N-1: the checkpoint rank 0 restarts from."""
        return self._broadcast(None)


class PeerContext(StageContext):
    """Rank k > 0's batch: the same config, hyper-parameters and checkpoint
    as rank 0's, but it reports nothing to the controller; at each report it
    follows rank 0's `Verdict`."""

    def __init__(self, spec: BatchSpec, group: RankGroup) -> None:
        super().__init__(spec, controller=None, put=lambda key, payload: None, group=group)

    def source_payload(self) -> CheckpointPayload | None:
        """Rank 0's checkpoint, holding this rank's RNG states in place of rank 0's."""
        payload = super().source_payload()
        if payload is None or not payload.rank_rng:
            return payload
        return replace(payload, rng=payload.rank_rng[self.group.info.rank - 1])

    def record(self, metrics: dict[str, Any], make_payload: Any, can_checkpoint: bool = True, reported: bool = False):
        check_picklable(metrics, self.iteration + 1)  # as rank 0 does, so a bad metric fails every rank alike
        self.iteration += 1
        self.group.checkpoint(None)
        verdict = self.group.follow()
        self.stop, self.save_iterations = verdict.stop, set(verdict.save_iterations)
        if verdict.path_stop > self.spec.stop:
            self._extend_path(verdict.path_stop)
        if self.iteration >= self.stop:
            raise BatchEnd()
        if verdict.restart:
            self._restart(self.group.restart_payload())

    def flush(self) -> None:
        """Rank 0 reports for the group."""

    def finish(self, failed: bool = False) -> BatchOutcome:
        outcome = BatchOutcome(self.spec.batch_id)
        outcome.returned_at = self.returned_at
        self._drop_latest()
        self._drop_restored()
        return outcome
