"""What the driver hears at each poll (runtime.control.driver_feed), without Ray."""

from __future__ import annotations

from ray_stagetree.planning.config import TrialConfig
from ray_stagetree.runtime.control.driver_feed import DriverFeed
from ray_stagetree.runtime.control.trials import TrialState


def trial() -> TrialState:
    state = TrialState(
        trial_id="t1", config={"lr": 0.1}, name="train_t1", dirname="train_t1_0", experiment_tag="0_lr=0.1000"
    )
    state.configure({"lr": 0.1}, TrialConfig.from_config({"lr": 0.1}))
    return state


def test_a_trial_is_announced_once_with_its_config_before_its_rows():
    feed = DriverFeed()
    state = trial()
    feed.announce(state)
    feed.row({"trial_id": "t1", "training_iteration": 1})
    feed.announce(state)
    feed.event("complete", state)
    news = feed.take()
    named = {"trial_id": "t1", "name": "train_t1", "dirname": "train_t1_0", "experiment_tag": "0_lr=0.1000"}
    assert news["events"] == [
        {"event": "start", **named, "config": {"lr": 0.1}},
        {"event": "complete", **named},
    ]
    assert news["rows"] == [{"trial_id": "t1", "training_iteration": 1}] and state.announced


def test_each_piece_of_news_is_taken_once():
    feed = DriverFeed()
    feed.warn("a missing checkpoint")
    feed.event("error", trial(), error="boom")
    feed.output("t1", [("stdout", "printed\n")])
    first = feed.take()
    assert first["warnings"] == ["a missing checkpoint"] and first["events"][0]["error"] == "boom"
    assert first["output"] == [("t1", [("stdout", "printed\n")])]
    assert feed.take() == {"rows": [], "events": [], "warnings": [], "output": []}
    feed.warn("later")
    assert first["warnings"] == ["a missing checkpoint"]  # what was taken is not changed by what comes after
    assert feed.take()["warnings"] == ["later"]
