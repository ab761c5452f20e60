"""The worked examples of the Hippo paper, as trial configs.

Figure 3/4 (the thesis' Figure 1.1/3.1): four learning-rate trials over 300
iterations, values from {0.1, 0.05, 0.02, 0.01}. Figure 5: trial 5 keeps 0.1 for
150 iterations, which splits stage A2. Figure 6/7: a search plan with checkpoints
and metrics already recorded, turned into a stage tree.
"""

from ray_stagetree import Constant, Cosine, Exponential, Linear, MultiStep
from ray_stagetree.planning import SearchPlan
from ray_stagetree.planning.plan import CheckpointInfo

FIGURE_4_TRIALS = {
    "trial_1": {"lr": MultiStep(values=(0.1, 0.01), milestones=[200])},
    "trial_2": {"lr": MultiStep(values=(0.1, 0.05, 0.02), milestones=[100, 200])},
    "trial_3": {"lr": MultiStep(values=(0.1, 0.05, 0.01), milestones=[100, 200])},
    "trial_4": {"lr": MultiStep(values=(0.1, 0.05), milestones=[100])},
}
FIGURE_5_TRIAL = {"lr": MultiStep(values=(0.1, 0.02), milestones=[150])}
FIGURE_4_HORIZON = 300

_H1_LR = Exponential(0.1, 0.9)
FIGURE_6_CONFIGS = {
    "H1": {"lr": _H1_LR, "batch_size": 128},
    "H2": {"lr": _H1_LR.then(Linear(1.0, 0.5, 25), at=10), "batch_size": 128},
    "H3": {"lr": _H1_LR.then(Cosine(0.1, 0.0, 30), at=20), "batch_size": 128},
    "H4": {
        "lr": _H1_LR.then(Cosine(0.1, 0.0, 30), at=20).then(Constant(1e-6), at=40),
        "batch_size": MultiStep(values=(128, 64), milestones=[40]),
    },
}
# (plan node, iteration) of each request in Figure 6, in the order the nodes appear.
FIGURE_6_REQUESTS = [("H1", 15), ("H1", 30), ("H2", 25), ("H3", 35), ("H3", 40), ("H4", 50)]
FIGURE_6_CHECKPOINTS = {"H1": [10, 20], "H2": [20], "H3": [30]}
FIGURE_6_METRICS = {"H1": {10: 0.6, 20: 0.7}, "H2": {20: 0.75}, "H3": {25: 0.75, 30: 0.8}}


def figure_6_plan() -> tuple[SearchPlan, dict[str, int]]:
    """The plan of Figure 6 and the node id of each of H1..H4."""
    plan = SearchPlan()
    node_ids: dict[str, int] = {}
    for name, iteration in FIGURE_6_REQUESTS:
        request = plan.add_trial(f"{name}@{iteration}", FIGURE_6_CONFIGS[name], iteration)
        node_ids.setdefault(name, request.node.node_id)
    for name, iterations in FIGURE_6_CHECKPOINTS.items():
        for iteration in iterations:
            plan.record_checkpoint(
                node_ids[name], iteration, CheckpointInfo(path=f"/ckpt_path/{name}/{iteration}_steps")
            )
    for name, metrics in FIGURE_6_METRICS.items():
        for iteration, accuracy in metrics.items():
            plan.record_metrics(node_ids[name], iteration, {"test_acc": accuracy})
    return plan, node_ids
