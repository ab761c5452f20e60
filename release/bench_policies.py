"""Critical path against THR and BFS on the thesis' own study (section 6.3,
Figure 6.4), on the simulator: a calibrated model, not a measurement.

The study: ResNet20 on CIFAR-10, learning rate and batch size tuned as
sequences, merge rate 3.55 (`resnet20_policy_space`: 300 trials, 3.57),
run as a grid and under ASHA as its paper defines it and the thesis
re-implemented it (`PromotingASHAScheduler`, reduction 4, rungs at 15 and
60 epochs, max 120: trials wait at a rung and are promoted once in its top
quarter), on several GPU counts; ASHA's trials either all in the plan from
the start or sampled as workers free up (the thesis' "ASHA dynamically adds
new trials"). As in the thesis, the best trial trains
100 more epochs, counted, and critical path does not batch stages (every
stage loads its checkpoint, as THR's and BFS's do); the batched critical
path is printed beside it, and the order the runtime runs this study in by
default: batched critical path, ready batches by the oldest trial they serve
(`simulate(trial_order=True)`), as for every study whose scheduler compares
trials. Critical path knows the study's
horizon (as in the runtime) and counts how far a trial requested short of it
(up to a rung) may still go; the rows without look-ahead do not. It ties
paths about as long (one band, 10% wide) and runs the one serving fewer
trials first (`CriticalPathPolicy`'s ``tie_tolerance``); the lengths-only
row orders by the estimates alone, as the policy did before. Critical path
estimates stage times as the runtime does, and as the thesis' scheduler did
(section 5.2: a linear regression on profiled timings, one unit per
iteration before any): `CostModel`, fitted to the timings the run records.
The exact-costs row gives it the simulator's own per-iteration costs.

The final epochs are the Hippo paper's protocol for its single studies
(section 6.1); section 6.3 does not say whether its times count them. They
are one trial's 100 epochs on one GPU after the search, much the same time
whatever the policy, so the ratios are printed both ways: of the makespan,
and of the search alone (the time until the study's last trial ended).

What was fitted: ResNet20's GPU-seconds per epoch (35 s at batch 128, a
third of ResNet56's, which is fitted to the Hippo paper's trial-based
GPU-hours on K80s), 10 s per checkpoint load and 5 s per final save; the
learning curves are synthetic (`ray_stagetree.simulation.simulated_study`).
ASHA's decisions depend on the order results reach it; each ASHA repeat
submits the trials in another random order (ASHA samples its trials), the
same orders for every policy. The grid is deterministic (one run).

Instrumented per run: the makespan against the bound of the work that run
trained (`Simulation.trained_bound`: the longest requested path, the unique
work over the GPUs, and the study's work before its best trial's final
epochs plus those epochs on one GPU; no schedule of that work ends sooner),
the epochs trained, the share of GPU time busy, and how many trials
reached each of ASHA's rungs and the horizon (what its promotions cost). Per GPU count, the
shortest makespan any run of the study can have, whatever its policy and
ASHA's decisions: the cheapest path of a trial to the horizon plus its final
epochs, which every run trains one after the other (and that path alone,
for the search).

    python release/bench_policies.py --full      # 4, 8, 16, 40 GPUs, 5 ASHA orders (a few minutes)
    python release/bench_policies.py --quick     # a twelfth of the trials on 4 GPUs, one order (CI smoke test)
"""

from __future__ import annotations

import random
from typing import Any

import harness

from ray_stagetree import CriticalPathPolicy, ExecutionPolicy, PromotingASHAScheduler, as_sequence
from ray_stagetree.planning import CostModel
from ray_stagetree.planning.merge import merge_rate
from ray_stagetree.searchers import generate_trials
from ray_stagetree.simulation.paper_spaces import RESNET20_HORIZON, resnet20_policy_space
from ray_stagetree.simulation.simulated_study import RESNET20, StudyDefinition, simulate

FINAL = 100  # the best trial trains 100 more epochs, counted (Hippo and thesis, section 6.1)
SAMPLED = "ASHA, sampled"  # ASHA's trials admitted as workers free up
PAPER_THR_OVER_CRITICAL = {"grid": "~1", "ASHA": "1.27x", SAMPLED: "1.27x"}
TARGET = 1.15  # critical path over THR on the ASHA study
RUNTIME = "critical + batch, admission order"
LENGTHS_ONLY = "critical, lengths only"  # tie_tolerance=0: no band, no fewer-trials-first
EXACT_COSTS = "critical, exact costs"  # the simulator's own costs instead of the fitted estimates


def _critical(batch_stages: bool, tie_tolerance: float = 0.1) -> CriticalPathPolicy:
    """Critical path estimating stage times as the runtime does: `CostModel`
    fitted to the timings the run records (`simulate` copies it per run)."""
    return CriticalPathPolicy(CostModel(), batch_stages=batch_stages, tie_tolerance=tie_tolerance)


POLICIES: dict[str, tuple[str | ExecutionPolicy, bool | None, bool, bool]] = {
    # label -> (policy, batch_stages, look_ahead, trial_order)
    "BFS": ("bfs", None, True, False),
    "THR": ("thr", None, True, False),
    "critical": (_critical(False), False, True, False),
    LENGTHS_ONLY: (_critical(False, tie_tolerance=0), False, True, False),
    EXACT_COSTS: ("critical_path", False, True, False),
    "critical + batch": (_critical(True), True, True, False),
    "critical, no look-ahead": (_critical(False), False, False, False),
    RUNTIME: (_critical(True), True, True, True),
}


class RecordedASHA:
    """ASHA's scheduler factory for a study; keeps the latest run's
    scheduler, whose rungs the tables count."""

    def __init__(self) -> None:
        self.latest: PromotingASHAScheduler | None = None

    def __call__(self) -> PromotingASHAScheduler:
        self.latest = PromotingASHAScheduler(max_t=RESNET20_HORIZON, grace_period=15, reduction_factor=4)
        return self.latest


def studies(trials: list[dict[str, Any]], orders: int) -> dict[str, list[StudyDefinition]]:
    """The grid (one run), and ASHA in ``orders`` random trial orders: every
    trial in the plan from the start, and sampled as workers free up (a
    trial waits for a worker at most, as ASHA samples a configuration when
    a worker has no promotion to run)."""
    asha = RecordedASHA()
    runs = {"grid": [StudyDefinition("grid", trials, RESNET20, RESNET20_HORIZON, final_iterations=FINAL)]}
    runs["ASHA"], runs[SAMPLED] = [], []
    for seed in range(orders):
        order = trials[:]
        random.Random(seed).shuffle(order)
        for name, pending in (("ASHA", None), (SAMPLED, 1)):
            runs[name].append(
                StudyDefinition(
                    "asha", order, RESNET20, RESNET20_HORIZON, asha, final_iterations=FINAL, max_pending_trials=pending
                )
            )
    return runs


def shortest_hours(trials: list[dict[str, Any]], final: int) -> float:
    """The shortest makespan of any run of the study: its cheapest trial's
    path to the horizon, then ``final`` epochs (the best trial trains both,
    one iteration after the other), checkpoint costs left out."""
    return min(
        simulate([StudyDefinition("one", [trial], RESNET20, RESNET20_HORIZON, final_iterations=final)], 1).bound_hours
        for trial in trials
    )


def run_policy(study: StudyDefinition, gpus: int, label: str) -> dict[str, float]:
    policy, batch, look_ahead, trial_order = POLICIES[label]
    run = simulate([study], gpus, policy=policy, batch_stages=batch, look_ahead=look_ahead, trial_order=trial_order)
    scheduler = study.scheduler.latest if isinstance(study.scheduler, RecordedASHA) else None
    return {
        "at_rungs": [len(rung) for rung in scheduler.rungs] if scheduler is not None else [],
        "to_horizon": len(run.studies[study.name].finishes),
        "hours": run.hours,
        "search": run.studies[study.name].search_seconds / 3600,
        "bound": run.bound_hours,
        "over_bound": run.hours / run.bound_hours,
        "epochs": run.result.iterations,
        "busy": run.result.worker_seconds / (gpus * run.result.makespan),
        "loads": run.result.checkpoint_loads,
    }


def main() -> None:
    args = harness.parse(harness.parser(__doc__, quick_repeats=1, full_repeats=5))
    trials = generate_trials(resnet20_policy_space())
    rate = merge_rate(trials, RESNET20_HORIZON)
    if args.quick:
        trials = trials[::12]
    gpu_counts = [4] if args.quick else [4, 8, 16, 40]
    section = harness.Section("Execution policies on the thesis' ResNet20 study", args, model=True)
    section.text(
        f"{len(trials)} trials (space: {len(generate_trials(resnet20_policy_space()))} trials, merge rate {rate:.2f};"
        f" thesis 3.55), ResNet20 35 GPU-s per epoch, checkpoint load 10 s; ASHA = `PromotingASHAScheduler("
        f"grace_period=15, reduction_factor=4, max_t=120)` over {args.repeats} random trial orders (medians"
        " [ranges]); grid: one run. Critical path unbatched as in the thesis; the runtime runs the grid as"
        f" `critical + batch` and ASHA as `{RUNTIME}`."
    )
    shortest, shortest_search = shortest_hours(trials, FINAL), shortest_hours(trials, 0)
    rows, summary, verdicts, tails = [], [], [], []
    # GPUs -> trials THR's, lengths-only critical path's and critical path's ASHA runs trained to 120
    horizons: dict[int, list[list[float]]] = {}
    for gpus in gpu_counts:
        for name, definitions in studies(trials, args.repeats).items():
            runs = harness.interleaved(
                {label: _cycle(definitions, gpus, label) for label in POLICIES}, len(definitions), f"{gpus} GPUs {name}"
            )
            for label, figures in runs.items():
                rows.append(
                    [
                        gpus,
                        name,
                        label,
                        harness.median_range(harness.values(figures, "hours"), 2),
                        harness.median_range(harness.values(figures, "search"), 2),
                        harness.median_range(harness.values(figures, "over_bound"), 2),
                        harness.median_range(harness.values(figures, "epochs"), 0),
                        harness.median_range([100 * busy for busy in harness.values(figures, "busy")], 0, "%"),
                        _trials_reaching(figures),
                    ]
                )
            thr, critical = harness.values(runs["THR"], "hours"), harness.values(runs["critical"], "hours")
            thr_search, critical_search = (harness.values(runs[label], "search") for label in ("THR", "critical"))
            if name == "ASHA":
                horizons[gpus] = [
                    harness.values(runs[label], "to_horizon") for label in ("THR", LENGTHS_ONLY, "critical")
                ]
            tails += [run["hours"] - run["search"] for figures in runs.values() for run in figures]
            at_most = harness.median(thr) / shortest
            if name != "grid":
                for view, pair, limit in (
                    ("makespan", (thr, critical), at_most),
                    ("search", (thr_search, critical_search), harness.median(thr_search) / shortest_search),
                ):
                    verdicts.append((name, view, gpus, harness.median(harness.ratios(*pair)), limit))
            summary.append(
                [
                    gpus,
                    name,
                    harness.ratio(thr, critical),
                    harness.ratio(thr_search, critical_search),
                    harness.ratio(thr, harness.values(runs["critical + batch"], "hours")),
                    PAPER_THR_OVER_CRITICAL[name],
                    harness.ratio(harness.values(runs["THR"], "bound"), harness.values(runs["critical"], "bound")),
                    f"{at_most:.2f}x",
                    harness.ratio(harness.values(runs[LENGTHS_ONLY], "hours"), critical),
                    harness.ratio(harness.values(runs[EXACT_COSTS], "hours"), critical),
                    harness.ratio(harness.values(runs["critical, no look-ahead"], "hours"), critical),
                    harness.ratio(thr, harness.values(runs[RUNTIME], "hours")),
                ]
            )
    section.table(
        [
            "GPUs",
            "study",
            "policy",
            "hours",
            "search hours",
            "hours / bound",
            "epochs trained",
            "GPUs busy",
            "trials at 15 / 60 / 120",
        ],
        rows,
    )
    section.table(
        [
            "GPUs",
            "study",
            "THR / critical",
            "THR / critical, search",
            "THR / critical + batch",
            "thesis",
            "bound, THR / critical",
            "THR / shortest of any run",
            "lengths only / critical",
            "exact costs / critical",
            "no look-ahead / critical",
            "THR / the runtime's",
        ],
        summary,
    )
    beyond = sorted({gpus for _, view, gpus, _, at_most in verdicts if view == "makespan" and at_most < TARGET})
    section.text(
        "hours / bound: the makespan over the bound of the work that run trained (no schedule of it ends sooner);"
        " bound, THR / critical: the same bounds' ratio, what THR's run trained against critical path's: each"
        " policy changes which trials ASHA promotes (the order results reach its rungs), hence what each trains."
        f" THR / shortest of any run: THR's median hours over {shortest:.2f} h, the cheapest path of a trial to the"
        f" horizon plus its {FINAL} final epochs, which no run of this study can end before: no policy is faster"
        f" than THR by more than this. search hours: until the study's last trial ended, before the best trial's"
        f" {FINAL} final epochs ({harness.median_range(tails, 2)} h: the best trial's batch size sets it, not the"
        f" policy); the search alone can end no sooner than {shortest_search:.2f} h.",
        f"Target: critical path (unbatched, as in the thesis) at least {TARGET}x faster than THR on the ASHA study"
        f" (thesis 1.27x), medians; trials in the plan from the start, of the makespan:"
        f" {_verdict(verdicts, 'ASHA', 'makespan')}; of the search alone: {_verdict(verdicts, 'ASHA', 'search')}."
        f" Trials sampled as workers free up, of the makespan: {_verdict(verdicts, SAMPLED, 'makespan')}; of the"
        f" search alone: {_verdict(verdicts, SAMPLED, 'search')}."
        + (
            f" At {', '.join(map(str, beyond))} GPUs no policy can meet it on the makespan: THR ends within"
            f" {TARGET}x of the shortest makespan of any run."
            if beyond
            else ""
        ),
        "Where the time goes. With few GPUs (4) every policy runs what its run trained close to that work's bound"
        " (hours / bound), so a policy is faster than another by having ASHA train less; with many (16, 40) the"
        " bound is the longest path, the best trial's 120 epochs and its 100 final ones, alike for every policy;"
        " in between (8), the GPUs idle at the start, where the tree is narrow (6 paths to the first rung, few to"
        " the first milestones), and from the last trials' last epochs through the final ones, and every policy"
        " keeps them all busy in between: again, what ASHA trains decides. It follows its promotions: a trial is"
        " promoted once it is in the top quarter of the results its rung holds so far, so the order in which"
        " results reach a rung decides how many trials are promoted on thin evidence. Trials that share their"
        " path to a rung reach it together, tied. Every policy brings the same trials to rung 60 (trials at"
        f" 15 / 60 / 120): the {len(trials)} trials reach rung 15 in {_paths_to(trials, 15)} tied groups, the"
        " paths to it, and its top quarter goes on. The time is lost or won at rung 60: the policies run the"
        " promoted trials' epochs 15-60 in different orders. Ordered by path length alone, critical path runs the"
        " largest group of trials sharing their path to 60 first (its longest path, by the few seconds its"
        " smallest batch size costs), and that group alone fills the rung's top quarter: its trials, tied, train"
        f" on to 120 whatever the groups after them score ({len(trials) // 4 // 4} would if every rung's results"
        " came best first). The paths' estimates differ by less than they are worth (fitted timings, and past a"
        " rung a guess), so critical path ties paths whose estimates fall in one band, 10% wide, and runs the"
        " one serving fewer trials first: the rung then hears from more distinct configurations for each trial"
        " that reaches it, and promotes on evidence from several groups rather than from one. Trials trained"
        " to 120 by THR / critical path by length alone / critical path (medians): "
        + "; ".join(
            f"{gpus} GPUs {' / '.join(f'{harness.median(counts):g}' for counts in per_policy)}"
            f" (critical path fewer than THR in {sum(c < t for t, c in zip(per_policy[0], per_policy[2]))}"
            f" of {len(per_policy[0])} orders, more in {sum(c > t for t, c in zip(per_policy[0], per_policy[2]))})"
            for gpus, per_policy in horizons.items()
        )
        + ". The lengths only / critical column is what the tie rule gains; exact costs / critical, what it"
        " gains only where the estimates leave paths about as long: with the simulator's exact costs the"
        " paths that keep batch size 128 longest are the longest by more than the band, the groups holding"
        " one of them go first whatever their size, and the rule rarely applies. The estimates a scheduler has"
        " are the fitted ones (the runtime's, and the thesis' regression), and every trial of this space trains"
        " its first 50 epochs at batch size 128, so the first timings cannot tell batch sizes apart. Looking"
        " ahead to the horizon (the no look-ahead row without it) runs the results that decide on more work"
        " before the work no decision waits for; the ratio of the two is in the no look-ahead / critical column."
        " The final epochs add about as much time to every run, so the ratio of the search alone is further"
        " from 1 wherever the policies differ, and equal where the longest path bounds both.",
        f"{SAMPLED}: the thesis explains its 1.27x by ASHA adding trials as it runs (THR's descendant counts"
        " change as trials come, the critical path much less). Here ASHA samples a trial only when one may"
        " wait for a worker (`max_pending_trials=1`: no more live than the GPUs plus one), as its paper's"
        " `get_job` samples a configuration for a worker with no promotion to run: the plan then holds about"
        " as many unfinished trials as there are GPUs, so every policy runs nearly the same stages in nearly the"
        " same order, and their ratios stay near 1.",
        f"The runtime's order ({RUNTIME}, the default for this study): for a study whose scheduler compares"
        " trials, as ASHA does, the runtime runs ready batches by the oldest trial they serve, critical path"
        " only breaking ties, as Tune runs its trials; on a study with nothing to share, ASHA then decides as"
        " it would under Tune (`bench_asha.py`). Its ratio to THR is the last column; the policies in their own"
        " order are the thesis' comparison.",
    )
    section.emit()


def _verdict(verdicts: list[tuple[str, str, int, float, float]], study: str, view: str) -> str:
    """Per GPU count, the median THR / critical ratio of ``view`` on
    ``study`` and, where THR ends too close to the shortest run for any
    policy to reach the target, that limit; then whether the target is met
    where it can be."""
    mine = [
        (gpus, speedup, at_most) for name, each, gpus, speedup, at_most in verdicts if (name, each) == (study, view)
    ]
    attainable = [(gpus, speedup) for gpus, speedup, at_most in mine if at_most >= TARGET]
    met = [gpus for gpus, speedup in attainable if speedup >= TARGET]
    figures = "; ".join(
        f"{gpus} GPUs {speedup:.2f}x" + ("" if at_most >= TARGET else f" (no policy can exceed {at_most:.2f}x)")
        for gpus, speedup, at_most in mine
    )
    if attainable and len(met) == len(attainable):
        return f"{figures}: **met**"
    return f"{figures}: **NOT met**" + (f" (met at {', '.join(map(str, met))} GPUs)" if met else "")


def _paths_to(trials: list[dict[str, Any]], iterations: int) -> int:
    """How many distinct paths the trials take through their first ``iterations``."""
    return len(
        {
            tuple(tuple(as_sequence(value).value(step) for step in range(iterations)) for value in trial.values())
            for trial in trials
        }
    )


def _trials_reaching(figures: list[dict[str, Any]]) -> str:
    """Median trials with a result at each of ASHA's rungs and at the horizon ("-" for the grid)."""
    if not figures[0]["at_rungs"]:
        return "-"
    counts = [[run["at_rungs"][rung] for run in figures] for rung in range(len(figures[0]["at_rungs"]))]
    counts.append(harness.values(figures, "to_horizon"))
    return " / ".join(f"{harness.median(column):g}" for column in counts)


def _cycle(definitions: list[StudyDefinition], gpus: int, label: str):
    """A system for `harness.interleaved`: its n-th call runs the n-th definition."""
    remaining = iter(definitions)
    return lambda: run_policy(next(remaining), gpus, label)


if __name__ == "__main__":
    main()
