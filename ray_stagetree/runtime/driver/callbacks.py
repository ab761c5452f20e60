"""Tune's callbacks and loggers on the driver.

The controller reports what happened since the last poll (``progress()``:
``events`` for a trial's start, completion, error and final checkpoint, and
``rows`` for its results); `CallbackRunner` turns that into the hooks of
``ray.tune.Callback``, called on the driver as Tune calls them, with
`TrialView` objects that carry what Tune's own callbacks read from a
``ray.tune.experiment.Trial``. Ray's ``JsonLoggerCallback``,
``CSVLoggerCallback`` and ``TBXLoggerCallback`` are the default loggers, as
in Tune, so every trial folder holds ``params.json``, ``params.pkl``,
``result.json``, ``progress.csv`` and TensorBoard events: written by the
batched subclasses of `log_files`, on a thread of their own
(`log_thread.LogThread`), one flush per poll, so that the driver's loop
never waits on a file (a user's own logger instance is called on the loop,
as every other callback).

Logs are written where the loggers can open files: the trial folder itself
for a local experiment path, a local staging folder otherwise, uploaded to
the trial folder when a trial ends, when the study ends and every
``SyncConfig.sync_period`` seconds in between (as Tune syncs).

Storage that refuses a log write (read-only, full, unreachable) never ends
the study: Tune's loggers write through the driver, and what they could not
write is left out with one warning, while the study goes on and keeps its
results (its snapshot and checkpoints have their own retries); a remote
study's staged logs are uploaded again at the next sync.

A runner created again for the same experiment path (a restored study)
continues each trial's logs: it reads the last ``training_iteration`` a
trial's ``result.json`` holds and skips the results up to it, so the files
are appended to and no iteration is logged twice.
"""

from __future__ import annotations

import functools
import json
import logging
import os
import posixpath
import shutil
import tempfile
import time
import traceback
from types import SimpleNamespace
from typing import Any

from ray.tune import Callback
from ray.tune.error import TuneError
from ray.tune.logger import CSVLoggerCallback, JsonLoggerCallback, LoggerCallback, TBXLoggerCallback
from ray.tune.result import EXPR_ERROR_FILE, SHOULD_CHECKPOINT
from ray.tune.utils import date_str, flatten_dict

from ray_stagetree.execution.storage import CheckpointStorage
from ray_stagetree.execution.study_file import ENDED_STUDY, FAILED_STUDY, INTERRUPTED_STUDY
from ray_stagetree.planning.config import tabular
from ray_stagetree.planning.filesystems import arrow_filesystem, is_local
from ray_stagetree.planning.lifecycle import ERROR, PENDING, RUNNING, TERMINATED
from ray_stagetree.runtime.control.messages import REPORTED_AGAIN, CallbackAnswer, Progress, tagged
from ray_stagetree.runtime.driver.log_files import BATCHED
from ray_stagetree.runtime.driver.log_thread import LogThread
from ray_stagetree.runtime.driver.pbt_policy import write_policy
from ray_stagetree.runtime.driver.status_file import StatusFile
from ray_stagetree.sequences._params import _is_unresolved

logger = logging.getLogger("ray_stagetree")

#: The hooks Tune calls while it handles a trial's event (a result, its end,
#: a save, a restore, a failure): an error one raises ends the run as a
#: ``TuneError`` holding its traceback, unless ``fail_fast="raise"``; but
#: one ``on_trial_complete`` raises is logged, and the run goes on.
TRIAL_EVENT_HOOKS = frozenset(
    {"on_trial_result", "on_trial_complete", "on_trial_save", "on_checkpoint", "on_trial_restore"}
    | {"on_trial_recover", "on_trial_error"}
)

RESULT_FILE = "result.json"
PROGRESS_FILE = "progress.csv"
# What a restored study downloads to continue: the other logs are rewritten
# (params) or start a new file (TensorBoard events) anyway.
CONTINUED_FILES = (RESULT_FILE, PROGRESS_FILE)


class TrialView:
    """A trial as Tune's callbacks, loggers and progress reporters see it:
    the attributes of ``ray.tune.experiment.Trial`` they read."""

    def __init__(
        self,
        trial_id: str,
        name: str,
        dirname: str,
        config: dict[str, Any],
        experiment_path: str,
        local_experiment_path: str,
        searched: tuple[str, ...] | None,
    ) -> None:
        self.trial_id = trial_id
        self.trial_name = name or trial_id
        self.experiment_tag = ""  # from the controller's events (`_view`)
        self.dirname = dirname
        self.config = config
        self.status = PENDING
        self.last_result: dict[str, Any] = {}
        self.checkpoint = None  # a ray.tune.Checkpoint once the final one is written
        self.error_msg: str | None = None
        self.path = f"{experiment_path}/{dirname}"
        self.local_path = os.path.join(local_experiment_path, dirname)
        self.local_experiment_path = local_experiment_path
        self.experiment_dir_name = experiment_path.rstrip("/").rsplit("/", 1)[-1]
        self.run_metadata = SimpleNamespace(num_failures=0)
        self.temporary_state = SimpleNamespace(location=_Location())
        self._searched = searched

    @property
    def logdir(self) -> str:
        return self.local_path

    @property
    def evaluated_params(self) -> dict[str, Any]:
        """The config's values drawn from the search space (sampled or
        gridded), flattened with "/": Tune's hyper-parameter columns and
        TensorBoard's hparams. A sequence contributes its declarative
        parameters ("lr/init", "lr/milestones", ...)."""
        flat = flatten_dict(tabular(self.config), delimiter="/")
        if self._searched is None:
            return flat
        return {
            key: value
            for key, value in flat.items()
            if any(key == path or key.startswith(path + "/") for path in self._searched)
        }

    @property
    def error_file(self) -> str | None:
        return os.path.join(self.local_path, EXPR_ERROR_FILE) if self.error_msg is not None else None

    def get_ray_actor_ip(self) -> str | None:
        """A trial's iterations may run on several workers: no one address."""
        return None

    def init_local_path(self) -> None:
        os.makedirs(self.local_path, exist_ok=True)

    def __str__(self) -> str:
        return self.trial_name

    def __repr__(self) -> str:
        return self.trial_name


class _Location:
    """Tune's trial location column: unknown on the driver (a trial's
    iterations may run on several workers)."""

    def __str__(self) -> str:
        return ""


def searched_paths(param_space: dict[str, Any]) -> tuple[str, ...]:
    """The "/"-joined paths of ``param_space`` that the search space draws
    (a Tune domain, a grid, a sequence with a domain inside)."""
    paths = []

    def walk(space: dict[str, Any], prefix: str) -> None:
        for key, value in space.items():
            path = f"{prefix}{key}"
            if isinstance(value, dict) and set(value) != {"grid_search"}:
                walk(value, path + "/")
            elif _is_unresolved(value) or isinstance(value, (list, tuple)) and any(map(_is_unresolved, value)):
                paths.append(path)

    walk(param_space, "")
    return tuple(paths)


def with_default_loggers(callbacks: list[Callback] | None) -> list[Callback]:
    """``callbacks`` and Tune's default loggers, added as Tune adds them: the
    user's own instance of a logger class replaces its default, and
    ``TUNE_DISABLE_AUTO_CALLBACK_LOGGERS=1`` adds none."""
    callbacks = list(callbacks or [])
    if os.environ.get("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "0") == "1":
        return callbacks
    for cls in (CSVLoggerCallback, JsonLoggerCallback):
        if not any(isinstance(callback, cls) for callback in callbacks):
            callbacks.append(BATCHED[cls]())
    if not any(isinstance(callback, TBXLoggerCallback) for callback in callbacks):
        try:
            callbacks.append(BATCHED[TBXLoggerCallback]())
        except ImportError:
            logger.warning("TensorBoard files are not written: pip install tensorboardX to have them")
    return callbacks


class _DeclarativeTrial:
    """A `TrialView` as Tune's loggers and reporters see it: ``config`` (and
    the config in ``last_result``) with sequences in their declarative form;
    every other attribute is the view's."""

    def __init__(self, view: TrialView) -> None:
        self._view = view

    @property
    def config(self) -> dict[str, Any]:
        return tabular(self._view.config)

    @property
    def last_result(self) -> dict[str, Any]:
        return tabular(self._view.last_result)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._view, name)

    def shows(self, view: TrialView) -> bool:
        """Whether this is ``view``'s declarative face (loggers key their files by the trial object)."""
        return self._view is view

    def __str__(self) -> str:
        return str(self._view)

    def __repr__(self) -> str:
        return repr(self._view)


class CallbackRunner:
    """Calls ``callbacks`` (user callbacks and the default loggers) from the
    controller's progress, on the driver.

    Parameters
    ----------
    callbacks:
        ``RunConfig.callbacks``; Tune's default loggers are added to them.
    experiment_path:
        The study's folder (a local path or a URI); trial folders are
        ``f"{experiment_path}/{dirname}"``.
    storage_filesystem:
        ``RunConfig.storage_filesystem``, if any.
    param_space:
        The search space, for each trial's ``evaluated_params``.
    sync_period:
        Seconds between two uploads of a remote study's logs while it runs.
    raise_errors:
        ``fail_fast="raise"``: an error a hook raises handling a trial's
        event ends ``fit()`` as it is, not as a ``TuneError`` (`TRIAL_EVENT_HOOKS`).
    """

    def __init__(
        self,
        callbacks: list[Callback] | None,
        experiment_path: str,
        storage_filesystem: Any = None,
        param_space: dict[str, Any] | None = None,
        sync_period: float = 300.0,
        status: StatusFile | None = None,
        answers_checkpoint_requests: bool = False,
        raise_errors: bool = False,
    ) -> None:
        self.callbacks = with_default_loggers(callbacks)
        self.raise_errors = raise_errors
        batched = tuple(BATCHED.values())
        self._log = LogThread([c for c in self.callbacks if isinstance(c, batched)], self._storage_fault)
        self._on_loop = [c for c in self.callbacks if not isinstance(c, batched)]
        self.experiment_path = experiment_path.rstrip("/")
        self.status = status  # the study's status file (`status_file`), kept from each poll
        self._remote = not is_local(experiment_path, storage_filesystem)
        self._storage_filesystem = storage_filesystem
        self._storage = CheckpointStorage(self.experiment_path, storage_filesystem) if self._remote else None
        self.local_experiment_path = (
            tempfile.mkdtemp(prefix="stagetree_logs_") if self._remote else self.experiment_path
        )
        self._searched = searched_paths(param_space) if param_space is not None else None
        self.sync_period = sync_period
        self._last_sync = time.monotonic()
        self._uploaded: dict[str, tuple[int, int]] = {}  # local file -> (size, mtime_ns) uploaded
        self.trials: dict[str, TrialView] = {}
        self._declarative_views: dict[str, _DeclarativeTrial] = {}  # what loggers see of self.trials
        # The views in order, handed to every hook as Tune hands its trial list (not copied per call).
        self._trial_list: list[TrialView] = []
        self._logged: dict[str, int] = {}  # trial id -> last training_iteration logged
        self._recovering: set[str] = set()  # failed trials retried, until their retry's first result
        self.iteration = 0  # Tune's loop iteration: here, the driver's polls
        self.storage_faults = 0  # log writes storage refused
        # The trainable waits for each answer (`asks_for_checkpoints`): the requests, (trial id, iteration), since
        # the last (`answer`).
        self.answers_checkpoint_requests = answers_checkpoint_requests
        self._asked: list[tuple[str, int]] = []
        self._rows_through = 0

    def _call(self, hook: str, **info: Any) -> None:
        """Call ``hook`` on the callbacks the loop calls (not the batched
        loggers); an error one raises ends ``fit()``, as in Tune."""
        if not self._on_loop:  # Tune's default loggers only: every result comes here
            return
        try:
            self._call_each(hook, info)
        except Exception:
            if hook not in TRIAL_EVENT_HOOKS or self.raise_errors:
                raise
            if hook == "on_trial_complete":  # (Tune also fails the trial: here it stays ended)
                logger.exception("Trial %s: Error stopping trial.", info["trial"])
                return
            raise TuneError(traceback.format_exc())  # noqa: B904 (chained as Tune chains it)

    def _call_each(self, hook: str, info: dict[str, Any]) -> None:
        declarative = None
        for callback in self._on_loop:
            if isinstance(callback, LoggerCallback):
                declarative = declarative or self._declarative(info)
                try:
                    getattr(callback, hook)(**declarative)
                except OSError as error:  # storage refused a log file: the study goes on
                    self._storage_fault(error)
                if hook == "on_trial_result" and declarative["result"].get(SHOULD_CHECKPOINT):  # it asks
                    info["result"][SHOULD_CHECKPOINT] = True
            else:
                getattr(callback, hook)(**info)

    def _storage_fault(self, error: OSError) -> None:
        """Storage refused a log write: warn once, go on."""
        self.storage_faults += 1
        if self.storage_faults == 1:
            logger.warning(
                "storage refused the trials' logs under %s (%s: %s): the study goes on and keeps its results; "
                "logs it cannot write are left out%s",
                self.experiment_path,
                type(error).__name__,
                error,
                ", and uploaded again at the next sync" if self._remote else "",
            )

    def _declarative(self, info: dict[str, Any]) -> dict[str, Any]:
        """A hook's arguments as Tune's loggers (its file loggers, MLflow's,
        W&B's: every ``LoggerCallback``) see them. ``trial.config`` and
        ``result["config"]`` hold the user's objects, as in Tune, and a
        logger would write a sequence as its ``str()``: loggers see each
        sequence as its JSON form instead, so ``params.json`` and
        ``result.json`` keep the declarative form that ``stagetree show``
        and the monitor read back without unpickling, and TensorBoard's
        hparams and MLflow's params a sequence's parameters (``lr/init``,
        ...). Other objects (a ``Path``) are written as Tune writes them;
        other callbacks get the user's objects."""

        out = dict(info)
        if "trial" in out:
            out["trial"] = self._declarative_trial(out["trial"])
        # ``trials`` stays the views: Tune's loggers read only ``trial``, and a copy per call would cost O(trials).
        if isinstance(out.get("result"), dict):
            out["result"] = tabular(out["result"])
        return out

    def _declarative_trial(self, view: Any) -> Any:
        if not isinstance(view, TrialView):
            return view
        proxy = self._declarative_views.get(view.trial_id)
        if proxy is None or not proxy.shows(view):  # loggers key their files by the trial object
            proxy = self._declarative_views[view.trial_id] = _DeclarativeTrial(view)
        return proxy

    def reported_trials(self) -> list[Any]:
        """The trials as Tune's progress reporters show them: as the loggers
        see them, so a parameter column may name a sequence's parameter
        (``"lr/milestones"``)."""
        return [self._declarative_trial(view) for view in self._trial_list]

    def setup(self, stop: Any = None, num_samples: int | None = None, total_num_samples: int | None = None) -> None:
        self._call("setup", stop=stop, num_samples=num_samples, total_num_samples=total_num_samples)

    # -- progress into hooks --------------------------------------------------------

    def update(self, progress: Progress) -> None:
        """Call the hooks for one poll of ``controller.progress()``.

        A trial's start comes before its results and its results before its
        end (the controller's order), so each trial's start, then its rows,
        then its other events keep its order. Trial by trial, not all starts
        first: Tune's loggers open files at a trial's start and close them at
        its end, and one poll of a study of short trials holds thousands."""
        self.iteration += 1
        self._rows_through = progress.rows_through
        # Tune's loop steps: here, the driver's polls (a hook that raises ends fit() with its error, as in Tune).
        self._call("on_step_begin", iteration=self.iteration, trials=self._trial_list)
        by_trial: dict[str, tuple[list[dict], list[dict], list[dict]]] = {}
        for event in progress.events:
            starts, _, others = by_trial.setdefault(event["trial_id"], ([], [], []))
            (starts if event["event"] == "start" else others).append(event)
        for row in progress.rows:
            by_trial.setdefault(row["trial_id"], ([], [], []))[1].append(row)
        for starts, rows, others in by_trial.values():
            for event in starts:
                self._start(event)
            for row in rows:
                self._result(row)
            for event in others:
                self._other(event)
        self._call("on_step_end", iteration=self.iteration, trials=self._trial_list)
        self._log.batch_done()
        if progress.pbt_policy:
            self._write_policy(progress.pbt_policy)
        if progress.output:
            self._write_output(progress.output)
        if self.status is not None:
            self.status.update(progress)
        if self._remote and time.monotonic() - self._last_sync >= self.sync_period:
            self._last_sync = time.monotonic()
            self._log.then(self.sync)  # after the flush

    def _other(self, event: dict[str, Any]) -> None:
        """A trial's event other than its start."""
        kind = event["event"]
        if kind == "complete":
            self._end(event, failed=False)
        elif kind == "error":
            self._end(event, failed=True)
        elif kind == "recover":
            view = self._view(event)
            self._failed(view, event.get("error") or "")
            self._trial_list.remove(view)  # Tune requeues it at the end of its trials before the callbacks hear
            self._trial_list.append(view)
            self._recovering.add(view.trial_id)
            self._call("on_trial_recover", iteration=self.iteration, trials=self._trial_list, trial=view)
        elif kind == "checkpoint":
            self._checkpoint(event)

    def _view(self, event: dict[str, Any]) -> TrialView:
        view = self.trials.get(event["trial_id"])
        if view is None:
            view = self.trials[event["trial_id"]] = TrialView(
                event["trial_id"],
                event.get("name") or event["trial_id"],
                event.get("dirname") or event["trial_id"],
                event.get("config") or {},
                self.experiment_path,
                self.local_experiment_path,
                self._searched,
            )
            self._trial_list.append(view)
        view.experiment_tag = event.get("experiment_tag") or view.experiment_tag
        return view

    def _start(self, event: dict[str, Any]) -> None:
        known = event["trial_id"] in self.trials
        view = self._view(event)
        view.config = event.get("config", view.config)
        view.status = RUNNING
        try:
            view.init_local_path()  # Tune's trials have their folder before the loggers open files in it
        except OSError as error:
            self._storage_fault(error)
        if not known:
            self._continue_logs(view)
        self._log.start(view)
        self._call("on_trial_start", iteration=self.iteration, trials=self._trial_list, trial=view)

    def _continue_logs(self, view: TrialView) -> None:
        """A study continued under the same path: fetch the trial's logs
        into staging (a remote study) and note the last iteration they hold."""
        if self._remote:
            for name in CONTINUED_FILES:
                remote = self._storage.path(f"{view.dirname}/{name}")
                if self._storage.filesystem.exists(remote):
                    view.init_local_path()
                    self._storage.filesystem.get_file(remote, os.path.join(view.local_path, name))
        last = _last_iteration(os.path.join(view.local_path, RESULT_FILE))
        if last is not None:
            self._logged[view.trial_id] = last

    def _result(self, row: dict[str, Any]) -> None:
        view = self.trials.get(row["trial_id"])
        if view is None:  # a trial announced before this runner existed
            view = self._view({"trial_id": row["trial_id"], "config": row.get("config")})
            self._continue_logs(view)
        iteration = row.get("training_iteration", 0)
        # Reported again (a retry, a PBT exploit back to an earlier checkpoint): logged again, as under Tune.
        retried = row.pop(REPORTED_AGAIN, False)
        if not retried and iteration <= self._logged.get(view.trial_id, 0):
            return  # already logged: a retrained iteration, or one logged before a restore
        if view.trial_id in self._recovering:  # its retry's first result
            self._recovering.discard(view.trial_id)
            if iteration > 1:  # it restored from a checkpoint (Tune's on_trial_restore)
                self._call("on_trial_restore", iteration=self.iteration, trials=self._trial_list, trial=view)
        self._logged[view.trial_id] = iteration
        view.status = RUNNING
        if isinstance(row.get("config"), dict):
            view.config = row["config"]  # PBT changes a trial's config
        self._log.result(self.iteration, view, row)
        checkpointed = row.get(SHOULD_CHECKPOINT)  # a function trainable's row that came with a checkpoint
        self._call("on_trial_result", iteration=self.iteration, trials=self._trial_list, trial=view, result=row)
        # After the callbacks, as Tune updates it (they see the last result before this one), with
        # the tag in a copy: the loggers may write ``row`` later.
        view.last_result = tagged(row, view.experiment_tag)
        # A callback asked for a checkpoint here (Tune's SHOULD_CHECKPOINT): the trainable waits for the answer.
        if self.answers_checkpoint_requests and row.get(SHOULD_CHECKPOINT) and not checkpointed:
            self._asked.append((view.trial_id, iteration))

    def answer(self) -> CallbackAnswer | None:
        """What the callbacks asked of the rows of the last poll, for the
        next (`StudyController.progress`); None where no trainable waits."""
        if not self.answers_checkpoint_requests:
            return None
        asked, self._asked = self._asked, []
        return CallbackAnswer(self._rows_through, asked)

    def _end(self, event: dict[str, Any], failed: bool) -> None:
        view = self._view(event)
        if self._on_loop:  # its hooks see the trial's results in its files, as under Tune
            self._log.written()
        if failed:
            view.status, view.error_msg = ERROR, event.get("error") or ""
            self._failed(view, view.error_msg)
            self._call("on_trial_error", iteration=self.iteration, trials=self._trial_list, trial=view)
        else:
            view.status = TERMINATED
            self._call("on_trial_complete", iteration=self.iteration, trials=self._trial_list, trial=view)
        self._log.end(view, failed)
        if self._remote:
            self._log.then(functools.partial(self._upload, view))  # once its files are written

    def _failed(self, view: TrialView, error: str) -> None:
        """A failure of the trial, retried or its last: counted, and added to
        its error.txt as Tune's ``Trial.handle_error`` adds it (a retried
        trial's file keeps its failures, as under Tune)."""
        view.run_metadata.num_failures += 1
        try:
            view.init_local_path()
            with open(os.path.join(view.local_path, EXPR_ERROR_FILE), "a") as file:
                file.write(f"Failure # {view.run_metadata.num_failures} (occurred at {date_str()})\n{error}\n")
        except OSError as fault:
            self._storage_fault(fault)

    def _checkpoint(self, event: dict[str, Any]) -> None:
        """A checkpoint in the trial's folder: each as it is registered
        (``iteration`` given: Tune's ``on_trial_save`` then
        ``on_checkpoint``, the trial's ``checkpoint`` the new one), else the
        final one at the study's end."""
        from ray.tune import Checkpoint

        view = self._view(event)
        filesystem = None if self._storage_filesystem is None else arrow_filesystem(self._storage_filesystem)
        view.checkpoint = Checkpoint(event["path"], filesystem)
        if "iteration" in event:
            self._call("on_trial_save", iteration=self.iteration, trials=self._trial_list, trial=view)
        self._call(
            "on_checkpoint", iteration=self.iteration, trials=self._trial_list, trial=view, checkpoint=view.checkpoint
        )

    def end(self, interrupted: bool = False) -> None:
        """The study is over (``interrupted``: its driver stopped it):
        ``on_experiment_end``, the logs written, then the last upload."""
        if self.status is not None:
            self.status.close(INTERRUPTED_STUDY if interrupted else ENDED_STUDY)
        self._call("on_experiment_end", trials=self._trial_list)
        self.close_logs()
        self._log.raise_error()
        if self._remote:
            if not self.sync():
                logger.warning("the trials' logs storage refused are kept in %s", self.local_experiment_path)
                return
            # Everything is in the trials' folders now; a later driver (a
            # restore) fetches what it continues from there.
            shutil.rmtree(self.local_experiment_path, ignore_errors=True)

    def wait_for_logs(self) -> None:
        """Wait until what the loggers were handed is written (and uploaded, for a remote study)."""
        self._log.drain()
        self._log.raise_error()

    def close_logs(self) -> None:
        """Write the logs handed over so far and stop their thread (`end`,
        or a study that raised: its status file says it failed)."""
        if self.status is not None:
            self.status.close(FAILED_STUDY)
        self._log.close()

    def _write_policy(self, steps: Any) -> None:
        """PBT's exploits into Ray's policy files (a remote study's uploaded at once: exploits are few)."""
        try:
            os.makedirs(self.local_experiment_path, exist_ok=True)
            for name in write_policy(steps, self.local_experiment_path):
                if self._storage is not None:
                    self._storage.filesystem.put_file(
                        os.path.join(self.local_experiment_path, name), self._storage.path(name)
                    )
        except OSError as error:
            self._storage_fault(error)

    def _write_output(self, outputs: list[tuple[str, list[tuple[str, str]]]]) -> None:
        """What trainables printed, appended to their trials' files (``log_to_file``; a remote study's uploaded
        with the trial's other files)."""
        try:
            for trial_id, chunks in outputs:
                view = self.trials.get(trial_id)
                if view is None:
                    continue
                by_file: dict[str, list[str]] = {}
                for name, text in chunks:
                    by_file.setdefault(name, []).append(text)
                os.makedirs(view.local_path, exist_ok=True)
                for name, texts in by_file.items():
                    with open(os.path.join(view.local_path, name), "a", encoding="utf-8") as file:
                        file.write("".join(texts))
        except OSError as error:
            self._storage_fault(error)

    # -- remote experiment paths ----------------------------------------------------

    def sync(self) -> bool:
        """Upload what changed in the staged logs to the trials' folders;
        False when storage refused some."""
        self._last_sync = time.monotonic()
        return all([self._upload(view) for view in self.trials.values()])

    def _upload(self, view: TrialView) -> bool:
        try:
            self._upload_changed(view)
        except OSError as error:  # what was not uploaded goes at the next sync
            self._storage_fault(error)
            return False
        return True

    def _upload_changed(self, view: TrialView) -> None:
        if not os.path.isdir(view.local_path):
            return
        filesystem = self._storage.filesystem
        for folder, _, files in os.walk(view.local_path):
            for name in files:
                local = os.path.join(folder, name)
                stat = os.stat(local)
                if self._uploaded.get(local) == (stat.st_size, stat.st_mtime_ns):
                    continue
                relative = os.path.relpath(local, view.local_path).replace(os.sep, "/")
                remote = self._storage.path(f"{view.dirname}/{relative}")
                filesystem.makedirs(posixpath.dirname(remote), exist_ok=True)
                filesystem.put_file(local, remote)
                self._uploaded[local] = (stat.st_size, stat.st_mtime_ns)


def _last_iteration(path: str) -> int | None:
    """The last ``training_iteration`` a ``result.json`` holds (a torn last
    line, from a driver killed mid-write, is skipped)."""
    if not os.path.exists(path):
        return None
    last = None
    with open(path) as file:
        for line in file:
            try:
                iteration = json.loads(line).get("training_iteration")
            except (json.JSONDecodeError, AttributeError):
                continue
            if isinstance(iteration, int) and (last is None or iteration > last):
                last = iteration
    return last
