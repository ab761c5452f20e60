"""The search plan: the persistent, append-only record of a study.

Thesis section 4.2. A plan is a forest of `PlanNode` objects. A node is one
trial configuration that takes over from its parent at ``fork_iteration``: the
model at ``(node, k)`` was trained with the parent's path for ``fork_iteration``
iterations and then with ``node.config`` for iterations ``fork_iteration .. k-1``.
A trial is a path from a root, and a request ``(node, k)`` asks for the model
(and its metrics) after ``k`` iterations of that path.

Adding a trial walks down from the root that matches its iteration-0 values
and adds at most one node, where the trial first differs from every existing
path (siblings forking at the same iteration differ at that iteration, so the walk never
branches). Nodes are never removed: paths are invariant to other trials.

The plan also tracks which requests are scheduled (``SCHED``) and the segments
that running stage batches are training, so a new request that a running batch
will reach is served by that batch instead of training the prefix again, and
a batch that reaches its end continues live when a trial goes on there.

The records it holds (nodes, requests, trials, runs) are `plan_records`'; the
bookkeeping of its running batches is `running_batches.RunningBatches`, a
part of the class kept in a module of its own (the tree, the requests and the
running batches keep one set of invariants); persistence and policies live
in their own modules.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from typing import Any

import ray_stagetree.planning.persistence as persistence
from ray_stagetree.planning._deprecated import renamed_arguments
from ray_stagetree.planning._gc import gc_paused
from ray_stagetree.planning.config import TrialConfig

# The plan's records live in plan_records.py; they are named here too, where
# the plans and snapshots pickled before the move find them.
from ray_stagetree.planning.plan_records import (
    BatchRun,
    CheckpointInfo,
    OpenTrialsWatcher,
    PlanNode,
    Request,
    RequestState,
    RunningBatch,
    Timing,
    TrialRecord,
)
from ray_stagetree.planning.running_batches import RunningBatches
from ray_stagetree.validation import Int, check


def _check_iteration(iteration: Any, name: str = "iteration") -> int:
    return check(name, iteration, Int(low=1), meaning=" (iterations to train)")


class SearchPlan(RunningBatches):
    """Append-only tree of configurations with checkpoints, metrics and requests.

    Examples
    --------
    >>> from ray_stagetree import MultiStep
    >>> from ray_stagetree.planning import SearchPlan
    >>> plan = SearchPlan()
    >>> a = plan.add_trial("a", {"lr": MultiStep(0.1, [100], 0.1)}, iteration=200)
    >>> b = plan.add_trial("b", {"lr": MultiStep(0.1, [150], 0.1)}, iteration=200)
    >>> plan.unique_iterations(), plan.total_iterations()
    (300, 400)
    """

    def __init__(self) -> None:
        self.nodes: list[PlanNode] = []
        self.trials: dict[str, TrialRecord] = {}
        self.timings: list[Timing] = []
        self.runs: list[BatchRun] = []
        self._roots: dict[tuple, PlanNode] = {}
        self._sequences: dict = {}
        self._located: dict[tuple, PlanNode] = {}
        self._batches: dict[int, RunningBatch] = {}
        self._next_batch_id = 0
        # (node id, trial id) -> (the trial's config, iteration checked up to, first iteration it differs from the node)
        self._divergence: dict[tuple[int, str], tuple[TrialConfig | None, int, int | None]] = {}
        # Nodes that changed in a way a stage tree sees, in order; read with `touched_since`.
        self._touched: list[PlanNode] = []
        self._read_up_to = 0  # entries before this may have been read: never merged into
        self.watchers: list[OpenTrialsWatcher] = []
        # (node id, iteration) -> (the metrics recorded there, their JSON): a running study's snapshots
        # write every record each time; each is encoded once, while the same dict stays recorded.
        self.encoded_metrics: dict[tuple[int, int], tuple[dict[str, Any], str]] = {}

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "encoded_metrics": {}}  # a cache, not the plan

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.__dict__.setdefault("encoded_metrics", {})  # a plan pickled before the cache

    def _touch(self, node: PlanNode) -> None:
        touched = self._touched
        if len(touched) == self._read_up_to or touched[-1] is not node:
            touched.append(node)

    @property
    def changes(self) -> int:
        """A position in the plan's change log, for `touched_since`."""
        self._read_up_to = len(self._touched)
        return self._read_up_to

    def touched_since(self, position: int) -> set[PlanNode]:
        """Nodes that changed (requests, their states, checkpoints, running
        batches; new nodes) since `changes` was ``position``: where a cached
        stage tree must rebuild (`stage_tree.unit_of`); the rest is as it was."""
        return set(self._touched[position:])

    # -- structure ---------------------------------------------------------

    @property
    def roots(self) -> list[PlanNode]:
        return list(self._roots.values())

    def node(self, node_id: int) -> PlanNode:
        try:
            return self.nodes[node_id]
        except (IndexError, TypeError):
            raise KeyError(f"no plan node with id {node_id!r} (the plan has {len(self.nodes)})") from None

    def _new_node(self, config: TrialConfig, parent: PlanNode | None, fork_iteration: int) -> PlanNode:
        node = PlanNode(len(self.nodes), config, parent, fork_iteration)
        self.nodes.append(node)
        self._touch(node)
        return node

    @renamed_arguments(step="iteration")
    def locate(self, config: TrialConfig, iteration: int) -> PlanNode:
        """The node that trains the last of the first ``iteration`` iterations of
        ``config`` (index ``iteration - 1``), adding at most one node."""
        # Paths never change once made, so a config seen before (num_samples
        # repeats, a trial extended back and forth) lands where it did.
        # Interned sequences make their identities a complete signature.
        signature = (config.static_key, config.names, tuple(map(id, config.sequences)), config.lineage, iteration)
        node = self._located.get(signature)
        if node is None:
            node = self._located[signature] = self._descend(config, iteration)
        return node

    def _descend(self, config: TrialConfig, iteration: int) -> PlanNode:
        path, fork = self._follow(config, iteration)
        if not path:
            node = self._roots[config.observed_at(0)] = self._new_node(config, None, 0)
            return node
        if fork is None:
            return path[-1]
        child = path[-1].children[(fork, config.observed_at(fork))] = self._new_node(config, path[-1], fork)
        return child

    @renamed_arguments(step="iteration", study="share_key")
    def follow(
        self, config: Mapping[str, Any] | TrialConfig, iteration: int, share_key: str = "default"
    ) -> tuple[list[PlanNode], int]:
        """The existing nodes the first ``iteration`` iterations of ``config``
        pass through, root first, and how many iterations it shares with
        that path (it leaves the last node there). Adds nothing; the nodes'
        ``metrics`` are what the plan measured on the shared prefix."""
        path, fork = self._follow(TrialConfig.from_config(config, share_key), iteration)
        return path, (0 if not path else iteration if fork is None else fork)

    def _follow(self, config: TrialConfig, iteration: int) -> tuple[list[PlanNode], int | None]:
        """The existing nodes the first ``iteration`` iterations of ``config``
        pass through, root first, and the iteration where it leaves the last
        of them (None: it never does before ``iteration``). Adds nothing."""
        node = self._roots.get(config.observed_at(0))
        if node is None:
            return [], None
        path = [node]
        while True:
            fork = config.first_difference(node.config, iteration, node.fork_iteration)
            if fork is None:
                return path, None
            node = node.children.get((fork, config.observed_at(fork)))
            if node is None:
                return path, fork
            path.append(node)

    # -- trials --------------------------------------------------------------

    @renamed_arguments(step="iteration", study="share_key")
    def add_trial(
        self,
        trial_id: str,
        config: Mapping[str, Any] | TrialConfig,
        iteration: int,
        share_key: str = "default",
    ) -> Request:
        """Ask for ``config`` trained ``iteration`` iterations; returns the request serving it.

        Trials share stages only with trials of the same ``share_key``. If the
        plan already holds metrics for that point, ``request.answered`` is
        true at once and nothing needs to train.
        """
        if trial_id in self.trials:
            raise ValueError(f"trial {trial_id!r} is already in the plan; use extend_trial")
        _check_iteration(iteration)
        trial_config = TrialConfig.from_config(config, share_key, self._sequences)
        request = self._request(trial_id, trial_config, iteration)
        self.trials[trial_id] = TrialRecord(trial_id, trial_config, share_key, request)
        return request

    @renamed_arguments(study="share_key")
    def add_trials(
        self, trials: Iterable[tuple[str, Mapping[str, Any] | TrialConfig, int]], share_key: str = "default"
    ) -> list[Request]:
        """`add_trial` for many ``(trial_id, config, iteration)`` at once, as a
        searcher emits them (with the garbage collector paused, see `_gc`)."""
        with gc_paused():
            return [self.add_trial(trial_id, config, iteration, share_key) for trial_id, config, iteration in trials]

    @renamed_arguments(step="iteration")
    def extend_trial(self, trial_id: str, iteration: int) -> Request:
        """Move a trial's request to another iteration (continue, or evaluate earlier)."""
        record = self._record(trial_id)
        _check_iteration(iteration)
        self._detach(record)
        record.request = self._request(trial_id, record.config, iteration)
        return record.request

    def remove_trial(self, trial_id: str) -> None:
        """Drop a trial. Its unscheduled request goes; a scheduled one that no
        other trial needs becomes cancellable. Other trials are unaffected."""
        self._detach(self._record(trial_id))
        del self.trials[trial_id]

    def _record(self, trial_id: str) -> TrialRecord:
        try:
            return self.trials[trial_id]
        except KeyError:
            raise KeyError(f"trial {trial_id!r} is not in the plan") from None

    def _request(self, trial_id: str, config: TrialConfig, iteration: int) -> Request:
        node = self.locate(config, iteration)
        request = node.requests.get(iteration)
        if request is None:
            request = Request(node, iteration)
            if not request.answered:
                node.requests[iteration] = request
                batch_id = node.running_batch_through(iteration)
                if batch_id is not None:
                    self._attach_to_batch(request, batch_id)
        request.trials.add(trial_id)
        node.trials.add(trial_id)
        self._touch(node)
        if self._is_open(request):
            for watcher in self.watchers:
                watcher.opened([trial_id])
        return request

    @staticmethod
    def _is_open(request: Request) -> bool:
        """Unanswered: registered on its node (answered ones never are, or are popped)."""
        return request.node.requests.get(request.iteration) is request

    def _detach(self, record: TrialRecord) -> None:
        request = record.request
        if record.trial_id in request.trials and self._is_open(request):
            for watcher in self.watchers:
                watcher.closed([record.trial_id])
        request.trials.discard(record.trial_id)
        request.node.trials.discard(record.trial_id)
        self._touch(request.node)
        if not request.trials and request.state is RequestState.NOT_SCHED:
            if request.node.requests.get(request.iteration) is request:  # an answered one was never registered
                del request.node.requests[request.iteration]

    def open_requests(self) -> Iterator[Request]:
        """Requests not yet answered (both states)."""
        for node in self.nodes:
            yield from node.requests.values()

    def path(self, trial_id: str) -> list[PlanNode]:
        """Root-to-node path of a trial's current request."""
        node = self._record(trial_id).request.node
        return [*reversed(list(node.ancestors())), node]

    def history(self, trial_id: str) -> dict[int, dict[str, Any]]:
        """Metrics the plan holds for a trial, by iteration, up to its request."""
        request = self._record(trial_id).request
        out: dict[int, dict[str, Any]] = {}
        path = self.path(trial_id)
        for node, successor in zip(path, path[1:] + [None]):
            upper = request.iteration if successor is None else successor.fork_iteration
            out.update(
                (iteration, metrics)
                for iteration, metrics in node.metrics.items()
                if node.fork_iteration < iteration <= upper
            )
        return dict(sorted(out.items()))

    @renamed_arguments(step="iteration")
    def trials_through(self, node: PlanNode, iteration: int) -> set[str]:
        """Live trials whose path passes through ``(node, iteration)``."""
        found = {trial_id for trial_id in node.trials if self.trials[trial_id].request.iteration >= iteration}
        pending = [child for child in node.children.values() if child.fork_iteration >= iteration]
        while pending:
            current = pending.pop()
            found |= current.trials
            pending.extend(current.children.values())
        return found

    # -- results from the runtime ----------------------------------------------

    @renamed_arguments(step="iteration")
    def record_metrics(self, node_id: int, iteration: int, metrics: Mapping[str, Any]) -> list[Request]:
        """Store metrics of ``(node, iteration)``; returns the requests this answers."""
        node = self.node(node_id)
        node.metrics[iteration] = dict(metrics)
        request = node.requests.pop(iteration, None)
        if request is None:
            return []
        for watcher in self.watchers:
            watcher.closed(request.trials)
        self._touch(node)
        if request.batch_id is not None and request.batch_id in self._batches:
            self._batches[request.batch_id].requests.remove(request)
        return [request]

    @renamed_arguments(step="iteration")
    def record_progress(self, batch_id: int, node_id: int, iteration: int) -> None:
        """A running batch trained ``node`` up to ``iteration``: a point it passed
        without leaving a checkpoint (a trainable that keeps none) is no
        longer one to wait for."""
        node = self.node(node_id)
        if batch_id in node.running:
            node.trained[batch_id] = max(iteration, node.trained.get(batch_id, iteration))
            self._touch(node)

    @renamed_arguments(step="iteration")
    def record_checkpoint(self, node_id: int, iteration: int, info: CheckpointInfo) -> None:
        """A checkpoint of ``(node, iteration)`` exists, or its record changed (its
        durable copy landed): the plan is the only writer of these records."""
        node = self.node(node_id)
        if not node.fork_iteration < iteration:
            raise ValueError(
                f"a checkpoint of node {node_id} must be after its fork iteration "
                f"{node.fork_iteration}, got {iteration}"
            )
        node._checkpoints[iteration] = info
        self._touch(node)

    def record_parked(self, node_id: int, iteration: int) -> None:
        """A trainable of ``node`` waits alive at ``iteration`` (a trial paused
        there, with no checkpoint): the stage continuing this node starts
        there, as from a checkpoint. Other nodes cannot fork from it."""
        node = self.node(node_id)
        node.parked.add(iteration)
        self._touch(node)

    def drop_parked(self, node_id: int, iteration: int) -> None:
        """The parked trainable at ``(node, iteration)`` went on, or was released."""
        node = self.node(node_id)
        if iteration in node.parked:
            node.parked.discard(iteration)
            self._touch(node)

    def reopen(self, trial_id: str) -> Request:
        """Train a trial's last point again (its checkpoint was lost and is
        still wanted): its metrics there are forgotten, so its request is
        open again and trains from the nearest checkpoint on its path."""
        request = self._record(trial_id).request
        request.node.metrics.pop(request.iteration, None)
        return self.extend_trial(trial_id, request.iteration)

    @renamed_arguments(step="iteration")
    def drop_checkpoint(self, node_id: int, iteration: int) -> None:
        """Forget a checkpoint (lost, corrupt, or evicted with no stored copy):
        the next stage tree trains from the previous one instead."""
        node = self.node(node_id)
        if node._checkpoints.pop(iteration, None) is not None:
            self._touch(node)

    def record_timing(self, node_id: int, start: int, stop: int, seconds: float) -> None:
        self.node(node_id)
        if stop <= start or not seconds >= 0:
            raise ValueError(f"timing needs start < stop and seconds >= 0, got {start}, {stop}, {seconds}")
        self.timings.append(Timing(node_id, start, stop, float(seconds)))

    def record_run(
        self,
        batch_id: int,
        worker: int,
        segments: Iterable[tuple[int, int, int]],
        began: float,
        ended: float,
        outcome: str = "done",
        phases: Mapping[str, float] | None = None,
    ) -> None:
        """A stage batch ran on ``worker`` from ``began`` to ``ended`` (wall-clock
        seconds), its time spent by ``phases``: what the monitor draws as a
        worker's timeline, and what `simulation.replay` holds a study's makespan
        against. Nothing plans from it."""
        segments = tuple((int(node_id), int(start), int(stop)) for node_id, start, stop in segments)
        for node_id, start, stop in segments:
            self.node(node_id)
            if stop <= start:
                raise ValueError(f"a run's segment needs start < stop, got {start}, {stop}")
        if not ended >= began:
            raise ValueError(f"a run needs began <= ended, got {began}, {ended}")
        spent = tuple((str(name), float(seconds)) for name, seconds in (phases or {}).items())
        self.runs.append(BatchRun(int(batch_id), int(worker), segments, float(began), float(ended), outcome, spent))

    def record_batch_timings(self, batch_id: int, iterations: Iterable[tuple[int, int, Any]]) -> None:
        """Time a running batch's trained iterations, given as ``(node_id,
        iteration, seconds)``: one timing per run of consecutive iterations on a
        node. The batch's first iteration is left out: it also pays for the
        worker's setup and checkpoint restore, which belong to no stage; so
        are iterations without a number of seconds."""
        first = self._batch(batch_id).segments[0][1] + 1
        runs: list[list] = []
        for node_id, iteration, seconds in iterations:
            if iteration == first or not isinstance(seconds, (int, float)) or not seconds >= 0:
                continue
            if runs and runs[-1][0] == node_id and runs[-1][2] == iteration - 1:
                runs[-1][2], runs[-1][3] = iteration, runs[-1][3] + seconds
            else:
                runs.append([node_id, iteration - 1, iteration, float(seconds)])
        for node_id, start, stop, seconds in runs:
            self.record_timing(node_id, start, stop, seconds)

    # -- accounting -------------------------------------------------------------

    def total_iterations(self) -> int:
        """Iterations trial-by-trial execution would run for the live trials."""
        return sum(record.request.iteration for record in self.trials.values())

    def unique_iterations(self) -> int:
        """Iterations needed to serve every live trial when prefixes are shared."""
        return sum(stop - self.nodes[node_id].fork_iteration for node_id, stop in self.requested_extent().items())

    def requested_extent(self, trial_ids: Iterable[str] | None = None) -> dict[int, int]:
        """Node id -> the furthest iteration of that node any trial's request
        passes through (of the trials ``trial_ids`` only, when given)."""
        extent: dict[int, int] = {}
        records = self.trials.values() if trial_ids is None else (self.trials[trial_id] for trial_id in trial_ids)
        for record in records:
            node, iteration = record.request.node, record.request.iteration
            while iteration > extent.get(node.node_id, node.fork_iteration):
                extent[node.node_id] = iteration
                if node.parent is None:
                    break
                node, iteration = node.parent, node.fork_iteration
        return extent

    @renamed_arguments(step="iteration", study="share_key")
    def covered_iterations(
        self, configs: Iterable[Mapping[str, Any] | TrialConfig], iteration: int, share_key: str = "default"
    ) -> list[int]:
        """How many of the first ``iteration`` iterations of each config the live
        trials already train (or have trained): adding that config as a trial
        would cost ``iteration`` minus this in unique iterations. Adds nothing to
        the plan.

        Examples
        --------
        >>> from ray_stagetree import MultiStep
        >>> from ray_stagetree.planning import SearchPlan
        >>> plan = SearchPlan()
        >>> _ = plan.add_trial("a", {"lr": MultiStep(0.1, [100], 0.1)}, iteration=200)
        >>> plan.covered_iterations([{"lr": MultiStep(0.1, [150], 0.1)}, {"lr": 0.2}], 200)
        [100, 0]
        """
        _check_iteration(iteration)
        extents = self.requested_extent()
        covered = []
        for config in configs:
            path, limit = self.follow(config, iteration, share_key)
            reach = 0
            # The deepest node a live trial still needs bounds what is shared:
            # the config follows each node on its path up to where the next starts.
            for node in reversed(path):
                if node.node_id in extents:
                    reach = min(limit, extents[node.node_id])
                    break
                limit = node.fork_iteration
            covered.append(reach)
        return covered

    # -- persistence -------------------------------------------------------------

    def save(self, url: str, storage_filesystem: Any = None) -> None:
        """Write the plan as Parquet tables under ``url`` (any fsspec URL)."""
        persistence.save(self, url, storage_filesystem)

    @classmethod
    def load(cls, url: str, storage_filesystem: Any = None, objects: bool = False) -> SearchPlan:
        """Read a plan written by `save`. Scheduled requests come back unscheduled:
        no batch survives a restore. Config values JSON cannot hold stay
        `PickledValue` values unless ``objects`` (then the side file is unpickled:
        only to continue a study in a directory the user chose)."""
        plan = cls()
        persistence.load_into(plan, url, storage_filesystem, objects)
        return plan

    def records(self) -> dict[str, list[dict[str, Any]]]:
        """The plan as plain rows (what `save` writes), for a study snapshot."""
        return persistence.records(self)

    def objects(self) -> dict[str, Any]:
        """The objects of its config values JSON cannot hold, by ref (a snapshot keeps them beside `records`)."""
        return persistence.objects(self)

    @classmethod
    def from_records(
        cls, records: dict[str, list[dict[str, Any]]], objects: dict[str, Any] | None = None
    ) -> SearchPlan:
        """The plan `records` (and `objects`) came from, requests unscheduled as in `load`."""
        plan = cls()
        persistence.fill(plan, records, objects)
        return plan

    def _restore_node(self, node_id: int, config: TrialConfig, parent_id: int | None, fork_iteration: int) -> PlanNode:
        if node_id != len(self.nodes):
            raise ValueError(f"plan nodes must be restored in id order, got {node_id} after {len(self.nodes) - 1}")
        parent = None if parent_id is None else self.nodes[parent_id]
        node = self._new_node(config, parent, fork_iteration)
        if parent is None:
            self._roots[config.observed_at(0)] = node
        else:
            parent.children[(fork_iteration, config.observed_at(fork_iteration))] = node
        return node

    def _restore_checkpoint(self, node_id: int, iteration: int, path: str, size_bytes: int, checksum: str) -> None:
        self.record_checkpoint(node_id, iteration, CheckpointInfo(path, size_bytes, checksum))

    def _restore_trial(self, trial_id: str, config: TrialConfig, share_key: str, node_id: int, iteration: int) -> None:
        node = self.nodes[node_id]
        request = node.requests.get(iteration)
        if request is None:
            request = Request(node, iteration)
            if not request.answered:
                node.requests[iteration] = request
        request.trials.add(trial_id)
        node.trials.add(trial_id)
        self._touch(node)
        self.trials[trial_id] = TrialRecord(trial_id, config, share_key, request)

    def describe(self) -> str:
        """A readable dump of the plan: one node per line, children indented
        under their parent."""
        lines = []
        pending = [(root, 0) for root in reversed(self.roots)]
        while pending:
            node, depth = pending.pop()
            lines.append(
                f"{'  ' * depth}H{node.node_id} from {node.fork_iteration}: "
                f"ckpt={sorted(node.checkpoints)} metrics={sorted(node.metrics)} "
                f"requests={[(r.iteration, r.state.value) for r in node.requests.values()]}"
            )
            children = sorted(node.children.values(), key=lambda child: (child.fork_iteration, child.node_id))
            pending.extend((child, depth + 1) for child in reversed(children))
        return "\n".join(lines)
