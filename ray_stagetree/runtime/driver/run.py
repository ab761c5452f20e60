"""A study's run from the driver: what ``Tuner.fit`` does once the Tuner
has checked its arguments, and what `Study` (evaluate, extend) and the
command line run the same way.

`StudyRun` assembles the `StudySpec` from a Tuner's settings (its public
attributes), starts the study's controller with its workers (or attaches
the study to a plan service), polls it into Tune's callbacks and the
progress line until it ends or the driver is interrupted, continues it from
its last snapshot when the controller's process dies, and builds the
`ResultGrid`.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import datetime
import logging
import math
import posixpath
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import ray
from ray import tune
from ray.tune.error import TuneError
from ray.tune.search import BasicVariantGenerator, Searcher
from ray.tune.utils import date_str
from ray.tune.utils.log import Verbosity, set_verbosity

from ray_stagetree.execution.payload_auth import TRUST_ENV, experiment_key, key_dir, trust_storage
from ray_stagetree.execution.scaling import describe, groups_that_fit
from ray_stagetree.execution.storage import CheckpointStorage
from ray_stagetree.monitor.live import live_monitor
from ray_stagetree.planning.filesystems import arrow_filesystem
from ray_stagetree.planning.lifecycle import ERROR, TERMINATED
from ray_stagetree.runtime.control.controller import fetch_summaries
from ray_stagetree.runtime.control.experiment_state import (
    Restore,
    can_restore,
    has_state,
    read_state,
    restored_progress,
)
from ray_stagetree.runtime.control.messages import Progress, StudyError, TrialSummary, tagged
from ray_stagetree.runtime.control.spec import LoopSpec, StudySpec, WorkerSpec, live_nodes
from ray_stagetree.runtime.driver.arguments import (
    check_resource_request,
    keep_workers_seconds,
    max_pending_trials,
    request_bundles,
    restore_retries,
    stall_warning_seconds,
    state_period,
    storage_wait,
    strict_metric_checking,
)
from ray_stagetree.runtime.driver.callback_hooks import asks_for_checkpoints, wants_each_checkpoint
from ray_stagetree.runtime.driver.callbacks import CallbackRunner
from ray_stagetree.runtime.driver.cluster import check_shared_storage
from ray_stagetree.runtime.driver.controllers import keep_controller, start_controller
from ray_stagetree.runtime.driver.kept_workers import keep_workers, take_workers
from ray_stagetree.runtime.driver.notebook import ray_init_options
from ray_stagetree.runtime.driver.progress import ProgressReporter
from ray_stagetree.runtime.driver.restoring import save_settings
from ray_stagetree.runtime.driver.results import ResultGrid, TrialResult
from ray_stagetree.runtime.driver.settings import StudySettings, TrialSource
from ray_stagetree.runtime.driver.status_file import StatusFile
from ray_stagetree.runtime.driver.tune_compat import adopt_scheduler_state, adopt_searcher_state
from ray_stagetree.runtime.driver.tune_state import write_tune_state
from ray_stagetree.runtime.service.service_client import run_attached
from ray_stagetree.runtime.workers.reproducibility import Reproducibility
from ray_stagetree.runtime.workers.trial_errors import unpack_error
from ray_stagetree.searchers.sources import SearcherSource, VariantSource
from ray_stagetree.searchers.variants import tuned_paths
from ray_stagetree.trial_schedulers.ray_fields import log_files, trainable_resources

logger = logging.getLogger("ray_stagetree")

#: Seconds between the driver's polls of the study's progress.
POLL_SECONDS = 0.5

#: Times a study whose controller's process died continues from its last
#: snapshot, in the same fit(), before it stops with an error.
CONTROLLER_RESTARTS = 3

#: How the message of an interrupted study says to continue it, given its
#: experiment directory: Tune's call for a Python script; the command line sets its own (`restore_hint`).
_RESTORE_HINT: contextvars.ContextVar[Callable[[str], str]] = contextvars.ContextVar(
    "stagetree_restore_hint", default=lambda path: f"Tuner.restore({path!r}, trainable)"
)


@contextlib.contextmanager
def restore_hint(hint: Callable[[str], str]) -> Iterator[None]:
    """Studies run inside say how to continue them with ``hint(path)``:
    ``stagetree`` says ``stagetree restore PATH`` where a script says ``Tuner.restore``."""
    token = _RESTORE_HINT.set(hint)
    try:
        yield
    finally:
        _RESTORE_HINT.reset(token)


def how_to_continue(path: str) -> str:
    """How the entry point running the study continues the one at ``path``."""
    return _RESTORE_HINT.get()(path)


def _artifact_sync(sync_config: Any) -> dict[str, Any]:
    """``SyncConfig``'s settings for trials' working directories, as `StudySpec` fields (Tune's defaults)."""
    return {
        "sync_artifacts": bool(getattr(sync_config, "sync_artifacts", False)),
        "sync_artifacts_on_checkpoint": bool(getattr(sync_config, "sync_artifacts_on_checkpoint", True)),
        "sync_period_s": float(getattr(sync_config, "sync_period", 300.0)),
    }


class StudyRun:
    """One run of ``tuner``'s study in its experiment folder (``tuner.experiment_path``)."""

    def __init__(self, tuner: StudySettings) -> None:
        self.tuner = tuner
        self.experiment_path = tuner.experiment_path
        self.storage_filesystem = tuner.run_config.storage_filesystem

    def execute(
        self, trial_source: TrialSource, horizon: int | None, resume: bool, restore: Restore | None = None
    ) -> ResultGrid:
        """Run the trials of ``trial_source`` to ``horizon``, starting from the
        plan saved in the folder when ``resume``, or from a snapshot's whole
        study with ``restore``; raise the first trial error with Tune's
        ``fail_fast="raise"``."""
        started = time.time()
        if not ray.is_initialized():
            # joins the cluster the script runs on (RAY_ADDRESS, `ray start`), else starts one
            ray.init(**ray_init_options())
        check_shared_storage(self.experiment_path, self.storage_filesystem)
        spec = self.spec(trial_source, horizon, resume, restore)
        callbacks = self._callback_runner(
            trial_source, continues=resume or restore is not None, answers=spec.callbacks_ask_checkpoints
        )
        reporter = self._progress_reporter(trial_source)
        if restore is not None:  # the best so far counts the trials that ended before the interrupt
            reporter.observe(*restored_progress(restore))
        try:
            progress, summaries = self._run_to_the_end(spec, callbacks, reporter)
        finally:
            callbacks.close_logs()  # what the loggers were handed is written, also when fit() raises
        keep_settings(self.tuner, self.experiment_path)
        grid = self.result_grid(summaries, progress)
        write_tune_state(
            self.experiment_path,
            arrow_filesystem(self.storage_filesystem) if self.storage_filesystem else None,
            self.tuner.trainable_name,
            self.tuner.run_config.checkpoint_config,
            list(zip(summaries, grid)),
            started,
            self.tune_trial_fields(spec, callbacks),
        )
        failure = self.tuner.run_config.failure_config
        if failure is not None and failure.fail_fast == "raise" and grid.errors:
            raise grid.errors[0]
        return grid

    def tune_trial_fields(self, spec: StudySpec, callbacks: CallbackRunner) -> Callable[[TrialSummary], dict[str, Any]]:
        """What Tune's ``Trial`` of a trial holds beside its results: the
        resources it asked for (from its config, or the study's), its searched
        values and ``FailureConfig.max_failures``."""
        study = tune.PlacementGroupFactory([spec.loop.worker.resources])
        failure = self.tuner.run_config.failure_config
        max_failures = failure.max_failures if failure is not None else 0

        def fields(summary: TrialSummary) -> dict[str, Any]:
            view = callbacks.trials.get(summary.trial_id)
            return {
                "placement_group_factory": summary.resources or study,
                "evaluated_params": view.evaluated_params if view is not None else {},
                "max_failures": max_failures,
            }

        return fields

    def spec(self, trial_source: TrialSource, horizon: int | None, resume: bool, restore: Restore | None) -> StudySpec:
        """The study as its controller runs it, from the Tuner's settings."""
        tuner = self.tuner
        resources = worker_resources(tuner, trial_source)
        # On a plan service the key is its plan directory's, which seals the shared checkpoints.
        key_path = posixpath.dirname(self.experiment_path) if tuner.plan_service else self.experiment_path
        worker_options: dict[str, Any] = {"num_cpus": resources.get("CPU", 0.0), "num_gpus": resources.get("GPU", 0.0)}
        custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU", "memory")}
        if custom:
            worker_options["resources"] = custom
        if "memory" in resources:
            worker_options["memory"] = resources["memory"]
        failure = tuner.run_config.failure_config
        concurrent = max_concurrent(tuner)
        loop = LoopSpec(
            worker=WorkerSpec(
                trainable=_pickled(tuner.trainable),
                options=worker_options,
                scaling=tuner.scaling,
                reproducibility=(
                    Reproducibility(tuner.seed, tuner.deterministic_algorithms) if tuner.reproducible else None
                ),
            ),
            experiment_path=self.experiment_path,
            storage_filesystem=self.storage_filesystem,
            num_workers=worker_count(
                tuner, resources, _trials_to_run(trial_source, restore) or tuner.tune_config.num_samples
            ),
            policy=tuner.policy,
            checkpoint_budget_bytes=tuner.checkpoint_budget_bytes,
            parked_per_worker=tuner.parked_trainables_per_worker,
            state_period_s=state_period(),
            storage_wait_s=storage_wait(),
            payload_key=payload_key(key_path, self.storage_filesystem, continues=resume or restore is not None),
            trust_storage=trust_storage(),
            stall_warning_s=stall_warning_seconds(),
        )
        return StudySpec(
            loop=loop,
            trial_source=trial_source,
            horizon=horizon,
            horizon_is_max_t=tuner.horizon_is_max_t,
            max_concurrent_trials=concurrent,
            max_pending_trials=trial_source.pending_limit(max_pending_trials(), concurrent),
            stage_sharing=tuner.stage_sharing,
            # -1 retries without limit, as in Tune
            max_failures=(math.inf if failure.max_failures == -1 else failure.max_failures) if failure else 0,
            fail_fast=failure.fail_fast if failure is not None else False,
            restore_retries=restore_retries(),
            stop_thresholds=tuner.stop_thresholds,
            stopper=tuner.stopper,
            scheduler=tuner.tune_config.scheduler,
            metric=tuner.tune_config.metric,
            mode=tuner.tune_config.mode,
            strict_metrics=strict_metric_checking(),
            time_budget_s=_seconds(tuner.tune_config.time_budget_s),
            checkpoint_config=tuner.run_config.checkpoint_config,
            class_trainable=isinstance(tuner.trainable, type),
            export_each_checkpoint=wants_each_checkpoint(tuner.run_config.callbacks),
            callbacks_ask_checkpoints=asks_for_checkpoints(tuner.run_config.callbacks, tuner.trainable),
            reuse_objects=bool(tuner.tune_config.reuse_actors) and isinstance(tuner.trainable, type),
            trial_request=None if tuner.scaling is not None else trial_request(tuner.trainable),
            log_files=log_files(tuner.run_config.log_to_file),
            working_dirs=f"{date_str()}/{loop.experiment_name}",
            **_artifact_sync(tuner.run_config.sync_config),
            resume=resume,
            restore=restore,
            trainable_name=tuner.trainable_name,
            trial_name_creator=tuner.tune_config.trial_name_creator,
            trial_dirname_creator=tuner.tune_config.trial_dirname_creator,
            tuned_paths=None if isinstance(trial_source, SearcherSource) else tuned_paths(tuner.param_space),
        )

    def _run_to_the_end(
        self, spec: StudySpec, callbacks: CallbackRunner, reporter: ProgressReporter
    ) -> tuple[Progress, list[TrialSummary]]:
        """`_run_controller`, again from the last snapshot each time the
        controller's process dies (`CONTROLLER_RESTARTS` times at most)."""
        restarts = 0
        while True:
            try:
                return self._run_controller(spec, callbacks, reporter)
            except ray.exceptions.RayActorError as error:  # the controller's process died
                storage = CheckpointStorage(self.experiment_path, self.storage_filesystem)
                restarts += 1
                if restarts > CONTROLLER_RESTARTS or not has_state(storage):
                    raise RuntimeError(
                        f"the study's controller died ({type(error).__name__}) {restarts} times; continue the "
                        f"study with {how_to_continue(self.experiment_path)}"
                    ) from error
                logger.warning(
                    "the study's controller died (%s); continuing from its last snapshot (restart %d of %d)",
                    type(error).__name__,
                    restarts,
                    CONTROLLER_RESTARTS,
                )
                spec = dataclasses.replace(spec, resume=False, restore=Restore(read_state(storage)))

    def _run_controller(
        self, spec: StudySpec, callbacks: CallbackRunner, reporter: ProgressReporter
    ) -> tuple[Progress, list[TrialSummary]]:
        """Run the study's controller and workers to the end (or Ctrl-C);
        the last progress and the trials' summaries. Raises RayActorError
        when the controller's process dies."""
        tuner = self.tuner
        if tuner.plan_service is not None:
            with _interruptible() as interrupted:
                return run_attached(
                    tuner.plan_service,
                    spec,
                    tuner.share_key,
                    tuner.storage_path,
                    callbacks,
                    reporter,
                    interrupted,
                    POLL_SECONDS,
                )
        keep_s = keep_workers_seconds()  # checked before the study runs, not after
        controller = start_controller(spec)
        worker_spec = spec.loop.worker
        workers = take_workers(worker_spec, controller, spec.loop.num_workers)
        # The others start with the controller rather than after it.
        workers += [worker_spec.start(controller) for _ in range(spec.loop.num_workers - len(workers))]
        run = controller.run.remote(workers)
        # Until the study's processes are gone: a Ctrl-C after the study ended
        # (while the loggers finish, or during clean-up) is absorbed, not raised
        # half way through them; a second one still raises.
        metric, mode = tuner.tune_config.metric, tuner.tune_config.mode
        monitor = (
            live_monitor(self.experiment_path, controller, metric, mode, self.storage_filesystem)
            if tuner.monitor
            else contextlib.nullcontext()
        )
        ended = False  # the study ran to its end: its controller's process may run this driver's next study
        with _interruptible() as interrupted, monitor:
            try:
                # Where a trainable waits for the callbacks' answer, the poll returns as soon as it waits.
                answer, wait_s = None, POLL_SECONDS if callbacks.answers_checkpoint_requests else 0.0
                while not ray.wait([run], timeout=POLL_SECONDS - wait_s)[0] and not interrupted.is_set():
                    progress = ray.get(controller.progress.remote(answer, wait_s))
                    callbacks.update(progress)
                    answer = callbacks.answer()
                    reporter.update(progress, trials=callbacks.reported_trials())
                if ray.wait([run], timeout=0)[0]:
                    _ended(run)
                else:
                    self._interrupted(controller)
                progress = ray.get(controller.progress.remote())
                callbacks.update(progress)
                if progress.study_error is not None:
                    raise StudyError(progress.study_error)
                reporter.update(progress, final=True, trials=callbacks.reported_trials(), partial=interrupted.is_set())
                summaries = fetch_summaries(controller.results.remote)
                if isinstance(tuner.tune_config.search_alg, Searcher):
                    adopt_searcher_state(tuner.tune_config.search_alg, ray.get(controller.searcher.remote()))
                if tuner.tune_config.scheduler is not None:
                    adopt_scheduler_state(tuner.tune_config.scheduler, ray.get(controller.scheduler.remote()))
                callbacks.end(interrupted=interrupted.is_set())
                ended = not interrupted.is_set()
            except Exception as error:
                if not isinstance(error, ray.exceptions.RayError):  # a callback raised: fit() raises it, as Tune's
                    _save_before_raising(controller)
                raise
            finally:
                closed, spared = False, []
                try:
                    spared = ray.get(controller.shutdown_workers.remote(spare=ended and keep_s > 0))
                    closed = True
                except ray.exceptions.RayActorError:
                    pass  # it died: the workers started here still hold what they grew
                finally:
                    for index, worker in enumerate(workers):
                        if index not in spared:
                            worker_spec.stop(worker, closed=closed)
                    keep_workers(worker_spec, [workers[index] for index in spared], keep_s)
                    if closed and ended:
                        keep_controller(controller)
                    else:
                        ray.kill(controller)
        return progress, summaries

    def _interrupted(self, controller: Any) -> None:
        """The driver was interrupted: the study is saved as it stands, and the user told how to continue it."""
        not_saved = ray.get(controller.interrupt.remote())
        if not_saved is None:
            logger.warning(
                "The study was interrupted; its state is saved. Continue it with %s",
                how_to_continue(self.experiment_path),
            )
        else:
            logger.warning("The study was interrupted; storage refused its state: %s", not_saved)

    def _callback_runner(self, trial_source: TrialSource, continues: bool, answers: bool) -> CallbackRunner:
        """``RunConfig.callbacks`` and Tune's default loggers, set up as Tune
        sets them up, and the study's status file (written from here on);
        ``answers``: the trainable waits for their checkpoint requests."""
        run_config = self.tuner.run_config
        sync_config = getattr(run_config, "sync_config", None)
        runner = CallbackRunner(
            run_config.callbacks,
            self.experiment_path,
            self.storage_filesystem,
            self.tuner.param_space,
            sync_period=getattr(sync_config, "sync_period", 300.0),
            status=StatusFile(self.experiment_path, self.storage_filesystem, continues=continues),
            answers_checkpoint_requests=answers,
            raise_errors=run_config.failure_config is not None and run_config.failure_config.fail_fast == "raise",
        )
        runner.setup(
            stop=self.tuner.stopper,
            num_samples=self.tuner.tune_config.num_samples,
            total_num_samples=_total_samples(trial_source),
        )
        return runner

    def _progress_reporter(self, trial_source: TrialSource) -> ProgressReporter:
        """The stage-sharing line, or ``RunConfig.progress_reporter``'s
        table with that line in it; ``verbose=0`` prints neither."""
        run_config, tune_config = self.tuner.run_config, self.tuner.tune_config
        table = run_config.progress_reporter
        if table is not None:
            # As Tune's loop: the reporter takes TuneConfig's metric and mode
            # (and refuses them when it was given its own).
            table.setup(
                start_time=time.time(),
                total_samples=_total_samples(trial_source),
                metric=tune_config.metric,
                mode=tune_config.mode,
            )
            # Tune's reporters read the process's verbosity, which every Ray Tune run sets (its new output
            # engine, which ignores a reporter, to 0): the legacy engine's default, which shows the table.
            set_verbosity(Verbosity.V3_TRIAL_DETAILS)
        verbose = 0 if run_config.verbose == 0 else 1
        return ProgressReporter(tune_config.metric, tune_config.mode, verbose=verbose, table=table)

    def result_grid(self, summaries: list[TrialSummary], progress: Progress) -> ResultGrid:
        """The trials' summaries as Tune's ``ResultGrid``, with the study's figures."""
        results = []
        filesystem = None if self.storage_filesystem is None else arrow_filesystem(self.storage_filesystem)
        for summary in summaries:
            rows = summary.rows
            checkpoints = [(tune.Checkpoint(path, filesystem), metrics) for path, metrics in summary.checkpoints]
            best = [(tune.Checkpoint(path, filesystem), metrics) for path, metrics in summary.best_checkpoints]
            error = None
            if summary.status == ERROR:
                error = unpack_error(summary.error_pickle, summary.error, summary.name)
            # A trial that reported nothing: Tune's last result of it holds its id whatever else it lacks.
            metrics = summary.returned_result or {"trial_id": summary.trial_id, "config": summary.shown_config}
            results.append(
                TrialResult(
                    rows,
                    metrics=tagged(rows[-1], summary.experiment_tag) if rows else metrics,
                    checkpoint=checkpoints[-1][0] if checkpoints else None,
                    best_checkpoints=best,
                    error=error,
                    path=f"{self.experiment_path}/{summary.dirname}",
                )
            )
        return ResultGrid(
            results,
            self.experiment_path,
            self.tuner.tune_config.metric,
            self.tuner.tune_config.mode,
            iterations=progress.iterations,
            unique_iterations=progress.unique_iterations,
            total_iterations=progress.total_iterations,
            worker_seconds=progress.worker_seconds,
            phase_seconds=progress.phase_seconds,
            state_seconds=progress.state_seconds,
            storage_filesystem=filesystem,
        )


def keep_settings(tuner: StudySettings, experiment_path: str) -> None:
    """The experiment folder lost its files while the study ran (deleted
    or emptied): the settings a restore needs are written again (the
    controller's last snapshot already was), and the user is told what is gone."""
    if tuner.plan_service or can_restore(CheckpointStorage(experiment_path, tuner.run_config.storage_filesystem)):
        return
    save_settings(tuner, experiment_path)
    logger.warning(
        "the experiment folder %s lost its files while the study ran (deleted or emptied): its settings and last "
        "snapshot are written again, so %s continues it, but the checkpoints and trial folders stored there "
        "before are gone: a restore retrains what it needs of them",
        experiment_path,
        how_to_continue(experiment_path),
    )


def payload_key(experiment_path: str, storage_filesystem: Any, continues: bool) -> bytes:
    """The experiment's key for sealing checkpoints, from this machine's
    key folder (created for a new experiment). Continuing an experiment
    whose key is not here, its stored checkpoints are retrained unless
    the directory is declared trusted: say so before that happens."""
    key, existed = experiment_key(CheckpointStorage(experiment_path, storage_filesystem))
    if continues and not existed and not trust_storage():
        logger.warning(
            "no key for the experiment at %s in %s (it ran on another machine, or its key was deleted): its "
            "stored checkpoints cannot be authenticated and are retrained where needed. If the directory is "
            "trusted, copy the key file from the machine that ran it, or set %s=1",
            experiment_path,
            key_dir(),
            TRUST_ENV,
        )
    return key


def trial_request(trainable: Any) -> Callable[[dict[str, Any]], Any] | None:
    """Where each trial asks for its own resources, from its config (a
    class's own ``default_resource_request``, or ``tune.with_resources`` of a
    function of the config), what gives a trial's request, as Tune asks it
    per trial; None where every trial asks for the same."""
    from ray.tune import Trainable
    from ray.tune.execution.placement_groups import resource_dict_to_pg_factory

    request = trainable_resources(trainable)
    if isinstance(trainable, type) and request is None:
        overridden = getattr(trainable, "default_resource_request", None)
        if overridden is None or getattr(overridden, "__func__", None) is Trainable.default_resource_request.__func__:
            return None
        request = trainable.default_resource_request
    if not callable(request) or hasattr(request, "bundles"):
        return None

    def asked(config: dict[str, Any]) -> Any:
        asked_for = request(config)
        return resource_dict_to_pg_factory(asked_for) if isinstance(asked_for, dict) else asked_for

    return asked


def worker_resources(tuner: StudySettings, trial_source: TrialSource) -> dict[str, float]:
    """One stage worker's resources: ``tune.with_resources``, or a class's
    ``default_resource_request``, for the first trial's config (the study's
    workers start so; a trial that asks for others gets a worker of its
    own shape, `trial_request`)."""
    if tuner.scaling is not None:  # one rank's
        return tuner.scaling.resources
    first = trial_source.peek() if isinstance(trial_source, VariantSource) else None
    config = first if first is not None else tuner.param_space
    asked = trial_request(tuner.trainable)
    request = asked(config) if asked is not None else trainable_resources(tuner.trainable)
    if request is None:
        return {"CPU": 1.0}
    check_resource_request(request)  # (Tune's with_resources and trial_request make a dict a PlacementGroupFactory)
    # A worker is one actor: a multi-bundle request (a trainer and its
    # workers, in Tune) is reserved as the sum of its bundles.
    total: dict[str, float] = {}
    for bundle in request_bundles(request):
        for key, value in bundle.items():
            total[key] = total.get(key, 0.0) + float(value)
    return {key: value for key, value in total.items() if value}


def worker_count(tuner: StudySettings, resources: dict[str, float], trials: float) -> int:
    """The stage workers the study starts: as many as the cluster holds,
    at most one per trial to run and ``max_concurrent_trials``."""
    total = ray.cluster_resources()
    fits = []
    if tuner.scaling is not None:
        groups = groups_that_fit(live_nodes(), tuner.scaling)
        if not groups:
            raise ValueError(
                f"each trial asks for a group of {describe(tuner.scaling)} in one placement group, and the "
                f"Ray cluster's nodes ({live_nodes()}) cannot place one: no trial can ever start (check "
                "scaling_config: num_workers, resources_per_worker, placement_strategy)"
            )
        fits.append(groups)
        resources = {}
    for key, amount in resources.items():
        available = total.get(key, 0.0)
        if amount > available:
            raise ValueError(
                f"each trial asks for {amount:g} {key} but the Ray cluster has {available:g}: "
                "no worker can ever start (check tune.with_resources)"
            )
        fits.append(math.floor(available / amount))
    workers = min([trials, *fits]) if fits else trials
    concurrent = max_concurrent(tuner)
    if concurrent:
        workers = min(workers, concurrent)
    if math.isinf(workers):  # num_samples=-1 and a trainable that asks for no resource
        workers = int(total.get("CPU", 1))
    return max(1, int(workers))


def max_concurrent(tuner: StudySettings) -> int | None:
    """TuneConfig.max_concurrent_trials, or a BasicVariantGenerator's max_concurrent."""
    generator = tuner.tune_config.search_alg
    own = generator.max_concurrent if isinstance(generator, BasicVariantGenerator) else 0
    return tuner.tune_config.max_concurrent_trials or own or None


def _ended(run: Any) -> None:
    """The controller's run, ended: an error it raised as a ``TuneError`` (Tune's
    for an error raised handling a trial's result) is raised as itself, as
    Tune's ``fit()`` raises it, not in Ray's wrapper."""
    try:
        ray.get(run)
    except ray.exceptions.RayTaskError as error:
        if isinstance(error.cause, TuneError):
            raise error.cause from None
        raise


def _seconds(budget: float | datetime.timedelta | None) -> float | None:
    return budget.total_seconds() if isinstance(budget, datetime.timedelta) else budget


def _pickled(trainable: Any) -> bytes:
    try:
        return ray.cloudpickle.dumps(trainable)
    except Exception as error:
        raise ValueError(
            f"the trainable cannot be sent to Ray workers ({type(error).__name__}: {error}); pass large or "
            "unpicklable objects with tune.with_parameters(...) or create them inside the trainable"
        ) from None


def _save_before_raising(controller: Any) -> None:
    """The driver stops on an error of its own (a callback raised): the
    study is saved as the driver last saw it, as on Ctrl-C, so that
    `Tuner.restore` continues it (Tune saves its experiment state too)."""
    try:
        ray.get(controller.interrupt.remote())
    except ray.exceptions.RayError as error:
        logger.warning("the study could not be saved before fit() raised: %s", error)


@contextlib.contextmanager
def _interruptible() -> Iterator[threading.Event]:
    """Ctrl-C (SIGINT) and SIGUSR1 (Tune's convention, for drivers whose
    SIGINT is filtered, as in a Ray task) set the yielded event, which the
    poll loop checks between polls: an interruption never lands half way
    through handing results to the callbacks. A second one raises
    KeyboardInterrupt at once."""
    interrupted = threading.Event()
    if threading.current_thread() is not threading.main_thread():
        yield interrupted
        return

    def interrupt(signum: int, frame: Any) -> None:
        if interrupted.is_set():
            raise KeyboardInterrupt
        interrupted.set()

    signals = [signal.SIGINT] + ([signal.SIGUSR1] if hasattr(signal, "SIGUSR1") else [])
    previous = {number: signal.signal(number, interrupt) for number in signals}
    try:
        yield interrupted
    finally:
        for number, handler in previous.items():
            signal.signal(number, handler)


def _trials_to_run(trial_source: TrialSource, restore: Restore | None) -> float:
    """Trials still to come, and those a restore continues."""
    if restore is None:
        return trial_source.remaining
    return trial_source.remaining + sum(
        restore.action(trial.status) != "end" and trial.status != TERMINATED for trial in restore.state.trials
    )


def _total_samples(trial_source: TrialSource) -> int | None:
    """The trials a study will run, where known (not with ``num_samples=-1``)."""
    remaining = trial_source.remaining
    return int(remaining) if math.isfinite(remaining) else None
