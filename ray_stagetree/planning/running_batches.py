"""The search plan's stage batches in flight: which requests each
serves, how far it may go on live, where it must checkpoint, and when no
live trial needs it any more. Pure Python.

`RunningBatches` is a part of `plan.SearchPlan` (its base), kept in a
module of its own for reading: the tree, its requests and its running
batches keep one set of invariants, and these methods read and update the
plan's nodes, requests and trial records with the rest of it.
"""

from __future__ import annotations

from collections.abc import Iterable

from ray_stagetree.planning.config import TrialConfig
from ray_stagetree.planning.plan_records import PlanNode, Request, RequestState, RunningBatch, TrialRecord


class RunningBatches:
    """The running batches of a `plan.SearchPlan` (its ``_batches``, by id)."""

    nodes: list[PlanNode]
    trials: dict[str, TrialRecord]
    _batches: dict[int, RunningBatch]
    _next_batch_id: int
    # (node id, trial id) -> (the trial's config, iteration checked up to, first iteration it differs from the node)
    _divergence: dict[tuple[int, str], tuple[TrialConfig | None, int, int | None]]

    def _touch(self, node: PlanNode) -> None:
        raise NotImplementedError  # the plan's change log (`SearchPlan._touch`)

    def mark_scheduled(self, segments: Iterable[tuple[PlanNode, int, int]]) -> int:
        """Register a dispatched stage batch by its ``(node, start, stop)``
        segments; every open request on them becomes ``SCHED``. Returns the
        batch id the runtime reports back with."""
        batch_id = self._next_batch_id
        self._next_batch_id += 1
        batch = self._batches[batch_id] = RunningBatch(batch_id, list(segments))
        for node, start, stop in batch.segments:
            node.running[batch_id] = (start, stop)
            self._touch(node)
            for iteration, request in node.requests.items():
                if start < iteration <= stop and request.state is RequestState.NOT_SCHED:
                    self._attach_to_batch(request, batch_id)
        return batch_id

    def _attach_to_batch(self, request: Request, batch_id: int) -> None:
        self._touch(request.node)
        request.state = RequestState.SCHED
        request.batch_id = batch_id
        self._batches[batch_id].requests.append(request)

    def _batch(self, batch_id: int) -> RunningBatch:
        try:
            return self._batches[batch_id]
        except KeyError:
            raise KeyError(f"no running batch {batch_id!r}") from None

    def release_batch(self, batch_id: int) -> list[Request]:
        """The batch ended (finished, failed or pre-empted). Its unanswered
        requests go back to ``NOT_SCHED`` (or away, if no trial needs them);
        returns those that need training again."""
        batch = self._batch(batch_id)
        del self._batches[batch_id]
        for node, _, _ in batch.segments:
            node.running.pop(batch_id, None)
            node.trained.pop(batch_id, None)
            self._touch(node)
        again = []
        for request in batch.requests:
            self._touch(request.node)
            request.state, request.batch_id = RequestState.NOT_SCHED, None
            if request.answered:
                continue
            if request.trials:
                again.append(request)
            else:
                request.node.requests.pop(request.iteration, None)
        return again

    def extend_batch(self, batch_id: int) -> int | None:
        """Live continuation: a running batch that reached the end of its last
        segment goes on along the same node, through the work live trials
        still want there (their requests beyond it, and branch points their
        forks need), instead of ending and leaving that work to a new batch
        that would restart from a checkpoint, or from scratch without one.
        Returns the new end, or None when nothing on the node is wanted or
        another batch already trains it."""
        batch = self._batch(batch_id)
        node, start, stop = batch.segments[-1]
        if any(other != batch_id and end > stop for other, (_, end) in node.running.items()):
            return None
        wanted = [iteration for iteration, request in node.requests.items() if iteration > stop and request.trials]
        wanted += [
            child.fork_iteration
            for child in node.children.values()
            if child.fork_iteration > stop and self._has_live_request(child)
        ]
        if not wanted:
            return None
        end = max(wanted)
        batch.segments[-1] = (node, start, end)
        node.running[batch_id] = (start, end)
        self._touch(node)
        for iteration, request in node.requests.items():
            if stop < iteration <= end and request.state is RequestState.NOT_SCHED:
                self._attach_to_batch(request, batch_id)
        return end

    def batch_segments(self, batch_id: int) -> list[tuple[PlanNode, int, int]]:
        """The ``(node, start, stop)`` segments of a running batch, as extended."""
        return list(self._batch(batch_id).segments)

    @property
    def running_batches(self) -> list[int]:
        return list(self._batches)

    def in_progress(self, trial_id: str) -> bool:
        """Whether a running batch trains the trial's path towards its request:
        the request itself, or a stage of an ancestor the trial forks from
        (another trial's, which it waits for rather than for a worker)."""
        request = self.trials[trial_id].request
        if request.state is RequestState.SCHED:
            return True
        node: PlanNode | None = request.node
        until = request.iteration
        while node is not None:
            if any(start < until for start, _ in node.running.values()):
                return True
            until = node.fork_iteration
            node = node.parent
        return False

    def scheduled_requests(self, batch_id: int) -> list[Request]:
        """The unanswered requests a running batch serves (late ones included)."""
        return list(self._batch(batch_id).requests)

    def _needed_points(self, batch_id: int) -> list[tuple[PlanNode, int, bool]]:
        """``(node, iteration, is_branch)`` points of a running batch that live
        trials need: their requests, and branch points other trials continue
        from (a child's fork, or the node itself going on past the segment)."""
        points = []
        for node, start, stop in self._batch(batch_id).segments:
            points += [
                (node, iteration, False)
                for iteration, request in node.requests.items()
                if start < iteration <= stop and request.trials
            ]
            points += [
                (node, child.fork_iteration, True)
                for child in node.children.values()
                if start < child.fork_iteration <= stop and self._has_live_request(child)
            ]
            if self._continues_past(node, stop):
                points.append((node, stop, True))
            points += [(node, fork, True) for fork in self._forks_ahead(node, start, stop)]
        return points

    def _forks_ahead(self, node: PlanNode, start: int, stop: int) -> set[int]:
        """Steps in ``(start, stop]`` where a trial now requested on ``node``
        will leave it once its request moves on (a trial requested a few
        iterations at a time, whose fork the plan has not reached yet)."""
        forks = set()
        for trial_id in node.trials:
            key = (node.node_id, trial_id)
            config = self.trials[trial_id].config
            known, checked, fork = self._divergence.get(key, (None, node.fork_iteration, None))
            if known is not config:  # new, or PBT gave the trial another config
                checked, fork = node.fork_iteration, None
            if fork is None and checked < stop:
                fork = config.first_difference(node.config, stop, checked)
                checked = stop
            self._divergence[key] = (config, checked, fork)
            if fork is not None and start < fork <= stop:
                forks.add(fork)
        return forks

    def _continues_past(self, node: PlanNode, iteration: int) -> bool:
        """Does a live trial train ``node`` beyond ``iteration``?"""
        if any(s > iteration and request.trials for s, request in node.requests.items()):
            return True
        return any(
            child.fork_iteration > iteration and self._has_live_request(child) for child in node.children.values()
        )

    def needed_until(self, batch_id: int) -> tuple[PlanNode, int] | None:
        """The furthest point of a running batch that some live trial still
        needs; None when nothing is, and the batch can be pre-empted at once."""
        segments = self._batch(batch_id).segments
        position = {node.node_id: index for index, (node, _, _) in enumerate(segments)}
        points = [
            (node, iteration)
            for node, iteration, is_branch in self._needed_points(batch_id)
            if not (is_branch and iteration in node.checkpoints)
        ]
        if not points:
            return None
        return max(points, key=lambda point: (position[point[0].node_id], point[1]))

    def checkpoints_needed(self, batch_id: int) -> list[tuple[PlanNode, int]]:
        """Branch points on a running batch that other trials continue from and
        that have no checkpoint yet, plus the batch's end. Trials added after the
        batch was dispatched can add points: the runtime asks again."""
        segments = self._batch(batch_id).segments
        forks = {
            (node.node_id, iteration): (node, iteration)
            for node, iteration, is_branch in self._needed_points(batch_id)
            if is_branch and iteration not in node.checkpoints
        }
        last_node, _, last_stop = segments[-1]
        forks.setdefault((last_node.node_id, last_stop), (last_node, last_stop))
        return sorted(forks.values(), key=lambda point: (point[0].fork_iteration, point[1]))

    @staticmethod
    def _has_live_request(node: PlanNode) -> bool:
        pending = [node]
        while pending:
            current = pending.pop()
            if any(request.trials for request in current.requests.values()):
                return True
            pending.extend(current.children.values())
        return False
