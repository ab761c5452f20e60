"""The conformance suites of `ray_stagetree.testing`: what every sequence
family, execution policy, hosted trial scheduler and searcher over
sequences must do, checked on the real planner and simulated workers."""

from __future__ import annotations

import copy
import json
import pickle
import random
from collections.abc import Callable
from typing import Any

import numpy as np

import ray_stagetree.sequences as sequences
from ray_stagetree.planning.plan import SearchPlan
from ray_stagetree.planning.policies import ExecutionPolicy
from ray_stagetree.planning.time_sharing import TimeSharingPolicy
from ray_stagetree.searchers.sources import SearcherSource
from ray_stagetree.sequences import FAMILIES, Sequence, from_json
from ray_stagetree.sequences.base import next_change
from ray_stagetree.simulation.simulated_study import RESNET20, StudyDefinition, simulate
from ray_stagetree.simulation.simulator import Simulation

#: Iterations the sequence checks look at.
HORIZON = 120


def _fails(what: str, detail: Any) -> AssertionError:
    return AssertionError(f"{what}: {detail}")


# -- sequence families -----------------------------------------------------------------


def check_sequence(sequence: Sequence, horizon: int = HORIZON) -> None:
    """What stage sharing and the job specs rely on of a sequence: its family
    registered under its name; a JSON form that rebuilds it (and is plain
    JSON); a repr that rebuilds it; equality and hash that survive pickling;
    ``values`` agreeing with ``value``; immutability; ``first_difference``
    and `next_change` agreeing with the values iteration by iteration."""
    family = type(sequence)
    if FAMILIES.get(sequence.family) is not family:
        raise _fails(f"{family.__name__}'s family {sequence.family!r}", "is not registered under its name")
    data = sequence.to_json()
    if data.get("family") != sequence.family or from_json(json.loads(json.dumps(data))) != sequence:
        raise _fails(f"{sequence!r}.to_json()", f"{data!r} does not rebuild it through from_json")
    if eval(repr(sequence), vars(sequences)) != sequence:  # noqa: S307 - the repr is the project's own
        raise _fails(f"repr of {family.__name__}", f"{sequence!r} does not rebuild it")
    again = pickle.loads(pickle.dumps(sequence))
    if again != sequence or hash(again) != hash(sequence):
        raise _fails(f"{sequence!r}", "is not equal to its pickled copy, or hashes differently")
    values = sequence.values(0, horizon)
    singly = [sequence.value(iteration) for iteration in range(horizon)]
    if len(values) != horizon or any(not _same(a, b) for a, b in zip(values, singly, strict=True)):
        raise _fails(f"{sequence!r}.values(0, {horizon})", "differs from value(i) at each i")
    try:
        setattr(sequence, next(iter(sequence.params), "family"), None)
    except (AttributeError, TypeError):
        pass
    else:
        raise _fails(f"{sequence!r}", "can be changed in place (sequences are immutable: plans key on them)")
    if sequence.first_difference(copy.deepcopy(sequence), horizon) is not None:
        raise _fails(f"{sequence!r}.first_difference(itself)", "is not None")
    changes = [i for i in range(1, horizon) if not _same(singly[i], singly[i - 1])]
    found = next_change(sequence, 0, horizon)
    if found != (changes[0] if changes else None):
        raise _fails(
            f"next_change({sequence!r}, 0, {horizon})", f"{found}, where the values first change at {changes[:1]}"
        )


def _same(a: Any, b: Any) -> bool:
    return a == b or (isinstance(a, float) and isinstance(b, float) and np.isnan(a) and np.isnan(b))


# -- execution policies --------------------------------------------------------------------


def _workloads() -> dict[str, list[tuple[str, dict[str, Any], int]]]:
    """Plans a policy must serve: a shared root forking at several points,
    unrelated roots, and a mix of both with unequal horizons."""
    forks = [(f"step{m}", {"lr": sequences.MultiStep(0.1, [m], 0.1)}, 40) for m in (5, 10, 20, 30)]
    roots = [(f"const{i}", {"lr": 0.1 * (i + 1)}, 20) for i in range(3)]
    mixed = forks[:2] + roots[:1] + [("short", {"lr": sequences.MultiStep(0.1, [10], 0.1)}, 15)]
    return {"forks": forks, "roots": roots, "mixed": mixed}


def check_execution_policy(policy: ExecutionPolicy, workers: tuple[int, ...] = (1, 2, 5)) -> None:
    """What the runtime relies on of an execution policy, on simulated
    workers (`simulation.Simulation`) over several plans: it serves every
    request; it trains each iteration once (never what a checkpoint or a
    running batch already holds); it never keeps more batches running than
    workers; and a study whose scheduler compares trials
    (`ExecutionPolicy.admission_order`) is served too."""
    for name, trials in _workloads().items():
        for count in workers:
            for in_order in (False, True):
                plan = SearchPlan()
                plan.add_trials(trials)
                unique = plan.unique_iterations()
                run = copy.deepcopy(policy)
                if in_order:
                    run.admission_order()
                if isinstance(run, TimeSharingPolicy):
                    run.set_metric("loss", "min")
                where = f"{type(policy).__name__} on the {name!r} plan, {count} workers" + (
                    ", in admission order" if in_order else ""
                )
                most = _MostRunning(plan)
                result = Simulation(workers=count, metrics=_loss).run(plan, run, on_dispatched=most.watch)
                if list(plan.open_requests()):
                    raise _fails(where, f"left requests unserved: {list(plan.open_requests())}")
                if result.iterations != unique and not isinstance(run, TimeSharingPolicy):
                    raise _fails(where, f"trained {result.iterations} iterations for {unique} unique ones")
                if most.most > count:
                    raise _fails(where, f"kept {most.most} batches running at once")


class _MostRunning:
    """The most batches a simulation kept running at once (its ``on_dispatched`` hook)."""

    def __init__(self, plan: SearchPlan) -> None:
        self.plan = plan
        self.most = 0

    def watch(self) -> bool:
        self.most = max(self.most, len(self.plan.running_batches))
        return False


def _loss(node: Any, iteration: int) -> dict[str, float]:
    return {"loss": 1.0 / iteration}


# -- trial schedulers -------------------------------------------------------------------


def _schedule_trials(count: int) -> list[dict[str, Any]]:
    milestones = [4, 8, 12, 16]
    return [
        {"lr": sequences.MultiStep(0.1 * (1 + index % 3), [milestones[index % len(milestones)]], 0.5)}
        for index in range(count)
    ]


def check_trial_scheduler(make_scheduler: Callable[[], Any], trials: int = 8, horizon: int = 24) -> None:
    """What stage sharing promises of a hosted Tune trial scheduler
    (``make_scheduler()`` builds a fresh one, with its metric and mode, or
    None for its defaults): on a simulated study with as many workers as
    trials, the scheduler stops, finishes and picks the same trials whether
    the trials share stages or each trains alone (Tune's way), and sharing
    never trains more."""
    study = StudyDefinition("conformance", _schedule_trials(trials), RESNET20, horizon, make_scheduler)
    runs = {}
    for share in (True, False):
        random.seed(0)  # Tune's schedulers draw from the global generators (PBT's perturbations)
        np.random.seed(0)
        runs[share] = simulate([study], gpus=trials, share=share)
    shared, alone = runs[True], runs[False]
    name = type(make_scheduler()).__name__
    for field in ("stopped", "finished", "best_trial"):
        merged, separate = getattr(shared.studies["conformance"], field), getattr(alone.studies["conformance"], field)
        if merged != separate:
            raise _fails(f"{name} {field}", f"{merged!r} with stage sharing, {separate!r} trial by trial")
    if shared.result.worker_seconds > alone.result.worker_seconds:
        raise _fails(f"{name}", "trained more with stage sharing than trial by trial")


# -- searchers ---------------------------------------------------------------------------


def check_searcher(make_searcher: Callable[[], Any], num_samples: int = 6, horizon: int = 12) -> None:
    """What a study needs of a Tune searcher over a space with sequences
    (``make_searcher()`` builds a fresh one): hosted as the controller hosts
    it (`searchers.sources.SearcherSource`), it proposes ``num_samples``
    configs that plan (their sequences resolved), hears their results, and
    a simulated study of them ends with every trial finished."""
    space = {
        "lr": sequences.MultiStep(_uniform(0.01, 0.1), [4], 0.1),
        "momentum": _uniform(0.8, 0.95),
    }
    source = SearcherSource(make_searcher(), space, RESNET20.metric, "max", num_samples)
    proposed = []
    while (proposal := source.next_trial()) not in (None,):
        if not isinstance(proposal, tuple):
            break  # it waits for results
        proposed.append(proposal)
        trial_id, config = proposal
        if not isinstance(config["lr"], Sequence) or not config["lr"].is_resolved:
            raise _fails("a proposed config", f"{config!r}: its lr is not a resolved sequence")
        source.on_complete(trial_id, {RESNET20.metric: 0.5, "training_iteration": 1})
    if not proposed:
        raise _fails(type(make_searcher()).__name__, "proposed nothing")
    study = StudyDefinition(
        "search", [], RESNET20, horizon, searcher=make_searcher, param_space=space, num_samples=num_samples
    )
    outcome = simulate([study], gpus=2).studies["search"]
    if len(outcome.finished) != num_samples:
        raise _fails(type(make_searcher()).__name__, f"{len(outcome.finished)} of {num_samples} trials finished")


def _uniform(low: float, high: float) -> Any:
    from ray import tune

    return tune.uniform(low, high)
