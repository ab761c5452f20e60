"""`ray_stagetree.Tuner`: Ray Tune's ``Tuner`` with stage sharing.

Same arguments (Ray's own ``TuneConfig`` and ``RunConfig``), same result
objects. Everything is validated on the driver before anything trains: the
trainable, the horizon, the resources, and the configs of the search
space's first draw (every grid value, through `arguments`); the study
draws the rest as it admits trials.

The Tuner is Tune's public surface and the study's settings read from
Tune's configs (construction, ``fit``, ``restore``, ``can_restore``,
``get_results``); ``fit`` hands the study to `run.StudyRun`, the argument
checks live in `arguments`, the trials' source in `trial_sources`.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import logging
import numbers
import os
import posixpath
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from ray import tune
from ray.tune.schedulers import ResourceChangingScheduler

from ray_stagetree.execution.parking import PARKED_PER_WORKER
from ray_stagetree.execution.storage import CheckpointStorage
from ray_stagetree.planning.filesystems import absolute_path
from ray_stagetree.planning.policies import ExecutionPolicy
from ray_stagetree.planning.time_sharing import study_policy
from ray_stagetree.runtime.control.experiment_state import (
    Restore,
    can_restore,
    has_state,
    read_state,
    read_tuner_settings,
    trial_summary,
)
from ray_stagetree.runtime.control.messages import Progress
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
    scaling_of,
)
from ray_stagetree.runtime.driver.callback_hooks import check_driver_hooks
from ray_stagetree.runtime.driver.lease import DriverLease, check_free
from ray_stagetree.runtime.driver.notebook import prepare_notebook
from ray_stagetree.runtime.driver.restoring import (
    PARAM_SPACE_KEYS,
    TRAINABLE_NAME,
    check_restored_param_space,
    check_restored_trainable,
    save_settings,
)
from ray_stagetree.runtime.driver.results import ResultGrid
from ray_stagetree.runtime.driver.run import StudyRun
from ray_stagetree.runtime.driver.trial_sources import copyable_trial_source
from ray_stagetree.runtime.driver.tune_compat import (
    TUNES_TUNER,
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
    tune_tune_config,
    tunes_tuner_for_trainer,
)
from ray_stagetree.runtime.service.service_client import PlanServiceConfig, service_config
from ray_stagetree.runtime.service.trainable_identity import share_key
from ray_stagetree.runtime.workers.reproducibility import (
    check_reproducibility_arguments,
)
from ray_stagetree.trial_schedulers.ray_fields import (
    config_interface,
    maximum_iterations,
    storage_context_class,
    trainable_resources,
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


logger = logging.getLogger("ray_stagetree")


class Tuner:
    """Run a hyper-parameter study where trials share their common prefixes.

    Parameters
    ----------
    trainable:
        What Tune takes: a function ``train(config)`` that reports with
        ``tune.report`` (or `ray_stagetree.report`), a ``ray.tune.Trainable``
        subclass, a `StageTrainable` subclass, or a registered name;
        ``tune.with_resources`` and ``tune.with_parameters`` wrappers work as
        in Tune (see the drop-in guide for what differs).
    param_space:
        Tune's search space; values may be sequences (`Exponential`, ...).
    tune_config:
        ``ray.tune.TuneConfig``, all of it: ``metric``, ``mode``,
        ``num_samples``, ``search_alg``, ``scheduler``,
        ``max_concurrent_trials``, ``time_budget_s``, ``reuse_actors``
        (True: a class trainable's object is reset for its worker's next
        batch, as Tune resets a reused actor), ``trial_name_creator``
        and ``trial_dirname_creator``.
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
        self.trainable_name = trainable_name(trainable)  # Tune's identifier, which restore checks
        self.plan_service = service_config(plan_service)
        # `is None`, not falsiness: an empty dict given as a config is refused, not replaced.
        if isinstance(param_space, config_interface()):  # as Tune: a config object's to_dict()
            param_space = param_space.to_dict()
        self.param_space = {} if param_space is None else param_space
        self.tune_config = tune.TuneConfig() if tune_config is None else tune_tune_config(tune_config)
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
        self.scaling = scaling_of(scaling_config)  # each trial's worker group, or None
        self.share_key: str | None = None  # on a plan service: the trainable identity whose plan it shares
        self._restore_options: tuple[bool, bool, bool] | None = None  # set by Tuner.restore
        self._results: ResultGrid | None = None  # the last fit()'s, for get_results()
        self._validate_arguments()
        # As Tune: the experiment folder, with what restore needs, exists from here on, so
        # Tuner.can_restore(path) holds before fit() (a restore continues it from scratch).
        self.experiment_path = self._experiment_folder()
        if not _EXISTING.get():
            storage = CheckpointStorage(self.experiment_path, self.run_config.storage_filesystem)
            check_writable(storage, self.experiment_path)
            check_free(storage, self.experiment_path)  # the settings a live driver's study restores from stay
            save_settings(self, self.experiment_path)

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
        storage = CheckpointStorage(self.experiment_path, self.run_config.storage_filesystem)
        try:
            if not has_state(storage):
                return None
            state = read_state(storage)
            progress = Progress(iterations=state.iterations, worker_seconds=state.worker_seconds)
            summaries = [trial_summary(trial) for trial in state.trials]
            return StudyRun(self).result_grid(summaries, progress)
        except Exception as error:  # noqa: BLE001 - as Tune: results that cannot be read are no results
            logger.warning("the results stored at %s cannot be read: %s", self.experiment_path, error)
            return None

    @classmethod
    def can_restore(cls, path: str, storage_filesystem: Any = None) -> bool:
        """True when ``path`` is a study's experiment directory that
        `restore` can continue (its trial folders are not)."""
        check_path("Tuner.can_restore", path)
        check_filesystem("Tuner.can_restore's storage_filesystem", storage_filesystem)
        return can_restore(CheckpointStorage(absolute_path(os.fspath(path), storage_filesystem), storage_filesystem))

    # -- validation (driver side, before anything runs) --------------------------

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
        self.policy = study_policy(self.execution_policy, self.tune_config.metric, self.tune_config.mode)
        check_reproducibility_arguments(
            self.reproducible, self.seed, self.repeats, self.deterministic_algorithms, self.param_space
        )
        check_resource_request(trainable_resources(trainable))
        if self.scaling is not None and trainable_resources(trainable) is not None:
            raise ValueError(
                "scaling_config gives each rank's resources (ScalingConfig.resources_per_worker); the trainable "
                "also asks for some through tune.with_resources: give only scaling_config"
            )
        check_scheduler(self.tune_config.scheduler, self.tune_config.metric, self.tune_config.mode)
        if self.scaling is not None and isinstance(self.tune_config.scheduler, ResourceChangingScheduler):
            raise NotImplementedError(
                "ResourceChangingScheduler with scaling_config: a trial's worker group keeps its ranks "
                "(ScalingConfig.num_workers); give the trainable its resources with tune.with_resources instead"
            )
        check_metric_conflict(self.tune_config.scheduler, self.tune_config.metric, self.tune_config.mode)
        self._stop_criteria()
        check_driver_hooks(self.run_config)
        check_checkpoint_config(self.run_config.checkpoint_config, function_trainable=False)

    def _stop_criteria(self) -> None:
        """``RunConfig.stop`` as Tune takes it (None, a dict, a ``Stopper``, a
        list of them, a function) into the horizon, when known, the metric
        thresholds and the stopper. The horizon only sizes requests:
        open-ended trials run until a criterion, their scheduler or the
        trainable ends them."""
        from ray.tune.stopper import CombinedStopper, FunctionStopper, MaximumIterationStopper, Stopper

        stop = self.run_config.stop
        if isinstance(stop, list) and stop and all(isinstance(each, Stopper) for each in stop):
            stop = CombinedStopper(*stop)  # as Tune's Experiment combines them
        scheduler = self.tune_config.scheduler
        max_t = scheduler_max_t(scheduler)
        self.horizon = int(max_t) if max_t is not None else None
        # Whether the scheduler's max_t, rather than a stop criterion, ends trials: Tune then asks it about the last result.
        self.horizon_is_max_t = max_t is not None
        self.stop_thresholds: dict[str, float] = {}
        self.stopper = None
        if stop is None:
            return
        if type(stop) is MaximumIterationStopper:  # {"training_iteration": max_iter}, which plans better
            self.horizon = maximum_iterations(stop)
            self.horizon_is_max_t = False
            return
        if isinstance(stop, Stopper):
            self.stopper = stop
            return
        if callable(stop):
            self.stopper = FunctionStopper(stop)
            return
        if not isinstance(stop, dict):
            raise ValueError(
                f"RunConfig.stop must be None, a dict, a ray.tune.Stopper (or a list of them) or a function "
                f"(trial_id, result) -> bool, "
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
            self.horizon_is_max_t = False

    # -- running -------------------------------------------------------------------

    @property
    def storage_path(self) -> str:
        """``RunConfig.storage_path`` (``~`` expanded, as Tune expands it), Tune's ``~/ray_results`` by default."""
        given = self.run_config.storage_path
        default = os.path.expanduser("~/ray_results")
        return (absolute_path(given, self.run_config.storage_filesystem) if given else default).rstrip("/")

    def _experiment_folder(self) -> str:
        """``storage_path/name``; on a plan service, the study's folder in its
        plan directory: ``storage_path/<service>/<study_group>-<fingerprint>/name``."""
        parent = self.storage_path
        if self.plan_service is not None:
            self.share_key = share_key(self.plan_service.study_group, self.trainable, self.scaling)
            parent = f"{parent}/{self.plan_service.name}/{self.share_key.replace(':', '-')}"
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
        experiment_path = self.experiment_path
        storage = CheckpointStorage(experiment_path, self.run_config.storage_filesystem)
        check_writable(storage, experiment_path)
        # One driver per folder: a second one (a restore, a fresh fit()) is refused, naming the first.
        with DriverLease(storage, experiment_path):
            if self._restore_options is not None and has_state(storage):
                state = read_state(storage)
                restore = Restore(state, *self._restore_options)
                self._results = StudyRun(self).execute(state.source, self.horizon, resume=False, restore=restore)
                return self._results
            trial_source = copyable_trial_source(self)
            save_settings(self, experiment_path)
            self._results = StudyRun(self).execute(trial_source, self.horizon, resume=False)
            return self._results
