"""Config values JSON cannot hold (paths, tuples holding paths, namespaces,
any picklable object) are planned: keyed by the fingerprint of their pickle,
stored as their description, their objects in a side file that only a
continuing study loads."""

import argparse
import copy
import itertools
import json
import pathlib

import numpy as np
import pyarrow.parquet as pq
import pytest

from ray_stagetree import MultiStep
from ray_stagetree.planning import SearchPlan, TrialConfig
from ray_stagetree.planning.config import PICKLED, PickledValue
from ray_stagetree.planning.persistence import OBJECTS_FILE

UNPICKLED = []  # what Tripwire objects were unpickled in this process


def _rebuilt(value):
    UNPICKLED.append(value)
    return Tripwire(value)


class Tripwire:
    """Records being unpickled, so a test sees whether reading a plan runs its pickles."""

    def __init__(self, value):
        self.value = value

    def __reduce__(self):
        return _rebuilt, (self.value,)

    def __eq__(self, other):
        return isinstance(other, Tripwire) and other.value == self.value

    def __repr__(self):
        return f"Tripwire({self.value})"


class Dataset:
    """A user's object with no __eq__ of its own (identity), as most classes."""

    def __init__(self, rows):
        self.rows = rows


OBJECTS = {
    "path": pathlib.Path("/data/fail_marker"),
    "tuple-with-path": (None, pathlib.Path("/data/hang_marker")),
    "namespace": argparse.Namespace(smoke_test=True, use_gpu=False),
    "instance": Dataset([1, 2, 3]),
}


@pytest.mark.parametrize("value", OBJECTS.values(), ids=OBJECTS.keys())
def test_a_value_json_cannot_hold_is_planned_and_stored_as_its_description(value):
    config = TrialConfig.from_config({"lr": MultiStep(0.1, [5], 0.1), "data": value})
    assert config.static["data"] is value  # the user's object, as given
    stored = config.to_json()["data"][PICKLED]
    assert (
        stored["ref"].startswith("sha256:") and stored["type"] == f"{type(value).__module__}.{type(value).__qualname__}"
    )
    assert stored["repr"] == repr(value)[:200] or stored["repr"].endswith("...")
    json.dumps(config.to_json())  # the stored form is JSON


@pytest.mark.parametrize("value", OBJECTS.values(), ids=OBJECTS.keys())
def test_equal_content_shares_and_different_content_does_not(value):
    lr = MultiStep(0.1, [5], 0.1)
    mine = TrialConfig.from_config({"lr": lr, "data": value})
    # Tune hands each trial its own copy: equal content, another object
    assert mine.first_difference(TrialConfig.from_config({"lr": lr, "data": copy.deepcopy(value)}), 10) is None
    assert mine.first_difference(TrialConfig.from_config({"lr": lr, "data": "other"}), 10) == 0


def test_objects_that_differ_in_content_do_not_share():
    lr = MultiStep(0.1, [5], 0.1)
    pairs = [
        (pathlib.Path("/a"), pathlib.Path("/b")),
        ((None, pathlib.Path("/a")), (pathlib.Path("/a"), None)),
        (argparse.Namespace(a=1), argparse.Namespace(a=2)),
        (Dataset([1]), Dataset([2])),
        (pathlib.Path("/a"), pathlib.PurePosixPath("/a")),  # equal text, another type
    ]
    for first, second in pairs:
        a = TrialConfig.from_config({"lr": lr, "data": first})
        b = TrialConfig.from_config({"lr": lr, "data": second})
        assert a.first_difference(b, 10) == 0, (first, second)


class Clock:
    """A value whose pickle differs each time (its state holds a counter): no stable fingerprint."""

    ticks = itertools.count()

    def __getstate__(self):
        return {"tick": next(Clock.ticks)}


def test_a_value_without_a_stable_fingerprint_shares_nothing_but_is_planned():
    config = {"lr": 0.1, "clock": Clock()}
    a, b = TrialConfig.from_config(config), TrialConfig.from_config(config)
    assert a.pickled["clock"].ref.startswith("unique:") and not a.pickled["clock"].shareable
    assert a.first_difference(b, 10) == 0  # not even with itself, parsed again
    plan = SearchPlan()
    first, second = plan.add_trial("a", config, 10), plan.add_trial("b", config, 10)
    assert first.node is not second.node and first.node.fork_iteration == second.node.fork_iteration == 0
    # ...except with the copy it was made from (PBT's exploit deep-copies its source's config)
    copied = TrialConfig.from_config(copy.deepcopy(config), copied_from=a)
    assert copied.first_difference(a, 10) is None and isinstance(copied.static["clock"], Clock)


def test_a_value_only_cloudpickle_takes_is_fingerprinted_by_it():
    pytest.importorskip("cloudpickle")

    def local_factory():  # a local function: the standard pickle refuses it, cloudpickle takes it by value
        return 1

    a = TrialConfig.from_config({"lr": 0.1, "make": local_factory})
    b = TrialConfig.from_config({"lr": 0.1, "make": local_factory})
    assert a.pickled["make"].shareable and a.first_difference(b, 10) is None
    c = TrialConfig.from_config({"lr": 0.1, "make": lambda: 2})
    assert a.first_difference(c, 10) == 0


def test_the_plan_tables_are_readable_with_pyarrow_alone_and_nothing_is_unpickled(tmp_path):
    plan = SearchPlan()
    plan.add_trial("a", {"lr": MultiStep(0.1, [5], 0.1), "data": Tripwire(1), "marker": pathlib.Path("/m")}, 10)
    plan.add_trial("b", {"lr": MultiStep(0.1, [5], 0.01), "data": Tripwire(1), "marker": pathlib.Path("/m")}, 10)
    assert plan.trials["b"].request.node.fork_iteration == 5, "equal objects share the prefix"
    plan.save(str(tmp_path / "plan"))
    UNPICKLED.clear()

    rows = pq.read_table(tmp_path / "plan" / "trials.parquet").to_pylist()
    stored = {row["trial_id"]: json.loads(row["config"]) for row in rows}
    assert stored["a"]["data"][PICKLED]["repr"] == "Tripwire(1)"
    assert stored["a"]["marker"][PICKLED]["type"] == "pathlib.PosixPath"

    loaded = SearchPlan.load(str(tmp_path / "plan"))  # what status, show and the monitor read
    assert UNPICKLED == []
    config = loaded.trials["a"].config
    assert isinstance(config.static["data"], PickledValue) and not config.complete
    assert config.static_key == plan.trials["a"].config.static_key  # keyed as it was
    assert repr(config.static["data"]) == "<pickled Tripwire(1)>"

    assert (tmp_path / "plan" / OBJECTS_FILE).is_file()
    resumed = SearchPlan.load(str(tmp_path / "plan"), objects=True)  # continuing the study
    assert UNPICKLED == [1]
    config = resumed.trials["a"].config
    assert config.complete and config.to_config()["data"] == Tripwire(1)
    assert config.to_config()["marker"] == pathlib.Path("/m")
    assert config.static_key == plan.trials["a"].config.static_key


def test_records_and_objects_rebuild_the_plan_as_a_snapshot_does():
    plan = SearchPlan()
    value = argparse.Namespace(data="/data", workers=2)
    plan.add_trial("a", {"lr": 0.1, "args": value, "paths": (pathlib.Path("/x"), 3)}, 10)
    rebuilt = SearchPlan.from_records(plan.records(), plan.objects())
    config = rebuilt.trials["a"].config.to_config()
    assert config["args"] == value and config["paths"] == (pathlib.Path("/x"), 3)
    assert type(config["paths"]) is tuple
    # a new trial with equal objects joins the restored plan's node
    request = rebuilt.add_trial("b", {"lr": 0.1, "args": copy.deepcopy(value), "paths": (pathlib.Path("/x"), 3)}, 10)
    assert request.node is rebuilt.trials["a"].request.node


class MockData:
    """A dataset-like object holding a large array (as Ray's restore tests put in param_space)."""

    def __init__(self, data):
        self.data = data


def test_a_dataset_like_object_is_keyed_by_its_content():
    data = np.random.default_rng(0).random(2 * 1024 * 1024)  # 16 MB, hashed in place
    mine = TrialConfig.from_config({"lr": 0.1, "data": MockData(data)})
    assert mine.first_difference(TrialConfig.from_config({"lr": 0.1, "data": MockData(data.copy())}), 10) is None
    changed = data.copy()
    changed[-1] += 1.0
    assert mine.first_difference(TrialConfig.from_config({"lr": 0.1, "data": MockData(changed)}), 10) == 0
