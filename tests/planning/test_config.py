import json

import numpy as np
import pyarrow.fs as pafs
import pytest

from ray_stagetree import Constant, MultiStep
from ray_stagetree.planning import SearchPlan, TrialConfig
from ray_stagetree.planning.config import HParams, hparam_keys, unflatten


def test_split_flattens_nested_dicts_and_keeps_static_values():
    config = TrialConfig.from_config(
        {"optim": {"lr": MultiStep(0.1, [30], 0.1), "name": "sgd"}, "layers": [64, 64], "seed": 3}
    )
    assert config.names == ("optim/lr", "optim/name", "seed")
    assert config.declared == {"optim/lr"}
    assert config.static == {"layers": [64, 64]}
    assert config.hparams_at(30) == {"optim/lr": pytest.approx(0.01), "optim/name": "sgd", "seed": 3}


def test_json_round_trip_rebuilds_the_nested_config():
    original = {"optim": {"lr": MultiStep(0.1, [30], 0.1), "name": "sgd"}, "layers": [64, 64], "seed": 3}
    config = TrialConfig.from_config(original)
    data = json.loads(json.dumps(config.to_json()))
    assert unflatten(data)["optim"]["name"] == "sgd"
    again = TrialConfig.from_json(data)
    assert again.names == config.names and again.sequences == config.sequences
    assert again.static_key == config.static_key


def test_a_branched_config_shares_up_to_its_branch_and_keeps_its_lineage_through_json_and_a_saved_plan(tmp_path):
    source = TrialConfig.from_config({"lr": MultiStep(0.1, [2], 0.5)})
    clone = source.branched(4, "trial_b")
    assert source.first_difference(clone, stop=10) == 4
    assert source.observed_at(3) == clone.observed_at(3) and source.observed_at(4) != clone.observed_at(4)
    assert clone.branched(4, "trial_c").first_difference(clone, stop=10) == 4, "a clone of the clone at its fork"
    assert clone.branched(6, "trial_c").first_difference(clone, stop=10) == 6
    again = TrialConfig.from_json(json.loads(json.dumps(clone.to_json())))
    assert again.lineage == ((4, "trial_b"),) and again.first_difference(clone, stop=10) is None
    plan = SearchPlan()
    plan.add_trial("a", source, 8)
    plan.add_trial("b", clone, 8)
    plan.save(str(tmp_path / "plan"))
    loaded = SearchPlan.load(str(tmp_path / "plan"))
    assert [node.fork_iteration for node in loaded.path("b")] == [0, 4]
    assert loaded.path("b")[0] is loaded.path("a")[0]


def test_values_of_different_types_never_share():
    ints = TrialConfig.from_config({"batch_size": 128})
    floats = TrialConfig.from_config({"batch_size": 128.0})
    assert ints.first_difference(floats, 10) == 0
    plan = SearchPlan()
    plan.add_trial("int", {"batch_size": 128}, 10)
    plan.add_trial("float", {"batch_size": 128.0}, 10)
    assert len(plan.roots) == 2


def test_different_hyper_parameter_names_never_share():
    a = TrialConfig.from_config({"lr": 0.1})
    b = TrialConfig.from_config({"lr": 0.1, "momentum": 0.9})
    assert a.first_difference(b, 10) == 0


def test_bad_keys_are_named():
    # Any value is planned (objects as PickledValue: tests/planning/test_pickled_values.py); keys must be strings.
    with pytest.raises(TypeError, match="config keys must be strings, got 1"):
        TrialConfig.from_config({1: 0.1})


def test_nan_inf_and_numpy_values_are_planned_as_tune_takes_them(tmp_path):
    config = {"lr": np.float32(0.5), "clip": float("inf"), "floor": float("nan"), "weights": np.arange(3)}
    flat = TrialConfig.from_config(config)
    assert flat.names == ("lr",) and flat.hparams_at(0) == {"lr": 0.5}  # a number; nan and inf are static
    assert flat.to_json()["weights"] == [0, 1, 2] and type(flat.to_json()["lr"]) is float
    assert TrialConfig.from_config({**config, "floor": 0.0}).first_difference(flat, 10) == 0
    plan = SearchPlan()
    plan.add_trial("a", config, 20)
    plan.save(str(tmp_path / "plan"))
    assert SearchPlan.load(str(tmp_path / "plan")).trials["a"].config.static_key == flat.static_key


def test_plan_saves_to_a_local_directory_and_a_pyarrow_filesystem(tmp_path):
    plan = SearchPlan()
    plan.add_trial("a", {"lr": MultiStep(0.1, [30], 0.1), "layers": [8]}, 50)
    plan.add_trial("b", {"lr": Constant(0.1), "layers": [8]}, 50, share_key="other")
    plan.save(str(tmp_path / "plan"))
    plan.save("plan2", storage_filesystem=pafs.SubTreeFileSystem(str(tmp_path), pafs.LocalFileSystem()))
    for loaded in (SearchPlan.load(str(tmp_path / "plan")), SearchPlan.load(f"file://{tmp_path}/plan2")):
        assert loaded.trials["b"].share_key == "other"
        assert loaded.describe() == plan.describe()
        assert loaded.unique_iterations() == plan.unique_iterations()


def test_loading_something_that_is_not_a_plan_fails_clearly(tmp_path):
    with pytest.raises(FileNotFoundError, match="no search plan at"):
        SearchPlan.load(str(tmp_path / "missing"))


def test_keys_holding_the_separator_never_collide_with_nested_keys():
    """{"a/b": x, "a": {"b": y}}: two hyper-parameters, not one (issue point 3)."""
    configs = [{"a/b": outer, "a": {"b": inner}, "~x": 1} for outer in (1, 2) for inner in (1, 2)]
    flats = [TrialConfig.from_config(config) for config in configs]
    assert flats[0].names == ("a/b", "a~1b", "~0x")
    # every config keeps both values and round-trips to itself
    for config, flat in zip(configs, flats):
        assert unflatten(json.loads(json.dumps(flat.to_json()))) == config
    # (1, 2) and (2, 1) differ from the first iteration on: no two of the four share
    assert flats[1].first_difference(flats[2], 10) == 0
    plan = SearchPlan()
    for index, config in enumerate(configs):
        plan.add_trial(f"t{index}", config, 4)
    assert len(plan.roots) == 4 and plan.unique_iterations() == 16


def test_hyper_parameters_are_keyed_as_the_config_writes_them_and_a_collision_by_json_pointer():
    """get_hparams() keys (issue 30 point 4): a key holding '/' or '~' reads as
    written, as in result.config; where two entries join to one key, each
    has its JSON Pointer and the shared key names both."""
    flat = TrialConfig.from_config({"a/b": 1, "a": {"b": 2}, "x~y": 3, "c/d": 4, "opt": {"lr": 0.1}})
    keys, ambiguous = hparam_keys(flat.names)
    assert {keys[name]: value for name, value in flat.hparams_at(0).items()} == {
        "/a~1b": 1,
        "/a/b": 2,
        "x~y": 3,
        "c/d": 4,
        "opt/lr": 0.1,
    }
    assert ambiguous == {"a/b": ("/a/b", "/a~1b")}


def test_a_key_two_entries_join_to_fails_loudly_however_it_is_read():
    """``get_hparams()["a/b"]``, ``.get("a/b", default)`` and ``"a/b" in``
    all name both entries; none answers as if the key were absent."""
    flat = TrialConfig.from_config({"a/b": 1, "a": {"b": 2}, "c": 3})
    keys, ambiguous = hparam_keys(flat.names)
    hparams = HParams({keys[name]: value for name, value in flat.hparams_at(0).items()}, ambiguous)
    message = r"'a/b' names 2 config entries .*config\['a'\]\['b'\] as get_hparams\(\)\['/a/b'\]"
    for read in (lambda: hparams["a/b"], lambda: hparams.get("a/b", 0), lambda: "a/b" in hparams):
        with pytest.raises(KeyError, match=message):
            read()
    assert hparams.get("c") == 3 and "c" in hparams and hparams.get("missing", 7) == 7 and "missing" not in hparams
