"""A study's state in its experiment directory, kept current while it runs,
so that `Tuner.restore` continues it after the driver dies.

Two files sit at the experiment root:

* ``stagetree_tuner.pkl``: how the study was set up (param_space,
  TuneConfig, RunConfig and the Tuner's own options), written by the driver
  when ``fit()`` starts; `Tuner.restore` rebuilds the Tuner from it.
* ``stagetree_state.pkl``: a `StudyState` snapshot written by the controller
  whenever something changed (a result, a durable checkpoint, a trial's
  status): the search plan with its metrics and durable checkpoints (and
  the config objects its JSON records name by fingerprint), every
  trial's state and results, and the searcher and scheduler objects, all
  taken at one instant, so they agree with each other. Each write replaces
  the file atomically (temporary name, then move): a kill mid-write leaves
  the previous snapshot.

What a restore loses is only what no snapshot recorded: iterations trained
since the last snapshot and not checkpointed by then are trained again.
Snapshots are pickled (the searcher and scheduler are arbitrary Python
objects, as in Tune's ``experiment_state``): restore only directories you
trust.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Any

import ray

from ray_stagetree.execution import stored_pickles
from ray_stagetree.execution.storage import CheckpointStorage, CheckpointUnavailableError
from ray_stagetree.planning.lifecycle import ERROR, UNFINISHED
from ray_stagetree.runtime.control.messages import PackedRows, TrialSummary

if TYPE_CHECKING:
    from ray_stagetree.runtime.control.trials import TrialState

TUNER_FILE = "stagetree_tuner.pkl"
STATE_FILE = "stagetree_state.pkl"
FORMAT_VERSION = 1

#: A snapshot may cost the controller at most 1/STATE_COST_FACTOR of its
#: time: after one that took s seconds to take, the next waits STATE_COST_FACTOR * s.
STATE_COST_FACTOR = 20


@dataclasses.dataclass
class StudyState:
    """Everything a controller needs to continue a study."""

    plan: dict[str, list[dict[str, Any]]]  # SearchPlan.records()
    trials: list[Any]  # the controller's TrialStates (runtime.control.trials), without their plan nodes
    # The study's TrialSource (a VariantSource / SearcherSource, with the
    # searcher's own state); "source" is the name snapshots were written with.
    source: Any
    host: Any  # the SchedulerHost, with the scheduler's own state
    iterations: int = 0
    worker_seconds: float = 0.0
    elapsed: float = 0.0
    version: int = FORMAT_VERSION
    # SearchPlan.objects(): the config values the plan's JSON records hold
    # only as fingerprints, by ref. None in snapshots written before them.
    objects: dict[str, Any] | None = None


@dataclasses.dataclass(frozen=True)
class Restore:
    """A snapshot to continue from, and Tune's restore options
    (``Tuner.restore``'s arguments of the same names)."""

    state: StudyState
    resume_unfinished: bool = True
    resume_errored: bool = False
    restart_errored: bool = False

    def action(self, status: str) -> str:
        """What happens to a trial restored in ``status``: "keep" (its
        results stand), "resume" (from its latest checkpoint), "restart"
        (its results start over) or "end" (an unfinished trial not resumed
        is terminated where it stood)."""
        if status == ERROR:
            if self.restart_errored:
                return "restart"
            return "resume" if self.resume_errored else "keep"
        if status in UNFINISHED:
            return "keep" if self.resume_unfinished else "end"
        return "keep"


def restored_progress(restore: Restore) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """What the driver's progress line already knows of a restored study:
    the last row of each trial whose results go on counting, and an
    ``error`` event for each errored trial that stays errored (the best it
    shows leaves those out, as ``get_best_result`` does)."""
    rows, events = [], []
    for trial in restore.state.trials:
        action = restore.action(trial.status)
        if trial.reported and action != "restart":
            rows.append({**trial.reported[-1], "trial_id": trial.trial_id})
        if trial.status == ERROR and action == "keep":
            events.append({"event": "error", "trial_id": trial.trial_id})
    return rows, events


def trial_summary(state: TrialState) -> TrialSummary:
    """What the driver makes a trial's ``ray.tune.Result`` from: at the end of
    a study (`StudyController.results`), or from a snapshot's trials
    (``Tuner.get_results()`` of a restored Tuner)."""
    return TrialSummary(
        trial_id=state.trial_id,
        name=state.name,
        dirname=state.dirname,
        config=state.config,
        config_json=state.config_json,
        shown_config=state.shown_config(),
        experiment_tag=state.shown_tag,
        status=state.status,
        error=state.error,
        error_pickle=state.error_pickle,
        rows=PackedRows(state.reported),
        checkpoints=state.checkpoints,
        best_checkpoints=state.best_checkpoints,
        returned_result=state.returned_result,
        resources=state.resources,
    )


def dumps(state: StudyState) -> bytes:
    return ray.cloudpickle.dumps(state, protocol=5)


def read_state(storage: CheckpointStorage) -> StudyState:
    """The latest snapshot under ``storage``'s root; raises ValueError when
    there is none or it is not one this version reads."""
    data = _read(storage, STATE_FILE)
    state = stored_pickles.loads(data)  # written by this library in a directory the user chose to restore
    if not isinstance(state, StudyState):
        raise ValueError(f"{storage.path(STATE_FILE)!r} is not a ray_stagetree study state")
    if state.version > FORMAT_VERSION:
        raise ValueError(
            f"{storage.path(STATE_FILE)!r} was written by a newer ray_stagetree (state version {state.version}, "
            f"this one reads {FORMAT_VERSION}); upgrade to restore it"
        )
    return state


def write_tuner_settings(storage: CheckpointStorage, settings: dict[str, Any]) -> bool:
    """Save the Tuner's set-up; False (nothing written) when some part of it
    cannot be pickled, in which case the study runs but cannot be restored."""
    try:
        data = ray.cloudpickle.dumps(settings, protocol=5)
    except Exception:
        return False
    storage.write(TUNER_FILE, data)
    return True


def read_tuner_settings(storage: CheckpointStorage) -> dict[str, Any]:
    return stored_pickles.loads(_read(storage, TUNER_FILE))


def can_restore(storage: CheckpointStorage) -> bool:
    """True when ``storage``'s root is a study's experiment directory (not
    one of its trial folders)."""
    return storage.filesystem.isfile(storage.path(TUNER_FILE))


def has_state(storage: CheckpointStorage) -> bool:
    """False for a study whose driver was lost before its first snapshot."""
    return storage.filesystem.isfile(storage.path(STATE_FILE))


def _read(storage: CheckpointStorage, name: str) -> bytes:
    try:
        return storage.read_key(name)
    except CheckpointUnavailableError:
        raise ValueError(
            f"no ray_stagetree study to restore at {storage.storage_path!r}: {name} is missing. Pass the experiment "
            "directory itself (ResultGrid.experiment_path, the folder holding stagetree_tuner.pkl), not a trial "
            "folder; Tuner.can_restore(path) tells"
        ) from None
