"""A finished study's makespan against what its own plan allowed.

`replay` takes the search plan a runtime study saved (the work its trials
finally asked for, the timings of the iterations it trained, and the runs of
its batches, `SearchPlan.runs`) and schedules that work again on the
simulator, on as many workers, under the study's execution policy: every
iteration costs what the study's cost model fits to its own timings, and
every batch the start-up its runs show beyond their iterations (dispatch,
set-up, checkpoint fetch and restore, saves and reports), and each worker's
first batch the warm-up its first runs show. So:

* ``measured / predicted`` is how far the runtime fell short of the schedule
  its own costs allow: near 1, the time went where the plan says; well above,
  to something the plan does not see (waiting workers, a slow controller);
* ``trial_based / shared``, both without any per-batch cost, is the wall-time
  saving the tree's shape allows on these workers at these per-iteration
  costs: where few stages can run at the start (a long shared prefix), it is
  below the merge rate whatever the runtime does.

The work is replayed as known from the start, as a grid's is; a trial
scheduler's study (ASHA) is replayed as the work it finally chose.

Examples
--------
>>> grid = tuner.fit()                                         # doctest: +SKIP
>>> plan = SearchPlan.load(f"{grid.experiment_path}/plan")     # doctest: +SKIP
>>> replay(plan, workers=4).accuracy                           # doctest: +SKIP
1.04
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass

from ray_stagetree.planning.cost import CostModel, stage_features
from ray_stagetree.planning.plan import PlanNode, SearchPlan
from ray_stagetree.simulation.simulator import Simulation


@dataclass(frozen=True)
class Replay:
    """A study's measured makespan beside its replays (seconds)."""

    measured: float
    """From the first batch's dispatch to the last batch's end."""
    predicted: float
    """The same work on as many simulated workers, with the measured costs."""
    batch_start_seconds: float
    """Each batch's measured start-up beyond its iterations (the mean over those started from scratch on a
    worker that ran one before)."""
    checkpoint_load_seconds: float
    """What a batch started from a checkpoint took beyond that (the mean over them, on such workers)."""
    worker_start_seconds: float
    """What a worker's first batch took beyond that: its process warming up (a CUDA context, the first model)."""
    shared: float
    """The shared work's makespan without any per-batch cost."""
    trial_based: float
    """Every trial trained on its own (no sharing), without any per-batch cost."""

    @property
    def accuracy(self) -> float:
        """Measured over predicted makespan."""
        return self.measured / self.predicted if self.predicted else 1.0

    @property
    def tree_limit(self) -> float:
        """The wall-time saving the tree's shape allows: trial-based over shared makespan."""
        return self.trial_based / self.shared if self.shared else 1.0


def replay(plan: SearchPlan, workers: int, policy: str = "critical_path") -> Replay:
    """Replay the study ``plan`` records on ``workers`` simulated workers
    under execution policy ``policy`` (the Tuner's ``execution_policy``)."""
    if not plan.runs:
        raise ValueError("the plan records no batch runs: replay needs a study the runtime ran")
    costs = CostModel().fit(plan)

    @functools.cache  # the simulator asks for each iteration at every dispatch that passes it
    def iteration_seconds(node: PlanNode, iteration: int) -> float:
        return costs.predict(stage_features(node, iteration, iteration + 1))

    def seconds(node: PlanNode, start: int, stop: int) -> float:
        # Iteration by iteration: a stage's values may change inside it.
        return sum(iteration_seconds(node, iteration) for iteration in range(start, stop))

    # Each run's time beyond its iterations' costs, apart for a worker's first run (its process warming up).
    excess: dict[tuple[bool, bool], list[float]] = {}  # (a worker's first, from a checkpoint) -> seconds
    warm: set[int] = set()
    for run in sorted(plan.runs, key=lambda run: run.began):
        if not run.segments:
            continue
        trained = sum(seconds(plan.nodes[node_id], start, stop) for node_id, start, stop in run.segments)
        key = (run.worker not in warm, run.segments[0][1] > 0)
        excess.setdefault(key, []).append(max(0.0, run.ended - run.began - trained))
        warm.add(run.worker)

    def mean(values: list[float]) -> float:
        return statistics.fmean(values) if values else 0.0

    later_fresh, later_restored = excess.get((False, False), []), excess.get((False, True), [])
    start_seconds = mean(later_fresh)
    load_seconds = max(0.0, mean(later_restored) - start_seconds) if later_restored else 0.0
    first_runs = [
        seconds - start_seconds - (load_seconds if restored else 0.0)
        for (first, restored), values in excess.items()
        if first
        for seconds in values
    ]
    worker_seconds = max(0.0, mean(first_runs))

    def makespan(shared: bool, **overheads: float) -> float:
        replayed = SearchPlan()
        for trial_id, record in plan.trials.items():
            config = record.config if shared else record.config.branched(0, trial_id)  # a path of its own
            replayed.add_trial(trial_id, config, record.request.iteration, record.share_key)
        simulation = Simulation(workers, seconds_per_iteration=iteration_seconds, **overheads)
        return float(simulation.run(replayed, policy).makespan)

    return Replay(
        measured=max(run.ended for run in plan.runs) - min(run.began for run in plan.runs),
        predicted=makespan(
            True,
            batch_start_seconds=start_seconds,
            checkpoint_load_seconds=load_seconds,
            worker_start_seconds=worker_seconds,
        ),
        batch_start_seconds=start_seconds,
        checkpoint_load_seconds=load_seconds,
        worker_start_seconds=worker_seconds,
        shared=makespan(True),
        trial_based=makespan(False),
    )
