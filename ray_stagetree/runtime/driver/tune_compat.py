"""What ``ray.tune.Tuner`` checks and resolves before a study runs, with
Tune 2.60's exception types and messages, so that a Tune script meets the
same refusals and warnings here (a drop-in changes an import, nothing else).

Each function names where Tune does the same (its ``TunerInternal`` at
``Tuner()``, or ``tune.run`` at ``fit()``).
"""

from __future__ import annotations

import functools
import importlib
import inspect
import io
import logging
import os
import sys
from collections.abc import Callable
from typing import Any

from ray_stagetree.trial_schedulers.ray_fields import deprecated_default, registered_function

#: Environment variables ``tune.run`` refuses (it raises DeprecationWarning).
DEPRECATED_ENV = ("TUNE_RESULT_DIR", "RAY_AIR_LOCAL_CACHE_DIR")

#: Ray Tune's own Tuner, as it is when ray_stagetree is imported: a script may
#: then put ours in its place (``ray.tune.Tuner = ray_stagetree.Tuner``), and a
#: Ray Train trainer's ``fit()`` builds whatever ``ray.tune.tuner.Tuner`` is.
TUNES_TUNER = importlib.import_module("ray.tune.tuner").Tuner

logger = logging.getLogger(__name__)


def is_ray_train_trainer(trainable: Any) -> bool:
    """Whether ``trainable`` is a Ray Train trainer (``TorchTrainer(...)``,
    the legacy ``BaseTrainer`` or Train v2's ``DataParallelTrainer``)."""
    if isinstance(trainable, (str, type)) or callable(trainable):
        return False
    kinds = (
        _loaded_class("ray.train.base_trainer", "BaseTrainer"),
        _loaded_class("ray.train.v2.api.data_parallel_trainer", "DataParallelTrainer"),
    )
    return isinstance(trainable, tuple(kind for kind in kinds if kind is not None))


def _loaded_class(module: str, name: str) -> type | None:
    """``module.name`` if ``module`` is already imported, else None: an
    object cannot be an instance of a class never loaded, and importing
    Ray Train's trainers would load torch into every driver (185 MB)."""
    return getattr(sys.modules.get(module), name, None)


@functools.cache
def _say_trainers_run_as_tune_runs_them() -> None:
    logger.warning(
        "a Ray Train trainer is run by Ray Tune's Tuner, as Tune runs it: its trials share no stages. For stage "
        "sharing, tune a function or Trainable class whose sequences come from ray_stagetree.get_hparams()"
    )


def tunes_tuner_for_trainer(trainer: Any, *args: Any, **kwargs: Any) -> Any:
    """Ray Tune's Tuner for a Ray Train ``trainer`` (it refuses or warns
    as Tune does, e.g. for Train v2 trainers), with the same arguments."""
    _say_trainers_run_as_tune_runs_them()
    return TUNES_TUNER(trainer, *args, **kwargs)


#: The config key Tune hands a Ray Train trainer's ``train_loop_per_worker`` its config under.
TRAIN_LOOP_CONFIG = "train_loop_config"


def legacy_torch_trainer(trainable: Any) -> bool:
    """Whether ``trainable`` is a legacy-engine ``TorchTrainer``
    (``RAY_TRAIN_V2_ENABLED=0``), which ray_stagetree runs on its own
    data-parallel stages (`hosted_trainer`)."""
    torch_trainer = _loaded_class("ray.train.torch.torch_trainer", "TorchTrainer")
    return torch_trainer is not None and isinstance(trainable, torch_trainer)


def hosts_trainer(trainer: Any, param_space: Any) -> bool:
    """Whether ``Tuner(trainer, param_space=...)`` runs on data-parallel
    stages: a legacy ``TorchTrainer`` without Ray Data datasets whose
    ``param_space`` tunes only its ``train_loop_config`` (a tuned
    ``scaling_config`` changes the group between trials: Tune runs those)."""
    if not legacy_torch_trainer(trainer) or getattr(trainer, "datasets", None):
        return False
    return param_space is None or (isinstance(param_space, dict) and set(param_space) <= {TRAIN_LOOP_CONFIG})


def hosted_trainer(trainable: Any, param_space: Any, scaling_config: Any) -> tuple[Any, Any, Any]:
    """``(trainable, param_space, scaling_config)`` for the Tuner: a hosted
    ``TorchTrainer`` (`hosts_trainer`) becomes a function running its
    ``train_loop_per_worker`` on every rank, given the trainer's
    ``train_loop_config`` updated with the trial's, and its ``ScalingConfig``
    the study's; ``get_hparams()`` keys what is under ``train_loop_config``
    as the loop reads its config. Anything else passes as it is."""
    if not hosts_trainer(trainable, param_space):
        return trainable, param_space, scaling_config
    if scaling_config is not None:
        raise ValueError(
            "Tuner(TorchTrainer(...), scaling_config=...): the trainer's ScalingConfig is its workers' already; "
            "give it to TorchTrainer(scaling_config=...) only"
        )
    from ray.tune.utils.util import merge_dicts

    from ray_stagetree.trial_schedulers.ray_fields import legacy_train_loop

    loop, base_config = legacy_train_loop(trainable)
    takes_config = bool(inspect.signature(loop).parameters)

    def train_loop_per_worker(config: dict[str, Any]) -> None:
        loop_config = merge_dicts(base_config, config.get(TRAIN_LOOP_CONFIG, {}))
        loop(loop_config) if takes_config else loop()

    train_loop_per_worker.__name__ = train_loop_per_worker.__qualname__ = getattr(loop, "__name__", "train_loop")
    train_loop_per_worker.__stagetree_hparams_root__ = TRAIN_LOOP_CONFIG  # type: ignore[attr-defined]
    return train_loop_per_worker, param_space, trainable.scaling_config


def resolve_trainable(trainable: Any) -> Any:
    """The function or class a trainable given by its registered name
    (``tune.register_trainable(name, fn)``) stands for; anything else as
    it is. An unknown name raises Tune's ``TuneError("Unknown trainable:
    ...")``."""
    if not isinstance(trainable, str):
        return trainable
    from ray.tune.registry import get_trainable_cls
    from ray.tune.trainable.function_trainable import FunctionTrainable

    registered = get_trainable_cls(trainable)
    if isinstance(registered, type) and issubclass(registered, FunctionTrainable):
        # register_trainable wrapped the function in a class: the function is what stage workers run.
        function = registered_function(registered)
        if not callable(function):
            raise TypeError(
                f"the trainable registered as {trainable!r} is a function wrapped by a Ray version whose wrapper "
                "ray_stagetree cannot read (tested with Ray 2.60); pass the function itself to the Tuner"
            )
        return function
    return registered


def trainable_name(trainable: Any) -> str:
    """Tune's identifier of a trainable: the registered name, the function's
    or class's name (``lambda`` for a lambda), through ``with_parameters`` /
    ``with_resources``; it starts the default trial names."""
    from ray.tune.experiment import Experiment

    return Experiment.get_trainable_name(trainable)


def tune_tune_config(tune_config: Any) -> Any:
    """``TuneConfig`` with a ``SearchGenerator`` (Tune's wrapper of a
    ``Searcher``, which Tune also takes) as the searcher it wraps, which the
    study asks as Tune's wrapper asks it; anything else as it is."""
    import dataclasses

    from ray.tune.search import SearchGenerator

    if not isinstance(getattr(tune_config, "search_alg", None), SearchGenerator):
        return tune_config
    return dataclasses.replace(tune_config, search_alg=tune_config.search_alg.searcher)


def tune_run_config(run_config: Any) -> Any:
    """A ``ray.train.RunConfig`` given to the Tuner as Tune's ``RunConfig``
    (Tune takes Train's, warning that it should be imported from
    ``ray.tune``), its ``CheckpointConfig`` too; anything else as it is."""
    import warnings

    import ray.train
    from ray import tune
    from ray.util.annotations import RayDeprecationWarning

    # Tune's own is a Train RunConfig too where Train's v1 API is on (RAY_TRAIN_V2_ENABLED=0): Tune takes it as it is.
    if isinstance(run_config, tune.RunConfig) or not isinstance(run_config, ray.train.RunConfig):
        return run_config
    warnings.warn(
        "The `RunConfig` class should be imported from `ray.tune` when passing it to the Tuner. "
        "Please update your imports.",
        RayDeprecationWarning,
        stacklevel=3,
    )
    settings = _shared_fields(run_config, tune.RunConfig)
    for name, tune_class in (("checkpoint_config", tune.CheckpointConfig), ("failure_config", tune.FailureConfig)):
        given = settings.get(name)
        if given is not None and not isinstance(given, tune_class):
            settings[name] = tune_class(**_shared_fields(given, tune_class))
    return tune.RunConfig(**settings)


def _shared_fields(config: Any, target: type) -> dict[str, Any]:
    """``config``'s dataclass fields that ``target`` also has, as given
    (Train's ``"DEPRECATED"`` placeholders left out: ``target``'s defaults)."""
    import dataclasses

    names = {field.name for field in dataclasses.fields(target) if field.init}
    given = {field.name: getattr(config, field.name) for field in dataclasses.fields(config) if field.name in names}
    return {name: value for name, value in given.items() if not (isinstance(value, str) and value == "DEPRECATED")}


def check_param_space(param_space: Any) -> None:
    """As Tune's ``TunerInternal.param_space`` setter and ``_choose_run_config``."""
    if not isinstance(param_space, dict) and param_space is not None:
        raise ValueError(f"The `param_space` passed to the `Tuner` must be a dict. Got '{type(param_space)}' instead.")
    if param_space and "run_config" in param_space:
        raise ValueError(
            "`RunConfig` cannot be tuned as part of the `param_space`! Move the run config to be a parameter of "
            "the `Tuner`: Tuner(..., run_config=RunConfig(...))"
        )
    depth, path = _deepest(param_space or {})
    if depth > MAX_NESTING:
        raise ValueError(
            f"param_space{_path_text(path[:3])}... nests dicts and lists {depth} levels deep; up to {MAX_NESTING} "
            "are taken (Tune copies the param_space for each trial and Ray pickles it, recursing per level): "
            "flatten it, or pass the structure as one object (tune.with_parameters(trainable, name=value))"
        )


#: How deep ``param_space`` may nest dicts and lists: copying and pickling it recurse per level.
MAX_NESTING = 100


def _children(value: Any) -> list[tuple[Any, Any]]:
    if isinstance(value, dict):
        return list(value.items())
    if isinstance(value, (list, tuple)):
        return list(enumerate(value))
    return []


def _deepest(space: Any) -> tuple[int, tuple[Any, ...]]:
    """How many levels of dicts and lists ``space`` nests, and the path to the deepest (iteratively: any depth)."""
    deepest: tuple[int, tuple[Any, ...]] = (0, ())
    stack: list[tuple[Any, tuple[Any, ...]]] = [(space, ())]
    while stack:
        value, path = stack.pop()
        children = _children(value)
        if children and len(path) + 1 > deepest[0]:
            deepest = (len(path) + 1, path)
        stack.extend((child, (*path, key)) for key, child in children)
    return deepest


def _path_text(path: tuple[Any, ...]) -> str:
    return "".join(f"[{key!r}]" for key in path)


def uncopyable_value(space: Any) -> tuple[str, Any] | None:
    """Where in ``space`` the first value that cannot be deep-copied is (a lock,
    an open file), as ``"['a']['lock']"``, with the value; None if every one can."""
    import copy

    stack: list[tuple[Any, tuple[Any, ...]]] = [(space, ())]
    while stack:
        value, path = stack.pop()
        children = _children(value)
        if children:
            stack.extend((child, (*path, key)) for key, child in reversed(children))
            continue
        try:
            copy.deepcopy(value)
        except Exception:  # noqa: BLE001 - whatever copying raises, this is the value
            return _path_text(path), value
    return None


def check_serializable(trainable: Any) -> None:
    """As Tune's ``TunerInternal._validate_trainable`` at ``Tuner()``: a
    trainable that cannot be pickled (a ``TypeError`` from pickling) is
    refused with a trace of what could not be pickled."""
    import ray.cloudpickle as pickle
    from ray.util import inspect_serializability

    try:
        pickle.dumps(trainable)
    except TypeError as error:
        trace = io.StringIO()
        inspect_serializability(trainable, print_file=trace)
        raise TypeError(
            "The provided trainable is not serializable, which is a requirement since the trainable is serialized "
            "and deserialized when transferred to remote workers. See below for a trace of the non-serializable "
            f"objects that were found in your trainable:\n{trace.getvalue()}"
        ) from error


def check_function_signature(trainable: Callable) -> None:
    """As Tune's ``wrap_function`` (at ``fit()``): a function trainable takes
    one ``config`` argument; the old ``(config, checkpoint_dir)`` signature
    is refused."""
    if isinstance(trainable, type):
        return
    try:
        inspect.signature(trainable).bind({})
        return
    except TypeError:
        pass
    except ValueError:  # no signature to read (a builtin): Tune lets it through too
        return
    raise ValueError(
        "Unknown argument found in the Trainable function. The function args must include a single 'config' "
        f"positional parameter.\nFound: {inspect.getfullargspec(trainable).args}"
    )


def check_deprecated_at_fit(tune_config: Any, run_config: Any) -> None:
    """What ``tune.run`` refuses when ``Tuner.fit()`` calls it: the deprecated
    ``TuneConfig(chdir_to_trial_dir=...)`` and result-directory environment
    variables (Tune raises ``DeprecationWarning`` as an exception), and
    ``fail_fast`` with retries."""
    from ray.train.constants import RAY_CHDIR_TO_TRIAL_DIR

    for variable in DEPRECATED_ENV:
        if os.environ.get(variable):
            raise DeprecationWarning(
                f"The environment variable `{variable}` is deprecated. It is no longer used and will not have any "
                "effect. You should set the `storage_path` instead. Files will no longer be written to "
                "`~/ray_results` as long as `storage_path` is set.See the docs: "
                "https://docs.ray.io/en/latest/train/user-guides/persistent-storage.html"
                "#setting-the-local-staging-directory"
            )
    unset = deprecated_default()
    if getattr(tune_config, "chdir_to_trial_dir", unset) != unset:
        raise DeprecationWarning(
            f"`chdir_to_trial_dir` is deprecated. Use the {RAY_CHDIR_TO_TRIAL_DIR} environment variable instead. "
            "Set it to 0 to disable the default behavior of changing the working directory.",
            DeprecationWarning,
        )
    failure = run_config.failure_config
    if failure is not None and failure.fail_fast and failure.max_failures != 0:
        raise ValueError("max_failures must be 0 if fail_fast=True.")


def adopt_searcher_state(user: Any, final: Any) -> None:
    """Give the user's searcher object the state its copy ended the study
    with (``final``, from the controller). Tune runs the searcher in the
    driver, so the object passed to ``TuneConfig(search_alg=...)`` is the one
    that learned (``searcher.save()`` after ``fit()``, Optuna's study in it);
    ours ran on the controller. Wrappers (``ConcurrencyLimiter``, repeats)
    keep the user's inner objects, each given its copy's state."""
    from ray.tune.search import Searcher

    while type(final) is not type(user) and isinstance(getattr(final, "searcher", None), Searcher):
        final = final.searcher  # a wrapper the study added (Tuner(repeats=...))
    if type(final) is not type(user):
        return
    state = dict(vars(final))
    inner, final_inner = getattr(user, "searcher", None), getattr(final, "searcher", None)
    if isinstance(inner, Searcher) and isinstance(final_inner, Searcher):
        adopt_searcher_state(inner, final_inner)
        state["searcher"] = inner
    vars(user).update(state)


def adopt_scheduler_state(user: Any, final: Any) -> None:
    """Give the user's trial scheduler the state its copy on the controller
    ended the study with, as for the searcher: Tune's runs in the driver, so
    the object handed to ``TuneConfig(scheduler=...)`` is the one that
    decided (ASHA's rungs, PB2's data). Families whose rule runs on the plan
    (PBT) keep their decisions in their adapter, not in Ray's object."""
    if type(final) is type(user):
        vars(user).update(vars(final))
