"""A shared stage runs with a config that is identical for every trial
through it (issue point 4): property test over random trial pairs, through
the config a stage worker hands the trainable (no Ray started)."""

import pickle

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from ray_stagetree import Exponential, MultiStep
from ray_stagetree.execution.batches import BatchSpec
from ray_stagetree.planning import TrialConfig
from ray_stagetree.runtime.workers.context import StageContext
from ray_stagetree.runtime.workers.visible_config import FutureValueError, SequenceSoFar

HORIZON = 12


def context_at(config, iteration):
    """The stage context of a batch of ``config`` at ``iteration``."""
    flat = TrialConfig.from_config(config)
    spec = BatchSpec(
        1,
        config,
        segments=[(0, 0, HORIZON)],
        save_iterations=set(),
        trial_config=flat,
        plain=frozenset(flat.names) - flat.declared,
    )
    context = StageContext(spec, controller=None, put=None)
    context.iteration = iteration
    return context


def visible(config, iteration):
    """The config a batch of ``config`` hands the trainable at ``iteration``."""
    return context_at(config, iteration).trainable_config()


def observe(value, iteration):
    """Everything a trainable can learn from a config value at ``iteration``."""
    if isinstance(value, dict):
        return tuple(sorted((key, observe(item, iteration)) for key, item in value.items()))
    if isinstance(value, SequenceSoFar):
        with pytest.raises(FutureValueError, match="not visible at iteration"):
            value.value(iteration + 1)
        seen = [value.value(k) for k in range(iteration + 1)]
        return ("sequence", repr(value), tuple((type(x), x) for x in seen), value.values(0, iteration + 1).tolist())
    return (type(value), repr(value))


sequences = st.one_of(
    st.builds(lambda m, g: MultiStep(0.1, [m], g), st.integers(1, HORIZON), st.sampled_from([0.5, 0.1])),
    st.builds(
        lambda m1, m2, g: MultiStep(0.1, sorted({m1, m2}), g),
        st.integers(1, 6),
        st.integers(1, 6),
        st.sampled_from([0.5, 0.1]),
    ),
    st.builds(lambda g: Exponential(0.1, g), st.sampled_from([1.0, 0.9])),
)
configs = st.fixed_dictionaries(
    {
        "lr": sequences,
        "optim": st.fixed_dictionaries({"momentum": sequences, "nesterov": st.booleans()}),
        "layers": st.sampled_from([[64, 64], [64, 64]]),
        "seed": st.just(0),
    }
)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(configs, configs)
def test_trials_sharing_iterations_see_identical_configs_there(a, b):
    shared = TrialConfig.from_config(a).first_difference(TrialConfig.from_config(b), HORIZON)
    shared = HORIZON if shared is None else shared
    for iteration in range(shared):
        assert observe(visible(a, iteration), iteration) == observe(visible(b, iteration), iteration)
    if shared < HORIZON:  # where they part, the trainable sees the difference
        assert observe(visible(a, shared), shared) != observe(visible(b, shared), shared)


def test_a_sequence_shows_its_values_so_far_and_nothing_else():
    config = {"lr": MultiStep(0.1, [4], 0.5), "batch_size": 128}
    seen = visible(config, 2)
    lr = seen["lr"]
    assert seen["batch_size"] == 128 and lr.value(2) == 0.1 and lr.iteration == 2
    with pytest.raises(
        FutureValueError, match=r"config\['lr'\] at iteration 4 is not visible at iteration 2.*get_hparams"
    ):
        lr.value(4)
    with pytest.raises(AttributeError):
        lr.milestones  # noqa: B018 (reading it is what raises)
    # pickled (Tune's loggers pickle configs) it keeps what it showed, no more
    again = pickle.loads(pickle.dumps(lr))
    assert again.value(2) == 0.1 and again.iteration == 2
    with pytest.raises(FutureValueError):
        again.value(3)


def test_get_hparams_keys_values_as_the_config_writes_them():
    """A key holding '/' or '~' is read by its name as written, as in
    result.config (issue 30 point 4: get_hparams()["a/b"] was the nested
    {"a": {"b"}}'s value, the key "a/b" hidden as "a~1b")."""
    config = {"a/b": 1.0, "a": {"b": 2.0}, "x~y": MultiStep(0.5, [1], 0.1), "c/d": 4, "opt": {"lr": 0.1}}
    context = context_at(config, 1)
    hparams = context.hparams()
    assert hparams == {"/a~1b": 1.0, "/a/b": 2.0, "x~y": 0.05, "c/d": 4, "opt/lr": 0.1}
    with pytest.raises(
        KeyError, match=r"read config\['a'\]\['b'\] as get_hparams\(\)\['/a/b'\] and config\['a/b'\] as"
    ):
        hparams["a/b"]  # noqa: B018 (reading it is what raises)
    with pytest.raises(FutureValueError, match=r"get_hparams\(\)\['x~y'\]"):
        context.trainable_config()["x~y"].value(2)
