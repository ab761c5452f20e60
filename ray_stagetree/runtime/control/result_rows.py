"""A trial's reported metrics as Tune's results: the fields Tune adds to a
row (``training_iteration``, ``done``, ``config``, the times since the
start and the restore), the checks the study controller makes of them (a
value a scheduler or searcher compares must be a number; the study's metric
should be there), and ``RunConfig.stop`` (thresholds, a ``Stopper``).

Ray-free: the controller folds the row into the trial's lifecycle and tells
the driver.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from ray.tune.result import DEBUG_METRICS, DEFAULT_METRIC, SHOULD_CHECKPOINT

from ray_stagetree.execution.batches import REPORTED_CHECKPOINT
from ray_stagetree.runtime.control.messages import SCHEDULE_KEY
from ray_stagetree.runtime.control.trials import CHECKPOINT_DIR_NAME, TrialState
from ray_stagetree.trial_schedulers.ray_fields import searcher_metric

#: Seconds between asks of a stopper's ``stop_all`` while no result comes:
#: Tune asks it at each step of its loop, which waits this long for an event
#: (a ``TimeoutStopper`` in ``stop`` ends the study on time, not at the next result).
STOPPER_POLL_S = 0.1

#: The keys Tune adds to what a function trainable reports, in the order its
#: ``FunctionTrainable`` and ``Trainable.train`` add them: the columns of
#: ``progress.csv`` and ``metrics_dataframe`` after the reported metrics.
FUNCTION_RESULT_KEYS = (
    "timestamp",
    CHECKPOINT_DIR_NAME,
    SHOULD_CHECKPOINT,
    "done",
    "training_iteration",
    "trial_id",
    "date",
    "time_this_iter_s",
    "time_total_s",
    "pid",
    "hostname",
    "node_ip",
    "config",
    SCHEDULE_KEY,
    "time_since_restore",
    "iterations_since_restore",
)

#: Values in one result (dict and list items, array elements) past which a
#: study warns: every result stays in the controller's and the driver's memory.
LARGE_RESULT_VALUES = 10_000


def values_in(result: Any, limit: int) -> int:
    """How many values ``result`` holds, counted until they pass ``limit``."""
    count, stack = 0, [result]
    while stack and count <= limit:
        item = stack.pop()
        if isinstance(item, dict):
            stack.extend(itertools.islice(item.values(), limit + 1))
        elif isinstance(item, (list, tuple)):
            stack.extend(itertools.islice(item, limit + 1))
        else:
            count += item.size if isinstance(item, np.ndarray) else 1
    return count


#: Fields of a row that say nothing the trainable reported.
NOT_REPORTED = frozenset({"done", "training_iteration", "time_this_iter_s", REPORTED_CHECKPOINT, *DEBUG_METRICS})


def expected_metrics(metric: str | None, searcher: Any, scheduler: Any) -> list[tuple[str, list[str]]]:
    """What expects which metrics in each result, in the order Tune checks
    them: TuneConfig's metric, the trial scheduler's, the searcher's (Tune's
    placeholder metric, set when none was given, expects nothing)."""
    expected = []
    for who, names in (
        ("tune.TuneConfig()", metric),
        (type(scheduler).__name__, searcher_metric(scheduler)),
        (type(searcher).__name__, searcher_metric(searcher)),
    ):
        names = [names] if isinstance(names, str) else list(names or [])
        if names := [name for name in names if name != DEFAULT_METRIC]:
            expected.append((who, names))
    return expected


def metric_consumers(searcher: Any, scheduler: Any) -> dict[str, str]:
    """Metric name -> what compares its values (the trial scheduler, the
    searcher; Tune's FIFOScheduler compares nothing): those must be numbers."""
    consumers = {}
    if type(scheduler).__name__ == "FIFOScheduler":
        scheduler = None
    for consumer, role in ((searcher, "searcher"), (scheduler, "trial scheduler")):
        metric = searcher_metric(consumer) or []
        # A multi-objective searcher (OptunaSearch(metric=["loss", "gain"])) compares several.
        for name in [metric] if isinstance(metric, str) else metric:
            consumers[name] = f"the {role} ({type(consumer).__name__})"
    return consumers


class ResultRows:
    """A study's results, as Tune makes them from what a trainable reports.

    Parameters
    ----------
    metric:
        ``TuneConfig.metric``: without ``strict``, a row without it is warned
        of, once per study.
    consumers:
        `metric_consumers` of the study's searcher and scheduler.
    expected:
        `expected_metrics` of the study: with ``strict``, a result without
        one of them stops the study (`missing_metric`).
    stop_thresholds, stopper:
        ``RunConfig.stop``: a metric reaching its threshold, or the
        ``ray.tune.Stopper``, ends the trial (``stop_all``: the study).
    warn:
        Where a warning for the driver goes.
    """

    def __init__(
        self,
        metric: str | None,
        consumers: dict[str, str],
        stop_thresholds: dict[str, float],
        stopper: Any,
        warn: Callable[[str], None],
        expected: Sequence[tuple[str, list[str]]] = (),
        strict: bool = False,
    ) -> None:
        self.metric = metric
        self.consumers = consumers
        self.expected = list(expected)
        self.strict = strict
        self.stop_thresholds = stop_thresholds
        self.stopper = stopper
        self._warn = warn
        self._warned_missing_metric = False
        self._warned_large = False

    def invalid(self, state: TrialState, iteration: int, metrics: dict[str, Any]) -> str | None:
        """Why the trial cannot go on with these metrics (a value its
        scheduler or searcher must compare is not a number), or None. Warns,
        once per study, when the study's metric is missing."""
        metric = self.metric
        if metric and metric not in metrics and not self.strict and not self._warned_missing_metric:
            self._warned_missing_metric = True
            self._warn(
                f"trial {state.name or state.trial_id} reported {sorted(set(metrics) - {'time_this_iter_s', REPORTED_CHECKPOINT})} "
                f"at iteration {iteration}, without TuneConfig's metric {metric!r}: results without it are not ranked "
                "(this warning is shown once per study)"
            )
        if not self._warned_large:
            self._warn_if_large(state, iteration, metrics)
        for name, consumer in self.consumers.items():
            value = metrics.get(name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float, np.number))):
                return (
                    f"trial {state.name or state.trial_id} reported {name}={value!r} ({type(value).__name__}) at "
                    f"iteration {iteration}, but {consumer} compares {name!r}: it must be a number"
                )
        return None

    def missing_metric(self, state: TrialState, iteration: int, metrics: dict[str, Any]) -> str | None:
        """With ``strict`` (Tune's default), why the study cannot go on: the
        result lacks a metric its TuneConfig, trial scheduler or searcher
        expects, said as Tune says it; None when nothing is missing, or when
        the row holds nothing the trainable reported (it returned)."""
        if not self.strict or not metrics.keys() - NOT_REPORTED:
            return None
        for who, names in self.expected:
            if missing := [name for name in names if name not in metrics]:
                return (
                    f"Trial {state.name or state.trial_id} returned a result which did not include the specified "
                    f"metric(s) `{', '.join(missing)}` that `{who}` expects (it reported "
                    f"{sorted(metrics.keys() - NOT_REPORTED)} at iteration {iteration}). Make sure your calls to "
                    "`tune.report()` include the metric, or set the TUNE_DISABLE_STRICT_METRIC_CHECKING environment "
                    "variable to 1."
                )
        return None

    def _warn_if_large(self, state: TrialState, iteration: int, metrics: dict[str, Any]) -> None:
        values = values_in(metrics, LARGE_RESULT_VALUES)
        if values > LARGE_RESULT_VALUES:
            self._warned_large = True
            self._warn(
                f"trial {state.name or state.trial_id} reported more than {LARGE_RESULT_VALUES:,} values at iteration "
                f"{iteration}: every result stays in the controller's and the driver's memory and is written to "
                "result.json, progress.csv and TensorBoard, so the study's memory grows by a result this large at "
                "each iteration. Report summary figures, and save large arrays in the trial's checkpoints (this "
                "warning is shown once per study)"
            )

    def row(self, state: TrialState, iteration: int, metrics: dict[str, Any], horizon: float) -> dict[str, Any]:
        """The result Tune shows for ``metrics`` reported at ``iteration``:
        ``done`` when the trainable said so or the trial reached ``horizon``;
        its times add up from the trial's previous row (``state.reported``);
        a function trainable's names its checkpoint's folder and, where it
        reported one, has Tune's ``should_checkpoint``."""
        row = dict(metrics)
        reported = row.pop(REPORTED_CHECKPOINT, None)
        if reported is not None:  # a function trainable's: Tune names the folder of its checkpoint, if any
            row[CHECKPOINT_DIR_NAME] = state.reported_checkpoint_folder(iteration) if reported else None
            if reported:
                row[SHOULD_CHECKPOINT] = True
        row["trial_id"] = state.trial_id
        row["training_iteration"] = iteration
        row["done"] = bool(row.get("done", False)) or iteration >= horizon
        row["config"] = state.shown_config(iteration)
        if state.scheduled():
            row[SCHEDULE_KEY] = state.config
        previous = state.reported[-1] if state.reported else {}
        row["time_total_s"] = previous.get("time_total_s", 0.0) + row.get("time_this_iter_s", 0.0)
        since = (
            previous.get("time_since_restore", 0.0)
            if previous.get("training_iteration", 0) > state.restored_at
            else 0.0
        )
        row["time_since_restore"] = since + row.get("time_this_iter_s", 0.0)
        row["iterations_since_restore"] = iteration - state.restored_at
        if reported is None:  # a class trainable's: in Tune's order already (its Trainable.train made it)
            return row
        added = {key: row.pop(key) for key in FUNCTION_RESULT_KEYS if key in row}
        return {**row, **added}

    def stop_met(self, trial_id: str, row: dict[str, Any]) -> bool:
        """RunConfig.stop: a metric reached its threshold, or the stopper says so."""
        reached = any(
            isinstance(row.get(key), (int, float)) and row[key] >= threshold
            for key, threshold in self.stop_thresholds.items()
        )
        return reached or (self.stopper is not None and bool(self.stopper(trial_id, row)))

    def stop_all(self) -> bool:
        """The stopper ends the whole study (asked after each result, and
        every `STOPPER_POLL_S` without one, as Tune asks it at each step)."""
        return self.stopper is not None and bool(self.stopper.stop_all())

    def poll_in(self) -> float | None:
        """Seconds until the stopper is to be asked again without a result; None without one."""
        return None if self.stopper is None else STOPPER_POLL_S
