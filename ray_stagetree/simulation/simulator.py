"""A discrete-event simulation of stage execution on W workers.

It drives the real planner: the execution policy dispatches stage batches to
idle simulated workers; a worker goes through its batch one iteration at a
time, records each iteration's metrics in the plan, and saves the
checkpoints the plan asks for as it passes them (so a waiting branch starts
as soon as its fork is trained, not when the whole batch ends). Answered
requests, checkpoints, timings and released batches go back into the plan as
the Ray runtime reports them, and a batch that no live trial needs any more
is pre-empted, as the controller does (`SearchPlan.needed_until`). Only time
is simulated: an iteration costs what ``seconds_per_iteration`` says.

With ``on_answered``, whatever drives the study (a trial scheduler, see
`ray_stagetree.simulation.simulated_study`) sees every answered request at the
simulated instant it is answered and may add, extend or stop trials; the
simulation then dispatches what the changed plan needs.

Use it to compare execution policies, or sharing against trial-by-trial
execution, at a scale no test machine has.
"""

from __future__ import annotations

import bisect
import copy
import heapq
import itertools
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ray_stagetree.planning.cost import CostModel
from ray_stagetree.planning.plan import CheckpointInfo, PlanNode, Request, SearchPlan
from ray_stagetree.planning.policies import (
    POLICIES,
    CriticalPathPolicy,
    ExecutionPolicy,
    StageBatch,
    get_policy,
)
from ray_stagetree.planning.stage_tree import build_stage_tree
from ray_stagetree.validation import Int, check

#: Event times are rounded to this many decimals, so that the same point
#: reached through differently cut stages (sums of float costs in another
#: order) is the same instant, and same-instant answers are fed together.
_TIME_DECIMALS = 6


@dataclass(frozen=True)
class FinalTraining:
    """A study's best trial trains on from iteration ``start`` once every
    other request of the study's trials, ``trial_ids``, is answered (the
    papers' final epochs): `Simulation.trained_bound` counts it after them."""

    trial_ids: tuple[str, ...]
    trial_id: str
    start: int


@dataclass(frozen=True)
class SimulationResult:
    makespan: float
    worker_seconds: float
    iterations: int
    batches: int
    lower_bound: float
    """max(longest root-to-leaf path, unique work / workers) of the requests
    open when the run started: no schedule of those is faster."""
    checkpoint_loads: int = 0
    checkpoint_saves: int = 0
    preempted: int = 0
    yielded: int = 0
    """Batches a time-sharing policy stopped at a quantum's end for other work."""

    @property
    def makespan_ratio(self) -> float:
        return self.makespan / self.lower_bound if self.lower_bound else 1.0


def _unit_cost(node: PlanNode, iteration: int) -> float:
    return 1.0


class KnownCosts(CostModel):
    """A cost model that knows the simulated per-iteration costs: the thesis'
    scheduler profiles a configuration's time per iteration when its plan node is
    added, which is what a simulation knows exactly. (Fitting `CostModel` on
    every new timing is quadratic in the batches of a long simulation.)"""

    def __init__(self, seconds_per_iteration: Callable[[PlanNode, int], float]) -> None:
        super().__init__()
        self._cost = seconds_per_iteration

    def fit(self, plan: SearchPlan) -> KnownCosts:
        return self

    @property
    def is_fitted(self) -> bool:
        return True

    def seconds_per_iteration(self, node: PlanNode, start: int, stop: int) -> float:
        return self.stage_seconds(node, start, stop) / (stop - start) if stop > start else 0.0

    def stage_seconds(self, node: PlanNode, start: int, stop: int) -> float:
        return sum(self._cost(node, iteration) for iteration in range(start, stop))


@dataclass(eq=False)
class _Progress:
    """A dispatched batch as its worker goes through it. ``times[i]`` is when
    the worker finishes the ``i``-th iteration of the batch; ``index`` maps a
    plan node to (first iteration trained on it, position of that iteration)."""

    batch: StageBatch
    started: float
    iterations: list[tuple[PlanNode, int]]
    times: list[float]
    index: dict[int, tuple[int, int]]
    passed: int = 0
    queued: set[int] = field(default_factory=set)
    released: bool = False
    boundary: int | None = None  # the iteration ending its quantum (time-sharing policies)

    def position(self, node: PlanNode, iteration: int) -> int | None:
        """Position of the iteration that ends at ``(node, iteration)``, if the batch trains it."""
        found = self.index.get(node.node_id)
        if found is None:
            return None
        start, offset = found
        position = offset + iteration - start - 1
        if 0 <= position < len(self.iterations) and self.iterations[position] == (node, iteration):
            return position
        return None


@dataclass
class Simulation:
    """A simulated cluster.

    Parameters
    ----------
    workers:
        Number of simulated workers (GPUs).
    seconds_per_iteration:
        Cost of (0-based) ``iteration`` of plan node ``node``; one unit by default.
    checkpoint_load_seconds:
        Paid when a batch starts from a stored checkpoint rather than from scratch.
    batch_start_seconds:
        Paid by every batch before its first iteration, on top of a
        checkpoint's load: its dispatch and the trainable's own set-up
        (building the model, moving data), which no iteration's cost holds.
    worker_start_seconds:
        Paid on top by each worker's first batch: the process warming up
        (its first model built, a CUDA context). A batch goes to a worker
        that ran one before while any is idle.
    checkpoint_save_seconds:
        Paid at the end of a batch, whose final checkpoint the worker writes
        before it is free. Checkpoints at branch points inside a batch are
        written in the background while training goes on (thesis section
        4.3), so they cost no worker time.
    metrics:
        ``metrics(node, iteration)``: what the trainable reports after
        ``iteration`` iterations of ``node``'s path (beside ``time_total_s``); nothing by default.
    profiled_costs:
        Policies given by name estimate stage times with the simulated costs
        (`KnownCosts`); otherwise they use their default `CostModel`.

    Examples
    --------
    >>> from ray_stagetree import MultiStep
    >>> from ray_stagetree.planning import SearchPlan
    >>> plan = SearchPlan()
    >>> _ = plan.add_trials([(f"t{m}", {"lr": MultiStep(0.1, [m], 0.1)}, 100) for m in (30, 60, 90)])
    >>> Simulation(workers=3).run(plan).makespan  # one worker per branch, each from its fork
    100.0
    """

    workers: int
    seconds_per_iteration: Callable[[PlanNode, int], float] = _unit_cost
    checkpoint_load_seconds: float = 0.0
    checkpoint_save_seconds: float = 0.0
    batch_start_seconds: float = 0.0
    worker_start_seconds: float = 0.0
    metrics: Callable[[PlanNode, int], dict[str, Any]] | None = None
    profiled_costs: bool = True

    def __post_init__(self) -> None:
        check("workers", self.workers, Int(low=1))
        for name in (
            "checkpoint_load_seconds",
            "checkpoint_save_seconds",
            "batch_start_seconds",
            "worker_start_seconds",
        ):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)!r}")

    def _seconds(self, node: PlanNode, start: int, stop: int) -> float:
        return sum(self.seconds_per_iteration(node, iteration) for iteration in range(start, stop))

    def policy(self, policy: str | ExecutionPolicy, batch_stages: bool | None = None) -> ExecutionPolicy:
        """The execution policy for a run: a name gives that policy,
        estimating stage times with the simulated costs (see `KnownCosts`),
        dispatching whole paths or not as ``batch_stages`` says; an instance
        comes back as a copy (a policy keeps the state of the run it
        serves), with its own cost model and batching."""
        if isinstance(policy, ExecutionPolicy):
            return copy.deepcopy(policy)
        if policy not in POLICIES:
            return get_policy(policy)  # raises the usual error
        return POLICIES[policy](cost_model=KnownCosts(self.seconds_per_iteration), batch_stages=batch_stages)

    def lower_bound(self, plan: SearchPlan) -> float:
        """max(longest root-to-leaf path, unique work / workers) of the open requests."""
        tree = build_stage_tree(plan)
        costs = {stage: self._seconds(stage.node, stage.start, stage.stop) for stage in tree.stages}
        longest = CriticalPathPolicy().path_seconds(tree, costs)
        return max(max(longest.values(), default=0.0), sum(costs.values()) / self.workers)

    def trained_bound(self, plan: SearchPlan, finals: Iterable[FinalTraining] = ()) -> float:
        """max(longest path, unique work / workers) of what the trials were
        finally requested up to: after a run whose trial schedulers chose
        what to train, no schedule of that work ends sooner (checkpoint
        costs left out). With ``finals``, also: a study's other work, on all
        workers, then its best trial's final training, on one."""
        bound = self._work(plan, plan.requested_extent()) / self.workers
        for record in plan.trials.values():
            bound = max(bound, self._path_seconds(record.request.node, 0, record.request.iteration))
        for final in finals:
            request = plan.trials[final.trial_id].request
            tail = self._path_seconds(request.node, final.start, request.iteration)
            before = self._work(plan, plan.requested_extent(final.trial_ids)) - tail
            bound = max(bound, before / self.workers + tail)
        return bound

    def _work(self, plan: SearchPlan, extent: Mapping[int, int]) -> float:
        """Seconds of the iterations ``extent`` (`SearchPlan.requested_extent`) covers."""
        return sum(
            self._seconds(plan.nodes[node_id], plan.nodes[node_id].fork_iteration, stop)
            for node_id, stop in extent.items()
        )

    def _path_seconds(self, node: PlanNode, start: int, stop: int) -> float:
        """Seconds of iterations ``[start, stop)`` of the path to ``node``."""
        seconds = 0.0
        while stop > start:
            low = max(start, node.fork_iteration)
            seconds += self._seconds(node, low, stop)
            if node.parent is None:
                break
            node, stop = node.parent, min(stop, node.fork_iteration)
        return seconds

    def run(
        self,
        plan: SearchPlan,
        policy: str | ExecutionPolicy = "critical_path",
        on_answered: Callable[[list[Request], float], None] | None = None,
        on_dispatched: Callable[[], bool] | None = None,
    ) -> SimulationResult:
        """Train every open request of ``plan`` on the simulated workers.

        Parameters
        ----------
        plan:
            The search plan; its open requests are what gets trained.
        policy:
            An execution policy or its name.
        on_answered:
            Called with the requests answered at one simulated instant and
            that instant, after their metrics are in the plan; it may change
            the plan (add, extend or remove trials). The run ends when no
            batch runs and the policy dispatches nothing.
        on_dispatched:
            Called after each dispatch; True when it added requests to
            dispatch at once (trials admitted because the dispatched ones
            wait for a worker no more).
        """
        if isinstance(policy, str) and self.profiled_costs:
            policy = self.policy(policy)
        return _Run(self, plan, get_policy(policy), on_answered, on_dispatched).go()


class _Run:
    """One `Simulation.run`: the event loop and its bookkeeping."""

    def __init__(
        self,
        simulation: Simulation,
        plan: SearchPlan,
        policy: ExecutionPolicy,
        on_answered: Callable[[list[Request], float], None] | None,
        on_dispatched: Callable[[], bool] | None = None,
    ) -> None:
        self.sim, self.plan, self.policy, self.on_answered = simulation, plan, policy, on_answered
        self.on_dispatched = on_dispatched
        self.events: list[tuple[float, int, int, int]] = []  # (time, tie, batch id, position or -1 = release)
        self.tie_break = itertools.count()
        self.running: dict[int, _Progress] = {}
        self.now = self.busy = 0.0
        self.idle = simulation.workers
        self.cold = simulation.workers  # idle workers that never ran a batch
        self.iterations = self.batches = self.loads = self.saves = self.preempted = self.yielded = 0
        policy.bind(simulation.workers)

    def go(self) -> SimulationResult:
        bound = self.sim.lower_bound(self.plan)
        while True:
            self._dispatch()
            if self.on_dispatched is not None and self.on_dispatched():
                continue
            if not self.events:
                break
            self.now = self.events[0][0]
            answered: list[Request] = []
            touched: set[int] = set()
            while self.events and self.events[0][0] <= self.now:
                _, _, batch_id, position = heapq.heappop(self.events)
                progress = self.running.get(batch_id)
                if progress is None:
                    continue  # pre-empted after this event was queued
                if position < 0:
                    self._release(progress)
                else:
                    answered += self._advance(progress)
                    touched.add(batch_id)
                    if not progress.released and progress.boundary is not None and progress.passed > progress.boundary:
                        self._quantum_end(progress)
            if answered and self.on_answered is not None:
                self.on_answered(answered, self.now)
                touched = set(self.running)  # the plan changed: any batch may need more, or less
            for batch_id in touched:
                progress = self.running.get(batch_id)
                if progress is not None and not progress.released:
                    self._review(progress)
        return SimulationResult(
            self.now,
            self.busy,
            self.iterations,
            self.batches,
            bound,
            checkpoint_loads=self.loads,
            checkpoint_saves=self.saves,
            preempted=self.preempted,
            yielded=self.yielded,
        )

    # -- dispatch ------------------------------------------------------------

    def _dispatch(self) -> None:
        for batch in self.policy.select(self.plan, self.idle):
            self.idle -= 1
            self.batches += 1
            source = batch.source
            elapsed = self.now + self.sim.batch_start_seconds
            if self.idle < self.cold:  # no warm worker was idle (this one counted out already)
                self.cold -= 1
                elapsed += self.sim.worker_start_seconds
            if source is not None and not source.is_initialization:
                elapsed += self.sim.checkpoint_load_seconds
                self.loads += 1
            iterations, times, index = [], [], {}
            for node, start, stop in batch.segments:
                index[node.node_id] = (start, len(iterations))
                for iteration in range(start, stop):
                    elapsed += self.sim.seconds_per_iteration(node, iteration)
                    iterations.append((node, iteration + 1))
                    times.append(round(elapsed, _TIME_DECIMALS))
            progress = self.running[batch.batch_id] = _Progress(batch, self.now, iterations, times, index)
            # Every stage end (requests and branch points as dispatched) and
            # the batch's end get an event; points that appear later are
            # queued by `_review`.
            for stage in batch.stages:
                self._queue(progress, progress.position(stage.node, stage.stop))
            self._set_boundary(progress, self.policy.started(batch, self.now))
            self._review(progress)

    def _set_boundary(self, progress: _Progress, deadline: float | None) -> None:
        """Queue the first iteration boundary at or after ``deadline``, where
        a time-sharing policy decides whether the batch goes on."""
        position = None if deadline is None else bisect.bisect_left(progress.times, round(deadline, _TIME_DECIMALS))
        progress.boundary = position if position is not None and position < len(progress.times) else None
        if progress.boundary is not None:
            self._queue(progress, progress.boundary)

    def _quantum_end(self, progress: _Progress) -> None:
        """The quantum is over: the worker stops here with a checkpoint if
        the policy runs other work next, and otherwise goes on."""
        batch_id = progress.batch.batch_id
        node, iteration = progress.iterations[progress.passed - 1]
        if not self.policy.at_boundary(self.plan, batch_id, node, iteration, self.now):
            self._set_boundary(progress, self.policy.quantum_deadline(batch_id))
            return
        self.yielded += 1
        if iteration not in node.checkpoints:
            self._save(node, iteration)
        progress.released = True
        done = round(self.now + self.sim.checkpoint_save_seconds, _TIME_DECIMALS)
        heapq.heappush(self.events, (done, next(self.tie_break), batch_id, -1))

    def _queue(self, progress: _Progress, position: int | None) -> None:
        if position is None or position < progress.passed or position in progress.queued:
            return
        progress.queued.add(position)
        heapq.heappush(self.events, (progress.times[position], next(self.tie_break), progress.batch.batch_id, position))

    # -- a worker going through its batch ------------------------------------------

    def _advance(self, progress: _Progress) -> list[Request]:
        """Record every iteration the worker has finished by now; save the
        checkpoints the plan needs at the points passed."""
        plan, batch_id = self.plan, progress.batch.batch_id
        wanted = {(node.node_id, iteration) for node, iteration in plan.checkpoints_needed(batch_id)}
        answered: list[Request] = []
        while progress.passed < len(progress.iterations) and progress.times[progress.passed] <= self.now:
            node, iteration = progress.iterations[progress.passed]
            progress.passed += 1
            self.iterations += 1
            metrics = {"time_total_s": progress.times[progress.passed - 1]}
            if self.sim.metrics is not None:
                metrics.update(self.sim.metrics(node, iteration))
            answered += plan.record_metrics(node.node_id, iteration, metrics)
            if (node.node_id, iteration) in wanted:
                self._save(node, iteration)
        if progress.passed == len(progress.iterations):
            self._finish(progress)
        return answered

    def _review(self, progress: _Progress) -> None:
        """After the plan changed: pre-empt a batch nothing needs any more,
        and queue events at the points it must now reach (requests attached
        after dispatch, new branch points)."""
        batch_id = progress.batch.batch_id
        needed = self.plan.needed_until(batch_id)
        furthest = None if needed is None else progress.position(*needed)
        if furthest is None or furthest < progress.passed:
            self._preempt(progress)
            return
        self._queue(progress, furthest)
        for node, iteration in self.plan.checkpoints_needed(batch_id):
            self._queue(progress, progress.position(node, iteration))
        for request in self.plan.scheduled_requests(batch_id):
            self._queue(progress, progress.position(request.node, request.iteration))

    def _save(self, node: PlanNode, iteration: int) -> None:
        info = CheckpointInfo(path=f"simulated://{node.node_id}/{iteration}")
        self.plan.record_checkpoint(node.node_id, iteration, info)
        self.saves += 1

    def _finish(self, progress: _Progress) -> None:
        """The last iteration is done: the worker writes the final checkpoint
        (saved above) and is free once it is written."""
        progress.released = True
        for node, start, stop in progress.batch.segments:
            seconds = sum(self.sim.seconds_per_iteration(node, iteration) for iteration in range(start, stop))
            self.plan.record_timing(node.node_id, start, stop, seconds)
        done = round(self.now + self.sim.checkpoint_save_seconds, _TIME_DECIMALS)
        heapq.heappush(self.events, (done, next(self.tie_break), progress.batch.batch_id, -1))

    def _preempt(self, progress: _Progress) -> None:
        """Nothing ahead of the worker is needed: it stops now, saving nothing more."""
        self.preempted += 1
        progress.released = True
        self._release(progress)

    def _release(self, progress: _Progress) -> None:
        batch_id = progress.batch.batch_id
        last = progress.iterations[progress.passed - 1] if progress.passed else None
        self.policy.ended(self.plan, batch_id, self.now, last)
        del self.running[batch_id]
        self.plan.release_batch(batch_id)
        self.busy += self.now - progress.started
        self.idle += 1
