import pytest
from paper_examples import FIGURE_4_HORIZON, FIGURE_4_TRIALS, figure_6_plan

from ray_stagetree import BreadthFirstPolicy, CriticalPathPolicy, MultiStep, ThroughputPolicy, get_policy
from ray_stagetree.planning import CostModel, RequestState, SearchPlan, build_stage_tree


def spans(batch):
    return [(s.node.node_id, s.start, s.stop) for s in batch.stages]


def test_critical_path_dispatches_longest_path_first_on_figure_7():
    plan, h = figure_6_plan()
    batches = CriticalPathPolicy().select(plan, 4)
    assert [spans(b) for b in batches] == [
        [(h["H3"], 30, 35), (h["H3"], 35, 40), (h["H4"], 40, 50)],
        [(h["H1"], 20, 30)],
        [(h["H1"], 10, 15)],
        [(h["H2"], 20, 25)],
    ]
    assert batches[0].segments == [(plan.nodes[h["H3"]], 30, 40), (plan.nodes[h["H4"]], 40, 50)]
    assert batches[0].source.node is plan.nodes[h["H3"]] and batches[0].source.iteration == 30
    assert all(r.state is RequestState.SCHED for r in plan.open_requests())
    assert build_stage_tree(plan).stages == [], "everything is scheduled"


def test_critical_path_batches_a_whole_root_to_leaf_path():
    plan = SearchPlan()
    for trial_id, config in FIGURE_4_TRIALS.items():
        plan.add_trial(trial_id, config, FIGURE_4_HORIZON)
    order = CriticalPathPolicy().order(build_stage_tree(plan))
    first = order[0]
    assert first.stages[0].start == 0 and not first.stages[-1].children
    assert first.iterations == 300
    # the other branches start from checkpoints this batch saves
    assert all(batch.after is not None and not batch.ready for batch in order[1:])
    points = {(n.node_id, iteration) for n, iteration in first.checkpoint_points}
    assert (first.stages[0].node.node_id, 100) in points
    assert sum(batch.iterations for batch in order) == plan.unique_iterations()


def test_idle_workers_get_only_ready_batches():
    plan = SearchPlan()
    for trial_id, config in FIGURE_4_TRIALS.items():
        plan.add_trial(trial_id, config, FIGURE_4_HORIZON)
    assert len(CriticalPathPolicy().select(plan, 8)) == 1, "one shared prefix: one ready batch"


def test_throughput_policy_prefers_the_stage_with_most_descendants():
    plan = SearchPlan()
    # a long lone trial and a short shared prefix with three branches
    plan.add_trial("long", {"lr": 0.5}, 500)
    for index, milestone in enumerate((20, 30, 40)):
        plan.add_trial(f"branch{index}", {"lr": MultiStep(0.1, [milestone], 0.1)}, 50)
    tree = build_stage_tree(plan)
    thr = ThroughputPolicy().order(tree)
    critical = CriticalPathPolicy().order(tree)
    assert spans(thr[0])[0][1:] == (0, 20) and len(thr[0].stages) == 1, "THR runs single stages"
    assert spans(critical[0]) == [(0, 0, 500)]


def test_breadth_first_policy_runs_shallow_stages_first():
    plan = SearchPlan()
    for trial_id, config in FIGURE_4_TRIALS.items():
        plan.add_trial(trial_id, config, FIGURE_4_HORIZON)
    order = BreadthFirstPolicy().order(build_stage_tree(plan))
    starts = [batch.stages[0].start for batch in order]
    assert starts == sorted(starts) and all(len(batch.stages) == 1 for batch in order)


def test_cost_model_changes_the_critical_path():
    plan = SearchPlan()
    slow = plan.add_trial("slow", {"lr": 0.1, "batch_size": 512}, 40).node
    fast = plan.add_trial("fast", {"lr": 0.1, "batch_size": 32}, 60).node
    by_iterations = CriticalPathPolicy().order(build_stage_tree(plan))
    assert by_iterations[0].stages[0].node is fast
    plan.record_timing(slow.node_id, 0, 10, 10 * 4.0)
    plan.record_timing(fast.node_id, 0, 10, 10 * 0.5)
    policy = CriticalPathPolicy(cost_model=CostModel())
    (first,) = policy.select(plan, 1)
    assert first.stages[0].node is slow
    assert first.estimated_seconds == pytest.approx(40 * 4.0, rel=0.05)


def test_select_validates_workers_and_get_policy_names():
    with pytest.raises(ValueError, match="idle_workers must be an int >= 0"):
        CriticalPathPolicy().select(SearchPlan(), -1)
    assert isinstance(get_policy("thr"), ThroughputPolicy)
    names = r"\['bfs', 'critical_path', 'fifo', 'hermes', 'round_robin', 'slaq', 'thr'\]"
    with pytest.raises(ValueError, match=f"one of {names}"):
        get_policy("fastest")
    assert CriticalPathPolicy(batch_stages=False).batch_stages is False


# Study shapes: every trial its own plan root, or all sharing iteration 0 (one
# root) and branching from its checkpoint.
STUDIES = {
    "independent": lambda x: {"x": x},
    "one-root": lambda x: {"x": MultiStep(values=(0.5, x), milestones=[1])},
}


@pytest.mark.parametrize("study", sorted(STUDIES))
@pytest.mark.parametrize("policy_name", ["critical_path", "thr"])
def test_a_dispatch_costs_what_changed_not_the_whole_study(policy_name, study, monkeypatch):
    """Studies of many trials stay linear: the stages built per trial (the
    planner's work) do not grow with the number of trials, as they did
    when every dispatch rebuilt the whole stage tree (independent trials)
    or the whole tree of their common root (one root)."""
    from ray_stagetree.planning import stage_tree
    from ray_stagetree.planning.plan import CheckpointInfo

    built = []

    class CountedStage(stage_tree.Stage):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            built.append(1)

    monkeypatch.setattr(stage_tree, "Stage", CountedStage)

    def stages_per_trial(trials):
        built.clear()
        plan, policy = SearchPlan(), get_policy(policy_name)
        plan.add_trials((f"t{i}", STUDIES[study](i / trials), 2) for i in range(trials))
        running = []
        while True:
            running += policy.select(plan, 2 - len(running))
            if not running:
                return len(built) / trials
            batch = running.pop(0)
            for node, start, stop in batch.segments:
                for iteration in range(start + 1, stop + 1):
                    plan.record_metrics(node.node_id, iteration, {"y": 0.0})
                plan.record_timing(node.node_id, start, stop, 0.01)
            for node, iteration in plan.checkpoints_needed(batch.batch_id):
                plan.record_checkpoint(node.node_id, iteration, CheckpointInfo(path=f"{node.node_id}/{iteration}"))
            plan.release_batch(batch.batch_id)

    small, large = stages_per_trial(200), stages_per_trial(1600)
    assert large < 2 * small, (small, large)  # rebuilding the whole tree (or root): 8x


@pytest.mark.parametrize("policy_name", ["critical_path", "thr", "bfs"])
def test_a_study_whose_scheduler_compares_trials_runs_them_in_admission_order(policy_name):
    # Issue 31: ASHA decides on the order trials reach its rungs. Tune runs the
    # oldest unfinished trials; ordering ready batches by path length or by plan
    # node (configs sorted by value) fed ASHA the trials in ascending-lr order.
    plan = SearchPlan()
    admitted = [("t0", 0.0067), ("t1", 0.0001), ("t2", 0.0165), ("t3", 0.0008), ("t4", 0.1), ("t5", 0.0003)]
    for trial_id, lr in admitted:
        plan.add_trial(trial_id, {"lr": lr}, 1)
    plan.extend_trial("t4", 8)  # a younger trial with a longer request: it waits for older ones
    policy = get_policy(policy_name).admission_order()
    served = [sorted(request.trials) for batch in policy.select(plan, 6) for request in batch.requests]
    assert served == [["t0"], ["t1"], ["t2"], ["t3"], ["t4"], ["t5"]]


def test_admission_order_holds_across_dispatches_as_trials_leave_and_arrive():
    plan = SearchPlan()
    for index in range(4):
        plan.add_trial(f"t{index}", {"lr": 1.0 / (index + 1)}, 1)
    policy = CriticalPathPolicy().admission_order()
    (first,) = policy.select(plan, 1)
    assert [sorted(r.trials) for r in first.requests] == [["t0"]]
    plan.remove_trial("t1")  # stopped before its first result
    plan.add_trial("t4", {"lr": 10.0}, 1)
    served = [sorted(request.trials) for batch in policy.select(plan, 3) for request in batch.requests]
    assert served == [["t2"], ["t3"], ["t4"]]


def test_timing_noise_no_longer_sorts_constant_trials_by_their_values():
    # What issue 31 measured: trials alike in cost, but iteration timings a
    # little noisy. The fitted cost model then orders them by learning rate
    # (here: smaller is slower), and ASHA saw rung arrivals sorted by a value
    # its metric depends on, continuing nearly every trial, or stopping them.
    def build():
        plan = SearchPlan()
        rates = [0.0067, 0.0001, 0.0165, 0.0008, 0.1, 0.0003]
        for index, lr in enumerate(rates):
            plan.add_trial(f"t{index}", {"lr": lr}, 2)
        plan.record_timing(plan.trials["t4"].request.node.node_id, 0, 1, 0.050)
        plan.record_timing(plan.trials["t1"].request.node.node_id, 0, 1, 0.051)
        return plan

    def order(policy):
        return [sorted(r.trials) for batch in policy.select(build(), 6) for r in batch.requests]

    assert order(CriticalPathPolicy(cost_model=CostModel(), tie_tolerance=0))[:2] == [["t1"], ["t5"]]  # sorted by lr
    assert order(CriticalPathPolicy(cost_model=CostModel()).admission_order()) == [[f"t{i}"] for i in range(6)]


def test_in_admission_order_a_batch_at_a_rung_yields_only_to_an_older_trial():
    plan = SearchPlan()
    for index in range(3):
        plan.add_trial(f"t{index}", {"lr": 0.1 * (index + 1)}, 1)
    waiting = [plan.trials["t2"].request]
    assert CriticalPathPolicy().yields(plan, {"t1"}, waiting), "by default any waiting work takes the worker"
    policy = CriticalPathPolicy().admission_order()
    assert not policy.yields(plan, {"t1"}, waiting), "t1 is older: Tune keeps it on its worker"
    assert policy.yields(plan, {"t1"}, [plan.trials["t0"].request])
    assert not CriticalPathPolicy().yields(plan, {"t1"}, [])


def test_critical_path_looks_ahead_to_the_horizon_a_request_falls_short_of():
    """A trial a scheduler requested only up to its rung may go on to the
    horizon: with the horizon known, its path counts as long as it may
    become (at its pace), so the rung's result, which decides on more work,
    comes before work no decision waits for."""
    from ray_stagetree.simulation.simulator import KnownCosts

    def first_served(horizon):
        plan = SearchPlan()
        plan.add_trial("at_rung", {"batch_size": 32}, 45)  # 2 s an iteration, a rung at 45
        plan.add_trial("to_the_end", {"batch_size": 256}, 120)  # 1 s an iteration, requested to its end
        slow = plan.trials["at_rung"].request.node
        policy = CriticalPathPolicy(cost_model=KnownCosts(lambda node, iteration: 2.0 if node is slow else 1.0))
        policy.set_horizon(horizon)
        (batch,) = policy.select(plan, 1)
        return batch.requests[0].trials

    assert first_served(None) == {"to_the_end"}, "open-ended: 120 s against 90 s"
    assert first_served(120) == {"at_rung"}, "90 s and up to 150 s more, against 120 s"


def test_critical_path_runs_the_path_serving_fewer_trials_first_among_paths_about_as_long():
    """Trials sharing a path reach a rung together, tied: heard first, a
    large group fills a promoting ASHA's top quantile on its own. Among
    paths whose estimates are about equal, the one serving fewer trials
    goes first; a clearly longer path still goes before both."""

    def served(policy):
        plan = SearchPlan()
        for index in range(3):
            plan.add_trial(f"group{index}", {"lr": 0.1}, 105)  # one path, three trials
        plan.add_trial("alone", {"lr": 0.2}, 100)
        plan.add_trial("longest", {"lr": 0.3}, 150)
        return [sorted(request.trials) for batch in policy.select(plan, 3) for request in batch.requests]

    group = ["group0", "group1", "group2"]
    assert served(CriticalPathPolicy()) == [["longest"], ["alone"], group]
    assert served(CriticalPathPolicy(tie_tolerance=0)) == [["longest"], group, ["alone"]]


def test_tie_tolerance_must_be_a_non_negative_number():
    with pytest.raises(ValueError, match="tie_tolerance.*>= 0.*-0.1"):
        CriticalPathPolicy(tie_tolerance=-0.1)
