"""StructuredBO: Bayesian optimisation that knows trials are paths of a stage tree.

The seed paper (Dalibard et al., "Tuning the scheduling of distributed SGD
with Bayesian optimization") converges in a third of generic BO's
iterations by modelling the objective along the system's known structure.
Here the structure is the stage tree:

* a trial's metric after ``k`` iterations depends only on its
  hyper-parameter values in iterations ``0 .. k-1``, so one model of
  "schedule prefix -> metric" (`PrefixSurrogate`: a parametric learning
  curve plus a GP on prefix features) learns from every intermediate result
  of every trial, finished, running or stopped, not only from final ones;
* a candidate that shares a prefix with trials already measured has a
  known metric at its fork point: its forecast is that measurement plus the
  modelled change after the fork;
* a candidate that shares a prefix with trials already trained or requested
  costs only its unshared iterations (`SearchPlan.covered_iterations` on
  the searcher's own plan of what it suggested, with stopped trials cut to
  where they stopped).

Each suggestion maximises Monte-Carlo expected improvement per unit of cost
(``EI / unique_iterations ** cost_exponent``) over random candidates and
neighbours of the trials so far (moving a few parameters keeps the prefix
the others decide, so neighbours are often cheap). Several trials running
at once are fantasised at their forecast mean (kriging believer), which
also raises the incumbent, so a batch spreads out instead of collapsing
onto one point.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import numpy as np
from ray.tune.search import Searcher

from ray_stagetree.planning.config import TrialConfig
from ray_stagetree.planning.plan import SearchPlan
from ray_stagetree.searchers.space import LeafSpace
from ray_stagetree.searchers.surrogate import Anchor, PrefixSurrogate
from ray_stagetree.validation import Int, Real, check, is_finite_number


class StructuredBO(Searcher):
    """Structured-surrogate Bayesian optimisation over hyper-parameter sequences.

    Parameters
    ----------
    space:
        Search space (Tune domains, sequences with Tune domains as
        parameters); None to take the Tuner's ``param_space``.
    metric, mode:
        As every Tune searcher; None to take ``TuneConfig``'s.
    horizon:
        Iterations a trial trains: the surrogate forecasts the metric there,
        and costs are unique iterations out of it. None (the default) takes
        it from the study, as Tune hands it to every searcher: the
        ``training_iteration`` of ``RunConfig(stop=...)`` (a dict or a
        ``MaximumIterationStopper``), or the scheduler's ``max_t`` (ASHA,
        HyperBand), the smaller where both are set. A study with neither has
        open-ended trials (they end themselves, or a ``Stopper`` ends
        them): the horizon is then the longest trial completed so far (one
        that ended in an error does not count), suggestions are random until
        the first trial completes, and the model is refitted, with every
        result kept, whenever a longer trial completes.
    num_initial:
        Trials drawn at random before the model proposes (it also draws at
        random while nothing has been measured).
    num_candidates:
        Candidates scored per suggestion: half drawn at random, half
        neighbours of the trials suggested so far.
    num_samples:
        Monte-Carlo draws per candidate for the expected improvement.
    cost_exponent:
        Expected improvement is divided by ``unique_iterations **
        cost_exponent``: 1 is improvement per iteration, 0 ignores cost.
    max_points:
        Most measured points the GP is trained on (its cost grows as their
        cube): the horizon's and each trial's latest are kept, then a
        geometric grid of iterations.
    seed:
        Seeds candidates, Monte-Carlo draws and the GP's restarts.

    Examples
    --------
    >>> from ray import tune
    >>> from ray_stagetree import MultiStep
    >>> searcher = StructuredBO(
    ...     {"lr": MultiStep(tune.loguniform(1e-3, 1.0), [tune.randint(5, 25)], tune.loguniform(0.01, 0.5))},
    ...     metric="accuracy", mode="max", horizon=30, seed=0)
    >>> sorted(searcher.suggest("t0")["lr"])
    ['family', 'gamma', 'init', 'milestones', 'values']

    Pass it as ``TuneConfig(search_alg=StructuredBO(), num_samples=40,
    max_concurrent_trials=4)`` to `ray_stagetree.Tuner`, with the space as the
    Tuner's ``param_space`` and ``RunConfig(stop={"training_iteration": 30})``.
    """

    def __init__(
        self,
        space: Mapping[str, Any] | None = None,
        metric: str | None = None,
        mode: str | None = None,
        *,
        horizon: int | None = None,
        num_initial: int = 5,
        num_candidates: int = 256,
        num_samples: int = 128,
        cost_exponent: float = 1.0,
        max_points: int = 200,
        seed: int | None = None,
    ) -> None:
        if mode not in (None, "min", "max"):
            raise ValueError(f"StructuredBO: mode must be 'min' or 'max', got {mode!r}")
        if horizon is not None:
            _check_horizon(horizon, "horizon")
        for name, value, low in (
            ("num_initial", num_initial, 1),
            ("num_candidates", num_candidates, 2),
            ("num_samples", num_samples, 1),
            ("max_points", max_points, 10),
        ):
            check(f"StructuredBO: {name}", value, Int(low=low))
        check("StructuredBO: cost_exponent", cost_exponent, Real(low=0, high=4))
        check("StructuredBO: seed", seed, Int(), None)
        super().__init__(metric=metric, mode=mode)
        self.horizon = horizon  # None until the study gives it (see the class docstring)
        # Whether the horizon is the longest trial completed so far (open-ended trials).
        self._learns_horizon = False
        self.num_initial = num_initial
        self.num_candidates = num_candidates
        self.num_samples = num_samples
        self.cost_exponent = float(cost_exponent)
        self.max_points = max_points
        self.seed = seed
        self._rng = np.random.default_rng(seed)
        self._space: LeafSpace | None = None
        self._plan = SearchPlan()
        self._leaves: dict[str, list[Any]] = {}
        self._running: set[str] = set()
        # trial id -> {iteration: metric} for every result, beyond the horizon
        # too: a learned horizon grows, and the plan is rebuilt from these.
        self._reported: dict[str, dict[int, float]] = {}
        # trial id -> the last iteration it reported ("step": the name study snapshots pickled)
        self._last_step: dict[str, int] = {}
        self._errored: set[str] = set()  # trials that ended in an error: no natural end, for a learned horizon
        self._model: PrefixSurrogate | None = None  # None: results arrived since the last fit
        self._previous_model: PrefixSurrogate | None = None
        if space is not None:
            self._space = LeafSpace(space, "StructuredBO")

    # -- Tune's Searcher interface ---------------------------------------------

    def set_search_properties(self, metric: str | None, mode: str | None, config: dict, **spec: Any) -> bool:
        if self.horizon is None and not self._leaves:
            self.horizon = study_horizon(spec)
            self._learns_horizon = self.horizon is None
        if self._space is not None:
            return False
        if mode not in (None, "min", "max"):
            raise ValueError(f"StructuredBO: mode must be 'min' or 'max', got {mode!r}")
        self._space = LeafSpace(config, "StructuredBO")
        self._metric = self._metric or metric
        self._mode = self._mode or mode
        return True

    def suggest(self, trial_id: str) -> dict[str, Any] | None:
        if self._space is None:
            raise RuntimeError(
                "StructuredBO has no search space: pass space=... or use it through a Tuner's param_space"
            )
        if self._metric is None or self._mode is None:
            raise RuntimeError("StructuredBO needs metric and mode: pass them to it or to TuneConfig")
        if self.horizon is None and not self._learns_horizon:
            # Used outside a Tuner with no horizon given: trials are open-ended.
            self._learns_horizon = True
        modelled = self.horizon is not None and any(node.metrics for node in self._plan.nodes)
        if len(self._leaves) < self.num_initial or not modelled:
            leaves, config = self._draw()
        else:
            leaves, config = self._propose()
        self._leaves[trial_id] = leaves
        self._running.add(trial_id)
        if self.horizon is not None:
            self._plan.add_trial(trial_id, config, self.horizon)
        return self._space.resolved(leaves)

    def on_trial_result(self, trial_id: str, result: dict[str, Any]) -> None:
        iteration, value = result.get("training_iteration"), result.get(self._metric)
        if (
            trial_id not in self._running
            or not is_finite_number(value)
            or not isinstance(iteration, int)
            or iteration < 1
        ):
            return
        self._reported.setdefault(trial_id, {})[iteration] = float(value)
        self._last_step[trial_id] = max(iteration, self._last_step.get(trial_id, 0))
        if self.horizon is not None and iteration <= self.horizon:
            self._record(trial_id, iteration, float(value))

    def on_trial_complete(self, trial_id: str, result: dict[str, Any] | None = None, error: bool = False) -> None:
        if trial_id not in self._running:
            return
        if result:
            self.on_trial_result(trial_id, result)
        self._running.discard(trial_id)
        if error:
            self._errored.add(trial_id)
        last = self._last_step.get(trial_id, 0)
        if self._learns_horizon and not error and last > (self.horizon or 0):
            # An open-ended trial ended itself: the study's trials run at least this long.
            self.horizon = last
            self._rebuild_plan()
        elif self.horizon is not None:
            self._end_in_plan(trial_id)

    def _record(self, trial_id: str, iteration: int, value: float) -> None:
        node = self._plan.locate(self._plan.trials[trial_id].config, iteration)
        self._plan.record_metrics(node.node_id, iteration, {self._metric: value})
        self._model = None

    def _end_in_plan(self, trial_id: str) -> None:
        """What a trial never trained is not shared with anyone: its request
        ends where it stopped (early stopping, an error)."""
        last = min(self._last_step.get(trial_id, 0), self.horizon)
        if last == 0:
            self._plan.remove_trial(trial_id)
        elif last < self.horizon:
            self._plan.extend_trial(trial_id, last)

    def _rebuild_plan(self) -> None:
        """The plan of every trial suggested so far, at the current horizon."""
        self._plan = SearchPlan()
        self._model = self._previous_model = None  # fitted for another horizon
        for trial_id, leaves in self._leaves.items():
            self._plan.add_trial(trial_id, self._space.config(leaves), self.horizon)
            for iteration, value in sorted(self._reported.get(trial_id, {}).items()):
                if iteration <= self.horizon:
                    self._record(trial_id, iteration, value)
            if trial_id not in self._running:
                self._end_in_plan(trial_id)

    # -- the model ------------------------------------------------------------------

    @property
    def _sign(self) -> float:
        return 1.0 if self._mode == "max" else -1.0

    def _measured(self) -> list[tuple[TrialConfig, int, float]]:
        """Every measured ``(prefix config, iteration, signed value)`` of the plan,
        at most ``max_points`` of them (see the class docstring)."""
        grid = set(np.unique(np.geomspace(1, self.horizon, 12).round().astype(int)).tolist())
        kept, spare = [], []
        for node in self._plan.nodes:
            latest = max(node.metrics, default=0)
            for iteration, metrics in node.metrics.items():
                point = (node.config, iteration, self._sign * metrics[self._metric])
                (kept if iteration in grid or iteration == latest else spare).append(point)
        kept.sort(key=lambda point: -point[1])  # the horizon's first
        if len(kept) > self.max_points:
            return kept[: self.max_points]
        extra = self.max_points - len(kept)
        if len(spare) > extra:
            spare = [spare[i] for i in self._rng.choice(len(spare), extra, replace=False)]
        return kept + spare

    def _surrogate(self) -> PrefixSurrogate:
        if self._model is None:
            surrogate = PrefixSurrogate(self.horizon, seed=int(self._rng.integers(2**31)))
            self._model = surrogate.fit(self._measured(), previous=self._previous_model)
            self._previous_model = self._model
        return self._model

    def _anchor(self, config: TrialConfig) -> Anchor | None:
        """The last measured point of the plan that ``config`` shares."""
        path, shared = self._plan.follow(config, self.horizon)
        best = None
        for node, successor in zip(path, path[1:] + [None]):
            limit = shared if successor is None else successor.fork_iteration
            for iteration, metrics in node.metrics.items():
                if node.fork_iteration < iteration <= limit and (best is None or iteration > best[0]):
                    best = (iteration, metrics[self._metric])
        return None if best is None else Anchor(best[0], self._sign * best[1])

    def _draw(self) -> tuple[list[Any], TrialConfig]:
        """A random candidate the sequences accept."""
        for _ in range(100):
            candidates = self._planned(self._space.sample(self._rng))
            if candidates[0]:
                return candidates[0][0], candidates[1][0]
        raise ValueError(
            "StructuredBO: 100 random draws from the search space all gave sequences that refuse their "
            "parameters (e.g. milestones out of order); narrow the domains"
        )

    def _propose(self) -> tuple[list[Any], TrialConfig]:
        model = self._surrogate()
        running = [self._plan.trials[trial_id].config for trial_id in sorted(self._running)]
        anchors = [self._anchor(config) for config in running]
        believed, _ = model.forecast(running, anchors) if running else (np.array([]), None)
        finals = [
            self._sign * node.metrics[self.horizon][self._metric]
            for node in self._plan.nodes
            if self.horizon in node.metrics
        ]
        model = model.condition(
            [
                (config, self.horizon, value)
                for config, anchor, value in zip(running, anchors, believed)
                if anchor is None or anchor.iteration < self.horizon
            ]
        )
        leaves, configs = self._candidates(model)
        covered = np.array(self._plan.covered_iterations(configs, self.horizon))
        fresh = covered < self.horizon  # a copy of a suggested trial teaches nothing
        if not fresh.any():
            return self._draw()
        leaves = [leaf for leaf, keep in zip(leaves, fresh) if keep]
        configs = [config for config, keep in zip(configs, fresh) if keep]
        draws = model.sample(configs, [self._anchor(c) for c in configs], self.num_samples, self._rng)
        incumbent = max([*finals, *believed]) if finals or len(believed) else float(draws.mean(axis=1).max())
        improvement = np.maximum(draws - incumbent, 0.0).mean(axis=1)
        cost = (self.horizon - covered[fresh]).astype(float) ** self.cost_exponent
        # Ties (no improvement anywhere) go to the highest mean per cost.
        order = np.lexsort((draws.mean(axis=1) / cost, improvement / cost))
        return leaves[order[-1]], configs[order[-1]]

    def _candidates(self, model: PrefixSurrogate) -> tuple[list[list[Any]], list[TrialConfig]]:
        """Random draws and neighbours of suggested trials (half of those
        of the ones forecast best), as leaves and as planned configs."""
        # Trials that ended without a result have left the plan.
        suggested = [trial_id for trial_id in self._leaves if trial_id in self._plan.trials]
        if not suggested:
            return self._planned(self._space.sample(self._rng, self.num_candidates))
        configs = [self._plan.trials[t].config for t in suggested]
        mean, _ = model.forecast(configs, [self._anchor(c) for c in configs])
        best = [suggested[i] for i in np.argsort(-mean)[: max(1, len(suggested) // 5)]]
        quarter = self.num_candidates // 4
        parents = [*self._rng.choice(best, quarter), *self._rng.choice(suggested, quarter)]
        drawn = self._space.sample(self._rng, self.num_candidates - len(parents))
        return self._planned(drawn + [self._space.neighbour(self._leaves[p], self._rng) for p in parents])

    def _planned(self, candidates: list[list[Any]]) -> tuple[list[list[Any]], list[TrialConfig]]:
        """The candidates whose sequences accept their parameters, with their planned configs."""
        leaves, planned = [], []
        for candidate in candidates:
            try:
                config = TrialConfig.from_config(self._space.config(candidate))
            except (TypeError, ValueError):  # a combination the sequence refuses (e.g. milestones out of order)
                continue
            leaves.append(candidate)
            planned.append(config)
        return leaves, planned

    # -- persistence ------------------------------------------------------------------

    def save(self, checkpoint_path: str) -> None:
        """Write the searcher's state as JSON (no pickle): its suggestions,
        what it measured of them, its random state and a learned horizon."""
        trials = [
            {
                "trial_id": trial_id,
                "leaves": leaves,
                "running": trial_id in self._running,
                "error": trial_id in self._errored,
                "metrics": {str(at): value for at, value in self._reported.get(trial_id, {}).items()},
            }
            for trial_id, leaves in self._leaves.items()
        ]
        state = {
            "metric": self._metric,
            "mode": self._mode,
            "rng": self._rng.bit_generator.state,
            "trials": trials,
            "horizon": self.horizon,
            "learns_horizon": self._learns_horizon,
        }
        with open(checkpoint_path, "w") as file:
            json.dump(state, file)

    def restore(self, checkpoint_path: str) -> None:
        """Read a state `save` wrote; the search space must be set (given to
        the constructor, or the Tuner's) before the trials are replayed."""
        if self._space is None:
            raise RuntimeError("StructuredBO.restore needs the search space first: pass space=... to the constructor")
        with open(checkpoint_path) as file:
            state = json.load(file)
        self._metric, self._mode = state["metric"], state["mode"]
        self._rng.bit_generator.state = state["rng"]
        if state.get("learns_horizon"):
            self.horizon, self._learns_horizon = state["horizon"], True
        for trial in state["trials"]:
            trial_id = trial["trial_id"]
            self._leaves[trial_id] = trial["leaves"]
            self._running.add(trial_id)
            if self.horizon is not None:
                self._plan.add_trial(trial_id, self._space.config(trial["leaves"]), self.horizon)
            for iteration, value in sorted(trial["metrics"].items(), key=lambda item: int(item[0])):
                self.on_trial_result(trial_id, {"training_iteration": int(iteration), self._metric: value})
            if not trial["running"]:
                self.on_trial_complete(trial_id, error=trial.get("error", False))


def study_horizon(spec: Mapping[str, Any]) -> int | None:
    """The iterations a study's trials run, from what Tune gives a searcher's
    ``set_search_properties`` (``stop``: a dict or a
    ``MaximumIterationStopper``) and ``max_t`` (the scheduler's, given by
    ray_stagetree's Tuner): the smaller of those set, None for neither."""
    from ray.tune.stopper import MaximumIterationStopper

    stop, ends = spec.get("stop"), []
    if isinstance(stop, Mapping) and stop.get("training_iteration") is not None:
        ends.append(_check_horizon(stop["training_iteration"], "stop['training_iteration']"))
    elif type(stop) is MaximumIterationStopper:
        ends.append(_check_horizon(stop._max_iter, "MaximumIterationStopper(max_iter)"))
    if spec.get("max_t") is not None:
        ends.append(_check_horizon(spec["max_t"], "the scheduler's max_t"))
    return min(ends, default=None)


def _check_horizon(value: Any, name: str) -> int:
    """``value`` as a horizon (an int >= 1; a float that is one, as Tune's
    schedulers keep ``max_t``), or a ValueError naming it."""
    whole = isinstance(value, (int, float, np.number)) and not isinstance(value, bool) and float(value).is_integer()
    if not whole or value < 1:
        raise ValueError(f"StructuredBO: {name} must be an int >= 1, got {value!r} (the iterations a trial trains)")
    return int(value)
