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


def test_a_sequence_in_the_config_is_its_value_where_the_trainable_starts():
    """A Tune trainable reads config values as numbers and strings (issue 57
    point 1): SGD(lr=config["lr"]), torch.save of what holds them (loaded
    with weights_only, torch's default), JSON, pickle; nothing of the
    sequence after the iteration is in it."""
    import io
    import json

    import torch

    from ray_stagetree import Values

    config = {
        "lr": MultiStep(0.1, [4], 0.5),
        "bs": MultiStep(values=(32, 64), milestones=[3]),
        "opt": Values(["sgd"] * 3 + ["adam"] * 9),
        "batch_size": 128,
    }
    seen = visible(config, 5)
    assert seen == {"lr": 0.05, "bs": 64, "opt": "adam", "batch_size": 128}
    assert [type(seen[key]) for key in ("lr", "bs", "opt")] == [float, int, str]
    assert json.loads(json.dumps(seen)) == seen and pickle.loads(pickle.dumps(seen)) == seen
    assert visible(config, 2)["lr"] == 0.1  # the value at the iteration, not a later one
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=seen["lr"], momentum=0.9)
    buffer = io.BytesIO()
    torch.save({"optimizer": optimizer.state_dict(), "config": seen}, buffer)
    buffer.seek(0)
    assert torch.load(buffer)["optimizer"]["param_groups"][0]["lr"] == 0.05


def test_a_trainable_that_does_not_follow_values_restarts_where_one_changes():
    """Until it calls get_hparams() the trainable holds config's values as
    they were at its start: the next restart is the next change of any of
    them (issue 57 point 2); once it follows values live, only a plain value
    PBT explores restarts it."""
    config = {"lr": MultiStep(0.1, [4], 0.5), "wd": MultiStep(0.01, [2], 0.5), "seed": 0}
    context = context_at(config, 0)
    context.trainable_config()
    context._begin(context.spec)
    assert context._next_fixed_value_change() == 2 and context.should_checkpoint() is False
    context.iteration = 1
    assert context.should_checkpoint()  # the restart at 2 needs the checkpoint reported there
    context.hparams(live=True)
    assert context.follows_values and context._next_fixed_value_change() is None
    assert not context.should_checkpoint()


def test_get_hparams_keys_values_as_the_config_writes_them():
    """A key holding '/' or '~' is read by its name as written, as in
    result.config (issue 30 point 4: get_hparams()["a/b"] was the nested
    {"a": {"b"}}'s value, the key "a/b" hidden as "a~1b")."""
    config = {"a/b": 1.0, "a": {"b": 2.0}, "x~y": MultiStep(0.5, [1], 0.1), "c/d": 4, "opt": {"lr": 0.1}}
    context = context_at(config, 1)
    hparams = context.hparams()
    assert not context.follows_values  # the runtime's own reads are not the trainable's
    assert hparams == {"/a~1b": 1.0, "/a/b": 2.0, "x~y": 0.05, "c/d": 4, "opt/lr": 0.1}
    with pytest.raises(
        KeyError, match=r"read config\['a'\]\['b'\] as get_hparams\(\)\['/a/b'\] and config\['a/b'\] as"
    ):
        hparams["a/b"]  # noqa: B018 (reading it is what raises)
