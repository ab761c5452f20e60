"""Time-sharing of workers by priority: Hermes (Son et al., Electronics 2021)
and the baselines it is compared with.

When trials outnumber workers, a running stage batch is pre-empted at an
iteration boundary once its *quantum* (seconds of worker time) is over, its
model goes to a checkpoint, and the worker runs the waiting batch of highest
priority (which may be the same one: then it simply goes on). The policies
differ in their priority and quantum:

* `HermesPolicy` (convergence priority, the paper's section 3.3). With
  ``L_j(i)`` the losses job ``j`` reported during its ``i``-th quantum, its
  representative loss is the midrange ``loss_j(i) = (max L_j(i) + min
  L_j(i)) / 2`` and its convergence is the loss it dropped per iteration,
  ``C_j(i) = (loss_j(i-1) - loss_j(i)) / |L_j(i)|``; after its first quantum,
  ``C_j(0) = (max L_j(0) - min L_j(0)) / |L_j(0)|``. The job with the largest
  ``C`` runs. Quanta start at 10 s and grow (times ``quantum_growth``) each
  time the job's loss passes a milestone, a fraction of its first loss it has
  dropped (``milestones``), so that slopes that flatten stay comparable.
* `RoundRobinPolicy` (Gandiva's time-sharing, the paper's "RR"): 30 s quanta,
  the job that waited longest runs.
* `SlaqPolicy` (SLAQ, Zhang et al., SoCC 2017, as its paper defines it):
  30 s quanta; the job whose *predicted* loss reduction per second of
  worker time over its next quantum is largest runs. The prediction comes
  from a curve ``loss(k) = c + a / k`` fitted by least squares to the
  losses a job has reported (``k`` its iterations so far), normalised by the
  job's first loss so that jobs of different loss scales compare (SLAQ's
  normalised quality).
* `FifoPolicy`: no pre-emption, jobs in the order they arrived.

A *job* is a plan node (a trial, or a stage shared by several trials): its
losses are the metric values recorded along the path its batches trained.
A node that has not run yet inherits the record of its nearest ancestor, so
a trial forking off a shared prefix starts with the prefix's convergence;
a job with no record at all (a new trial) runs before any measured one, in
arrival order, since a quantum is what measures it. Where the paper breaks
ties or reads Algorithm 3 ambiguously, this module compares the job whose
quantum just ended (with its fresh ``C``) against the best waiting one and
pre-empts only for a strictly higher priority.

Admission (the paper's ``G_thres``, Algorithms 1 and 2): at most
``max_jobs_per_worker`` jobs per worker time-share at once; a new job starts
only while fewer are active, the others wait in arrival order. The paper
binds a job to one GPU because its checkpoints live on that node's disk; here
a checkpoint lives in the object store and any worker resumes it, so the
bound is on the jobs of all workers together.

The policies read losses from the plan's recorded metrics, so the Ray
runtime and the simulator drive them the same way: `started` when a batch is
dispatched, `at_boundary` at iteration boundaries (True: stop here with a
checkpoint), `ended` when the batch ends.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

from ray_stagetree.planning.cost import CostModel
from ray_stagetree.planning.policies import POLICIES, ExecutionPolicy, StageBatch, get_policy
from ray_stagetree.planning.stage_tree import Stage, StageTree
from ray_stagetree.validation import Int, Options, Real, check, is_number

if TYPE_CHECKING:
    from ray_stagetree.planning.plan import PlanNode, SearchPlan


def midrange(losses: Sequence[float]) -> float:
    """``loss_j(i)``: the representative loss of a quantum, robust to the
    noise of single values (the paper's Figure 4)."""
    if not losses:
        raise ValueError("a quantum's midrange needs at least one loss")
    return (max(losses) + min(losses)) / 2


def convergence(losses: Sequence[float], previous_midrange: float | None) -> float:
    """``C_j(i)``: loss dropped per iteration over a quantum with ``losses``.
    ``previous_midrange`` is ``loss_j(i-1)``, None for a job's first quantum."""
    if not losses:
        raise ValueError("a quantum's convergence needs at least one loss")
    if previous_midrange is None:
        return (max(losses) - min(losses)) / len(losses)
    return (previous_midrange - midrange(losses)) / len(losses)


@dataclasses.dataclass
class JobRecord:
    """What the policies know of a job after its latest quantum."""

    first_loss: float | None = None
    last_loss: float | None = None
    midrange: float | None = None
    convergence: float | None = None
    quanta: int = 0
    milestones_passed: int = 0
    last_ran: float = -math.inf  # when its latest quantum ended
    losses: tuple[float, ...] = ()  # every loss reported, one per iteration, in order
    seconds: float = 0.0  # worker time it ran

    def observe(
        self, losses: Sequence[float], ended: float, milestones: Sequence[float] = (), seconds: float = 0.0
    ) -> None:
        """Close a quantum of ``seconds`` that ended at ``ended``, in which the
        job reported ``losses`` (none where the policy reads no metric)."""
        self.last_ran = ended
        self.quanta += 1
        self.seconds += seconds
        if not losses:
            return
        self.losses += tuple(losses)
        self.convergence = convergence(losses, self.midrange)
        self.midrange = midrange(losses)
        if self.first_loss is None:
            self.first_loss = losses[0]
        self.last_loss = losses[-1]
        dropped = self.first_loss - self.midrange
        self.milestones_passed = sum(1 for m in milestones if dropped >= m * abs(self.first_loss))


@dataclasses.dataclass
class _Quantum:
    job: PlanNode
    start: tuple[PlanNode, int]  # where the quantum's losses begin (exclusive)
    began: float
    last: tuple[PlanNode, int]  # the latest point the batch reported


def _check_positive(name: str, value: object) -> None:
    check(name, value, Real(low=0, closed="neither"))


class TimeSharingPolicy(ExecutionPolicy):
    """Base of the time-sharing policies (see the module docstring).

    Parameters
    ----------
    metric, mode:
        The loss the priorities read and whether lower ("min") or higher
        ("max", its negation is the loss) is better. None: the Tuner takes
        ``TuneConfig``'s.
    quantum_s:
        Seconds of worker time before a batch may be pre-empted (None: never).
    max_jobs_per_worker:
        The paper's ``G_thres``: jobs time-sharing one worker at most.
    """

    default_quantum_s: float | None = None
    needs_metric = True  # its priorities read the loss
    milestones: tuple[float, ...] = ()

    def __init__(
        self,
        metric: str | None = None,
        mode: str | None = None,
        quantum_s: float | None = None,
        max_jobs_per_worker: int = 4,
        cost_model: CostModel | None = None,
        batch_stages: bool | None = None,
    ) -> None:
        super().__init__(cost_model, batch_stages)
        if metric is not None and (not isinstance(metric, str) or not metric):
            raise ValueError(f"metric must be a non-empty str or None, got {metric!r}")
        check("mode", mode, Options(("min", "max")), None)
        if self.default_quantum_s is None and quantum_s is not None:
            raise ValueError(f"{type(self).__name__} never pre-empts: quantum_s must be None, got {quantum_s!r}")
        quantum_s = self.default_quantum_s if quantum_s is None else quantum_s
        if quantum_s is not None:
            _check_positive("quantum_s", quantum_s)
        check("max_jobs_per_worker", max_jobs_per_worker, Int(low=1))
        self.metric, self.mode = metric, mode
        self.quantum_s = quantum_s
        self.max_jobs_per_worker = max_jobs_per_worker
        self.workers: int | None = None  # set by `bind`; None: no admission limit
        self.records: dict[int, JobRecord] = {}  # by plan node id
        self._quanta: dict[int, _Quantum] = {}  # by running batch id

    def set_metric(self, metric: str, mode: str) -> None:
        """Take the study's metric and mode where none was given."""
        self.metric = self.metric or metric
        self.mode = self.mode or mode

    # -- priorities --------------------------------------------------------

    def job_priority(self, node: PlanNode, record: JobRecord) -> float:
        """Higher runs first (a job without a record runs before all)."""
        raise NotImplementedError

    def quantum_seconds(self, record: JobRecord | None) -> float | None:
        return self.quantum_s

    def record_of(self, node: PlanNode) -> JobRecord | None:
        """The node's record, or its nearest ancestor's (a fork inherits the
        convergence of the prefix it forks from)."""
        current: PlanNode | None = node
        while current is not None:
            record = self.records.get(current.node_id)
            if record is not None:
                return record
            current = current.parent
        return None

    def priority_of(self, node: PlanNode) -> float:
        record = self.record_of(node)
        return math.inf if record is None else self.job_priority(node, record)

    def priorities(self, tree: StageTree, costs: dict[Stage, float]) -> dict[Stage, float]:
        return {stage: self.priority_of(stage.node) for stage in tree.stages}

    def admission_order(self, on: bool = True) -> ExecutionPolicy:
        # A time-sharing policy's order of jobs is what it is chosen for
        # (Hermes, SLAQ, round robin): it keeps it under any scheduler.
        return self

    # -- admission (G_thres) ---------------------------------------------------

    def bind(self, workers: int) -> None:
        self.workers = workers

    def _active_jobs(self, plan: SearchPlan) -> int:
        """Jobs that have run and still have work: they hold their slots."""
        return sum(
            1 for node_id in self.records if any(request.trials for request in plan.nodes[node_id].requests.values())
        )

    def _candidates(self, plan: SearchPlan) -> Iterator[StageBatch]:
        room = math.inf if self.workers is None else self.max_jobs_per_worker * self.workers - self._active_jobs(plan)
        for batch in super()._candidates(plan):
            if self.record_of(batch.stages[0].node) is None:
                if room <= 0:
                    continue  # a new job waits for an active one to finish
                room -= 1
            yield batch

    # -- quanta ------------------------------------------------------------------

    def started(self, batch: StageBatch, now: float) -> float | None:
        assert batch.batch_id is not None  # a dispatched batch has its id
        first = batch.stages[0]
        start = (first.node, first.start)
        self._quanta[batch.batch_id] = _Quantum(first.node, start, now, start)
        return self.quantum_deadline(batch.batch_id)

    def quantum_deadline(self, batch_id: int) -> float | None:
        quantum = self._quanta.get(batch_id)
        if quantum is None:
            return None
        seconds = self.quantum_seconds(self.record_of(quantum.job))
        return None if seconds is None else quantum.began + seconds

    def at_boundary(self, plan: SearchPlan, batch_id: int, node: PlanNode, iteration: int, now: float) -> bool:
        quantum = self._quanta.get(batch_id)
        if quantum is None:
            return False
        quantum.last = (node, iteration)
        deadline = self.quantum_deadline(batch_id)
        if deadline is None or now < deadline or self._unmeasured(quantum):
            return False
        self._close(quantum, now)
        best_waiting = next(self._candidates(plan), None)
        if best_waiting is not None and self.priority_of(best_waiting.stages[0].node) > self.priority_of(node):
            del self._quanta[batch_id]
            return True
        self._quanta[batch_id] = _Quantum(node, (node, iteration), now, (node, iteration))  # it goes on: a new quantum
        return False

    def _unmeasured(self, quantum: _Quantum) -> bool:
        """A job's first quantum goes on until it has two losses: its
        convergence ``(max - min) / |L|`` is 0 from one loss, whatever the
        job, which would rank it with the jobs that do not learn (an
        iteration longer than the quantum, as on a loaded machine, made every
        job's first convergence 0)."""
        if not self.needs_metric:
            return False
        record = self.record_of(quantum.job)
        return (record is None or record.midrange is None) and len(self._losses(quantum.start, quantum.last)) < 2

    def ended(self, plan: SearchPlan, batch_id: int, now: float, point: tuple[PlanNode, int] | None = None) -> None:
        quantum = self._quanta.pop(batch_id, None)
        if quantum is not None:
            if point is not None:
                quantum.last = point
            self._close(quantum, now)

    def _close(self, quantum: _Quantum, now: float) -> None:
        node = quantum.last[0]
        record = self.records.get(node.node_id)
        if record is None:
            inherited = self.record_of(node)
            record = self.records[node.node_id] = JobRecord() if inherited is None else dataclasses.replace(inherited)
        losses = self._losses(quantum.start, quantum.last) if self.needs_metric else []
        record.observe(losses, now, self.milestones, now - quantum.began)
        if quantum.job is not node and quantum.job.node_id in self.records:
            self.records[quantum.job.node_id].last_ran = now

    def _losses(self, start: tuple[PlanNode, int], end: tuple[PlanNode, int]) -> list[float]:
        """The losses recorded on the path from ``start`` (exclusive) to ``end``."""
        if self.metric is None:
            raise ValueError(f"{type(self).__name__} needs a metric: pass metric=... or set TuneConfig(metric=...)")
        sign = -1.0 if self.mode == "max" else 1.0
        losses: list[float] = []
        node, upper = end
        while node is not None:
            lower = start[1] if node is start[0] else node.fork_iteration
            for iteration in range(upper, lower, -1):
                value = node.metrics.get(iteration, {}).get(self.metric)
                if is_number(value) and math.isfinite(value):
                    losses.append(sign * float(value))
            if node is start[0]:
                break
            upper = node.fork_iteration
            node = node.parent  # type: ignore[assignment]  # start's node is above: the walk ends there
        losses.reverse()
        return losses

    def __repr__(self) -> str:
        return f"{type(self).__name__}(metric={self.metric!r}, mode={self.mode!r}, quantum_s={self.quantum_s})"


class HermesPolicy(TimeSharingPolicy):
    """Convergence priority (Hermes). ``milestones``: fractions of its first
    loss a job has dropped at which its quantum grows ``quantum_growth``
    times; the paper leaves both to the user (defaults: 10 s quanta doubling
    at a 50%, 75% and 90% drop)."""

    name = "hermes"
    default_quantum_s = 10.0

    def __init__(
        self,
        metric: str | None = None,
        mode: str | None = None,
        quantum_s: float = 10.0,
        milestones: Sequence[float] = (0.5, 0.75, 0.9),
        quantum_growth: float = 2.0,
        max_jobs_per_worker: int = 4,
        cost_model: CostModel | None = None,
        batch_stages: bool | None = None,
    ) -> None:
        super().__init__(metric, mode, quantum_s, max_jobs_per_worker, cost_model, batch_stages)
        milestones = tuple(milestones)
        fraction = Real(low=0, high=1, closed="neither")
        if not all(fraction.holds(m) for m in milestones) or list(milestones) != sorted(set(milestones)):
            raise ValueError(f"milestones must be increasing fractions in (0, 1), got {milestones!r}")
        _check_positive("quantum_growth", quantum_growth)
        if quantum_growth < 1:
            raise ValueError(f"quantum_growth must be >= 1 (quanta grow at milestones), got {quantum_growth!r}")
        self.milestones, self.quantum_growth = milestones, float(quantum_growth)

    def job_priority(self, node: PlanNode, record: JobRecord) -> float:
        return math.inf if record.convergence is None else record.convergence

    def quantum_seconds(self, record: JobRecord | None) -> float | None:
        passed = record.milestones_passed if record is not None else 0
        assert self.quantum_s is not None  # default_quantum_s: this policy always pre-empts
        return self.quantum_s * self.quantum_growth**passed


class RoundRobinPolicy(TimeSharingPolicy):
    """Round robin with 30 s quanta: the job that waited longest runs."""

    name = "round_robin"
    default_quantum_s = 30.0
    needs_metric = False

    def job_priority(self, node: PlanNode, record: JobRecord) -> float:
        return -record.last_ran


def predicted_reduction(losses: Sequence[float], iterations_ahead: float) -> float:
    """The loss a job is predicted to lose over its next ``iterations_ahead``
    iterations, from ``loss(k) = c + a / k`` fitted by least squares to
    ``losses`` (the loss after iteration ``k = 1, 2, ...``): ``a * (1/n -
    1/(n + ahead))`` after ``n`` iterations, never below 0 (a curve fitted
    rising predicts no gain). Needs two losses."""
    if len(losses) < 2:
        raise ValueError(f"a loss curve needs at least two losses to fit, got {len(losses)}")
    xs = [1.0 / k for k in range(1, len(losses) + 1)]
    mean_x, mean_y = sum(xs) / len(xs), sum(losses) / len(losses)
    spread = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, losses)) / spread
    n = len(losses)
    return max(0.0, slope * (1.0 / n - 1.0 / (n + iterations_ahead)))


class SlaqPolicy(TimeSharingPolicy):
    """SLAQ: 30 s quanta, the job with the largest predicted loss reduction
    per second of worker time over its next quantum runs (see the module
    docstring); a job with fewer than two losses runs first, as its curve
    is not known yet."""

    name = "slaq"
    default_quantum_s = 30.0

    def job_priority(self, node: PlanNode, record: JobRecord) -> float:
        if len(record.losses) < 2 or record.seconds <= 0:
            return math.inf
        assert self.quantum_s is not None  # default_quantum_s: this policy always pre-empts
        seconds_per_iteration = record.seconds / len(record.losses)
        reduction = predicted_reduction(record.losses, self.quantum_s / seconds_per_iteration)
        scale = abs(record.losses[0]) or 1.0
        return reduction / scale / self.quantum_s


class FifoPolicy(TimeSharingPolicy):
    """First in, first out: no pre-emption, jobs in arrival (plan node) order."""

    name = "fifo"
    needs_metric = False

    def job_priority(self, node: PlanNode, record: JobRecord) -> float:
        return -float(node.node_id)

    def priority_of(self, node: PlanNode) -> float:
        return -float(node.node_id)


def study_policy(policy: str | ExecutionPolicy, metric: str | None, mode: str | None) -> ExecutionPolicy:
    """A fresh execution policy for one study (``Tuner(execution_policy=...)``):
    a name, or an instance, which is copied (a policy keeps per-study state).
    A time-sharing policy without its own metric and mode takes the study's;
    one whose priority reads the loss is refused without any."""
    if not isinstance(policy, (str, ExecutionPolicy)) or (isinstance(policy, str) and policy not in POLICIES):
        raise ValueError(f"execution_policy must be an ExecutionPolicy or one of {sorted(POLICIES)}, got {policy!r}")
    policy = copy.deepcopy(get_policy(policy))
    if isinstance(policy, TimeSharingPolicy):
        if metric is not None and mode is not None:
            policy.set_metric(metric, mode)
        if policy.needs_metric and (policy.metric is None or policy.mode is None):
            raise ValueError(
                f"execution_policy={policy!r} ranks trials by their loss: set TuneConfig(metric=..., mode=...) "
                f"or give the policy its own, {type(policy).__name__}(metric=..., mode=...)"
            )
    return policy


TIME_SHARING_POLICIES = {policy.name: policy for policy in (HermesPolicy, RoundRobinPolicy, SlaqPolicy, FifoPolicy)}
POLICIES.update(TIME_SHARING_POLICIES)
