"""Where a Tuner's trials come from (`searchers.sources`): its grid and
random variants, drawn as Tune's ``BasicVariantGenerator`` draws them, or
its searcher, hosted; the first draw checked on the driver, before anything runs."""

from __future__ import annotations

import functools
import pickle
from collections.abc import Callable
from typing import Any

import ray
from ray.tune.search import BasicVariantGenerator, Searcher

from ray_stagetree.planning.config import TrialConfig
from ray_stagetree.runtime.driver.settings import StudySettings, TrialSource
from ray_stagetree.runtime.driver.tune_compat import uncopyable_value
from ray_stagetree.runtime.workers.reproducibility import Reproducibility, SeededRepeater, repeat_configs, trial_seed
from ray_stagetree.searchers import SequenceGridSearch
from ray_stagetree.searchers.sources import SearcherSource, VariantSource
from ray_stagetree.searchers.variants import VariantStream, sample_variants
from ray_stagetree.trial_schedulers.ray_fields import maximum_iterations, variant_generator_settings
from ray_stagetree.trial_schedulers.registry import scheduler_max_t


def trial_source(tuner: StudySettings) -> TrialSource:
    """Where ``tuner``'s trials come from. Grid and random variants are drawn
    as the study admits them; the points to evaluate and the grid's first
    repeat are drawn and validated here, before anything runs: every grid
    value is in them, so errors that come from the space itself show before
    training, and the cost does not grow with ``num_samples``. Later draws,
    and a searcher's suggestions, are validated as they come (a bad one
    errs its trial, as in Tune)."""
    config = tuner.tune_config
    if isinstance(config.search_alg, Searcher):
        searcher, num_samples = config.search_alg, config.num_samples
        if tuner.repeats > 1:
            searcher = SeededRepeater(searcher, tuner.repeats, tuner.seed)
            num_samples = num_samples * tuner.repeats if num_samples > 0 else num_samples
        spec = searcher_spec(tuner.run_config.stop, config.num_samples, config.time_budget_s, config.scheduler)
        return SearcherSource(searcher, tuner.param_space, config.metric, config.mode, num_samples, spec)
    each_draw = functools.partial(repeat_configs, repeats=tuner.repeats, seed=tuner.seed) if tuner.repeats > 1 else None
    if isinstance(config.search_alg, SequenceGridSearch):
        # Its filter makes the trials' number known only once all are drawn: drawn here.
        configs = config.search_alg.generate(tuner.param_space, config.num_samples)
        source = VariantSource(each_draw(configs) if each_draw else configs)
    else:
        seed = tuner.seed if tuner.reproducible else None
        variants = _variants(tuner.param_space, config.num_samples, config.search_alg, seed, each_draw)
        source = VariantSource(variants, skip_repeats=tuner.stage_sharing)
    for index, trial_config in enumerate(source.drawn()):
        try:
            TrialConfig.from_config(trial_config)
            ray.cloudpickle.dumps(trial_config)
            if tuner.reproducible:
                trial_seed(trial_config, Reproducibility(tuner.seed))
        except (TypeError, ValueError) as error:
            raise ValueError(f"trial {index} ({trial_config!r}) cannot run: {error}") from None
    return source


def copyable_trial_source(tuner: StudySettings) -> TrialSource:
    """`trial_source`; where Tune's copy of the param_space fails, the error names the value's key."""
    try:
        return trial_source(tuner)
    except (TypeError, pickle.PicklingError) as error:
        found = uncopyable_value(tuner.param_space)
        if found is None:
            raise
        path, value = found
        raise TypeError(
            f"param_space{path} = {value!r} cannot be copied ({type(error).__name__}: {error}), and Tune "
            "copies the param_space for each trial: pass it with tune.with_parameters(trainable, name=value), "
            "or make it inside the trainable"
        ) from error


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
    return sample_variants(param_space, num_samples, **variant_generator_settings(generator), each_draw=each_draw)


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
