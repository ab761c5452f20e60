"""The structured surrogate behind `StructuredBO`: a trial's metric after
``k`` iterations as a function of the hyper-parameter values it saw in
iterations ``0 .. k-1``, the only thing it can depend on (DESIGN invariant 1).

Its sub-models follow the seed paper's recipe (Dalibard et al.: a
parametric form where the form is known, a Gaussian process on what the
form misses, inference on every measurement rather than on the objective
alone):

* `PrefixFeatures`: a schedule prefix becomes a short vector (``log k``;
  per hyper-parameter its value at the prefix's last iteration, its mean
  over the prefix and over the prefix's last quarter; for a categorical one
  the share of each category and the current one). Equal prefixes give
  equal vectors, so trials that share a stage share every prediction on it.
* `LearningCurvePrior`: the parametric part, ``y(k) = a + b * k ** -c``,
  fitted by least squares to every measured ``(k, metric)``.
* `PrefixSurrogate`: the prior plus a scikit-learn GP on its residuals over
  the prefix features, trained on every measured ``(prefix, k, metric)``:
  finished trials, running ones and stopped ones alike. It forecasts a
  candidate's metric at the horizon as the *measured* metric at the point
  where the candidate leaves the measured part of the plan (its fork point)
  plus the change from there to the horizon, the GP's values at both points
  drawn jointly, so a candidate that shares a long measured prefix is only
  as uncertain as its suffix. `sample` draws that forecast (forward
  sampling, for Monte-Carlo expected improvement).
"""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence as SequenceType
from dataclasses import dataclass

import numpy as np

from ray_stagetree._extras import require
from ray_stagetree.planning.config import TrialConfig


@dataclass(frozen=True)
class Anchor:
    """The last measured point a candidate shares: after ``iteration`` iterations
    of its prefix the plan holds ``value`` (already signed: larger is better)."""

    iteration: int
    value: float


class PrefixFeatures:
    """Feature vectors of schedule prefixes, scaled to [0, 1] on the
    training prefixes.

    Parameters
    ----------
    configs:
        The training trials' configurations: they decide which
        hyper-parameters are numeric (log scale when every value is
        positive) or categorical (the categories seen), and the scaling.
    horizon:
        Iterations of a full trial (``log k`` is scaled by ``log horizon``).

    Examples
    --------
    >>> from ray_stagetree import MultiStep
    >>> a = TrialConfig.from_config({"lr": MultiStep(0.1, [2], 0.1)})
    >>> features = PrefixFeatures([a], horizon=4)
    >>> features(a, [1, 4]).shape
    (2, 4)
    """

    def __init__(self, configs: SequenceType[TrialConfig], horizon: int) -> None:
        self.horizon = horizon
        self.names = configs[0].names
        self._log: dict[str, bool] = {}
        self._categories: dict[str, list] = {}
        for index, name in enumerate(self.names):
            values = np.concatenate([config.sequences[index].values(0, horizon) for config in configs])
            if values.dtype.kind in "biuf":
                numeric = values.astype(float)
                self._log[name] = bool(np.all(numeric > 0))
            else:
                self._categories[name] = sorted(set(values.tolist()), key=repr)
        self._floor = {
            name: min(float(np.min(config.sequences[index].values(0, horizon))) for config in configs)
            for index, name in enumerate(self.names)
            if self._log.get(name)
        }
        raw = np.vstack([self._raw(config, np.arange(1, horizon + 1)) for config in configs])
        self._low = raw.min(axis=0)
        span = raw.max(axis=0) - self._low
        self._span = np.where(span > 0, span, 1.0)

    def __call__(self, config: TrialConfig, iterations: SequenceType[int] | np.ndarray) -> np.ndarray:
        """One row per count in ``iterations``: the features of that many first iterations of ``config``."""
        return (self._raw(config, np.asarray(iterations, dtype=int)) - self._low) / self._span

    def _raw(self, config: TrialConfig, iterations: np.ndarray) -> np.ndarray:
        if config.names != self.names:
            raise ValueError(f"config has hyper-parameters {config.names}, the surrogate was trained on {self.names}")
        stop = int(iterations.max())
        columns = [np.log(iterations) / math.log(max(self.horizon, 2))]
        recent = np.maximum(1, np.ceil(iterations / 4).astype(int))
        for name, sequence in zip(self.names, config.sequences):
            values = sequence.values(0, stop)
            if name in self._categories:
                for category in self._categories[name]:
                    columns += _prefix_statistics((values == category).astype(float), iterations, recent)[:2]
                continue
            values = values.astype(float)
            if self._log[name]:
                values = np.log(np.maximum(values, self._floor[name]))
            columns += _prefix_statistics(values, iterations, recent)
        return np.column_stack(columns)


def _prefix_statistics(values: np.ndarray, iterations: np.ndarray, recent: np.ndarray) -> list[np.ndarray]:
    """Per prefix length: the mean, the last value and the mean of the last ``recent`` values."""
    cumulative = np.concatenate([[0.0], np.cumsum(values)])
    return [
        cumulative[iterations] / iterations,
        values[iterations - 1],
        (cumulative[iterations] - cumulative[iterations - recent]) / recent,
    ]


class LearningCurvePrior:
    """The parametric learning curve of every measured point together (the
    shape every trial's curve roughly shares): ``y(k) = a + b * (k ** p -
    1) / p``, a power law in ``k`` that tends to ``a - b / p`` for ``p < 0``
    and is ``a + b * log k`` at ``p = 0`` (the Box-Cox form: continuous in
    ``p``, so the fit has no degenerate edge where ``b`` and ``a`` trade off).

    Falls back to a constant (the mean) when there are too few distinct
    iterations, or the fit fails, to pin three parameters.

    Examples
    --------
    >>> iterations = np.arange(1, 31)
    >>> prior = LearningCurvePrior().fit(iterations, 0.9 - 0.5 * iterations ** -0.7)
    >>> round(float(prior(np.array([100]))[0]), 3)
    0.88
    """

    LOWER = (-np.inf, -np.inf, -3.0)
    UPPER = (np.inf, np.inf, 1.0)

    def fit(self, iterations: np.ndarray, values: np.ndarray) -> LearningCurvePrior:
        from scipy.optimize import curve_fit

        iterations, values = np.asarray(iterations, dtype=float), np.asarray(values, dtype=float)
        self.params = np.array([values.mean(), 0.0, 0.0])
        if len(np.unique(iterations)) < 4:
            return self
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                params, _ = curve_fit(
                    _power_law,
                    iterations,
                    values,
                    p0=[values[iterations == iterations.min()].mean(), 0.0, -0.5],
                    bounds=(self.LOWER, self.UPPER),
                    maxfev=2000,
                )
        except (RuntimeError, ValueError):
            return self
        if np.all(np.isfinite(params)):
            self.params = params
        return self

    def __call__(self, iterations: np.ndarray) -> np.ndarray:
        """The curve at ``iterations``."""
        return _power_law(np.asarray(iterations, dtype=float), *self.params)


def _power_law(iterations, a, b, p):
    power = np.where(np.abs(p) < 1e-6, 1e-6, p)
    return a + b * (iterations**power - 1) / power


class PrefixSurrogate:
    """`LearningCurvePrior` plus a GP on its residuals over `PrefixFeatures`.

    Parameters
    ----------
    horizon:
        Iterations of a full trial: forecasts are of the metric after it.
    seed:
        Seeds the GP's hyper-parameter restarts.

    Values are signed so that larger is better (the searcher negates a
    metric it minimises).

    Examples
    --------
    >>> from ray_stagetree import Constant
    >>> configs = [TrialConfig.from_config({"lr": Constant(lr)}) for lr in (0.01, 0.1, 1.0)]
    >>> points = [(c, k, -abs(np.log10(c.sequences[0].value(0)) + 1) - 1 / k) for c in configs for k in (1, 2, 5, 10)]
    >>> model = PrefixSurrogate(horizon=10, seed=0).fit(points)
    >>> mean, std = model.forecast([TrialConfig.from_config({"lr": Constant(0.1)})])
    >>> bool(abs(mean[0] + 0.1) < 0.05)
    True
    """

    def __init__(self, horizon: int, seed: int | None = None) -> None:
        self.horizon = horizon
        self.seed = seed

    def fit(
        self, points: SequenceType[tuple[TrialConfig, int, float]], previous: PrefixSurrogate | None = None
    ) -> PrefixSurrogate:
        """Learn the prior and the GP (its kernel hyper-parameters by maximum
        likelihood) from measured ``(config, iteration, value)`` points; the
        search starts from ``previous``'s kernel when it has as many inputs
        (hyper-parameters move little from one result to the next)."""
        gaussian_process = require("sklearn.gaussian_process", "StructuredBO", "bo")
        kernels = gaussian_process.kernels
        GaussianProcessRegressor = gaussian_process.GaussianProcessRegressor
        ConstantKernel, Matern, WhiteKernel = kernels.ConstantKernel, kernels.Matern, kernels.WhiteKernel

        configs = _distinct(config for config, _, _ in points)
        self.features = PrefixFeatures(configs, self.horizon)
        iterations = np.array([iteration for _, iteration, _ in points], dtype=float)
        values = np.array([value for _, _, value in points], dtype=float)
        self.prior = LearningCurvePrior().fit(iterations, values)
        inputs = self._inputs(points)
        dimensions = inputs.shape[1]
        kernel = ConstantKernel(1.0, (1e-3, 1e3)) * Matern(np.ones(dimensions), (1e-2, 1e2), nu=2.5) + WhiteKernel(
            1e-2, (1e-6, 1.0)
        )
        restarts = 1
        if previous is not None and previous.gp.kernel_.n_dims == kernel.n_dims:
            kernel, restarts = previous.gp.kernel_, 0
        residuals = values - self.prior(iterations)
        # Residuals are standardised once, here: the kernel's amplitude and
        # noise level keep their meaning in `condition`.
        self._shift, self._scale = residuals.mean(), residuals.std() or 1.0
        self.gp = GaussianProcessRegressor(kernel, n_restarts_optimizer=restarts, random_state=self.seed)
        self._fit_gp(inputs, residuals)
        return self

    def condition(self, points: SequenceType[tuple[TrialConfig, int, float]]) -> PrefixSurrogate:
        """A copy that also holds ``points`` (e.g. fantasies of running
        trials), with the same features, prior and kernel hyper-parameters."""
        GaussianProcessRegressor = require("sklearn.gaussian_process", "StructuredBO", "bo").GaussianProcessRegressor

        if not points:
            return self
        copy = PrefixSurrogate(self.horizon, self.seed)
        copy.features, copy.prior, copy._shift, copy._scale = self.features, self.prior, self._shift, self._scale
        iterations = np.array([iteration for _, iteration, _ in points], dtype=float)
        residuals = np.array([value for _, _, value in points]) - self.prior(iterations)
        copy.gp = GaussianProcessRegressor(self.gp.kernel_, optimizer=None)
        copy._fit_gp(np.vstack([self._inputs_seen, self._inputs(points)]), np.concatenate([self._residuals, residuals]))
        return copy

    def _fit_gp(self, inputs: np.ndarray, residuals: np.ndarray) -> None:
        self._inputs_seen, self._residuals = inputs, residuals
        with warnings.catch_warnings(), _one_blas_thread():
            warnings.simplefilter("ignore")  # a length scale at its bound: that input does not matter
            self.gp.fit(inputs, (residuals - self._shift) / self._scale)

    def _inputs(self, points: SequenceType[tuple[TrialConfig, int, float]]) -> np.ndarray:
        return np.vstack([self.features(config, [iteration]) for config, iteration, _ in points])

    def forecast(
        self, configs: SequenceType[TrialConfig], anchors: SequenceType[Anchor | None] | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Mean and standard deviation of the metric after ``horizon``
        iterations, at the prior's fitted parameters."""
        anchors = [None] * len(configs) if anchors is None else list(anchors)
        mean, std, base = self._moments(configs, anchors)
        return base + mean, std

    def sample(
        self,
        configs: SequenceType[TrialConfig],
        anchors: SequenceType[Anchor | None],
        count: int,
        rng: np.random.Generator,
    ) -> np.ndarray:
        """``count`` draws of each candidate's metric after ``horizon``
        iterations, shape ``(len(configs), count)``: its anchor's measured
        value, plus the curve's change from the anchor, plus the GP's
        residual change drawn jointly at the anchor and the horizon."""
        mean, std, base = self._moments(configs, list(anchors))
        return (base + mean)[:, None] + std[:, None] * rng.standard_normal((len(configs), count))

    def _moments(
        self, configs: SequenceType[TrialConfig], anchors: list[Anchor | None]
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """GP mean and standard deviation of the residual change from the
        anchor to the horizon, and the prior's part (the anchor's measured
        value plus the curve's change, at the fitted parameters)."""
        anchored = [index for index, anchor in enumerate(anchors) if anchor is not None]
        rows = [self.features(config, [self.horizon]) for config in configs]
        rows += [self.features(configs[index], [anchors[index].iteration]) for index in anchored]
        with _one_blas_thread():
            mean, covariance = self.gp.predict(np.vstack(rows), return_cov=True)
        mean, covariance = mean * self._scale + self._shift, covariance * self._scale**2
        # The kernel's white noise is on the diagonal: the horizon's value is
        # measured with it, the anchor's is known (the fork's model state is
        # what the candidate continues from), so it counts once.
        noise = self.gp.kernel_.k2.noise_level * self._scale**2
        count = len(configs)
        change, variance = mean[:count].copy(), np.diag(covariance)[:count].copy()
        base = np.full(count, float(self.prior(np.array([self.horizon]))[0]))
        for position, index in enumerate(anchored, start=count):
            anchor = anchors[index]
            change[index] -= mean[position]
            variance[index] += covariance[position, position] - 2 * covariance[index, position] - noise
            base[index] += anchor.value - float(self.prior(np.array([anchor.iteration]))[0])
        return change, np.sqrt(np.maximum(variance, 1e-12)), base


def _distinct(configs) -> list[TrialConfig]:
    seen: dict[int, TrialConfig] = {}
    for config in configs:
        seen.setdefault(id(config), config)
    return list(seen.values())


def _one_blas_thread():
    """A few hundred points: one BLAS thread is fastest, and threads fight
    the study's workers for the cores (threadpoolctl comes with scikit-learn)."""
    return require("threadpoolctl", "StructuredBO", "bo").threadpool_limits(1)
