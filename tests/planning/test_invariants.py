"""Property tests of DESIGN.md's invariants on random trial sets."""

import itertools
import json
import random
import uuid

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ray_stagetree import MultiStep, merge_rate
from ray_stagetree.planning import CheckpointInfo, SearchPlan, TrialConfig, build_stage_tree
from ray_stagetree.planning.policies import POLICIES

MAX_HORIZON = 60


@st.composite
def step_sequences(draw, values):
    milestones = sorted(draw(st.sets(st.integers(1, MAX_HORIZON - 1), max_size=3)))
    return MultiStep(
        values=draw(st.lists(st.sampled_from(values), min_size=len(milestones) + 1, max_size=len(milestones) + 1)),
        milestones=milestones,
    )


@st.composite
def trials(draw, min_size=1, max_size=12):
    count = draw(st.integers(min_size, max_size))
    out = []
    for _ in range(count):
        config = {
            "lr": draw(step_sequences((0.1, 0.01, 0.001))),
            "optimizer": draw(step_sequences(("sgd", "adam"))),
            "batch_size": draw(st.sampled_from([64, 128, MultiStep(values=(64, 128), milestones=[30])])),
        }
        out.append((config, draw(st.integers(1, MAX_HORIZON))))
    return out


def build(trial_list):
    plan = SearchPlan()
    for index, (config, horizon) in enumerate(trial_list):
        plan.add_trial(f"t{index}", config, horizon)
    return plan


def shared_in_plan(plan, a, b):
    """Iterations the plan trains once for both trials."""
    path_a, path_b = plan.path(a), plan.path(b)
    if path_a[0] is not path_b[0]:
        return 0
    common = [x for x, y in zip(path_a, path_b) if x is y]
    last = len(common) - 1

    def exit_step(path, trial):
        if len(path) > last + 1:
            return path[last + 1].fork_iteration
        return plan.trials[trial].request.iteration

    return min(exit_step(path_a, a), exit_step(path_b, b))


@settings(max_examples=60, deadline=None)
@given(trials(min_size=2))
def test_invariant_1_trials_share_exactly_their_identical_prefix(trial_list):
    plan = build(trial_list)
    for (i, (ca, ha)), (j, (cb, hb)) in itertools.combinations(enumerate(trial_list), 2):
        horizon = min(ha, hb)
        difference = TrialConfig.from_config(ca).first_difference(TrialConfig.from_config(cb), horizon)
        expected = horizon if difference is None else difference
        assert shared_in_plan(plan, f"t{i}", f"t{j}") == expected


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trials(), st.randoms(use_true_random=False))
def test_invariant_2_each_request_served_by_one_chain_from_an_existing_checkpoint(trial_list, rnd):
    plan = build(trial_list)
    for node in plan.nodes:
        for iteration in range(node.fork_iteration + 1, MAX_HORIZON + 1):
            if rnd.random() < 0.05:
                plan.record_checkpoint(node.node_id, iteration, CheckpointInfo(path=f"{node.node_id}/{iteration}"))
    tree = build_stage_tree(plan)
    serving = {}
    for stage in tree.stages:
        for request in stage.requests:
            assert id(request) not in serving, "a request served twice"
            serving[id(request)] = stage
            assert (stage.node, stage.stop) == (request.node, request.iteration)
    open_requests = [r for r in plan.open_requests() if r.trials]
    assert set(serving) == {id(r) for r in open_requests}
    for request in open_requests:
        stage = serving[id(request)]
        trial = next(iter(request.trials))
        path = plan.path(trial)
        while stage.parent is not None:
            assert stage.parent.stop == stage.start
            assert stage.node in path
            stage = stage.parent
        source = stage.source
        if source.is_initialization:
            assert stage.start == 0 and stage.node.parent is None
        else:
            assert source.iteration in source.node.checkpoints and source.node in path
    # no iteration of a node is trained twice
    for node in plan.nodes:
        spans = sorted((s.start, s.stop) for s in tree.stages if s.node is node)
        assert all(a[1] <= b[0] for a, b in zip(spans, spans[1:]))


@settings(max_examples=60, deadline=None)
@given(trials())
def test_invariant_3_stage_tree_iterations_equal_unique_iterations(trial_list):
    plan = build(trial_list)
    tree = build_stage_tree(plan)
    assert tree.iterations == plan.unique_iterations()
    assert plan.total_iterations() == sum(h for _, h in trial_list)
    assert plan.unique_iterations() <= plan.total_iterations()


@settings(max_examples=30, deadline=None)
@given(trials(max_size=1), st.integers(1, 20))
def test_merge_rate_of_n_identical_trials_is_n(trial_list, copies):
    ((config, horizon),) = trial_list
    assert merge_rate([config] * copies, horizon) == copies


def execute(plan, batch):
    """What a worker does: report every iteration, save where the plan asks."""
    for stage in batch.stages:
        for iteration in range(stage.start + 1, stage.stop + 1):
            plan.record_metrics(stage.node.node_id, iteration, {"step": iteration})
    for node, iteration in plan.checkpoints_needed(batch.batch_id):
        plan.record_checkpoint(node.node_id, iteration, CheckpointInfo(path=f"{node.node_id}/{iteration}"))
    plan.release_batch(batch.batch_id)
    return batch.iterations


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    trials(),
    trials(min_size=0, max_size=4),
    st.sampled_from(sorted(POLICIES)),
    st.integers(1, 4),
    st.randoms(use_true_random=False),
)
def test_invariant_3_executing_batches_runs_each_unique_iteration_once(early, late, policy_name, workers, rnd):
    """Workers finish batches in random order while new trials arrive. Every
    request is answered; trials known up front cost exactly their unique
    iterations. A late trial can cost at most its own horizon more: it may
    fork from a point whose batch finished without a checkpoint there."""
    policy = POLICIES[policy_name]()
    plan = build(early)
    arrivals = list(enumerate(late))
    running, executed = [], 0
    while True:
        running += policy.select(plan, workers - len(running))
        if arrivals and rnd.random() < 0.5:
            index, (config, horizon) = arrivals.pop()
            plan.add_trial(f"late{index}", config, horizon)
            continue
        if not running:
            if arrivals:
                continue
            break
        executed += execute(plan, running.pop(rnd.randrange(len(running))))
    assert all(record.request.answered for record in plan.trials.values())
    assert plan.unique_iterations() <= executed <= plan.unique_iterations() + sum(h for _, h in late)
    if not late:
        assert executed == plan.unique_iterations()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(trials(), st.randoms(use_true_random=False))
def test_parquet_round_trip_keeps_the_whole_plan(trial_list, rnd):
    plan = build(trial_list)
    for node in plan.nodes:
        iteration = rnd.randint(node.fork_iteration + 1, node.fork_iteration + 5)
        plan.record_checkpoint(
            node.node_id,
            iteration,
            CheckpointInfo(path=f"checkpoints/p{iteration}", size_bytes=iteration, checksum="c"),
        )
        plan.record_metrics(node.node_id, iteration, {"acc": rnd.random(), "nested": {"x": [1, 2]}})
        plan.record_timing(node.node_id, node.fork_iteration, iteration, rnd.random())
    url = f"memory://plans/{uuid.uuid4().hex}"
    plan.save(url)
    loaded = SearchPlan.load(url)
    assert snapshot(loaded) == snapshot(plan)
    # the loaded plan keeps merging new trials into the same nodes
    config, horizon = trial_list[0]
    assert loaded.add_trial("again", config, horizon).node.node_id == plan.trials["t0"].request.node.node_id


def snapshot(plan):
    nodes = [
        (
            n.node_id,
            None if n.parent is None else n.parent.node_id,
            n.fork_iteration,
            json.dumps(n.config.to_json(), sort_keys=True),
            n.config.static_key,
            sorted(n.checkpoints.items()),
            json.dumps(n.metrics, sort_keys=True),
            sorted((s, sorted(r.trials)) for s, r in n.requests.items()),
        )
        for n in plan.nodes
    ]
    trials = sorted((t, r.request.node.node_id, r.request.iteration, r.share_key) for t, r in plan.trials.items())
    return nodes, trials, plan.timings


def test_random_spaces_merge_and_split_consistently():
    """A fixed larger sample: the planner never merges what differs."""
    rnd = random.Random(7)
    trial_list = []
    for _ in range(200):
        milestones = sorted(rnd.sample(range(5, 55), 2))
        trial_list.append(({"lr": MultiStep(values=(0.1, rnd.choice((0.01, 0.02)), 0.001), milestones=milestones)}, 60))
    plan = build(trial_list)
    assert build_stage_tree(plan).iterations == plan.unique_iterations() < plan.total_iterations()


def fresh_top_priorities(policy, plan, count):
    """The priorities of the ``count`` first ready batches of a stage tree
    built from scratch, keyed by their first stage."""
    tree = build_stage_tree(plan)
    _, priority = policy._costs_and_priorities(tree)
    ready = {(s.node.node_id, s.start, s.stop): priority[s] for s in tree.roots if s.ready}
    return ready, sorted(ready.values(), reverse=True)[:count]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    trials(),
    trials(min_size=0, max_size=4),
    st.sampled_from(sorted(POLICIES)),
    st.integers(1, 4),
    st.randoms(use_true_random=False),
)
def test_select_dispatches_what_a_fresh_stage_tree_would(early, late, policy_name, workers, rnd):
    """Policies that keep their stage tree between calls (rebuilding only the
    roots the plan changed) choose batches of the same priorities as a tree
    built from scratch at each dispatch, while batches end in random order,
    trials arrive, timings refit the cost model and checkpoints are lost."""
    policy = POLICIES[policy_name]()
    plan = build(early)
    arrivals = list(enumerate(late))
    running, writes = [], []
    while True:
        policy.cost_model.fit(plan)
        ready, expected = fresh_top_priorities(policy, plan, workers - len(running))
        chosen = policy.select(plan, workers - len(running))
        got = sorted(
            (ready[(b.stages[0].node.node_id, b.stages[0].start, b.stages[0].stop)] for b in chosen), reverse=True
        )
        assert got == expected
        running += chosen
        if arrivals and rnd.random() < 0.5:
            index, (config, horizon) = arrivals.pop()
            plan.add_trial(f"late{index}", config, horizon)
            continue
        if not running:
            if arrivals or writes:
                arrivals or plan.record_checkpoint(writes[-1][0].node_id, writes.pop()[1], CheckpointInfo(path="late"))
                continue
            break
        batch = running.pop(rnd.randrange(len(running)))
        for node, start, stop in batch.segments:
            plan.record_timing(node.node_id, start, stop, (stop - start) * (1 + node.node_id % 3))
            for iteration in range(start + 1, stop + 1):
                plan.record_metrics(node.node_id, iteration, {"step": iteration})
        writes += plan.checkpoints_needed(batch.batch_id)
        plan.release_batch(batch.batch_id)
        while writes and rnd.random() < 0.7:  # written behind: stored after their batch ended
            node, iteration = writes.pop(rnd.randrange(len(writes)))
            plan.record_checkpoint(node.node_id, iteration, CheckpointInfo(path=f"{node.node_id}/{iteration}"))
        saved = [(node.node_id, iteration) for node in plan.nodes for iteration in node.checkpoints]
        if saved and rnd.random() < 0.2:
            plan.drop_checkpoint(*rnd.choice(saved))
    assert all(record.request.answered for record in plan.trials.values())
