"""Study results with Ray Tune's interface: a `ResultGrid` of ``ray.tune.Result``.

Each trial gets a directory under the experiment path, laid out as Tune lays
it out: the logs of Tune's logger callbacks, written on the driver
(``params.json``: the config, sequences in their declarative form;
``result.json``, ``progress.csv``, TensorBoard events), and
``checkpoint_<step>/`` (the final checkpoint). The search plan is saved beside them in ``plan/``, so a
later restore finds plan, results and checkpoints.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterator, Sequence
from typing import Any

import ray
from ray import tune

from ray_stagetree.planning.config import tabular
from ray_stagetree.runtime.workers.reproducibility import repeat_statistics
from ray_stagetree.trial_schedulers.ray_fields import arrow_filesystem_of

logger = logging.getLogger(__name__)


class TrialResult(tune.Result):
    """A trial's ``ray.tune.Result`` whose ``metrics_dataframe`` is made from
    its rows when first read (then kept): a DataFrame per trial costs about
    17 KB of the driver's memory (170 MB at 10,000 trials) that a study of
    many trials mostly never reads. Its columns are flattened as Tune
    flattens them: "config/lr/init", ..."""

    def __init__(self, rows: Sequence[dict], **fields: Any) -> None:
        self._rows: Sequence[dict] | None = rows  # a trial that never reported: an empty frame, as Tune's
        super().__init__(**fields)

    @property  # type: ignore[override]
    def metrics_dataframe(self) -> Any:
        if self._frame is None and self._rows is not None:
            import pandas as pd
            from ray.tune.utils import flatten_dict

            self._frame = pd.DataFrame([flatten_dict(tabular(row)) for row in self._rows])
        return self._frame

    @metrics_dataframe.setter
    def metrics_dataframe(self, frame: Any) -> None:
        self._frame = frame
        if frame is not None:
            self._rows = None

    def _repr(self, indent: int = 0) -> str:
        """Tune's text, under Tune's name: ``print(result)`` shows what it showed under Tune."""
        return super()._repr(indent).replace(type(self).__name__, "Result", 1)


class ResultGrid(ray.tune.ResultGrid):
    """The results of `Tuner.fit`: a ``ray.tune.ResultGrid`` (code that
    type-checks Tune's results takes it), each result a ``ray.tune.Result``.

    It is built from the study's trial summaries, not from Tune's
    ``ExperimentAnalysis``, so it defines every public method of Tune's class
    itself and never calls Tune's ``__init__``; ``ray.tune.ResultGrid(
    ExperimentAnalysis(path))`` still reads the same folder as Tune's own.

    Examples
    --------
    >>> grid = tuner.fit()                                  # doctest: +SKIP
    >>> best = grid.get_best_result("accuracy", "max")      # doctest: +SKIP
    >>> best.config, best.metrics["accuracy"], best.checkpoint   # doctest: +SKIP
    """

    def __init__(
        self,
        results: list[ray.tune.Result],
        experiment_path: str,
        default_metric: str | None = None,
        default_mode: str | None = None,
        iterations: int = 0,
        unique_iterations: int = 0,
        total_iterations: int = 0,
        worker_seconds: float = 0.0,
        state_seconds: float = 0.0,
        storage_filesystem: Any = None,
        phase_seconds: dict[str, float] | None = None,
    ) -> None:
        self._results = results
        self._experiment_path = experiment_path
        self._storage_filesystem = storage_filesystem
        self._default_metric = default_metric
        self._default_mode = default_mode
        self.iterations_executed = iterations
        self.unique_iterations = unique_iterations
        self.trial_by_trial_iterations = total_iterations
        #: Seconds workers spent on stage batches (dispatch to completion,
        #: summed over workers): the resources the study used.
        self.worker_seconds = worker_seconds
        #: ``worker_seconds`` by phase (`ray_stagetree.timed`): ``dispatch``, ``fetch`` and ``restore``
        #: (the starting checkpoint), ``parameters`` (``tune.with_parameters`` objects), ``train``, ``save``
        #: (checkpoints), ``report``, and the trainable's own.
        self.phase_seconds = dict(phase_seconds or {})
        #: Seconds the controller spent taking the study's snapshots for
        #: `Tuner.restore` (their writes run beside it, in the storage actor).
        self.state_seconds = state_seconds

    @property
    def experiment_path(self) -> str:
        return self._experiment_path

    @property
    def filesystem(self) -> Any:
        """The ``pyarrow.fs.FileSystem`` the experiment path is in, as Tune's."""
        return arrow_filesystem_of(self._experiment_path, self._storage_filesystem)

    def __len__(self) -> int:
        return len(self._results)

    def __getitem__(self, index: int) -> ray.tune.Result:
        return self._results[index]

    def __iter__(self) -> Iterator[ray.tune.Result]:
        return iter(self._results)

    @property
    def errors(self) -> list[Exception]:
        return [result.error for result in self._results if result.error is not None]

    @property
    def num_errors(self) -> int:
        return len(self.errors)

    @property
    def num_terminated(self) -> int:
        return sum(1 for result in self._results if result.error is None and result.metrics is not None)

    def get_best_result(
        self,
        metric: str | None = None,
        mode: str | None = None,
        scope: str = "last",
        filter_nan_and_inf: bool = True,
    ) -> ray.tune.Result:
        """The best trial by ``metric``; ``scope`` is "last", "avg", "last-5-avg",
        "last-10-avg" or "all" (best value over the trial's whole history)."""

        if len(self._results) == 1:  # Tune's rule: the only trial is the best, whatever metric and mode
            return self._results[0]
        metric = metric or self._default_metric
        mode = mode or self._default_mode
        if not metric:  # Tune's messages
            raise ValueError(
                "No metric is provided. Either pass in a `metric` arg to `get_best_result` or specify a metric in "
                "the `TuneConfig` of your `Tuner`."
            )
        if not mode:
            raise ValueError(
                "No mode is provided. Either pass in a `mode` arg to `get_best_result` or specify a mode in the "
                "`TuneConfig` of your `Tuner`."
            )
        if mode not in ("min", "max"):
            raise ValueError(f"mode must be 'min' or 'max', got {mode!r}")
        scopes = ("last", "avg", "last-5-avg", "last-10-avg", "all")
        if scope not in scopes:
            raise ValueError(f"scope must be one of {scopes}, got {scope!r}")

        def score(result: ray.tune.Result) -> float | None:
            frame = result.metrics_dataframe
            if frame is None or metric not in frame:
                return None
            values = [float(v) for v in frame[metric].tolist() if v is not None]
            if filter_nan_and_inf:
                values = [v for v in values if math.isfinite(v)]
            if not values:
                return None
            if scope == "last":
                return values[-1]
            if scope == "all":
                return max(values) if mode == "max" else min(values)
            window = {"avg": len(values), "last-5-avg": 5, "last-10-avg": 10}[scope]
            tail = values[-window:]
            return sum(tail) / len(tail)

        scored = [(score(result), result) for result in self._results if result.error is None]
        scored = [(value, result) for value, result in scored if value is not None]
        if not scored:
            raise RuntimeError(  # Tune's message
                f"No best trial found for the given metric: {metric}. This means that no trial has reported this "
                "metric"
                + (
                    ", or all values reported for this metric are NaN. To not ignore NaN values, you can set the "
                    "`filter_nan_and_inf` arg to False."
                    if filter_nan_and_inf
                    else "."
                )
            )
        pick = max if mode == "max" else min
        return pick(scored, key=lambda item: item[0])[1]

    def get_dataframe(self, filter_metric: str | None = None, filter_mode: str | None = None):
        """One row per trial, as Tune's: its last result, or with
        ``filter_metric`` and ``filter_mode`` its result where the metric was
        lowest ("min") or highest ("max") (a trial without the metric: its
        last). ``logdir`` is the trial's folder."""
        import pandas as pd

        if filter_mode is not None and filter_mode not in ("min", "max"):
            raise ValueError(f"get_dataframe(filter_mode={filter_mode!r}): it must be 'min', 'max' or None")
        if filter_mode is not None and not filter_metric:
            raise ValueError(f"get_dataframe(filter_mode={filter_mode!r}) needs the filter_metric it ranks by")
        rows = []
        for result in self._results:
            frame = result.metrics_dataframe
            if frame is None or frame.empty:
                continue
            if filter_mode is not None and filter_metric in frame:
                values = pd.to_numeric(frame[filter_metric], errors="coerce")
                if values.isna().all():  # Tune skips the trial, with a warning
                    logger.warning("get_dataframe: trial %s reported no number for %r", result.path, filter_metric)
                    continue
                row = frame.loc[values.idxmax() if filter_mode == "max" else values.idxmin()].to_dict()
            else:
                row = frame.iloc[-1].to_dict()
            row["logdir"] = result.path
            rows.append(row)
        return pd.DataFrame(rows)

    def get_repeats_dataframe(self, metric: str | None = None):
        """One row per configuration of a study with ``Tuner(repeats=N)``:
        the configuration (``config/...`` columns, without its seed),
        ``num_repeats``, ``seeds``, ``num_errors``, and ``<metric>_mean`` and
        ``<metric>_std`` (sample standard deviation) of the repeats' last
        ``metric`` (default: ``TuneConfig.metric``)."""
        metric = metric or self._default_metric
        if not isinstance(metric, str) or not metric:
            raise ValueError(
                f"get_repeats_dataframe needs a metric name: pass it here or to TuneConfig(metric=...), got {metric!r}"
            )
        return repeat_statistics(self._results, metric)
