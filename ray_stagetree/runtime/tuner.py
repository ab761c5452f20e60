"""`ray_stagetree.Tuner`: Ray Tune's ``Tuner`` with stage sharing.

Same arguments (Ray's own ``TuneConfig`` and ``RunConfig``), same result
objects. Everything is validated on the driver before anything trains: the
trainable, the horizon, the resources, and every drawn trial's config.
"""

from __future__ import annotations

import datetime
import math
import os
import uuid
from typing import Any, Callable

import ray
from ray import tune
from ray.tune.search import BasicVariantGenerator, Searcher

from ray_stagetree.planning.config import TrialConfig
from ray_stagetree.planning.policies import POLICIES
from ray_stagetree.runtime.controller import (
    ERROR,
    StudyController,
    StudySpec,
    start_worker,
)
from ray_stagetree.runtime.progress import ProgressReporter
from ray_stagetree.runtime.results import ResultGrid
from ray_stagetree.searchers import SequenceGridSearch, generate_trials
from ray_stagetree.searchers.sources import SearcherSource, VariantSource
from ray_stagetree.trainables import StageTrainable
from ray_stagetree.trial_schedulers.host import check_scheduler

POLL_SECONDS = 0.5


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
        ``failure_config.max_failures`` and ``verbose`` are honoured.
    stage_sharing:
        False runs every trial on its own (the paper's "Hippo-trial"
        baseline), for comparisons.
    execution_policy:
        "critical_path" (default), "thr" or "bfs".
    checkpoint_budget_bytes:
        Object-store memory for checkpoints before the least valuable ones
        are dropped to storage.

    Example
    -------
    >>> from ray import tune
    >>> from ray_stagetree import Tuner, MultiStep
    >>> tuner = Tuner(train, param_space={"lr": tune.grid_search(
    ...     [MultiStep(0.1, [m], 0.1) for m in (30, 60)])},
    ...     run_config=tune.RunConfig(stop={"training_iteration": 90}))   # doctest: +SKIP
    >>> results = tuner.fit()                                             # doctest: +SKIP
    """

    def __init__(
        self,
        trainable: Callable | type | None = None,
        *,
        param_space: dict[str, Any] | None = None,
        tune_config: tune.TuneConfig | None = None,
        run_config: tune.RunConfig | None = None,
        stage_sharing: bool = True,
        execution_policy: str = "critical_path",
        checkpoint_budget_bytes: int = 2 * 1024**3,
    ) -> None:
        self.trainable = trainable
        self.param_space = param_space or {}
        self.tune_config = tune_config or tune.TuneConfig()
        self.run_config = run_config or tune.RunConfig()
        self.stage_sharing = bool(stage_sharing)
        self.execution_policy = execution_policy
        self.checkpoint_budget_bytes = checkpoint_budget_bytes
        self._validate_arguments()

    # -- validation (driver side, before anything runs) --------------------------

    def _validate_arguments(self) -> None:
        trainable = self.trainable
        if isinstance(trainable, type):
            if issubclass(trainable, tune.Trainable):
                raise TypeError(
                    f"{trainable.__name__} subclasses ray.tune.Trainable; subclass "
                    "ray_stagetree.trainables.StageTrainable instead (same setup/step/save_checkpoint/"
                    "load_checkpoint methods, plus update_hparams)"
                )
            if not issubclass(trainable, StageTrainable):
                raise TypeError(f"a class trainable must subclass StageTrainable, got {trainable.__name__}")
        elif not callable(trainable):
            raise TypeError(f"trainable must be a function or a StageTrainable subclass, got {trainable!r}")
        if not isinstance(self.param_space, dict):
            raise TypeError(f"param_space must be a dict, got {type(self.param_space).__name__}")
        if not isinstance(self.tune_config, tune.TuneConfig):
            raise TypeError(f"tune_config must be a ray.tune.TuneConfig, got {type(self.tune_config).__name__}")
        if not isinstance(self.run_config, tune.RunConfig):
            raise TypeError(f"run_config must be a ray.tune.RunConfig, got {type(self.run_config).__name__}")
        if self.execution_policy not in POLICIES:
            raise ValueError(f"execution_policy must be one of {sorted(POLICIES)}, got {self.execution_policy!r}")
        if isinstance(self.checkpoint_budget_bytes, bool) or not isinstance(self.checkpoint_budget_bytes, int) or (
            self.checkpoint_budget_bytes < 0
        ):
            raise ValueError(f"checkpoint_budget_bytes must be an int >= 0, got {self.checkpoint_budget_bytes!r}")
        config = self.tune_config
        if config.mode not in (None, "min", "max"):
            raise ValueError(f"TuneConfig.mode must be 'min' or 'max', got {config.mode!r}")
        check_scheduler(config.scheduler, config.metric, config.mode)
        if config.search_alg is not None and not isinstance(
            config.search_alg, (Searcher, BasicVariantGenerator, SequenceGridSearch)
        ):
            raise TypeError(
                "TuneConfig.search_alg must be a ray.tune Searcher or ray_stagetree.searchers.SequenceGridSearch, "
                f"got {type(config.search_alg).__name__}"
            )
        if config.time_budget_s is not None:
            budget = config.time_budget_s
            seconds = budget.total_seconds() if isinstance(budget, datetime.timedelta) else budget
            if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or seconds <= 0:
                raise ValueError(f"TuneConfig.time_budget_s must be > 0 seconds, got {budget!r}")
        self.horizon = self._horizon()

    def _horizon(self) -> int:
        stop = self.run_config.stop
        scheduler = self.tune_config.scheduler
        max_t = getattr(scheduler, "_max_t", None) or getattr(scheduler, "_max_t_attr", None)  # ASHA / HyperBand
        if stop is None and max_t is not None:
            stop = {"training_iteration": int(max_t)}
        if stop is None:
            raise ValueError(
                "ray_stagetree needs each trial's length: pass RunConfig(stop={\"training_iteration\": N}) "
                "or a trial scheduler with max_t"
            )
        if not isinstance(stop, dict):
            raise ValueError(
                f"RunConfig.stop must be a dict with 'training_iteration' for ray_stagetree, got {stop!r}; "
                "stoppers and stop functions would make a trial's length unknown before it runs"
            )
        for key, threshold in stop.items():
            if key != "training_iteration" and (
                isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or threshold != threshold
            ):
                raise ValueError(
                    f"RunConfig.stop[{key!r}] must be a number (a trial stops once its {key!r} reaches it), "
                    f"got {threshold!r}"
                )
        if "training_iteration" not in stop and max_t is not None:
            stop = {**stop, "training_iteration": int(max_t)}
        if "training_iteration" not in stop:
            raise ValueError(
                f"RunConfig.stop={stop!r} has no 'training_iteration': ray_stagetree needs each trial's "
                "length (metric thresholds may stop trials earlier)"
            )
        horizon = stop["training_iteration"]
        if isinstance(horizon, bool) or not isinstance(horizon, int) or horizon < 1:
            raise ValueError(f"RunConfig.stop['training_iteration'] must be an int >= 1, got {horizon!r}")
        return horizon

    def _resources(self) -> dict[str, float]:
        request = getattr(self.trainable, "_resources", None)
        if request is None:
            return {"CPU": 1.0}
        bundles = getattr(request, "bundles", None) or [request.required_resources]
        if len(bundles) != 1:
            raise ValueError(
                f"stage workers run in one resource bundle; with_resources gave {len(bundles)} bundles: {bundles}"
            )
        return {key: float(value) for key, value in bundles[0].items() if value}

    def _source(self) -> VariantSource | SearcherSource:
        """Where trials come from; drawn variants are validated here, before
        anything runs (a searcher's suggestions are validated as they come)."""
        config = self.tune_config
        if isinstance(config.search_alg, Searcher):
            return SearcherSource(config.search_alg, self.param_space, config.metric, config.mode, config.num_samples)
        if isinstance(config.search_alg, SequenceGridSearch):
            configs = config.search_alg.generate(self.param_space, config.num_samples)
        else:
            configs = generate_trials(self.param_space, config.num_samples)
        for index, trial_config in enumerate(configs):
            try:
                TrialConfig.from_config(trial_config)
                ray.cloudpickle.dumps(trial_config)
            except (TypeError, ValueError) as error:
                raise ValueError(f"trial {index} ({trial_config!r}) cannot run: {error}") from None
        return VariantSource(configs)

    # -- running -------------------------------------------------------------------

    def _experiment_path(self) -> str:
        run_config = self.run_config
        storage = run_config.storage_path or os.path.expanduser("~/ray_results")
        name = run_config.name or f"stagetree_{datetime.datetime.now():%Y-%m-%d_%H-%M-%S}_{uuid.uuid4().hex[:4]}"
        return f"{str(storage).rstrip('/')}/{name}"

    def _num_workers(self, resources: dict[str, float], trials: int) -> int:
        total = ray.cluster_resources()
        fits = []
        for key, amount in resources.items():
            available = total.get(key, 0.0)
            if amount > available:
                raise ValueError(
                    f"each trial asks for {amount:g} {key} but the Ray cluster has {available:g}: "
                    "no worker can ever start (check tune.with_resources)"
                )
            fits.append(math.floor(available / amount))
        workers = min([trials, *fits]) if fits else trials
        if self.tune_config.max_concurrent_trials:
            workers = min(workers, self.tune_config.max_concurrent_trials)
        return max(1, workers)

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
        """Run the study; returns a `ResultGrid`."""
        return self._execute(self._source(), self.horizon, self._experiment_path(), resume=False)

    def _execute(
        self, source: VariantSource | SearcherSource, horizon: int, experiment_path: str, resume: bool
    ) -> ResultGrid:
        """Run the trials of ``source`` to ``horizon`` under ``experiment_path``,
        starting from the plan saved there when ``resume``."""
        resources = self._resources()
        if not ray.is_initialized():
            ray.init()
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
            trainable=self._pickled_trainable(),
            source=source,
            horizon=horizon,
            experiment_path=experiment_path,
            storage_filesystem=self.run_config.storage_filesystem,
            num_workers=self._num_workers(resources, source.remaining or self.tune_config.num_samples),
            worker_options=worker_options,
            max_concurrent_trials=self.tune_config.max_concurrent_trials,
            stage_sharing=self.stage_sharing,
            max_failures=failure.max_failures if failure is not None else 0,
            stop_thresholds={k: v for k, v in (self.run_config.stop or {}).items() if k != "training_iteration"},
            scheduler=self.tune_config.scheduler,
            metric=self.tune_config.metric,
            mode=self.tune_config.mode,
            time_budget_s=self._time_budget(),
            policy=self.execution_policy,
            checkpoint_budget_bytes=self.checkpoint_budget_bytes,
            resume=resume,
        )
        controller = ray.remote(StudyController).options(num_cpus=0, max_concurrency=1000).remote(spec)
        reporter = ProgressReporter(
            self.tune_config.metric, self.tune_config.mode, verbose=0 if self.run_config.verbose == 0 else 1
        )
        # The workers start with the controller rather than after it.
        workers = [start_worker(spec, controller) for _ in range(spec.num_workers)]
        run = controller.run.remote(workers)
        try:
            while not ray.wait([run], timeout=POLL_SECONDS)[0]:
                reporter.update(ray.get(controller.progress.remote()))
            ray.get(run)
            progress = ray.get(controller.progress.remote())
            reporter.update(progress, final=True)
            summaries = ray.get(controller.results.remote())
        finally:
            try:
                ray.get(controller.shutdown_workers.remote())
            finally:
                for actor in [*workers, controller]:  # also when the controller died
                    ray.kill(actor)
        return self._result_grid(summaries, experiment_path, progress)

    def _result_grid(self, summaries: list[dict[str, Any]], experiment_path: str, progress: dict) -> ResultGrid:
        import pandas as pd
        from ray.tune.error import TuneError
        from ray.tune.utils import flatten_dict

        results = []
        for summary in summaries:
            rows = summary["rows"]
            checkpoint = None
            if summary["checkpoint_path"]:
                checkpoint = tune.Checkpoint(summary["checkpoint_path"], self.run_config.storage_filesystem)
            error = None
            if summary["status"] == ERROR:
                error = TuneError(f"trial {summary['trial_id']} failed:\n{summary['error']}")
            results.append(
                tune.Result(
                    metrics=rows[-1] if rows else {"config": summary["config_json"]},
                    checkpoint=checkpoint,
                    error=error,
                    path=f"{experiment_path}/{summary['trial_id']}",
                    # flattened as Tune flattens them: "config/lr/init", ...
                    metrics_dataframe=pd.DataFrame([flatten_dict(row) for row in rows]) if rows else None,
                )
            )
        return ResultGrid(
            results,
            experiment_path,
            self.tune_config.metric,
            self.tune_config.mode,
            iterations=progress["iterations"],
            unique_iterations=progress["unique_iterations"],
            total_iterations=progress["total_iterations"],
            worker_seconds=progress["worker_seconds"],
        )
