"""A study planned without running it: ``stagetree plan``.

The trials are drawn as the study would draw them (the spec's own `Tuner`,
its grid, samples and seed); with a searcher, whose trials depend on
results, ``samples`` configurations are drawn at random from the space as
an estimate. They go into a `SearchPlan`, Algorithm 1 cuts it into a stage
tree, and a `CostModel` prices each stage: worker time with stage sharing
against trial by trial, and the lower bound on wall time with ``workers``
workers (the longest root-to-leaf path, or the unique work spread evenly).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from ray.tune.search import Searcher

from ray_stagetree._extras import require
from ray_stagetree.jobs.spec import JobSpec
from ray_stagetree.planning.cost import CostModel
from ray_stagetree.planning.plan import SearchPlan
from ray_stagetree.planning.stage_tree import Stage, StageTree, build_stage_tree, trials_served
from ray_stagetree.runtime.driver.trial_sources import trial_source
from ray_stagetree.searchers import generate_trials
from ray_stagetree.validation import short


@dataclasses.dataclass
class DryRun:
    """What a study would train; every figure in iterations and in estimated seconds."""

    trials: list[dict[str, Any]]
    horizon: int
    plan: SearchPlan
    tree: StageTree
    cost: CostModel
    sampled: bool  # trials drawn at random for a searcher, not the study's own
    shared_seconds: float
    trial_by_trial_seconds: float
    longest_path_seconds: float

    @property
    def unique_iterations(self) -> int:
        return self.plan.unique_iterations()

    @property
    def total_iterations(self) -> int:
        return self.plan.total_iterations()

    @property
    def merge_rate(self) -> float:
        return self.total_iterations / self.unique_iterations

    def makespan_bound(self, workers: int) -> float:
        """No schedule on ``workers`` workers ends sooner (seconds)."""
        return max(self.longest_path_seconds, self.shared_seconds / workers)


def dry_run(spec: JobSpec, cost: CostModel, horizon: int | None = None, samples: int | None = None) -> DryRun:
    """Plan ``spec``'s study. ``horizon`` is needed when the spec sets none
    (no ``stop.training_iteration``, no scheduler ``max_t``); ``samples``
    replaces ``num_samples`` for a searcher's estimate.

    Raises ValueError naming what is missing."""
    tuner = spec.dry_tuner()
    horizon = horizon or tuner.horizon
    if horizon is None:
        raise ValueError(
            "the spec sets no horizon (run_config.stop.training_iteration, or a scheduler's max_t): pass --horizon N"
        )
    search_alg = tuner.tune_config.search_alg
    sampled = isinstance(search_alg, Searcher)
    if sampled or tuner.tune_config.num_samples == -1:
        count = samples or tuner.tune_config.num_samples
        if count < 1:
            raise ValueError("num_samples is -1 (trials without end): pass --samples N to plan N trials")
        trials = generate_trials(spec.param_space, count)
    else:
        source = trial_source(tuner)  # the study's own trials, drawn and checked as fit() draws them
        trials = [config for _, config in iter(source.next_trial, None)]
    plan = SearchPlan()
    plan.add_trials((f"trial_{index}", config, horizon) for index, config in enumerate(trials))
    tree = build_stage_tree(plan)
    alone = SearchPlan()
    for index, config in enumerate(trials):  # a share key per trial keeps each in its own tree
        alone.add_trial(f"trial_{index}", config, horizon, share_key=f"trial_{index}")
    return DryRun(
        trials=trials,
        horizon=horizon,
        plan=plan,
        tree=tree,
        cost=cost,
        sampled=sampled,
        shared_seconds=_seconds(tree.stages, cost),
        trial_by_trial_seconds=_seconds(build_stage_tree(alone).stages, cost),
        longest_path_seconds=max((_path_seconds(stage, cost) for stage in tree.roots), default=0.0),
    )


def _seconds(stages: list[Stage], cost: CostModel) -> float:
    return sum(cost.stage_seconds(stage.node, stage.start, stage.stop) for stage in stages)


def _path_seconds(stage: Stage, cost: CostModel) -> float:
    below = max((_path_seconds(child, cost) for child in stage.children), default=0.0)
    return cost.stage_seconds(stage.node, stage.start, stage.stop) + below


# -- drawings -------------------------------------------------------------------------


def stage_label(stage: Stage, trials: int) -> str:
    """What a stage trains: its iterations, the values of its hyper-parameters
    there (``a->b`` where they change inside it) and ``trials``, how many trials it serves."""
    values = []
    for name, sequence in zip(stage.node.config.names, stage.node.config.sequences):
        first, last = sequence.value(stage.start), sequence.value(stage.stop - 1)
        values.append(f"{name}={short(first)}" + (f"->{short(last)}" if last != first else ""))
    return f"[{stage.start}, {stage.stop}) {' '.join(values)}  ({trials} trial{'s' if trials != 1 else ''})"


def draw_text(tree: StageTree, max_lines: int = 200) -> str:
    """The stage tree as indented text, one stage a line (shared prefixes at
    the top, forks below them), cut after ``max_lines`` lines."""
    lines: list[str] = []
    served = trials_served(tree)

    def walk(stage: Stage, prefix: str, last: bool, root: bool) -> None:
        lines.append(("" if root else prefix + ("└── " if last else "├── ")) + stage_label(stage, served[stage]))
        below = prefix if root else prefix + ("    " if last else "│   ")
        for index, child in enumerate(stage.children):
            walk(child, below, index == len(stage.children) - 1, False)

    for root in tree.roots:
        walk(root, "", True, True)
    if len(lines) > max_lines:
        lines = lines[:max_lines] + [f"... {len(lines) - max_lines} more stages (--max-lines shows more)"]
    return "\n".join(lines)


def draw_picture(tree: StageTree, path: str, horizon: int) -> None:
    """The stage tree as a picture (SVG, PNG or PDF, by ``path``'s extension):
    one bar per stage over its iterations, labelled with its id, its
    hyper-parameters and its trials (`picture_label`), one row per path
    from the root to a leaf, a line where a stage forks from its parent."""
    matplotlib = require("matplotlib", "stagetree plan --draw", "monitor")
    matplotlib.use("Agg")  # a file, never a window
    import matplotlib.pyplot as plt

    rows: dict[Stage, float] = {}
    served = trials_served(tree)
    next_row = [0]

    def place(stage: Stage) -> float:
        if not stage.children:
            rows[stage] = next_row[0]
            next_row[0] += 1
        else:
            rows[stage] = min(place(child) for child in stage.children)
        return rows[stage]

    for root in tree.roots:
        place(root)
    height = max(next_row[0], 1)
    with matplotlib.rc_context({"svg.fonttype": "none"}):  # an SVG's labels stay text: searchable, selectable
        figure, axes = plt.subplots(figsize=(12, min(2 + 0.32 * height, 60)))
        for stage, row in rows.items():
            (bar,) = axes.barh(
                row,
                stage.iterations,
                left=stage.start,
                height=0.7,
                edgecolor="white",
                linewidth=0.8,
                color="#9cc9ef" if stage.children else "#a8dcb9",
            ).patches
            if stage.parent is not None:
                axes.plot([stage.start, stage.start], [rows[stage.parent], row], color="grey", linewidth=0.8)
            label = axes.text(
                stage.start + horizon * 0.004,
                row,
                picture_label(stage, served[stage]),
                va="center",
                fontsize=7,
                family="monospace",
                clip_on=True,
            )
            label.set_clip_path(bar)  # a label never runs past its bar
        axes.set_xlim(0, horizon)
        axes.set_ylim(height - 0.5, -0.5)
        axes.set_yticks([])
        axes.set_xlabel("iteration")
        axes.set_title(
            f"stage tree: {len(tree.stages)} stages, {tree.iterations} iterations "
            "(H<node>:<start>-<stop>, its hyper-parameters, \u00d7trials through it; blue: forks below it, green: a leaf)",
            fontsize=9,
        )
        figure.tight_layout()
        figure.savefig(path)
    plt.close(figure)


def picture_label(stage: Stage, trials: int) -> str:
    """A stage's label in `draw_picture`: its id as the monitor shows it
    (``H<node>:<start>-<stop>``), its hyper-parameters and ``×`` ``trials``, the trials it serves."""
    values = []
    for name, sequence in zip(stage.node.config.names, stage.node.config.sequences):
        first, last = sequence.value(stage.start), sequence.value(stage.stop - 1)
        values.append(f"{name}={short(first)}" + (f"->{short(last)}" if last != first else ""))
    return f"H{stage.node.node_id}:{stage.start}-{stage.stop} {' '.join(values)} \u00d7{trials}"
