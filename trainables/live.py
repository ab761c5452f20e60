"""Values that change while a trainable runs, for code that is not the
trainable's own loop: a framework integration (`ray_stagetree.trainables.lightning`,
`ray_stagetree.trainables.transformers`) or a helper
(`ray_stagetree.trainables.torch.follow_optimizer_hparams`) applies them at
each iteration's start, on a stage worker and under ``ray.tune.Tuner`` alike.

On a stage worker the runtime hands this module the running batch's
context (`use_stage_context`); the context's methods named here are
``follow`` and ``resumed_rng``/``restore_rng``. Under ``ray.tune.Tuner`` the
values come from the trial's config at the trial's iteration.
"""

from __future__ import annotations

import inspect
import weakref
from collections.abc import Callable, Mapping
from typing import Any

# Where Tune's Trainable keeps its trial's details in the config it is given (ray.tune.trainable.trainable.TRIAL_INFO).
TRIAL_INFO_KEY = "__trial_info__"

_stage_context: Callable[[], Any] = lambda: None  # noqa: E731  (a stage worker replaces it)


def use_stage_context(current: Callable[[], Any]) -> None:
    """On a stage worker: ``current()`` is the batch this thread trains (None between batches)."""
    global _stage_context
    _stage_context = current


def follow_hparams(follows: Callable[[str], bool]) -> dict[str, Any]:
    """The values of the config keys ``follows`` picks (keyed as
    ``get_hparams()`` keys them) that change at the iteration about to be
    trained, for a caller that applies them itself now. The trainable then
    follows those keys live: they change without a restart, while it still
    restarts from its checkpoint where another value it holds changes.
    Empty at iteration 0 (the config's values are those it started with)."""
    context = _stage_context()
    if context is not None:
        return context.follow(follows)
    trainable = running_tune_trainable()
    if trainable is None or trainable.iteration == 0:
        return {}
    now, before = tune_hparams(trainable), tune_hparams(trainable, trainable.iteration - 1)
    return {key: value for key, value in now.items() if follows(key) and value != before[key]}


def restore_resumed_rng() -> None:
    """Set the random generators again to their states when the checkpoint
    this run started from was reported. ``get_checkpoint()`` already did,
    but a framework builds its model and data loaders after it, drawing
    numbers the uninterrupted run never drew: its integration calls this as
    the first iteration after the restore starts. Nothing on a fresh start,
    or under ``ray.tune.Tuner``."""
    context = _stage_context()
    rng = None if context is None else context.resumed_rng()
    if rng is not None:
        context.restore_rng(rng)


def running_tune_trainable() -> Any:
    """The ``ray.tune.Trainable`` running the caller under ``ray.tune.Tuner``:
    the nearest ``self`` that is one, up the caller's stack (a class's
    ``step``, or the function trainable's ``_trainable_func`` on its runner
    thread); None outside one."""
    from ray.tune import Trainable

    frame = inspect.currentframe()
    while frame is not None:
        candidate = frame.f_locals.get("self")
        if isinstance(candidate, Trainable):
            return candidate
        frame = frame.f_back
    return None


# A Tune trainable's config (as `TrialConfig`, and its keys), by trainable: flattened once, not per call.
_tune_configs: weakref.WeakKeyDictionary[Any, tuple[Any, Any, Any]] = weakref.WeakKeyDictionary()


def tune_hparams(trainable: Any, iteration: int | None = None) -> Mapping[str, Any]:
    """``get_hparams()`` of a trial that ``ray.tune.Tuner`` runs: its
    config's values at its iteration (or at ``iteration``), keyed as on a
    stage worker (an `HParams`)."""
    from ray_stagetree.planning import TrialConfig
    from ray_stagetree.planning.config import HParams, hparam_keys
    from ray_stagetree.searchers.variants import from_tune_config

    cached = _tune_configs.get(trainable)
    if cached is None or cached[0] is not trainable.config:  # PBT's reset_config hands it a new one
        # Sequences as objects, or in the JSON form Tune's variant generator resolves (`tune_grid`).
        config = from_tune_config({key: value for key, value in trainable.config.items() if key != TRIAL_INFO_KEY})
        flat = TrialConfig.from_config(config)
        cached = _tune_configs[trainable] = (trainable.config, flat, hparam_keys(flat.names))
    _, flat, (keys, ambiguous) = cached
    values = flat.hparams_at(trainable.iteration if iteration is None else iteration)
    return HParams({keys[name]: value for name, value in values.items()}, ambiguous)
