"""Time-sharing policies against hand-computed examples of the Hermes
paper's definitions (section 3.3): midrange loss, convergence per
iteration, quanta growing at milestones, and the pre-emption decision."""

import math

import pytest

from ray_stagetree import MultiStep
from ray_stagetree.planning import SearchPlan
from ray_stagetree.planning.plan import CheckpointInfo
from ray_stagetree.planning.policies import get_policy
from ray_stagetree.planning.time_sharing import (
    FifoPolicy,
    HermesPolicy,
    JobRecord,
    RoundRobinPolicy,
    SlaqPolicy,
    convergence,
    midrange,
    predicted_reduction,
)


def test_midrange_and_convergence_follow_the_paper():
    first = [2.0, 1.6, 1.8, 1.2]
    assert midrange(first) == pytest.approx(1.6)  # (max + min) / 2, not the mean (1.65)
    assert convergence(first, None) == pytest.approx((2.0 - 1.2) / 4)  # C_j(0) = (max - min) / |L|
    second = [1.1, 0.9, 1.0]
    assert convergence(second, midrange(first)) == pytest.approx((1.6 - 1.0) / 3)  # (loss(i-1) - loss(i)) / |L|
    assert convergence([1.0, 1.2], 1.0) == pytest.approx(-0.05)  # a loss that went up: negative
    with pytest.raises(ValueError, match="at least one loss"):
        midrange([])


def test_quanta_grow_at_each_milestone_passed():
    policy = HermesPolicy(metric="loss", mode="min", quantum_s=10, milestones=(0.5, 0.75), quantum_growth=2)
    record = JobRecord()
    assert policy.quantum_seconds(None) == 10
    record.observe([2.0, 1.2], ended=1.0, milestones=policy.milestones)  # midrange 1.6: 20% below the first loss
    assert (record.first_loss, record.milestones_passed, policy.quantum_seconds(record)) == (2.0, 0, 10)
    record.observe([1.1, 0.9], ended=2.0, milestones=policy.milestones)  # midrange 1.0: 50% below
    assert (record.milestones_passed, policy.quantum_seconds(record)) == (1, 20)
    record.observe([0.5, 0.3], ended=3.0, milestones=policy.milestones)  # midrange 0.4: 80% below
    assert (record.milestones_passed, policy.quantum_seconds(record), record.quanta) == (2, 40, 3)
    assert record.convergence == pytest.approx((1.0 - 0.4) / 2)


class Cluster:
    """One worker driven by hand: dispatch, losses reported, quantum ends."""

    def __init__(self, policy, jobs=3, horizon=20):
        self.policy, self.plan = policy, SearchPlan()
        self.plan.add_trials([(f"job{i}", {"lr": 0.1 * (i + 1)}, horizon) for i in range(jobs)])
        self.policy.bind(1)
        self.now = 0.0
        self.nodes = {self.plan.trials[f"job{i}"].request.node.node_id: f"job{i}" for i in range(jobs)}

    def dispatch(self):
        (batch,) = self.policy.select(self.plan, 1)
        self.policy.started(batch, self.now)
        return batch

    def train(self, batch, losses, seconds=10.0):
        """Report ``losses`` over ``seconds``; True if the batch yielded at the end."""
        node = batch.stages[0].node
        start = max([batch.stages[0].start, *[s for s in node.metrics]])
        for k, loss in enumerate(losses, start + 1):
            self.plan.record_metrics(node.node_id, k, {self.policy.metric or "loss": loss})
        self.now += seconds
        iteration = start + len(losses)
        yielded = self.policy.at_boundary(self.plan, batch.batch_id, node, iteration, self.now)
        if yielded:
            self.plan.record_checkpoint(
                node.node_id, iteration, CheckpointInfo(path=f"ckpt/{node.node_id}/{iteration}")
            )
            self.plan.release_batch(batch.batch_id)
        return yielded

    def job(self, batch):
        return self.nodes[batch.stages[0].node.node_id]


def test_hermes_runs_the_fastest_converging_job_and_preempts_only_for_a_better_one():
    cluster = Cluster(HermesPolicy(metric="loss", mode="min", quantum_s=10, milestones=(0.5, 0.75)))
    # Unmeasured jobs first, in arrival order: each runs one quantum and yields to the next.
    measured = {"job0": [1.0, 0.9, 0.8, 0.7], "job1": [1.0, 0.5, 0.4, 0.2], "job2": [1.0, 0.99, 0.98, 0.97]}
    for name, losses in measured.items():
        batch = cluster.dispatch()
        assert cluster.job(batch) == name
        assert cluster.train(batch, losses)
    records = {cluster.nodes[i]: r for i, r in cluster.policy.records.items()}
    assert records["job0"].convergence == pytest.approx(0.3 / 4)
    assert records["job1"].convergence == pytest.approx(0.8 / 4)
    assert records["job2"].convergence == pytest.approx(0.03 / 4)
    # The largest C runs next.
    batch = cluster.dispatch()
    assert cluster.job(batch) == "job1"
    # Its midrange goes from 0.6 to 0.185: C = 0.415 / 4 = 0.104 > job0's 0.075, so it keeps the worker ...
    assert not cluster.train(batch, [0.2, 0.19, 0.18, 0.17])
    assert records["job1"].convergence == pytest.approx((0.6 - 0.185) / 4)
    # ... with a longer quantum: 81.5% below its first loss passes both milestones (10 s x 2 x 2).
    assert cluster.policy.quantum_deadline(batch.batch_id) == pytest.approx(cluster.now + 40)
    assert not cluster.train(batch, [0.16, 0.16, 0.15, 0.15], seconds=39.0)  # the quantum is not over
    # Over: 8 losses since the quantum began, midrange 0.155, C = (0.185 - 0.155) / 8 < 0.075: job0 runs.
    assert cluster.train(batch, [0.15, 0.15, 0.15, 0.15], seconds=1.0)
    assert records["job1"].convergence == pytest.approx((0.185 - 0.155) / 8)
    assert cluster.job(cluster.dispatch()) == "job0"


def test_a_first_quantum_goes_on_until_the_job_has_two_losses():
    # Iterations longer than the quantum: one loss when it ends, whose (max - min) would say the job does not learn.
    cluster = Cluster(HermesPolicy(metric="loss", mode="min", quantum_s=1))
    batch = cluster.dispatch()
    assert not cluster.train(batch, [1.0], seconds=5.0)
    assert cluster.policy.records == {}  # the quantum is still open
    assert cluster.train(batch, [0.6], seconds=5.0)  # two losses: closed, and unmeasured jobs run first
    (record,) = cluster.policy.records.values()
    assert record.convergence == pytest.approx(0.4 / 2)
    # Round robin reads no loss: its quanta end on time.
    cluster = Cluster(RoundRobinPolicy(quantum_s=1))
    assert cluster.train(cluster.dispatch(), [1.0], seconds=5.0)


def test_round_robin_runs_the_job_that_waited_longest():
    cluster = Cluster(RoundRobinPolicy(quantum_s=30))
    order = []
    for _ in range(5):
        batch = cluster.dispatch()
        order.append(cluster.job(batch))
        assert cluster.train(batch, [1.0], seconds=30.0)  # someone always waits: every quantum ends in a yield
    assert order == ["job0", "job1", "job2", "job0", "job1"]


def test_slaq_runs_the_job_with_the_largest_predicted_loss_reduction():
    cluster = Cluster(SlaqPolicy(metric="loss", mode="min", quantum_s=30))
    # job0: high loss, flat curve; job1: low loss, steep; job2: rising (predicted gain 0).
    # Old rule (highest loss relative to the first) would run job0; SLAQ predicts job1 gains most.
    for losses in ([1.0, 0.95], [0.4, 0.2], [0.5, 0.9]):
        assert cluster.train(cluster.dispatch(), losses, seconds=30.0)
    records = {cluster.nodes[i]: r for i, r in cluster.policy.records.items()}
    # 2 iterations per 30 s quantum: the next quantum is 2 more iterations; loss(k) = c + a / k.
    assert cluster.policy.job_priority(None, records["job1"]) == pytest.approx(0.4 * (1 / 2 - 1 / 4) / 0.4 / 30)
    assert cluster.policy.job_priority(None, records["job0"]) == pytest.approx(0.1 * (1 / 2 - 1 / 4) / 1.0 / 30)
    assert cluster.policy.job_priority(None, records["job2"]) == 0.0
    assert cluster.job(cluster.dispatch()) == "job1"


def test_slaq_prediction_is_exact_on_its_own_curve_family():
    losses = [0.3 + 2.0 / k for k in range(1, 21)]
    assert predicted_reduction(losses, 10) == pytest.approx(2.0 * (1 / 20 - 1 / 30))
    with pytest.raises(ValueError, match="at least two losses"):
        predicted_reduction([1.0], 5)


def test_fifo_never_preempts_and_keeps_arrival_order():
    cluster = Cluster(FifoPolicy())
    batch = cluster.dispatch()
    assert cluster.job(batch) == "job0"
    assert cluster.policy.quantum_deadline(batch.batch_id) is None
    assert not cluster.train(batch, [1.0] * 5, seconds=1e6)


def test_at_most_max_jobs_per_worker_jobs_time_share():
    cluster = Cluster(RoundRobinPolicy(quantum_s=1, max_jobs_per_worker=2), horizon=4)
    seen = []
    for _ in range(4):
        batch = cluster.dispatch()
        seen.append(cluster.job(batch))
        cluster.train(batch, [1.0], seconds=1.0)
    assert seen == ["job0", "job1", "job0", "job1"]  # job2 waits for a slot
    batch = cluster.dispatch()
    assert cluster.job(batch) == "job0"
    cluster.train(batch, [1.0, 1.0], seconds=0.5)  # job0 reaches its horizon: its slot frees
    cluster.policy.ended(cluster.plan, batch.batch_id, cluster.now)
    cluster.plan.release_batch(batch.batch_id)
    assert cluster.job(cluster.dispatch()) == "job2"


def test_a_fork_inherits_the_convergence_of_its_prefix():
    plan = SearchPlan()
    plan.add_trials([(f"t{g}", {"lr": MultiStep(0.1, [3], g)}, 6) for g in (0.1, 0.5)])
    policy = HermesPolicy(metric="loss", mode="min", quantum_s=1)
    policy.bind(1)
    (batch,) = policy.select(plan, 1)
    root = batch.stages[0].node
    policy.started(batch, 0.0)
    for iteration, loss in zip((1, 2, 3), (1.0, 0.8, 0.7)):
        plan.record_metrics(root.node_id, iteration, {"loss": loss})
    policy.ended(plan, batch.batch_id, 1.0, (root, 3))
    (child,) = root.children.values()
    assert policy.record_of(child) is policy.records[root.node_id]
    assert policy.priority_of(child) == pytest.approx(0.3 / 3)


@pytest.mark.parametrize(
    "make, message",
    [
        (lambda: HermesPolicy(quantum_s=0), r"quantum_s must be a finite number > 0, got 0"),
        (lambda: HermesPolicy(quantum_s=math.inf), r"quantum_s must be a finite number > 0, got inf"),
        (lambda: HermesPolicy(milestones=(0.5, 1.5)), r"milestones must be increasing fractions in \(0, 1\)"),
        (lambda: HermesPolicy(quantum_growth=0.5), r"quantum_growth must be >= 1"),
        (lambda: RoundRobinPolicy(max_jobs_per_worker=0), r"max_jobs_per_worker must be an int >= 1, got 0"),
        (lambda: SlaqPolicy(mode="up"), r"mode must be 'min', 'max' or None, got 'up'"),
    ],
)
def test_bad_parameters_are_refused_by_name(make, message):
    with pytest.raises(ValueError, match=message):
        make()


def test_policies_by_name():
    assert isinstance(get_policy("hermes"), HermesPolicy)
    assert get_policy("round_robin").quantum_s == 30.0
    assert get_policy("slaq").quantum_s == 30.0
    assert get_policy("fifo").quantum_s is None


def test_numpy_metrics_count_and_missing_or_non_finite_ones_do_not():
    import numpy as np

    cluster = Cluster(HermesPolicy(metric="loss", mode="min", quantum_s=10))
    batch = cluster.dispatch()
    node = batch.stages[0].node
    for iteration, loss in enumerate([np.float32(2.0), None, float("nan"), np.float64(1.0)], 1):
        cluster.plan.record_metrics(node.node_id, iteration, {} if loss is None else {"loss": loss})
    cluster.policy.ended(cluster.plan, batch.batch_id, 10.0, (node, 4))
    assert cluster.policy.records[node.node_id].convergence == pytest.approx((2.0 - 1.0) / 2)
