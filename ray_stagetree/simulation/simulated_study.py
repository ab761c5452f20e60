"""Simulated studies: the real planner, execution policies and Ray Tune trial
schedulers on W simulated GPUs, with learning curves that depend on the
whole hyper-parameter schedule.

`simulate` submits one or more studies (trials drawn from a search space,
each with its own Tune scheduler) into one search plan and runs them on a
`Simulation`. Its trials go through the lifecycle the Ray controller's go
through (`planning.lifecycle`, one per study): a trial is requested only up to
its next decision point (its next rung); when the request is answered the scheduler
sees the row ``{"training_iteration": iteration, metric: value}`` and answers
CONTINUE (the request moves on to the next decision point), STOP (nothing
more is requested) or PAUSE (synchronous schedulers; the trial resumes when
the scheduler picks it). Trial-based execution (Ray Tune, the paper's
"Hippo-trial") is the same run with every trial in a plan tree of its own.

Learning curves
---------------
`LearningCurve` turns a schedule into metrics: a deterministic state
(progress, noise temperature, regularisation quality, a hash of the values
seen) is advanced one iteration at a time from the hyper-parameter values of
that iteration, so the metric after ``k`` iterations is a function of the
values of iterations ``0 .. k-1`` only: trials sharing a prefix have equal
metrics on it (the invariant stage sharing relies on). Per iteration, with
``eta`` the effective step size relative to the model's standard recipe
(``lr / (1 - momentum)`` for SGD with momentum, ``lr * adam_scale`` for Adam,
times ``reference_batch_size / batch_size``):

* progress grows by ``eta / (eta + 0.3)``, less ``0.5 * (eta - 2)`` above a
  divergence threshold of twice the recipe's step;
* the temperature (SGD noise) follows ``eta`` with a 2-epoch memory and costs
  accuracy in proportion, so decaying the learning rate or growing the
  batch pays off within a few epochs, as in real step-decay curves;
* every other hyper-parameter (weight decay, cutout, sequence length, ...)
  shifts the attainable score by a small hash-derived amount, averaged over
  the iterations it was in effect;
* the reported score is ``floor + (ceiling - floor) * (1 - exp(-progress /
  progress_scale)) - temperature_cost * temperature`` plus evaluation noise
  drawn from the hash of the schedule so far (a per-schedule seed).

Costs
-----
`ModelProfile` gives the GPU-seconds of an iteration (one epoch, or 100
steps of BERT) at the reference batch size, calibrated so that the paper's
trial-based GPU-hours (Table 5, "trial" column) divided by the epochs those
studies train give the per-epoch cost of the paper's K80 GPUs. A larger batch
makes an epoch cheaper: a fixed share of each step's time (launches,
optimizer step, input pipeline) is paid per step, so an epoch costs
``seconds * ((1 - f) + f * reference_batch_size / batch_size)`` with
``f = 0.4`` (batch 256: 0.8x). A longer BERT input costs proportionally more.
Loading a checkpoint costs seconds that cover restarting the model and the
input pipeline and reading the checkpoint from the shared file system;
writing the final checkpoint of a batch holds its worker as long.

(Over 600 lines: a simulated study is the runtime's study loop without Ray:
admission, the lifecycle's decisions, the plan's batches on W simulated
GPUs and the trial-based baseline share its state, as the controller's do.)
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

from ray_stagetree.planning.lifecycle import LIVE, TERMINATED, WAIT, Trial, TrialLifecycle
from ray_stagetree.planning.plan import PlanNode, Request, SearchPlan
from ray_stagetree.planning.policies import ExecutionPolicy
from ray_stagetree.planning.time_sharing import TimeSharingPolicy
from ray_stagetree.searchers.sources import SearcherSource, VariantSource
from ray_stagetree.simulation.simulator import FinalTraining, Simulation, SimulationResult
from ray_stagetree.trial_schedulers.host import SchedulerHost

#: Hyper-parameters the curve models explicitly; the rest enter as offsets.
_STEP_KEYS = frozenset({"lr", "batch_size", "momentum", "optimizer", "model"})


def _unit(text: str) -> float:
    """A uniform number in [0, 1) from a stable hash (Python's ``hash`` of a
    string changes from process to process)."""
    return int.from_bytes(hashlib.blake2b(text.encode(), digest_size=8).digest(), "big") / 2**64


@lru_cache(maxsize=4096)
def _offset(name: str, value: Any) -> float:
    return 2 * _unit(f"{name}={value!r}") - 1


@dataclass(frozen=True)
class CurveState:
    """Where training stands after some iterations of one schedule."""

    progress: float = 0.0
    temperature: float = 0.0
    quality: float = 0.0
    digest: bytes = b""


@dataclass(frozen=True)
class LearningCurve:
    """Metric of a schedule (see the module docstring for the model).

    Parameters
    ----------
    floor, ceiling:
        Score of an untrained model (chance) and the best score reachable.
    progress_scale:
        Progress (about 0.77 per epoch at the recipe's step) that closes
        ``1 - 1/e`` of the gap between floor and ceiling.
    temperature_cost:
        Score lost per unit of temperature (the recipe's step is 1).
    recipe:
        The model's standard hyper-parameters; step sizes are relative to
        this recipe's, and missing hyper-parameters take its values.
    adam_scale:
        Adam's step relative to SGD's at the same learning rate.
    offset_scale:
        Largest shift of the score by one other hyper-parameter.
    noise:
        Half-width of the evaluation noise.
    """

    floor: float
    ceiling: float
    progress_scale: float
    temperature_cost: float
    recipe: Mapping[str, Any]
    adam_scale: float = 30.0
    offset_scale: float = 0.003
    noise: float = 0.003

    def step_size(self, values: Mapping[str, Any]) -> float:
        """Effective step of one iteration, relative to the recipe's."""
        return self._raw_step({**self.recipe, **values}) / self._raw_step(self.recipe)

    def _raw_step(self, values: Mapping[str, Any]) -> float:
        optimizer = values.get("optimizer", "sgd_momentum")
        if optimizer == "adam":
            step = float(values["lr"]) * self.adam_scale
        else:
            momentum = float(values.get("momentum", 0.0)) if optimizer == "sgd_momentum" else 0.0
            step = float(values["lr"]) / (1.0 - momentum)
        if "batch_size" in values:
            step *= float(self.recipe.get("batch_size", values["batch_size"])) / float(values["batch_size"])
        return step

    def initial(self, static: Mapping[str, Any]) -> CurveState:
        """State before training; non-tunable values seed the schedule hash."""
        digest = hashlib.blake2b(repr(sorted(static.items())).encode(), digest_size=8).digest()
        return CurveState(digest=digest)

    def advance(self, state: CurveState, values: Mapping[str, Any]) -> CurveState:
        """State after one more iteration trained with ``values``."""
        eta = self.step_size(values)
        gain = eta / (eta + 0.3) - 0.5 * max(0.0, eta - 2.0)
        offsets = sum(_offset(k, v) for k, v in values.items() if k not in _STEP_KEYS) * self.offset_scale
        digest = hashlib.blake2b(state.digest + repr(sorted(values.items())).encode(), digest_size=8).digest()
        return CurveState(
            progress=max(0.0, state.progress + gain),
            temperature=state.temperature + 0.5 * (eta - state.temperature),
            quality=state.quality + 0.05 * (offsets - state.quality),
            digest=digest,
        )

    def score(self, state: CurveState) -> float:
        trained = 1.0 - math.exp(-state.progress / self.progress_scale)
        value = self.floor + (self.ceiling - self.floor) * trained
        value += state.quality - self.temperature_cost * state.temperature
        value += self.noise * (2 * int.from_bytes(state.digest, "big") / 2**64 - 1)
        return min(max(value, self.floor), 1.0)


@dataclass(frozen=True)
class ModelProfile:
    """Costs and learning curve of one model.

    Parameters
    ----------
    name:
        Model name; trials of different models never share a stage.
    metric:
        Name of the reported score.
    seconds_per_iteration:
        GPU-seconds of one iteration at the reference batch size (and
        sequence length).
    curve:
        The `LearningCurve` of its score.
    checkpoint_load_seconds, checkpoint_save_seconds:
        Paid when a batch starts from a checkpoint, and for the final
        checkpoint of a batch.
    reference_batch_size, step_overhead:
        An epoch at batch size ``b`` costs ``(1 - step_overhead) +
        step_overhead * reference_batch_size / b`` times the reference.
    reference_sequence_length:
        An iteration at input length ``n`` costs ``n /
        reference_sequence_length`` times the reference.
    gpus_per_trial:
        GPUs a trial trains on (synchronous data parallel, for models that
        do not fit one GPU); an iteration takes ``1 / gpus_per_trial`` of its
        GPU-seconds of wall-clock time (linear scaling).
    """

    name: str
    metric: str
    seconds_per_iteration: float
    curve: LearningCurve
    checkpoint_load_seconds: float
    checkpoint_save_seconds: float
    reference_batch_size: int = 128
    step_overhead: float = 0.4
    reference_sequence_length: int = 384
    gpus_per_trial: int = 1

    def iteration_seconds(self, values: Mapping[str, Any]) -> float:
        seconds = self.seconds_per_iteration
        if "batch_size" in values:
            share = self.step_overhead
            seconds *= (1 - share) + share * self.reference_batch_size / float(values["batch_size"])
        if "max_seq_length" in values:
            seconds *= float(values["max_seq_length"]) / self.reference_sequence_length
        return seconds / self.gpus_per_trial


_CIFAR_RECIPE = {"lr": 0.1, "momentum": 0.9, "optimizer": "sgd_momentum", "batch_size": 128}

# Per-epoch seconds: Table 5's trial-based GPU-hours over the epochs each study
# trains (SHA: 448 x 15 + 112 x 45 + 28 x 60 + 100 = 13,540 epochs in 404.95
# GPU-hours: 108 s; MobileNetV2: 240 x 120 + 100 epochs in 944.88: 118 s;
# BERT-Base: 40 x 27,000 + 100 steps in 808.21: 2.7 GPU-seconds a step).
# BERT-Base at sequence length 384 does not fit one 12 GB K80 die: the paper
# trains it data parallel; 4 GPUs a trial matches Table 5's trial-based run
# (808 GPU-hours over 24.1 hours keep 34 of 40 GPUs busy: 10 trials at a
# time). ResNet20 is about a third of ResNet56's compute. CIFAR checkpoints
# are a few MB: a load is mostly restarting the model and input pipeline
# (10 s); BERT-Base with its Adam state is 1.3 GB from GlusterFS at ~100 MB/s
# (30 s).
RESNET56 = ModelProfile("resnet56", "accuracy", 105.0, LearningCurve(0.1, 0.94, 15.0, 0.06, _CIFAR_RECIPE), 10.0, 5.0)
RESNET20 = ModelProfile("resnet20", "accuracy", 35.0, LearningCurve(0.1, 0.925, 15.0, 0.06, _CIFAR_RECIPE), 10.0, 5.0)
MOBILENETV2 = ModelProfile(
    "mobilenetv2", "accuracy", 118.0, LearningCurve(0.1, 0.955, 15.0, 0.06, _CIFAR_RECIPE), 10.0, 5.0
)
BERT_BASE = ModelProfile(
    "bert_base",
    "f1",
    270.0,  # one iteration = 100 steps
    LearningCurve(0.0, 0.80, 40.0, 0.02, {"lr": 5e-5, "optimizer": "adam"}, noise=0.005),
    30.0,
    15.0,
    gpus_per_trial=4,
)
PROFILES = {profile.name: profile for profile in (RESNET56, RESNET20, MOBILENETV2, BERT_BASE)}


class Curves:
    """Learning-curve states of a plan's nodes, computed once per trained
    iteration: the state at ``(node, iteration)`` continues the parent's at the
    fork, so it depends only on the values along the path.

    Parameters
    ----------
    profiles:
        Model profiles by name; a config's ``"model"`` value picks one.
    """

    def __init__(self, profiles: Mapping[str, ModelProfile] = PROFILES) -> None:
        self.profiles = profiles
        self._states: dict[int, list[CurveState]] = {}

    def profile(self, node: PlanNode) -> ModelProfile:
        return self.profiles[node.config.hparams_at(0)["model"]]

    def state(self, node: PlanNode, iteration: int) -> CurveState:
        """State after ``iteration`` iterations of ``node``'s path."""
        states = self._states.get(node.node_id)
        if states is None:
            curve = self.profile(node).curve
            if node.parent is None:
                first = curve.initial(node.config.static)
            else:
                first = self.state(node.parent, node.fork_iteration)
            states = self._states[node.node_id] = [first]
        if len(states) <= iteration - node.fork_iteration:
            curve = self.profile(node).curve
            while len(states) <= iteration - node.fork_iteration:
                trained = node.fork_iteration + len(states) - 1
                states.append(curve.advance(states[-1], node.config.hparams_at(trained)))
        return states[iteration - node.fork_iteration]

    def metrics(self, node: PlanNode, iteration: int) -> dict[str, float]:
        profile = self.profile(node)
        return {profile.metric: profile.curve.score(self.state(node, iteration))}

    def seconds(self, node: PlanNode, iteration: int) -> float:
        """GPU-seconds of iteration ``iteration`` of ``node`` (0-based)."""
        return self.profile(node).iteration_seconds(node.config.hparams_at(iteration))


@dataclass
class StudyDefinition:
    """One study of a simulated run.

    Parameters
    ----------
    name:
        Study name (prefix of its trial ids).
    trials:
        Resolved trial configs (e.g. `ray_stagetree.searchers.generate_trials`).
        Left empty when ``searcher`` proposes them.
    profile:
        The model the trials train.
    horizon:
        Most iterations a trial trains.
    scheduler:
        Builds a fresh Ray Tune ``TrialScheduler`` for each run (schedulers
        are stateful); None runs every trial to the horizon (grid search).
    mode:
        "max" or "min" for the profile's metric.
    final_iterations:
        When the study ends, its best trial trains this many iterations more
        (the paper adds 100 epochs, or 100 steps, and counts them).
    max_concurrent_trials:
        Live trials at once (None: all, as the controller admits them).
    searcher:
        Builds a fresh Ray Tune ``Searcher`` for each run, to propose
        ``num_samples`` trials from ``param_space`` as the study runs (as
        the controller hosts one, asked while fewer of its trials wait for
        a worker than Tune's pending-trial limit); it sees every iteration's result.
    max_pending_trials:
        Tune's ``TUNE_MAX_PENDING_TRIALS_PG``: trials that may wait for a
        worker at once, no more live than the run's workers plus it (None:
        the trial source's own rule). 1 admits ``trials`` as workers free
        up, as ASHA samples its next configuration when a worker has no
        promotion to run.
    """

    name: str
    trials: list[dict[str, Any]]
    profile: ModelProfile
    horizon: int
    scheduler: Callable[[], Any] | None = None
    mode: str = "max"
    final_iterations: int = 0
    max_concurrent_trials: int | None = None
    searcher: Callable[[], Any] | None = None
    param_space: Mapping[str, Any] | None = None
    num_samples: int = 0
    max_pending_trials: int | None = None

    def trial_source(self) -> VariantSource | SearcherSource:
        """Where the study's trials come from, fresh for one run."""
        if self.searcher is None:
            return VariantSource(self.trials, [f"{index:04d}" for index in range(len(self.trials))])
        if self.param_space is None:
            raise ValueError(f"study {self.name!r}: a searcher needs the param_space it searches")
        return SearcherSource(self.searcher(), self.param_space, self.profile.metric, self.mode, self.num_samples)


@dataclass
class StudyOutcome:
    """What one study of a run did."""

    best: float = float("nan")
    best_trial: str | None = None
    stopped: set[str] = field(default_factory=set)
    finished: set[str] = field(default_factory=set)
    #: (GPU-seconds of the iterations trained so far, the trial's final
    #: metric) for each trial that reached the horizon, in finishing order
    finishes: list[tuple[float, float]] = field(default_factory=list)
    #: simulated seconds when the study's trials had all ended: its search,
    #: before its best trial's final iterations
    search_seconds: float = float("nan")


@dataclass
class StudyRun:
    """A simulated run: timing of the whole run, outcome per study.

    ``explored_merge_rate`` is total over unique iterations of what the
    trials were finally requested up to: the merge rate of the part of the
    space the schedulers explored."""

    result: SimulationResult
    studies: dict[str, StudyOutcome]
    explored_merge_rate: float
    gpus_per_worker: int = 1
    bound_hours: float = 0.0
    """`Simulation.trained_bound` of the run, each study's final training
    after the study, in hours: no schedule of the work its schedulers chose
    ends sooner."""

    @property
    def gpu_hours(self) -> float:
        return self.result.worker_seconds * self.gpus_per_worker / 3600

    @property
    def hours(self) -> float:
        return self.result.makespan / 3600


@dataclass(kw_only=True, eq=False)
class _Trial(Trial):
    study: StudyDefinition
    reported_iteration: int = 0  # results the study's trial source has seen


class _StudyTrialSource:
    """A study's `planning.lifecycle.TrialSource` under the run's trial ids
    (``study/id``, unique across the studies of one plan); its searcher
    knows the ids it proposed."""

    def __init__(self, study: str, model: str, trial_source: VariantSource | SearcherSource) -> None:
        self._study, self._model = study, model
        self._trial_source = trial_source

    @property
    def remaining(self) -> float:
        return self._trial_source.remaining

    def next_trial(self) -> tuple[str, dict[str, Any]] | str | None:
        proposed = self._trial_source.next_trial()
        if proposed is None or proposed == WAIT:
            return proposed
        # The model is part of every config: trials of different models share nothing.
        return f"{self._study}/{proposed[0]}", {**proposed[1], "model": self._model}

    def on_result(self, trial_id: str, result: dict[str, Any]) -> None:
        self._trial_source.on_result(trial_id.partition("/")[2], result)

    def on_complete(self, trial_id: str, result: dict[str, Any] | None, error: bool = False) -> None:
        self._trial_source.on_complete(trial_id.partition("/")[2], result, error=error)


class _Driver:
    """Admits trials, feeds answered requests to each study's scheduler and
    applies its decisions to the plan through each study's
    `planning.lifecycle.TrialLifecycle` (the controller's, without Ray)."""

    def __init__(
        self,
        plan: SearchPlan,
        studies: list[StudyDefinition],
        share: bool,
        seconds: Callable[[PlanNode, int], float],
        workers: int,
    ) -> None:
        self.plan, self.share, self.seconds = plan, share, seconds
        self.workers = workers  # of the run: with a pending-trial limit, live trials stay below it plus the limit
        self.trials: dict[str, _Trial] = {}
        self.lifecycles: dict[str, TrialLifecycle] = {}
        self.outcomes = {study.name: StudyOutcome() for study in studies}
        self.studies = {study.name: study for study in studies}
        self._final: set[str] = set()  # best trials training their final iterations
        self.finals: list[FinalTraining] = []  # what each study's best trial trains after its study
        self._pending_limits: dict[str, int | None] = {}  # trials of a study that may wait for a worker (None: any)
        for study in studies:
            scheduler = study.scheduler() if study.scheduler is not None else None
            host = SchedulerHost(scheduler, study.profile.metric, study.mode, study.horizon, on_stop=self.stop)
            trial_source = study.trial_source()
            self._pending_limits[study.name] = trial_source.pending_limit(
                study.max_pending_trials, study.max_concurrent_trials
            )
            self.lifecycles[study.name] = TrialLifecycle(
                plan,
                host,
                _StudyTrialSource(study.name, study.profile.name, trial_source),
                self._share_key,
                host.next_decision,
                self._requested,
                self._ended,
            )

    @property
    def order_sensitive(self) -> bool:
        """Whether a study's scheduler compares trials, so that the runtime
        would run them in admission order (as the controller decides)."""
        return any(lifecycle.host.order_sensitive for lifecycle in self.lifecycles.values())

    def _share_key(self, trial_id: str) -> str:
        # One share key for every study when sharing (studies of one model
        # share stages); a key per trial gives each its own tree.
        return "shared" if self.share else trial_id

    # -- admission -------------------------------------------------------------

    def admit(self) -> bool:
        """Admit each study's next trials, as the controller does; True if any."""
        admitted = False
        for name, study in self.studies.items():
            lifecycle = self.lifecycles[name]
            pending_limit = self._pending_limits[name]
            while not lifecycle.full(study.max_concurrent_trials) and not lifecycle.pending_full(
                pending_limit, self.workers
            ):
                trial = lifecycle.admit_next(
                    lambda trial_id, config, _, study=study: _Trial(trial_id=trial_id, config=config, study=study)
                )
                if trial is None:
                    break
                self.trials[trial.trial_id] = trial
                admitted = True
        return admitted

    def _requested(self, trial: Trial, request: Request, iteration: int) -> None:
        """The trial is requested further: the plan may already hold the
        answer (another trial trained that path)."""
        if request.answered:
            self._report(trial, request.iteration)

    # -- results -------------------------------------------------------------------

    def on_answered(self, requests: list[Request], now: float) -> None:
        """`Simulation.run`'s hook. Answers of one instant reach the
        schedulers in trial-id order, so a scheduler sees the same sequence
        whether or not the stages were shared."""
        answered = sorted({(trial_id, request.iteration) for request in requests for trial_id in request.trials})
        for trial_id, iteration in answered:
            trial = self.trials[trial_id]
            if trial_id in self._final:
                self._final.discard(trial_id)
            elif trial.status in LIVE and self.plan.trials[trial_id].request.iteration == iteration:
                self._report(trial, iteration)
        self.admit()
        self._final_training(now)

    def _report(self, trial: _Trial, iteration: int) -> None:
        study, lifecycle = trial.study, self.lifecycles[trial.study.name]
        node = self.plan.trials[trial.trial_id].request.node
        row = {"training_iteration": iteration, study.profile.metric: node.metrics[iteration][study.profile.metric]}
        lifecycle.record(trial, iteration, row)
        self._feed_trial_source(trial, iteration)
        if iteration >= study.horizon:
            outcome = self.outcomes[study.name]
            outcome.finished.add(trial.trial_id)
            outcome.finishes.append((self._trained_seconds(), row[study.profile.metric]))
            lifecycle.finish(trial)
            return
        lifecycle.decide(trial, iteration, row)
        lifecycle.resume()

    def stop(self, trial_id: str) -> None:
        """The scheduler stopped the trial: nothing more is requested for it;
        the plan keeps its last answered iteration for the accounting."""
        trial = self.trials[trial_id]
        self.lifecycles[trial.study.name].stop(trial)

    def _ended(self, trial: _Trial) -> None:
        outcome = self.outcomes[trial.study.name]
        if trial.trial_id not in outcome.finished:
            outcome.stopped.add(trial.trial_id)

    # -- the study's trial source sees what a searcher in the runtime sees -----------------

    def _feed_trial_source(self, trial: _Trial, iteration: int) -> None:
        """Every iteration's result up to ``iteration``, once and in order (the
        plan holds them all: the simulated workers record each iteration)."""
        metric = trial.study.profile.metric
        trial_source = self.lifecycles[trial.study.name].trial_source
        for at, metrics in self.plan.history(trial.trial_id).items():
            if trial.reported_iteration < at <= iteration:
                trial_source.on_result(trial.trial_id, {"training_iteration": at, metric: metrics[metric]})
        trial.reported_iteration = max(trial.reported_iteration, iteration)

    def _trained_seconds(self) -> float:
        """GPU-seconds of every iteration trained so far (each once)."""
        return sum(self.seconds(node, at - 1) for node in self.plan.nodes for at in node.metrics)

    # -- the end -----------------------------------------------------------------------

    def _final_training(self, now: float) -> None:
        """A study with nothing left to run at ``now``: its search ended;
        its best trial trains ``final_iterations`` more (once)."""
        for name, study in self.studies.items():
            outcome, lifecycle = self.outcomes[name], self.lifecycles[name]
            if outcome.best_trial is not None or lifecycle.trial_source.remaining:
                continue
            if lifecycle.live():
                continue
            scored = [t for t in lifecycle.trials.values() if t.rows]
            if not scored:
                continue
            sign = 1 if study.mode == "max" else -1
            metric = study.profile.metric
            best = max(scored, key=lambda t: (max(t.rows), sign * t.last_row[metric], t.trial_id))
            outcome.best, outcome.best_trial = best.last_row[metric], best.trial_id
            outcome.search_seconds = now
            if study.final_iterations:
                # Past its study's end: not live, and no scheduler stops it.
                if best.status != TERMINATED:
                    lifecycle.close(best)
                request = self.plan.extend_trial(best.trial_id, max(best.rows) + study.final_iterations)
                if not request.answered:
                    self._final.add(best.trial_id)
                    self.finals.append(FinalTraining(tuple(lifecycle.trials), best.trial_id, max(best.rows)))


def simulate(
    studies: list[StudyDefinition],
    gpus: int,
    share: bool = True,
    policy: str | ExecutionPolicy = "critical_path",
    batch_stages: bool | None = None,
    metrics: Callable[[PlanNode, int], Mapping[str, float]] | None = None,
    look_ahead: bool = True,
    trial_order: bool | None = None,
) -> StudyRun:
    """Run ``studies`` together in one plan on ``workers`` simulated GPUs.

    Parameters
    ----------
    studies:
        The studies; several make a multi-study run (they share stages
        across studies when ``share``).
    gpus:
        Simulated GPUs; a worker holds the ``gpus_per_trial`` of the model.
    share:
        Stage-based execution (True) or trial-based: every trial in a tree of
        its own, nothing shared, same schedulers and policy.
    policy, batch_stages:
        Execution policy: a name ("critical_path", "thr", "bfs", or a
        time-sharing one: "hermes", "round_robin", "slaq", "fifo") and whether
        it dispatches whole root-to-leaf paths (default: the policy's own),
        or an `ExecutionPolicy` instance (copied; ``batch_stages`` is its own).
    metrics:
        What a trial reports after ``iteration`` iterations of ``node``
        (default: the profiles' learning curves), e.g. real training.
    look_ahead:
        Tell the policy the studies' horizon, as the runtime does (critical
        path then counts how far a trial requested short of it may go);
        False compares with a policy that does not know it.
    trial_order:
        Ready batches go by the oldest trial they serve, the policy's
        priority only breaking ties (`ExecutionPolicy.admission_order`).
        None (default): as the runtime runs them, in that order when a
        study's scheduler compares trials (ASHA, HyperBand, median stopping,
        PBT: `SchedulerHost.order_sensitive`), as Tune runs its trials, and
        in the policy's own order otherwise. False: always the policy's own
        order, as the thesis compares policies.

    Examples
    --------
    >>> from ray_stagetree import MultiStep
    >>> trials = [{"lr": MultiStep(0.1, [m], 0.1)} for m in (5, 8)]
    >>> run = simulate([StudyDefinition("s", trials, RESNET20, horizon=10)], gpus=2)
    >>> run.result.iterations, run.explored_merge_rate
    (15, 1.3333333333333333)
    """
    names = [study.name for study in studies]
    if len(set(names)) != len(names):
        raise ValueError(f"study names must be unique, got {names}")
    profiles = {study.profile.name: study.profile for study in studies}
    per_worker = {profile.gpus_per_trial for profile in profiles.values()}
    if len(per_worker) != 1:
        raise ValueError(f"studies of one run must use the same GPUs per trial, got {sorted(per_worker)}")
    gpus_per_worker = per_worker.pop()
    if gpus < gpus_per_worker:
        raise ValueError(f"{gpus} GPUs cannot hold one trial of {gpus_per_worker}")
    # Checkpoint costs are the cluster's: the largest model's bound them.
    load = max(profile.checkpoint_load_seconds for profile in profiles.values())
    save = max(profile.checkpoint_save_seconds for profile in profiles.values())
    curves = Curves(profiles)
    simulation = Simulation(
        gpus // gpus_per_worker,
        seconds_per_iteration=curves.seconds,
        checkpoint_load_seconds=load,
        checkpoint_save_seconds=save,
        metrics=metrics or curves.metrics,
    )
    plan = SearchPlan()
    driver = _Driver(plan, studies, share, curves.seconds, simulation.workers)
    driver.admit()
    execution = simulation.policy(policy, batch_stages)
    if look_ahead:
        execution.set_horizon(max(study.horizon for study in studies))
    in_trial_order = driver.order_sensitive if trial_order is None else trial_order
    if in_trial_order:
        execution.admission_order()
    if isinstance(execution, TimeSharingPolicy):  # its priorities read the (first) study's metric
        execution.set_metric(studies[0].profile.metric, studies[0].mode)
    result = simulation.run(plan, execution, on_answered=driver.on_answered, on_dispatched=driver.admit)
    unique = plan.unique_iterations()
    rate = plan.total_iterations() / unique if unique else 1.0
    bound = simulation.trained_bound(plan, driver.finals)
    return StudyRun(result, driver.outcomes, rate, gpus_per_worker, bound / 3600)
