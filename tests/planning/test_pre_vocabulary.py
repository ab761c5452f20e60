"""What was stored before the vocabulary rename loads after it
and gives the same plan: `tests/fixtures/make_pre_vocabulary.py` wrote the
fixtures with the code before the rename, and builds the same plan with
the new names. (A whole study's directory: `tests/runtime/driver/test_restore.py`.)"""

from __future__ import annotations

import os
import pickle
import warnings

import pyarrow.parquet as pq
import pytest
from fixtures.make_pre_vocabulary import FIXTURE as STORED
from fixtures.make_pre_vocabulary import build_plan

from ray_stagetree.planning import SearchPlan
from ray_stagetree.planning.decisions import Exploit
from ray_stagetree.planning.persistence import SCHEMAS


@pytest.fixture(autouse=True)
def no_deprecation_warnings():
    """Loading what was stored is nothing the user did wrong: no warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DeprecationWarning)
        yield


def test_a_saved_plan_loads_as_the_plan_it_was():
    loaded, built = SearchPlan.load(os.path.join(STORED, "plan")), build_plan()
    assert loaded.records() == built.records()
    assert loaded.describe() == built.describe()
    assert [node.fork_iteration for node in loaded.nodes] == [0, 4, 6, 0]
    assert {trial_id: record.share_key for trial_id, record in loaded.trials.items()} == {
        "a": "default",
        "b": "default",
        "c": "default",
        "d": "other",
    }


def test_new_trials_share_with_the_stored_ones_under_their_share_key():
    loaded = SearchPlan.load(os.path.join(STORED, "plan"))
    stored_c = loaded.trials["c"].request.node
    assert loaded.add_trial("e", {"lr": 0.1, "layers": [8, 8]}, 12).node is stored_c
    forked = loaded.add_trial("f", {"lr": 0.1, "layers": [8, 8]}, 12, share_key="other").node
    assert forked.parent is loaded.trials["d"].request.node and forked.fork_iteration == 4


def test_plans_are_saved_as_before(tmp_path):
    build_plan().save(str(tmp_path))
    for name, schema in SCHEMAS.items():
        before = pq.read_table(os.path.join(STORED, "plan", f"{name}.parquet"))
        now = pq.read_table(tmp_path / f"{name}.parquet")
        assert now.schema.equals(before.schema, check_metadata=True) and schema.names == before.schema.names
        assert now.to_pylist() == before.to_pylist()


def test_a_pickled_plan_loads_under_the_new_names():
    with open(os.path.join(STORED, "plan.pkl"), "rb") as file:
        loaded = pickle.load(file)  # a fixture of this repository
    assert loaded.records() == build_plan().records()
    assert loaded.trials["d"].share_key == "other" and loaded.trials["c"].request.iteration == 12
    again = pickle.loads(pickle.dumps(loaded))
    assert again.describe() == loaded.describe()


def test_a_pickled_exploit_loads_under_the_new_names():
    with open(os.path.join(STORED, "exploit.pkl"), "rb") as file:
        exploit = pickle.load(file)  # a fixture of this repository
    assert exploit == Exploit("source_trial", 6, {"lr": 0.05}) and exploit.iteration == 6
