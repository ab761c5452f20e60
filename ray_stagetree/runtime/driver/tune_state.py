"""Tune's experiment snapshot (``experiment_state-<time>.json``) beside the
study's own, so that Tune's readers work on a ray_stagetree experiment
folder: ``tune.ExperimentAnalysis(path)`` and ``ResultGrid(ExperimentAnalysis(path))``,
also after the folder was moved, as scripts written for Tune read results.

It is written by the driver when ``fit()`` returns, from the results it
returns: each trial as Tune's ``Trial`` (status, config, last result, kept
checkpoints, error) serialised the way Tune serialises it, and the default
searcher's state as finished, so that Tune's ``tune.run(..., resume=...)``
continues those trials (from their latest checkpoints) and adds none.
`Tuner.restore` continues from the study's own snapshot; Tune's
``Tuner.restore`` (which needs Tune's ``tuner.pkl``) does not take the folder.
"""

from __future__ import annotations

import copy
import json
import logging
import posixpath
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from numbers import Number
from typing import Any

import ray
import ray.cloudpickle as cloudpickle
from ray import tune
from ray.tune.result import EXPR_ERROR_FILE, EXPR_ERROR_PICKLE_FILE

from ray_stagetree.execution.storage import CheckpointStorage
from ray_stagetree.runtime.control.messages import TrialSummary
from ray_stagetree.trial_schedulers.ray_fields import metric_windows, storage_context_class, tune_checkpoint_manager

logger = logging.getLogger(__name__)

#: Tune's ``TuneController.CKPT_FILE_TMPL``: ExperimentAnalysis reads the newest match.
STATE_FILE_TEMPLATE = "experiment_state-{}.json"
#: ``BasicVariantGenerator.CKPT_FILE_TMPL``: the default searcher's state.
VARIANTS_FILE_TEMPLATE = "basic-variant-state-{}.json"


def write_tune_state(
    experiment_path: str,
    filesystem: Any,
    trainable_name: str,
    checkpoint_config: Any,
    trials: list[tuple[dict[str, Any], ray.tune.Result]],
    start_time: float,
    fields: Callable[[TrialSummary], dict[str, Any]] | None = None,
) -> None:
    """Write Tune's snapshot of ``trials`` (each the controller's trial
    summary and its ``Result``) at ``experiment_path`` (on ``filesystem``, a
    ``pyarrow.fs.FileSystem`` or None, as ``RunConfig.storage_filesystem``).
    ``fields``: a trial's other fields of Tune's ``Trial`` (its
    ``placement_group_factory``, ``evaluated_params``, ``max_failures``).
    A storage that refuses is logged: the study's own state is written already."""
    try:
        storage = CheckpointStorage(experiment_path, filesystem)
        storage_context = storage_context_class()
        experiment = storage_context(  # one for all trials: each writes a marker file into the experiment folder
            storage_path=posixpath.dirname(experiment_path.rstrip("/")),
            experiment_dir_name=posixpath.basename(experiment_path.rstrip("/")),
            storage_filesystem=filesystem,
        )
        trial_states = (
            tune_trial(
                experiment,
                storage,
                trainable_name,
                checkpoint_config,
                summary,
                result,
                fields(summary) if fields is not None else {},
            ).get_json_state()
            for summary, result in trials
        )
        session = time.strftime("%Y-%m-%d_%H-%M-%S")
        storage.write_chunks(STATE_FILE_TEMPLATE.format(session), _state_file(trial_states, session, start_time))
        # Tune's default searcher, done: tune.run(resume=...) continues these trials and adds none.
        storage.write(VARIANTS_FILE_TEMPLATE.format(session), cloudpickle.dumps({"_finished": True}))
    except Exception as error:  # noqa: BLE001 - each fsspec backend raises its own errors; Tune's readers are extra
        logger.warning("Tune's experiment snapshot was not written (%s: %s)", type(error).__name__, error)


def _state_file(trial_states: Iterable[Any], session: str, start_time: float) -> Iterator[bytes]:
    """Tune's snapshot as JSON, a trial at a time: the whole of it is about
    9 KB a trial (90 MB at 10,000 trials), the driver's memory peak if built
    before it is written."""
    from ray.tune.utils.serialization import TuneFunctionEncoder

    def encoded(value: Any) -> bytes:
        return json.dumps(value, cls=TuneFunctionEncoder).encode()

    yield b'{"trial_data": ['
    for index, state in enumerate(trial_states):
        yield (b", " if index else b"") + encoded(state)
    runner = {"_session_str": session, "_start_time": start_time}  # what Tune's controller restores of itself
    yield b'], "runner_data": ' + encoded(runner) + b', "stats": ' + encoded({"start_time": start_time}) + b"}"


def metric_analysis(
    rows: list[dict[str, Any]], windows: list[int]
) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, deque]]]:
    """Tune's statistics of a trial's numeric metrics over ``rows``
    (``metric_analysis`` and ``metric_n_steps``), exactly as
    ``Trial.update_last_result`` leaves them after each row in turn: that
    sets Tune's fields per row per metric and re-sums each window every
    time, most of a study's end at many results."""
    from ray.tune.result import DEBUG_METRICS
    from ray.tune.utils import flatten_dict

    analysis: dict[str, dict[str, Any]] = {}
    recent: dict[str, dict[str, deque]] = {}
    updated = set()  # metrics seen more than once: their windows' averages are sums, not the first value
    for row in rows:
        step = row.get("training_iteration") or 1
        metrics = {key: value for key, value in row.items() if key not in DEBUG_METRICS}
        if any(isinstance(value, dict) for value in metrics.values()):  # else flattening copies it unchanged
            metrics = flatten_dict(metrics)
        for metric, value in metrics.items():
            if not isinstance(value, Number):
                continue
            entry = analysis.get(metric)
            if entry is None:
                analysis[metric] = {"max": value, "min": value, "avg": value, "last": value}
                analysis[metric].update({f"last-{n:d}-avg": value for n in windows})
                recent[metric] = {str(n): deque([value], maxlen=n) for n in windows}
                continue
            entry["max"] = max(value, entry["max"])
            entry["min"] = min(value, entry["min"])
            entry["avg"] = 1 / step * (value + (step - 1) * entry["avg"])
            entry["last"] = value
            updated.add(metric)
            for n in windows:
                recent[metric][str(n)].append(value)
    for metric in updated:
        for n in windows:
            values = recent[metric][str(n)]
            analysis[metric][f"last-{n:d}-avg"] = sum(values) / len(values)
    return analysis, recent


def tune_trial(
    experiment: Any,
    storage: CheckpointStorage,
    trainable_name: str,
    checkpoint_config: Any,
    summary: TrialSummary,
    result: ray.tune.Result,
    fields: dict[str, Any] | None = None,
) -> Any:
    """A trial as Tune's ``Trial`` (a stub: its trainable is not looked up)
    in ``experiment`` (Tune's ``StorageContext`` of the experiment folder),
    with ``fields`` (more of ``Trial``'s attributes)."""
    from ray.tune.experiment import Trial

    trial_storage = copy.copy(experiment)
    trial_storage.trial_dir_name = summary.dirname
    # Tune numbers the next checkpoint it writes after the latest one (a resumed trial's).
    latest_folder = posixpath.basename(result.checkpoint.path) if result.checkpoint is not None else ""
    index = latest_folder.removeprefix("checkpoint_")
    trial_storage.current_checkpoint_index = int(index) if index.isdigit() else -1
    trial = Trial(
        trainable_name,
        config=summary.shown_config,
        trial_id=summary.trial_id,
        experiment_tag=summary.experiment_tag,
        storage=trial_storage,
        checkpoint_config=checkpoint_config,
        stub=True,
    )
    trial.placement_group_factory = tune.PlacementGroupFactory([{"CPU": 1}])  # Tune's loader requires one
    for name, value in (fields or {}).items():  # set as a stub's (its constructor leaves resources unset)
        setattr(trial, name, value)
    trial.status = summary.status
    rows = summary.rows
    if rows:  # as Tune's loop: its metric analysis (ExperimentAnalysis.get_best_trial), then the last result
        metadata = trial.run_metadata
        metadata.metric_analysis, metadata.metric_n_steps = metric_analysis(rows[:-1], metric_windows(metadata))
        trial.update_last_result(dict(rows[-1]))
    elif summary.returned_result is not None:  # a function that returned having reported nothing:
        trial.run_metadata.last_result = dict(summary.returned_result)  # Tune's default result, no tag
    # A checkpoint's metrics are its row as reported: Tune's Trial adds the experiment tag to the last result only.
    latest = None if result.checkpoint is None else (result.checkpoint, dict(rows[-1]) if rows else {})
    ranked = result.best_checkpoints or ([] if latest is None else [latest])
    trial.run_metadata.checkpoint_manager = tune_checkpoint_manager(checkpoint_config, ranked, latest)
    if summary.status == Trial.ERROR:
        trial.run_metadata.error_filename = EXPR_ERROR_FILE
        if summary.error_pickle is not None:
            storage.write(f"{summary.dirname}/{EXPR_ERROR_PICKLE_FILE}", summary.error_pickle)
            trial.run_metadata.pickled_error_filename = EXPR_ERROR_PICKLE_FILE
    trial.stub = False  # a stub to write (its trainable is not looked up here); Tune's tune.run(resume) runs it
    trial.invalidate_json_state()
    return trial
