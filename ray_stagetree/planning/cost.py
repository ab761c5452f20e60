"""Per-iteration cost estimates for the execution policy (thesis section 5.2).

Hyper-parameters change how long an iteration takes (a larger batch size means
fewer, longer steps), so the estimate is a linear regression of observed
seconds per iteration on the stage's hyper-parameter values: numeric values
enter as their mean over the stage, categorical ones as one-hot fractions.
Because the model is linear, the mean over a stage predicts the stage's mean
cost exactly, however the values change inside it. With no observations every
iteration costs one unit, as in the thesis.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:
    from ray_stagetree.planning.plan import PlanNode, SearchPlan


def stage_features(node: PlanNode, start: int, stop: int) -> dict[str, float]:
    """Mean hyper-parameter values of ``node`` over ``[start, stop)``."""
    features: dict[str, float] = {}
    for name, sequence in zip(node.config.names, node.config.sequences):
        values = sequence.values(start, stop)
        if values.dtype.kind in "biuf":
            features[name] = float(values.mean())
        else:
            for value, count in zip(*np.unique(values.astype(str), return_counts=True)):
                features[f"{name}={value}"] = count / len(values)
    return features


#: Below this many timings the model refits at every new one; above, once
#: their number has grown by `REFIT_GROWTH`, so that a study of n stages
#: refits O(log n) times (a refit reorders every open stage).
REFIT_ALWAYS_BELOW = 8
REFIT_GROWTH = 2.0


class CostModel:
    """Seconds per iteration, fitted to a plan's recorded timings.

    Parameters
    ----------
    default_seconds_per_iteration:
        Estimate used before any timing is recorded.
    ridge:
        L2 penalty keeping the fit stable when features are collinear or the
        observations are few.

    Examples
    --------
    >>> model = CostModel().fit(plan)          # doctest: +SKIP
    >>> model.stage_seconds(node, 0, 100)      # doctest: +SKIP
    """

    def __init__(self, default_seconds_per_iteration: float = 1.0, ridge: float = 1e-3) -> None:
        if not default_seconds_per_iteration > 0:
            raise ValueError(f"default_seconds_per_iteration must be > 0, got {default_seconds_per_iteration!r}")
        if not ridge >= 0:
            raise ValueError(f"ridge must be >= 0, got {ridge!r}")
        self.default_seconds_per_iteration = float(default_seconds_per_iteration)
        self.ridge = float(ridge)
        self._feature_names: list[str] = []
        self._coefficients: np.ndarray | None = None
        self._floor = self.default_seconds_per_iteration
        self._fitted_on = 0
        # Feature rows of the timings seen so far (a plan's timings only grow),
        # and of the stages estimated (a node's values over a range never change).
        self._timings: list | None = None
        self._rows: list[dict[str, float]] = []
        self._features: dict[tuple[int, int, int], dict[str, float]] = {}
        self.fits = 0
        """How many times the model was fitted: its estimates change only then."""
        self.min_new_timings = 0
        """Fewest new timings a refit waits for: a policy that re-prices that many ready batches after each
        refit sets it to their number, so that it pays for them once per as many timings, whatever the
        study's size."""

    @property
    def is_fitted(self) -> bool:
        return self._coefficients is not None

    def fit(self, plan: SearchPlan) -> CostModel:
        """Regress seconds per iteration on stage features; refits only when
        new timings arrived (past `REFIT_ALWAYS_BELOW` of them, when their
        number grew by `REFIT_GROWTH`), and, once fitted, at least
        `min_new_timings` of them."""
        timings = plan.timings
        if timings is not self._timings:  # another plan
            self._timings, self._rows, self._fitted_on = timings, [], 0
            self._features = {}
        if len(timings) == self._fitted_on:
            return self
        if self._fitted_on >= REFIT_ALWAYS_BELOW and len(timings) < self._fitted_on * REFIT_GROWTH:
            return self
        if self.is_fitted and len(timings) - self._fitted_on < self.min_new_timings:
            return self
        self._fitted_on = len(timings)
        self.fits += 1
        self._rows += [self._stage_features(plan.nodes[t.node_id], t.start, t.stop) for t in timings[len(self._rows) :]]
        rows = self._rows
        targets = np.array([t.seconds / (t.stop - t.start) for t in timings])
        names = sorted({name for row in rows for name in row})
        values = np.array([[row.get(name, 0.0) for name in names] for row in rows]).reshape(len(rows), len(names))
        # A feature equal in every timing says nothing of cost (centred, its column is zero): left out, so a
        # config's thousands of constant entries cost nothing here.
        scales = values.std(axis=0)
        varying = scales > 0
        names, values, scales = (
            [name for name, kept in zip(names, varying) if kept],
            values[:, varying],
            scales[varying],
        )
        # Centre features so the ridge penalty shrinks slopes, never the mean cost.
        means = values.mean(axis=0)
        design = np.hstack([np.ones((len(rows), 1)), (values - means) / scales])
        # Ridge as least squares on rows augmented with sqrt(ridge) * I; lstsq
        # also copes with collinear features (one-hot columns summing to one).
        penalty = np.sqrt(self.ridge) * np.eye(design.shape[1])[1:]
        solution, *_ = np.linalg.lstsq(
            np.vstack([design, penalty]), np.concatenate([targets, np.zeros(len(penalty))]), rcond=None
        )
        self._feature_names = names
        self._means, self._scales = means, scales
        self._coefficients = solution
        # A linear fit can extrapolate below zero; no iteration is free.
        self._floor = max(float(targets.min()) * 0.1, 1e-9)
        return self

    def seconds_per_iteration(self, node: PlanNode, start: int, stop: int) -> float:
        if self._coefficients is None:
            return self.default_seconds_per_iteration
        return self.predict(self._stage_features(node, start, stop))

    def predict(self, features: dict[str, float]) -> float:
        """Seconds per iteration of a stage with these `stage_features`
        (of any plan's node: the fitted plan's node ids are not involved)."""
        if self._coefficients is None:
            return self.default_seconds_per_iteration
        x = np.array([features.get(name, 0.0) for name in self._feature_names])
        x = (x - self._means) / self._scales
        prediction = self._coefficients[0] + float(x @ self._coefficients[1:])
        return max(prediction, self._floor)

    def _stage_features(self, node: PlanNode, start: int, stop: int) -> dict[str, float]:
        key = (node.node_id, start, stop)
        features = self._features.get(key)
        if features is None:
            features = self._features[key] = stage_features(node, start, stop)
        return features

    def stage_seconds(self, node: PlanNode, start: int, stop: int) -> float:
        return (stop - start) * self.seconds_per_iteration(node, start, stop)


def recompute_seconds(node: PlanNode, iteration: int) -> float:
    """What losing the checkpoint at ``(node, iteration)`` costs: the seconds the
    plan measured (``time_this_iter_s``) for the iterations since the
    previous checkpoint on the path to it, or since initialization without
    one. That is what retraining it would take; the eviction rule prices a
    checkpoint by it (DESIGN: recompute cost x expected reuse / size).
    Iterations with no measured time count one second each, the cost
    model's unit before any timing exists."""
    seconds = 0.0
    current: PlanNode | None = node
    latest = iteration - 1  # the latest checkpoint a retraining could start from
    while current is not None:
        previous = max((saved for saved in current.checkpoints if saved <= latest), default=current.fork_iteration)
        for done in range(previous + 1, iteration + 1):
            measured = current.metrics.get(done, {}).get("time_this_iter_s")
            seconds += float(measured) if isinstance(measured, (int, float)) and measured >= 0 else 1.0
        if previous > current.fork_iteration:
            break
        iteration = current.fork_iteration
        current = current.parent
        latest = iteration
    return seconds
