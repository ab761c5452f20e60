"""What the driver hears at each poll (runtime.control.driver_feed), without Ray."""

from __future__ import annotations

import asyncio

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
    assert feed.take() == {"rows": [], "events": [], "warnings": [], "output": [], "rows_through": 0}
    feed.warn("later")
    assert first["warnings"] == ["a missing checkpoint"]  # what was taken is not changed by what comes after
    assert feed.take()["warnings"] == ["later"]


def test_a_trainable_waits_until_the_drivers_callbacks_had_its_result_and_hears_what_they_asked():
    async def scenario():
        feed = DriverFeed()
        feed.row({"trial_id": "t1", "training_iteration": 1})
        feed.row({"trial_id": "t2", "training_iteration": 1})
        waiting = asyncio.ensure_future(feed.had_all())
        await feed.driver_needed(5.0)  # returns at once: the driver has not taken the rows it waits for
        news = feed.take()
        assert news["rows_through"] == 2 and not waiting.done()
        await asyncio.sleep(0)
        feed.answer(1, [])  # an answer to an earlier poll: not yet these rows
        await asyncio.sleep(0)
        assert not waiting.done()
        feed.answer(news["rows_through"], [("t2", 1)])
        await asyncio.wait_for(waiting, 1.0)
        assert feed.asked_at("t2", 1) and not feed.asked_at("t2", 1), "asked once"
        assert not feed.asked_at("t1", 1)
        await asyncio.wait_for(feed.had_all(), 1.0)  # nothing new fed: nothing to wait for

    asyncio.run(scenario())


def test_a_trainable_waiting_for_an_answer_goes_on_once_none_can_come():
    async def scenario():
        feed = DriverFeed()
        feed.row({"trial_id": "t1", "training_iteration": 1})
        waiting = asyncio.ensure_future(feed.had_all())
        await asyncio.sleep(0)
        feed.release()  # the study ended, or its driver stopped
        await asyncio.wait_for(waiting, 1.0)
        feed.row({"trial_id": "t1", "training_iteration": 2})
        await asyncio.wait_for(feed.had_all(), 1.0)

    asyncio.run(scenario())


def test_the_driver_is_woken_when_a_trainable_waits_for_rows_it_has_not_taken():
    async def scenario():
        feed = DriverFeed()
        feed.row({"trial_id": "t1", "training_iteration": 1})
        await feed.driver_needed(0.01)  # nothing waits: the poll returns once its time is up
        needed = asyncio.ensure_future(feed.driver_needed(60.0))
        await asyncio.sleep(0)
        assert not needed.done(), "rows alone do not wake it"
        waiting = asyncio.ensure_future(feed.had_all())
        await asyncio.wait_for(needed, 1.0)
        feed.answer(feed.take()["rows_through"], [])
        await asyncio.wait_for(waiting, 1.0)

    asyncio.run(scenario())
