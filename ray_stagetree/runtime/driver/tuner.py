"""`ray_stagetree.Tuner`: Ray Tune's ``Tuner`` with stage sharing.

Same arguments (Ray's own ``TuneConfig`` and ``RunConfig``), same result
objects. Everything is validated on the driver before anything trains: the
trainable, the horizon, the resources, and the configs of the search
space's first draw (every grid value, through `arguments`); the study
draws the rest as it admits trials.

(Over 600 lines: the Tuner is Tune's public surface in one class, as
Tune's own is: construction, ``fit``, ``restore``, ``can_restore``,
``get_results``, and the study's settings read from Tune's configs; the
argument checks live in `arguments`, the results in `results`.)
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import dataclasses
import datetime
import functools
import logging
import math
import numbers
import os
import posixpath
import signal
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import ray
from ray import tune
from ray.tune.search import BasicVariantGenerator, Searcher
from ray.tune.utils.log import Verbosity, set_verbosity
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from ray_stagetree.execution.parking import PARKED_PER_WORKER
from ray_stagetree.execution.payload_auth import TRUST_ENV, experiment_key, key_dir, trust_storage
from ray_stagetree.execution.scaling import describe, groups_that_fit
from ray_stagetree.execution.storage import CheckpointStorage
from ray_stagetree.execution.study_file import STUDY_FILE, study_record
from ray_stagetree.monitor.live import live_monitor
from ray_stagetree.planning.config import TrialConfig
from ray_stagetree.planning.filesystems import absolute_path, arrow_filesystem
from ray_stagetree.planning.lifecycle import ERROR, TERMINATED
from ray_stagetree.planning.policies import ExecutionPolicy
from ray_stagetree.planning.time_sharing import study_policy
from ray_stagetree.runtime.control.controller import StudyController, fetch_summaries
from ray_stagetree.runtime.control.experiment_state import (
    Restore,
    can_restore,
    has_state,
    read_state,
    read_tuner_settings,
    restored_progress,
    trial_summary,
    write_tuner_settings,
)
from ray_stagetree.runtime.control.messages import Progress, TrialSummary
from ray_stagetree.runtime.control.spec import StudySpec, WorkerSpec, live_nodes
from ray_stagetree.runtime.driver.arguments import (
    check_checkpoint_config,
    check_filesystem,
    check_path,
    check_resource_request,
    check_restore_arguments,
    check_run_config,
    check_stagetree_arguments,
    check_trainable,
    check_tune_config,
    check_writable,
    max_pending_trials,
    request_bundles,
    restore_retries,
    scaling_of,
    stall_warning_seconds,
    state_period,
    storage_wait,
)
from ray_stagetree.runtime.driver.callbacks import CallbackRunner, check_driver_hooks
from ray_stagetree.runtime.driver.cluster import check_shared_storage
from ray_stagetree.runtime.driver.lease import DriverLease, check_free
from ray_stagetree.runtime.driver.notebook import prepare_notebook, ray_init_options
from ray_stagetree.runtime.driver.progress import ProgressReporter
from ray_stagetree.runtime.driver.restoring import (
    PARAM_SPACE_KEYS,
    TRAINABLE_NAME,
    check_restored_param_space,
    check_restored_trainable,
    param_space_keys,
)
from ray_stagetree.runtime.driver.results import ResultGrid, TrialResult
from ray_stagetree.runtime.driver.tune_compat import (
    TUNES_TUNER,
    adopt_searcher_state,
    check_deprecated_at_fit,
    check_function_signature,
    check_param_space,
    check_serializable,
    hosted_trainer,
    hosts_trainer,
    is_ray_train_trainer,
    resolve_trainable,
    trainable_name,
    tune_run_config,
    tunes_tuner_for_trainer,
    uncopyable_value,
)
from ray_stagetree.runtime.driver.tune_state import write_tune_state
from ray_stagetree.runtime.service.service_client import PlanServiceConfig, run_attached, service_config
from ray_stagetree.runtime.service.trainable_identity import share_key
from ray_stagetree.runtime.workers.remote import remote_once
from ray_stagetree.runtime.workers.reproducibility import (
    Reproducibility,
    SeededRepeater,
    check_reproducibility_arguments,
    repeat_configs,
    trial_seed,
)
from ray_stagetree.runtime.workers.trial_errors import unpack_error
from ray_stagetree.searchers import SequenceGridSearch
from ray_stagetree.searchers.sources import SearcherSource, VariantSource
from ray_stagetree.searchers.variants import VariantStream, sample_variants, tuned_paths
from ray_stagetree.trial_schedulers.ray_fields import (
    config_interface,
    maximum_iterations,
    storage_context_class,
    trainable_resources,
    variant_generator_settings,
)
from ray_stagetree.trial_schedulers.registry import check_metric_conflict, check_scheduler, scheduler_max_t
from ray_stagetree.validation import Int, check

POLL_SECONDS = 0.5
#: Set while a Tuner is built for an experiment folder that is there already.
_EXISTING: contextvars.ContextVar[bool] = contextvars.ContextVar("stagetree_existing_experiment", default=False)


@contextlib.contextmanager
def in_existing_experiment() -> Iterator[None]:
    """Tuners built inside work in an experiment folder that exists
    (`Tuner.restore`, `Study`): they keep the settings saved there, which a
    later `Tuner.restore` reads, instead of writing their own."""
    token = _EXISTING.set(True)
    try:
        yield
    finally:
        _EXISTING.reset(token)


@contextlib.contextmanager
def writing_nothing() -> Iterator[None]:
    """Tuners built inside write nothing before ``fit()``: a job spec's dry
    Tuner (``stagetree plan``, the spec's checks) must leave no folder behind,
    nor overwrite the settings of an experiment that has its name; and
    ``stagetree run`` decides what to do with such an experiment first."""
    with in_existing_experiment():
        yield


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


#: Times a study whose controller's process died continues from its last
#: snapshot, in the same fit(), before it stops with an error.
CONTROLLER_RESTARTS = 3

logger = logging.getLogger("ray_stagetree")


class Tuner:
    """Run a hyper-parameter study where trials share their common prefixes.

    Parameters
    ----------
    trainable:
        A function ``train(config)`` using `ray_stagetree.report`, or a
        `StageTrainable` subclass; ``tune.with_resources`` and
        ``tune.with_parameters`` wrappers work as in Tune.
    param_space:
        Tune's search space; values may be sequences (`Exponential`, ...).
    tune_config:
        ``ray.tune.TuneConfig``: ``metric``, ``mode``, ``num_samples``,
        ``max_concurrent_trials`` are honoured.
    run_config:
        ``ray.tune.RunConfig``: ``stop={"training_iteration": N}`` sets the
        horizon, other ``stop`` keys are metric thresholds (a trial stops once
        its metric reaches one, as in Tune); ``name``, ``storage_path``, ``storage_filesystem``,
        ``failure_config.max_failures``, ``checkpoint_config`` and ``verbose`` are honoured. On a
        cluster of several nodes the storage path must be one every node sees.
    stage_sharing:
        False runs every trial on its own (the paper's "Hippo-trial"
        baseline), for comparisons.
    execution_policy:
        "critical_path" (default), "thr" or "bfs"; or time-sharing of the
        workers when trials outnumber them: "hermes" (convergence priority),
        "round_robin", "slaq", "fifo", or a configured policy object
        (`HermesPolicy(quantum_s=..., milestones=..., max_jobs_per_worker=...)`).
    checkpoint_budget_bytes:
        Object-store memory for checkpoints before the least valuable ones
        are dropped to storage.
    parked_trainables_per_worker:
        A trial paused where its trainable reported no checkpoint
        (synchronous HyperBand) keeps its trainable alive, parked on its
        worker, and goes on there when resumed instead of training again
        from scratch; each parked trainable holds its memory (GPU memory
        too). At most this many per worker (the oldest is let go first); 0
        parks none, as Tune, which restarts such trials.
    reproducible:
        Seed Python's, NumPy's and torch's generators on the workers at the
        start of every stage batch, from the trial's seed (its ``seed``
        config entry, else ``seed``) and the batch's first iteration, and
        draw random search spaces from ``seed``: a rerun on the same
        hardware reports bit-identical metrics.
    seed:
        The study's seed (an int >= 0).
    repeats:
        Train every configuration ``repeats`` times, with ``config["seed"]``
        set to ``seed``, ``seed + 1``, ...; repeats never share stages (the
        seed is in play from iteration 0), other configurations with the
        same seed do. ``ResultGrid.get_repeats_dataframe()`` gives the mean
        and standard deviation per configuration. With a searcher, it is
        wrapped in Tune's ``Repeater`` (it is told each configuration's mean)
        and ``num_samples`` counts configurations.
    deterministic_algorithms:
        With ``reproducible``, also ``torch.use_deterministic_algorithms(True)``
        on the workers (needed for bit-identical results on GPUs).
    monitor:
        Serve the study's web monitor on localhost while ``fit()`` runs (the
        URL is printed); see `ray_stagetree.monitor.serve`.
    plan_service:
        A plan service's name, or a `PlanServiceConfig`: the study attaches
        to that long-lived service (started if needed) and shares stages with
        the other studies of its trainable there, concurrent and earlier
        ones. Default: ``RAY_STAGETREE_PLAN_SERVICE``, else none (the study
        runs on its own).

    Examples
    --------
    >>> from ray import tune
    >>> from ray_stagetree import Tuner, MultiStep
    >>> tuner = Tuner(train, param_space={"lr": tune.grid_search(
    ...     [MultiStep(0.1, [m], 0.1) for m in (30, 60)])},
    ...     run_config=tune.RunConfig(stop={"training_iteration": 90}))   # doctest: +SKIP
    >>> results = tuner.fit()                                             # doctest: +SKIP
    """

    def __new__(cls, trainable: Any = None, *args: Any, **kwargs: Any) -> Any:
        """A legacy-engine ``TorchTrainer`` tuning its ``train_loop_config``
        runs here, on data-parallel stages (`tune_compat.hosted_trainer`).
        Any other Ray Train trainer (``Tuner(trainer)``, or a trainer's own
        ``fit()``, which builds a Tuner) is run by Ray Tune's Tuner, as Tune
        runs it: its worker groups are Ray Train's, and nothing is shared."""
        hosted = hosts_trainer(trainable, kwargs.get("param_space"))
        if (is_ray_train_trainer(trainable) and not hosted) or "_entrypoint" in kwargs:  # Ray's callers pass it
            return tunes_tuner_for_trainer(trainable, *args, **kwargs)
        return super().__new__(cls)

    def __init__(
        self,
        trainable: Callable | type | None = None,
        *,
        param_space: dict[str, Any] | None = None,
        tune_config: tune.TuneConfig | None = None,
        run_config: tune.RunConfig | None = None,
        stage_sharing: bool = True,
        execution_policy: str | ExecutionPolicy = "critical_path",
        checkpoint_budget_bytes: int = 2 * 1024**3,
        parked_trainables_per_worker: int = PARKED_PER_WORKER,
        reproducible: bool = False,
        seed: int = 0,
        repeats: int = 1,
        deterministic_algorithms: bool = False,
        monitor: bool = False,
        plan_service: str | PlanServiceConfig | None = None,
        scaling_config: Any = None,
    ) -> None:
        # A registered name (tune.register_trainable) stands for its function or class; Tune's name for it
        # (the registered name, else the function's) starts the default trial names.
        if not trainable:  # Tune's error
            from ray.tune.error import TuneError

            raise TuneError("You need to provide a trainable to tune.")
        self.scaling_config = scaling_config  # as given (Tuner.restore gives it again), not a hosted trainer's
        trainable, param_space, scaling_config = hosted_trainer(trainable, param_space, scaling_config)
        self.trainable = resolve_trainable(trainable)
        check_trainable(self.trainable)
        self._trainable_name = trainable_name(trainable)
        self.plan_service = service_config(plan_service)
        # `is None`, not falsiness: an empty dict given as a config is refused, not replaced.
        if isinstance(param_space, config_interface()):  # as Tune: a config object's to_dict()
            param_space = param_space.to_dict()
        self.param_space = {} if param_space is None else param_space
        self.tune_config = tune.TuneConfig() if tune_config is None else tune_config
        self.run_config = tune.RunConfig() if run_config is None else tune_run_config(run_config)
        self.stage_sharing = stage_sharing
        self.execution_policy = execution_policy
        self.checkpoint_budget_bytes = checkpoint_budget_bytes
        self.parked_trainables_per_worker = parked_trainables_per_worker
        self.reproducible = reproducible
        self.seed = seed
        self.repeats = repeats
        self.deterministic_algorithms = deterministic_algorithms
        self.monitor = monitor
        self._scaling = scaling_of(scaling_config)
        self._restore_options: tuple[bool, bool, bool] | None = None  # set by Tuner.restore
        self._results: ResultGrid | None = None  # the last fit()'s, for get_results()
        self._validate_arguments()
        # As Tune: the experiment folder, with what restore needs, exists from here on, so
        # Tuner.can_restore(path) holds before fit() (a restore continues it from scratch).
        self._experiment_dir = self._experiment_path()
        if not _EXISTING.get():
            storage = CheckpointStorage(self._experiment_dir, self.run_config.storage_filesystem)
            check_writable(storage, self._experiment_dir)
            check_free(storage, self._experiment_dir)  # the settings a live driver's study restores from stay
            self._save_settings(self._experiment_dir)

    def get_results(self) -> ResultGrid:
        """The `ResultGrid` the last `fit()` returned (Tune's ``Tuner.get_results``)."""
        if self._results is None:  # Tune's message
            raise RuntimeError(
                "Can't return results as experiment has not been run, yet. Call `Tuner.fit()` to run the "
                "experiment first."
            )
        return self._results

    # -- restore ----------------------------------------------------------------------

    @classmethod
    def restore(
        cls,
        path: str,
        trainable: Callable | type,
        *,
        resume_unfinished: bool = True,
        resume_errored: bool = False,
        restart_errored: bool = False,
        param_space: dict[str, Any] | None = None,
        storage_filesystem: Any = None,
        monitor: bool = False,
        **tune_internal: Any,
    ) -> Tuner:
        """A Tuner that continues the study saved at ``path`` when ``fit()`` is called.

        Everything the study stored is kept: finished trials' results, and
        every stage trained up to its latest stored checkpoint. What never
        reached storage trains again. A study that ran on a plan service
        attaches to it again: the service's plan answers what it trained.

        Parameters
        ----------
        path:
            The experiment directory (``ResultGrid.experiment_path``; a
            local path or a URI). It may have moved since the study ran.
        trainable:
            The study's trainable, wrapped as it was (``tune.with_resources``,
            ``tune.with_parameters``): code and object refs are not saved.
        resume_unfinished:
            Continue trials that were pending, running or paused; if False
            they end where they stood.
        resume_errored:
            Run errored trials again from their latest checkpoint.
        restart_errored:
            Start errored trials' results over (takes precedence over
            ``resume_errored``); iterations the plan stored are not trained again.
        param_space:
            Given again when the original cannot be restored (it held object refs).
        storage_filesystem:
            The filesystem ``path`` is in, as in ``RunConfig``.
        monitor:
            Serve the web monitor while the study continues, as ``Tuner(monitor=True)``.

        Examples
        --------
        >>> if Tuner.can_restore(path):                                 # doctest: +SKIP
        ...     tuner = Tuner.restore(path, train, resume_errored=True)
        ... else:
        ...     tuner = Tuner(train, param_space=space, run_config=run_config)
        >>> results = tuner.fit()                                       # doctest: +SKIP
        """
        if "_resume_config" in tune_internal:  # a Ray Train trainer restoring itself: Tune's Tuner ran it
            return TUNES_TUNER.restore(
                path, trainable, param_space=param_space, storage_filesystem=storage_filesystem, **tune_internal
            )
        if tune_internal:  # Python's own message for an unexpected argument
            raise TypeError(f"Tuner.restore() got an unexpected keyword argument {next(iter(tune_internal))!r}")
        if not isinstance(trainable, str):  # a registered name is checked against the saved one first
            check_trainable(trainable)
        check_restore_arguments(
            path,
            storage_filesystem,
            param_space,
            {
                "resume_unfinished": resume_unfinished,
                "resume_errored": resume_errored,
                "restart_errored": restart_errored,
            },
        )
        path = absolute_path(os.fspath(path), storage_filesystem).rstrip("/")
        settings = read_tuner_settings(CheckpointStorage(path, storage_filesystem))
        check_restored_trainable(trainable, settings.get(TRAINABLE_NAME))
        check_trainable(resolve_trainable(trainable))  # after Tune's check: an unknown name is its ValueError
        if param_space is not None:
            check_restored_param_space(param_space, settings.get(PARAM_SPACE_KEYS))
        run_config = copy.copy(settings["run_config"])
        run_config.storage_path, run_config.name = posixpath.split(path)
        if settings["options"].get("plan_service") is not None:
            # An attached study's folder is storage_path/<service>/<plan directory>/name: it attaches again
            # (the service keeps no snapshot of a study; its plan answers what the study had trained).
            run_config.storage_path = posixpath.dirname(posixpath.dirname(run_config.storage_path))
        run_config.storage_filesystem = storage_filesystem
        with in_existing_experiment():
            tuner = cls(
                trainable,
                param_space=settings["param_space"] if param_space is None else param_space,
                tune_config=settings["tune_config"],
                run_config=run_config,
                **settings["options"],
                monitor=monitor,
            )
        tuner._restore_options = (resume_unfinished, resume_errored, restart_errored)
        tuner._results = tuner._stored_results()
        return tuner

    def _stored_results(self) -> ResultGrid | None:
        """The results of the study as its last snapshot left it, for
        ``get_results()`` before the restored study runs (Tune loads them the
        same way, and has none when they cannot be read)."""
        storage = CheckpointStorage(self._experiment_dir, self.run_config.storage_filesystem)
        try:
            if not has_state(storage):
                return None
            state = read_state(storage)
            progress = Progress(iterations=state.iterations, worker_seconds=state.worker_seconds)
            summaries = [trial_summary(trial) for trial in state.trials]
            return self._result_grid(summaries, self._experiment_dir, progress)
        except Exception as error:  # noqa: BLE001 - as Tune: results that cannot be read are no results
            logger.warning("the results stored at %s cannot be read: %s", self._experiment_dir, error)
            return None

    @classmethod
    def can_restore(cls, path: str, storage_filesystem: Any = None) -> bool:
        """True when ``path`` is a study's experiment directory that
        `restore` can continue (its trial folders are not)."""
        check_path("Tuner.can_restore", path)
        check_filesystem("Tuner.can_restore's storage_filesystem", storage_filesystem)
        return can_restore(CheckpointStorage(absolute_path(os.fspath(path), storage_filesystem), storage_filesystem))

    def _settings_kept(self, experiment_path: str) -> None:
        """The experiment folder lost its files while the study ran (deleted
        or emptied): the settings a restore needs are written again (the
        controller's last snapshot already was), and the user is told what is gone."""
        if self.plan_service or can_restore(CheckpointStorage(experiment_path, self.run_config.storage_filesystem)):
            return
        self._save_settings(experiment_path)
        logger.warning(
            "the experiment folder %s lost its files while the study ran (deleted or emptied): its settings and last "
            "snapshot are written again, so %s continues it, but the checkpoints and trial folders stored there "
            "before are gone: a restore retrains what it needs of them",
            experiment_path,
            how_to_continue(experiment_path),
        )

    def _save_settings(self, experiment_path: str) -> None:
        """What `restore` rebuilds this Tuner from, at the experiment root."""
        settings = {
            TRAINABLE_NAME: self._trainable_name,
            PARAM_SPACE_KEYS: param_space_keys(self.param_space),
            "param_space": self.param_space,
            "tune_config": self.tune_config,
            "run_config": self.run_config,
            "options": {
                "stage_sharing": self.stage_sharing,
                "execution_policy": self.execution_policy,
                "checkpoint_budget_bytes": self.checkpoint_budget_bytes,
                "parked_trainables_per_worker": self.parked_trainables_per_worker,
                "reproducible": self.reproducible,
                "seed": self.seed,
                "repeats": self.repeats,
                "deterministic_algorithms": self.deterministic_algorithms,
                "plan_service": self.plan_service,
                "scaling_config": self.scaling_config,
            },
        }
        storage = CheckpointStorage(experiment_path, self.run_config.storage_filesystem)
        # What the monitor and `stagetree status` rank trials by, readable without unpickling.
        storage.write_text(STUDY_FILE, study_record(self.tune_config.metric, self.tune_config.mode))
        if not write_tuner_settings(storage, settings):
            logger.warning(
                "the Tuner's param_space, TuneConfig or RunConfig cannot be pickled: the study runs, but "
                "Tuner.restore will not be able to continue it"
            )

    # -- validation (driver side, before anything runs) --------------------------

    def _trial_source_of_copyable_space(self) -> Any:
        """`_trial_source`; where Tune's copy of the param_space fails, the error names the value's key."""
        import pickle

        try:
            return self._trial_source()
        except (TypeError, pickle.PicklingError) as error:
            found = uncopyable_value(self.param_space)
            if found is None:
                raise
            path, value = found
            raise TypeError(
                f"param_space{path} = {value!r} cannot be copied ({type(error).__name__}: {error}), and Tune "
                "copies the param_space for each trial: pass it with tune.with_parameters(trainable, name=value), "
                "or make it inside the trainable"
            ) from error

    def _validate_arguments(self) -> None:
        trainable = self.trainable
        check_trainable(trainable)
        check_serializable(trainable)
        check_param_space(self.param_space)
        check_tune_config(self.tune_config)
        check_run_config(self.run_config)
        check_stagetree_arguments(
            self.stage_sharing, self.checkpoint_budget_bytes, self.parked_trainables_per_worker, self.monitor
        )
        self._policy = study_policy(self.execution_policy, self.tune_config.metric, self.tune_config.mode)
        check_reproducibility_arguments(
            self.reproducible, self.seed, self.repeats, self.deterministic_algorithms, self.param_space
        )
        check_resource_request(trainable_resources(trainable))
        if self._scaling is not None and trainable_resources(trainable) is not None:
            raise ValueError(
                "scaling_config gives each rank's resources (ScalingConfig.resources_per_worker); the trainable "
                "also asks for some through tune.with_resources: give only scaling_config"
            )
        check_scheduler(self.tune_config.scheduler, self.tune_config.metric, self.tune_config.mode)
        check_metric_conflict(self.tune_config.scheduler, self.tune_config.metric, self.tune_config.mode)
        self._stop_criteria()
        check_driver_hooks(self.run_config)
        check_checkpoint_config(self.run_config.checkpoint_config, function_trainable=False)

    def _stop_criteria(self) -> None:
        """``RunConfig.stop`` as Tune takes it (None, a dict, a ``Stopper``, a
        function) into the horizon, when known, the metric thresholds and the
        stopper. The horizon only sizes requests: open-ended trials run until
        a criterion, their scheduler or the trainable ends them."""
        from ray.tune.stopper import FunctionStopper, MaximumIterationStopper, Stopper

        stop = self.run_config.stop
        scheduler = self.tune_config.scheduler
        max_t = scheduler_max_t(scheduler)
        self.horizon = int(max_t) if max_t is not None else None
        # Whether the scheduler's max_t, rather than a stop criterion, ends trials: Tune then asks it about the last result.
        self._horizon_is_max_t = max_t is not None
        self.stop_thresholds: dict[str, float] = {}
        self.stopper = None
        if stop is None:
            return
        if type(stop) is MaximumIterationStopper:  # {"training_iteration": max_iter}, which plans better
            self.horizon = maximum_iterations(stop)
            self._horizon_is_max_t = False
            return
        if isinstance(stop, Stopper):
            self.stopper = stop
            return
        if callable(stop):
            self.stopper = FunctionStopper(stop)
            return
        if not isinstance(stop, dict):
            raise ValueError(
                f"RunConfig.stop must be None, a dict, a ray.tune.Stopper or a function (trial_id, result) -> bool, "
                f"got {stop!r}"
            )
        for key, threshold in stop.items():
            if key != "training_iteration" and (not isinstance(threshold, numbers.Real) or threshold != threshold):
                raise ValueError(
                    f"RunConfig.stop[{key!r}] must be a number or a bool (a trial stops once its {key!r} "
                    f"reaches it), got {threshold!r}"
                )
        self.stop_thresholds = {key: value for key, value in stop.items() if key != "training_iteration"}
        if "training_iteration" in stop:
            self.horizon = int(check("RunConfig.stop['training_iteration']", stop["training_iteration"], Int(low=1)))
            self._horizon_is_max_t = False

    def _resources(self, trial_source: VariantSource | SearcherSource) -> dict[str, float]:
        """One stage worker's resources: ``tune.with_resources``, or a class's
        ``default_resource_request``, for the first trial's config (workers are
        alike: every trial of a study asks for the same)."""
        if self._scaling is not None:  # one rank's
            return self._scaling.resources
        first = trial_source.peek() if isinstance(trial_source, VariantSource) else None
        config = first if first is not None else self.param_space
        request = trainable_resources(self.trainable)
        if isinstance(self.trainable, type):
            request = self.trainable.default_resource_request(config)
        elif callable(request) and not hasattr(request, "bundles"):  # with_resources(fn, lambda config: ...)
            request = request(config)
        if request is None:
            return {"CPU": 1.0}
        check_resource_request(request)
        if isinstance(request, dict):
            return {key.upper() if key in ("cpu", "gpu") else key: float(v) for key, v in request.items() if v}
        # A worker is one actor: a multi-bundle request (a trainer and its
        # workers, in Tune) is reserved as the sum of its bundles.
        total: dict[str, float] = {}
        for bundle in request_bundles(request):
            for key, value in bundle.items():
                total[key] = total.get(key, 0.0) + float(value)
        return {key: value for key, value in total.items() if value}

    def _trial_source(self) -> VariantSource | SearcherSource:
        """Where trials come from. Grid and random variants are drawn as the
        study admits them; the points to evaluate and the grid's first repeat
        are drawn and validated here, before anything runs: every grid value
        is in them, so errors that come from the space itself show before
        training, and the cost does not grow with ``num_samples``. Later
        draws, and a searcher's suggestions, are validated as they come (a
        bad one errs its trial, as in Tune)."""
        config = self.tune_config
        if isinstance(config.search_alg, Searcher):
            searcher, num_samples = config.search_alg, config.num_samples
            if self.repeats > 1:
                searcher = SeededRepeater(searcher, self.repeats, self.seed)
                num_samples = num_samples * self.repeats if num_samples > 0 else num_samples
            spec = searcher_spec(self.run_config.stop, config.num_samples, config.time_budget_s, config.scheduler)
            return SearcherSource(searcher, self.param_space, config.metric, config.mode, num_samples, spec)
        each_draw = (
            functools.partial(repeat_configs, repeats=self.repeats, seed=self.seed) if self.repeats > 1 else None
        )
        if isinstance(config.search_alg, SequenceGridSearch):
            # Its filter makes the trials' number known only once all are drawn: drawn here.
            configs = config.search_alg.generate(self.param_space, config.num_samples)
            trial_source = VariantSource(each_draw(configs) if each_draw else configs)
        else:
            seed = self.seed if self.reproducible else None
            variants = _variants(self.param_space, config.num_samples, config.search_alg, seed, each_draw)
            trial_source = VariantSource(variants, skip_repeats=self.stage_sharing)
        for index, trial_config in enumerate(trial_source.drawn()):
            try:
                TrialConfig.from_config(trial_config)
                ray.cloudpickle.dumps(trial_config)
                if self.reproducible:
                    trial_seed(trial_config, Reproducibility(self.seed))
            except (TypeError, ValueError) as error:
                raise ValueError(f"trial {index} ({trial_config!r}) cannot run: {error}") from None
        return trial_source

    # -- running -------------------------------------------------------------------

    def _storage_path(self) -> str:
        return str(self.run_config.storage_path or os.path.expanduser("~/ray_results")).rstrip("/")

    def _experiment_path(self) -> str:
        """``storage_path/name``; on a plan service, the study's folder in its
        plan directory: ``storage_path/<service>/<study_group>-<fingerprint>/name``."""
        parent = self._storage_path()
        if self.plan_service is not None:
            self._share_key = share_key(self.plan_service.study_group, self.trainable, self._scaling)
            parent = f"{parent}/{self.plan_service.name}/{self._share_key.replace(':', '-')}"
        return f"{parent}/{self.run_config.name or self._default_name(parent)}"

    def _default_name(self, parent: str) -> str:
        """Tune's default experiment name, ``<trainable>_<date>``, with a
        suffix where that folder exists (a study of the same trainable that
        started in the same second): Tune would write both into one folder."""
        name = storage_context_class().get_experiment_dir_name(self.trainable)
        storage = CheckpointStorage(parent, self.run_config.storage_filesystem)
        if storage.filesystem.exists(storage.path(name)):
            name += f"_{uuid.uuid4().hex[:4]}"
        return name

    def _num_workers(self, resources: dict[str, float], trials: int) -> int:
        total = ray.cluster_resources()
        fits = []
        if self._scaling is not None:
            groups = groups_that_fit(live_nodes(), self._scaling)
            if not groups:
                raise ValueError(
                    f"each trial asks for a group of {describe(self._scaling)} in one placement group, and the "
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
        if self._max_concurrent:
            workers = min(workers, self._max_concurrent)
        if math.isinf(workers):  # num_samples=-1 and a trainable that asks for no resource
            workers = int(total.get("CPU", 1))
        return max(1, int(workers))

    @property
    def _max_concurrent(self) -> int | None:
        """TuneConfig.max_concurrent_trials, or a BasicVariantGenerator's max_concurrent."""
        generator = self.tune_config.search_alg
        own = generator.max_concurrent if isinstance(generator, BasicVariantGenerator) else 0
        return self.tune_config.max_concurrent_trials or own or None

    def _time_budget(self) -> float | None:
        budget = self.tune_config.time_budget_s
        return budget.total_seconds() if isinstance(budget, datetime.timedelta) else budget

    def _pickled_trainable(self) -> bytes:
        try:
            return ray.cloudpickle.dumps(self.trainable)
        except Exception as error:
            raise ValueError(
                f"the trainable cannot be sent to Ray workers ({type(error).__name__}: {error}); pass large or "
                "unpicklable objects with tune.with_parameters(...) or create them inside the trainable"
            ) from None

    def fit(self) -> ResultGrid:
        """Run the study; returns a `ResultGrid`.

        The study's state is saved in its experiment directory as it runs:
        after Ctrl-C (or SIGUSR1), a crash or a lost driver, `Tuner.restore`
        continues it (from the start, if the driver was lost before the
        study's first snapshot). Ctrl-C stops the study and returns the
        results so far."""
        prepare_notebook()
        check_function_signature(self.trainable)
        check_deprecated_at_fit(self.tune_config, self.run_config)
        # Tune refuses a function trainable's checkpoint_at_end / checkpoint_frequency in fit(), not at Tuner().
        function_trainable = not isinstance(self.trainable, type)
        check_checkpoint_config(self.run_config.checkpoint_config, function_trainable=function_trainable)
        experiment_path = self._experiment_dir
        storage = CheckpointStorage(experiment_path, self.run_config.storage_filesystem)
        check_writable(storage, experiment_path)
        # One driver per folder: a second one (a restore, a fresh fit()) is refused, naming the first.
        with DriverLease(storage, experiment_path):
            if self._restore_options is not None and has_state(storage):
                state = read_state(storage)
                restore = Restore(state, *self._restore_options)
                self._results = self._execute(
                    state.source, self.horizon, experiment_path, resume=False, restore=restore
                )
                return self._results
            trial_source = self._trial_source_of_copyable_space()
            self._save_settings(experiment_path)
            self._results = self._execute(trial_source, self.horizon, experiment_path, resume=False)
            return self._results

    def _execute(
        self,
        trial_source: VariantSource | SearcherSource,
        horizon: int | None,
        experiment_path: str,
        resume: bool,
        restore: Restore | None = None,
    ) -> ResultGrid:
        """Run the trials of ``trial_source`` to ``horizon`` under ``experiment_path``,
        starting from the plan saved there when ``resume``, or from a
        snapshot's whole study with ``restore``."""
        started = time.time()
        resources = self._resources(trial_source)
        if not ray.is_initialized():
            # joins the cluster the script runs on (RAY_ADDRESS, `ray start`), else starts one
            ray.init(**ray_init_options())
        check_shared_storage(experiment_path, self.run_config.storage_filesystem)
        # On a plan service the key is its plan directory's, which seals the shared checkpoints.
        key_path = posixpath.dirname(experiment_path) if self.plan_service else experiment_path
        payload_key = self._payload_key(key_path, continues=resume or restore is not None)
        worker_options: dict[str, Any] = {
            "num_cpus": resources.get("CPU", 0.0),
            "num_gpus": resources.get("GPU", 0.0),
        }
        custom = {k: v for k, v in resources.items() if k not in ("CPU", "GPU", "memory")}
        if custom:
            worker_options["resources"] = custom
        if "memory" in resources:
            worker_options["memory"] = resources["memory"]
        failure = self.run_config.failure_config
        spec = StudySpec(
            fail_fast=failure.fail_fast if failure is not None else False,
            trainable_name=self._trainable_name,
            trial_name_creator=self.tune_config.trial_name_creator,
            trial_dirname_creator=self.tune_config.trial_dirname_creator,
            tuned_paths=None if isinstance(trial_source, SearcherSource) else tuned_paths(self.param_space),
            worker=WorkerSpec(
                trainable=self._pickled_trainable(),
                options=worker_options,
                scaling=self._scaling,
                reproducibility=(
                    Reproducibility(self.seed, self.deterministic_algorithms) if self.reproducible else None
                ),
            ),
            trial_source=trial_source,
            horizon=horizon,
            horizon_is_max_t=self._horizon_is_max_t,
            experiment_path=experiment_path,
            storage_filesystem=self.run_config.storage_filesystem,
            num_workers=self._num_workers(
                resources, _trials_to_run(trial_source, restore) or self.tune_config.num_samples
            ),
            max_concurrent_trials=self._max_concurrent,
            max_pending_trials=trial_source.pending_limit(max_pending_trials(), self._max_concurrent),
            stage_sharing=self.stage_sharing,
            # -1 retries without limit, as in Tune
            max_failures=(math.inf if failure.max_failures == -1 else failure.max_failures) if failure else 0,
            stop_thresholds=self.stop_thresholds,
            stopper=self.stopper,
            scheduler=self.tune_config.scheduler,
            metric=self.tune_config.metric,
            mode=self.tune_config.mode,
            time_budget_s=self._time_budget(),
            policy=self._policy,
            checkpoint_budget_bytes=self.checkpoint_budget_bytes,
            parked_per_worker=self.parked_trainables_per_worker,
            resume=resume,
            restore=restore,
            state_period_s=state_period(),
            storage_wait_s=storage_wait(),
            restore_retries=restore_retries(),
            checkpoint_config=self.run_config.checkpoint_config,
            stall_warning_s=stall_warning_seconds(),
            payload_key=payload_key,
            trust_storage=trust_storage(),
        )
        callbacks = self._callback_runner(trial_source, experiment_path)
        reporter = self._progress_reporter(trial_source)
        if restore is not None:  # the best so far counts the trials that ended before the interrupt
            reporter.observe(*restored_progress(restore))
        restarts = 0
        try:
            while True:
                try:
                    progress, summaries = self._run_controller(spec, callbacks, reporter)
                    break
                except ray.exceptions.RayActorError as error:  # the controller's process died
                    storage = CheckpointStorage(experiment_path, self.run_config.storage_filesystem)
                    restarts += 1
                    if restarts > CONTROLLER_RESTARTS or not has_state(storage):
                        raise RuntimeError(
                            f"the study's controller died ({type(error).__name__}) {restarts} times; continue the "
                            f"study with {how_to_continue(experiment_path)}"
                        ) from error
                    logger.warning(
                        "the study's controller died (%s); continuing from its last snapshot (restart %d of %d)",
                        type(error).__name__,
                        restarts,
                        CONTROLLER_RESTARTS,
                    )
                    spec = dataclasses.replace(spec, resume=False, restore=Restore(read_state(storage)))
        finally:
            callbacks.close_logs()  # what the loggers were handed is written, also when fit() raises
        self._settings_kept(experiment_path)
        grid = self._result_grid(summaries, experiment_path, progress)
        write_tune_state(
            experiment_path,
            arrow_filesystem(self.run_config.storage_filesystem) if self.run_config.storage_filesystem else None,
            self._trainable_name,
            self.run_config.checkpoint_config,
            list(zip(summaries, grid)),
            started,
        )
        if failure is not None and failure.fail_fast == "raise" and grid.errors:
            raise grid.errors[0]
        return grid

    def _payload_key(self, experiment_path: str, continues: bool) -> bytes:
        """The experiment's key for sealing checkpoints, from this machine's
        key folder (created for a new experiment). Continuing an experiment
        whose key is not here, its stored checkpoints are retrained unless
        the directory is declared trusted: say so before that happens."""
        key, existed = experiment_key(CheckpointStorage(experiment_path, self.run_config.storage_filesystem))
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

    def _run_controller(
        self, spec: StudySpec, callbacks: CallbackRunner, reporter: ProgressReporter
    ) -> tuple[Progress, list[TrialSummary]]:
        """Run the study's controller and workers to the end (or Ctrl-C);
        the last progress and the trials' summaries. Raises RayActorError
        when the controller's process dies."""
        if self.plan_service is not None:
            with _interruptible() as interrupted:
                return run_attached(
                    self.plan_service,
                    spec,
                    self._share_key,
                    self._storage_path(),
                    callbacks,
                    reporter,
                    interrupted,
                    POLL_SECONDS,
                )
        # On the driver's node, as Tune's controller is in the driver: a study
        # outlives any worker node, and so must what drives it.
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        controller = (
            remote_once(StudyController)
            .options(num_cpus=0, max_concurrency=1000, scheduling_strategy=here)
            .remote(spec)
        )
        # The workers start with the controller rather than after it.
        workers = [spec.worker.start(controller) for _ in range(spec.num_workers)]
        run = controller.run.remote(workers)
        experiment_path = spec.experiment_path
        # Until the study's processes are gone: a Ctrl-C after the study ended
        # (while the loggers finish, or during clean-up) is absorbed, not raised
        # half way through them; a second one still raises.
        monitor = (
            live_monitor(
                experiment_path,
                controller,
                self.tune_config.metric,
                self.tune_config.mode,
                self.run_config.storage_filesystem,
            )
            if self.monitor
            else contextlib.nullcontext()
        )
        with _interruptible() as interrupted, monitor:
            try:
                while not ray.wait([run], timeout=POLL_SECONDS)[0] and not interrupted.is_set():
                    progress = ray.get(controller.progress.remote())
                    callbacks.update(progress)
                    reporter.update(progress, trials=callbacks.reported_trials())
                if ray.wait([run], timeout=0)[0]:
                    ray.get(run)
                else:
                    not_saved = ray.get(controller.interrupt.remote())
                    if not_saved is None:
                        logger.warning(
                            "The study was interrupted; its state is saved. Continue it with %s",
                            how_to_continue(experiment_path),
                        )
                    else:
                        logger.warning("The study was interrupted; storage refused its state: %s", not_saved)
                progress = ray.get(controller.progress.remote())
                callbacks.update(progress)
                if progress.study_error is not None:
                    raise RuntimeError(progress.study_error)
                reporter.update(progress, final=True, trials=callbacks.reported_trials(), partial=interrupted.is_set())
                summaries = fetch_summaries(controller.results.remote)
                if isinstance(self.tune_config.search_alg, Searcher):
                    adopt_searcher_state(self.tune_config.search_alg, ray.get(controller.searcher.remote()))
                callbacks.end()
            except Exception as error:
                if not isinstance(error, ray.exceptions.RayError):  # a callback raised: fit() raises it, as Tune's
                    _save_before_raising(controller)
                raise
            finally:
                try:
                    ray.get(controller.shutdown_workers.remote())
                except ray.exceptions.RayActorError:
                    pass  # it died: the workers it started died with it
                finally:
                    for worker in workers:
                        spec.worker.stop(worker)
                    ray.kill(controller)
        return progress, summaries

    def _callback_runner(self, trial_source: VariantSource | SearcherSource, experiment_path: str) -> CallbackRunner:
        """``RunConfig.callbacks`` and Tune's default loggers, set up as Tune
        sets them up."""
        sync_config = getattr(self.run_config, "sync_config", None)
        runner = CallbackRunner(
            self.run_config.callbacks,
            experiment_path,
            self.run_config.storage_filesystem,
            self.param_space,
            sync_period=getattr(sync_config, "sync_period", 300.0),
        )
        runner.setup(
            stop=self.stopper, num_samples=self.tune_config.num_samples, total_num_samples=_total_samples(trial_source)
        )
        return runner

    def _progress_reporter(self, trial_source: VariantSource | SearcherSource) -> ProgressReporter:
        """The stage-sharing line, or ``RunConfig.progress_reporter``'s
        table with that line in it; ``verbose=0`` prints neither."""
        table = self.run_config.progress_reporter
        if table is not None:
            # As Tune's loop: the reporter takes TuneConfig's metric and mode
            # (and refuses them when it was given its own).
            table.setup(
                start_time=time.time(),
                total_samples=_total_samples(trial_source),
                metric=self.tune_config.metric,
                mode=self.tune_config.mode,
            )
            # Tune's reporters read the process's verbosity, which every Ray Tune run sets (its new output
            # engine, which ignores a reporter, to 0): the legacy engine's default, which shows the table.
            set_verbosity(Verbosity.V3_TRIAL_DETAILS)
        verbose = 0 if self.run_config.verbose == 0 else 1
        return ProgressReporter(self.tune_config.metric, self.tune_config.mode, verbose=verbose, table=table)

    def _result_grid(self, summaries: list[TrialSummary], experiment_path: str, progress: Progress) -> ResultGrid:
        results = []
        filesystem = self.run_config.storage_filesystem
        filesystem = None if filesystem is None else arrow_filesystem(filesystem)
        for summary in summaries:
            rows = summary.rows
            checkpoints = [(tune.Checkpoint(path, filesystem), metrics) for path, metrics in summary.checkpoints]
            best = [(tune.Checkpoint(path, filesystem), metrics) for path, metrics in summary.best_checkpoints]
            error = None
            if summary.status == ERROR:
                error = unpack_error(summary.error_pickle, summary.error, summary.name)
            results.append(
                TrialResult(
                    rows,
                    metrics=rows[-1] if rows else {"config": summary.shown_config},
                    checkpoint=checkpoints[-1][0] if checkpoints else None,
                    best_checkpoints=best,
                    error=error,
                    path=f"{experiment_path}/{summary.dirname}",
                )
            )
        return ResultGrid(
            results,
            experiment_path,
            self.tune_config.metric,
            self.tune_config.mode,
            iterations=progress.iterations,
            unique_iterations=progress.unique_iterations,
            total_iterations=progress.total_iterations,
            worker_seconds=progress.worker_seconds,
            state_seconds=progress.state_seconds,
            storage_filesystem=filesystem,
        )


def _save_before_raising(controller: Any) -> None:
    """The driver stops on an error of its own (a callback raised): the
    study is saved as the driver last saw it, as on Ctrl-C, so that
    `Tuner.restore` continues it (Tune saves its experiment state too)."""
    try:
        ray.get(controller.interrupt.remote())
    except ray.exceptions.RayError as error:
        logger.warning("the study could not be saved before fit() raised: %s", error)


def _variants(
    param_space: dict[str, Any],
    num_samples: int,
    generator: BasicVariantGenerator | None,
    seed: int | None,
    each_draw: Callable[[list[dict]], list[dict]] | None,
) -> VariantStream:
    """Tune's grid and random variants, drawn as ``generator`` (Tune's
    ``BasicVariantGenerator``: its ``random_state``, ``points_to_evaluate``
    run first, ``constant_grid_search``) would draw them; without one, from
    ``seed`` (None: NumPy's global state, as Tune)."""
    if generator is None:
        return sample_variants(param_space, num_samples, seed=seed, each_draw=each_draw)
    return sample_variants(
        param_space,
        num_samples,
        **variant_generator_settings(generator),
        each_draw=each_draw,
    )


@contextlib.contextmanager
def _interruptible():
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


def searcher_spec(stop: Any, num_samples: int, time_budget_s: Any, scheduler: Any) -> dict[str, Any]:
    """What a searcher's ``set_search_properties`` gets besides the space:
    Tune's ``stop`` (its dict of criteria; {} for a ``Stopper``),
    ``num_samples`` and ``time_budget_s``, and ``max_t``, the most
    iterations a trial runs by other means (the scheduler's ``max_t``, a
    ``MaximumIterationStopper``), None if nothing limits them: searchers
    that model whole trials (StructuredBO) read it, Tune's ignore it."""
    from ray.tune.stopper import MaximumIterationStopper

    limits = [scheduler_max_t(scheduler)]
    if type(stop) is MaximumIterationStopper:
        limits.append(maximum_iterations(stop))
    limits = [limit for limit in limits if limit is not None]
    return {
        "stop": stop if isinstance(stop, dict) else {},
        "num_samples": num_samples,
        "time_budget_s": time_budget_s,
        "max_t": min(limits, default=None),
    }


def _trials_to_run(trial_source: VariantSource | SearcherSource, restore: Restore | None) -> float:
    """Trials still to come, and those a restore continues."""
    if restore is None:
        return trial_source.remaining
    return trial_source.remaining + sum(
        restore.action(trial.status) != "end" and trial.status != TERMINATED for trial in restore.state.trials
    )


def _total_samples(trial_source: VariantSource | SearcherSource) -> int | None:
    """The trials a study will run, where known (not with ``num_samples=-1``)."""
    remaining = trial_source.remaining
    return int(remaining) if math.isfinite(remaining) else None
