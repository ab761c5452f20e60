"""Studies attached to a plan service: drivers in other processes attaching
at once, a driver killed mid-study, a later service generation continuing
the stored plan, and studies whose trainables differ kept apart."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest
import ray
from service_study import HORIZON, expected_total, same_trial_ids, summary, tuner
from trainables_for_tests import count_of, noisy_descent, sum_of_lr

from ray_stagetree import Tuner
from ray_stagetree.runtime.service.service_client import shutdown, status

STUDY = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "service_study.py")


def start_driver(tmp_path, name, milestones, service, counter, sleep=0.0, **options):
    """A driver process running `service_study` against this test's Ray."""
    out = tmp_path / f"{name}.json"
    arguments = dict(
        address=ray.get_runtime_context().gcs_address,
        namespace=ray.get_runtime_context().namespace,
        storage=str(tmp_path),
        name=name,
        milestones=milestones,
        service=service,
        counter=counter,
        sleep=sleep,
        out=str(out),
        **options,
    )
    return subprocess.Popen([sys.executable, STUDY, json.dumps(arguments)]), out


def wait_for(condition, timeout=180.0, what="condition"):  # generous: CI machines may be loaded
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.2)


def attached(service):
    try:
        return status(service)["studies"]
    except ValueError:  # not started yet
        return []


@pytest.fixture
def service_name():
    name = f"svc_{os.urandom(3).hex()}"
    yield name
    shutdown(name)


def test_concurrent_drivers_share_stages_and_see_only_their_trials(ray_session, tmp_path, counter, service_name):
    # Two drivers attach at once; milestones 2 and 3 are in both studies.
    first, first_out = start_driver(tmp_path, "first", [2, 3, 4], service_name, counter, sleep=0.2)
    second, second_out = start_driver(tmp_path, "second", [2, 3, 5], service_name, counter, sleep=0.2)
    assert first.wait(timeout=120) == 0 and second.wait(timeout=120) == 0
    first_totals = {int(k): v for k, v in json.loads(first_out.read_text()).items()}
    second_totals = {int(k): v for k, v in json.loads(second_out.read_text()).items()}
    assert set(first_totals) == {2, 3, 4} and set(second_totals) == {2, 3, 5}  # each its own trials
    for totals in (first_totals, second_totals):
        assert totals == {m: expected_total(m) for m in totals}  # as trained alone
    # The union of both studies' stages trained once: milestone 5's whole
    # path, and each earlier milestone's tail from where it leaves lr 1.0.
    unique = HORIZON + sum(HORIZON - m for m in (2, 3, 4))
    assert count_of(counter) == unique < 6 * HORIZON
    assert status(service_name)["studies"] == []  # both detached when their fit() returned


@pytest.mark.long
def test_a_killed_driver_detaches_and_the_service_goes_on(ray_session, tmp_path, counter, service_name):
    # Its with_parameters objects are put by this driver, which dies: the
    # service's workers must not need it (the service keeps its own copy).
    options = dict(trainable="with_data", detach_after_s=2.0)
    doomed, _ = start_driver(tmp_path, "doomed", [3, 30], service_name, counter, sleep=0.5, **options)
    wait_for(lambda: attached(service_name) and count_of(counter) >= 2, what="the first study to train")
    doomed.kill()
    doomed.wait()
    wait_for(lambda: attached(service_name) == [], timeout=30, what="the killed driver's study to detach")
    trained = count_of(counter)
    time.sleep(1.5)  # its batches stopped: nothing trains for nobody
    assert count_of(counter) - trained <= 2  # at most the iterations under way (two workers) when it was detached
    # The service still serves: a new study attaches and gets the prefix the killed one trained.
    results = tuner(str(tmp_path), "after", [2, 3], service_name, counter=counter, trainable="with_data").fit()
    assert summary(results) == {2: expected_total(2), 3: expected_total(3)}


def test_a_new_service_generation_answers_from_the_stored_plan(ray_session, tmp_path, counter, service_name):
    first = tuner(str(tmp_path), "monday", [2, 3], service_name, counter=counter).fit()
    assert shutdown(service_name)
    trained = count_of(counter)
    assert trained == 2 + (HORIZON - 2) + (HORIZON - 3) + 1
    # A new service on the same storage: trials of Monday's study are answered
    # without training (metrics and checkpoints), a new one forks from Monday's prefix.
    later = tuner(str(tmp_path), "next_week", [3, 4], service_name, counter=counter).fit()
    assert summary(later) == {3: summary(first)[3], 4: expected_total(4)}
    # Only milestone 4's path from Monday's nearest stored checkpoint: iteration 3, the
    # end of the prefix it shares with milestone 3, whose trainable reported one there.
    assert count_of(counter) - trained == HORIZON - 3
    assert all(result.checkpoint is not None for result in later), [
        (result.path, result.checkpoint) for result in later
    ]


def test_studies_of_different_trainables_never_share(ray_session, tmp_path, counter, service_name):
    running, _ = start_driver(tmp_path, "running", [3, 30], service_name, counter, sleep=0.3)
    wait_for(lambda: attached(service_name), what="the first study to attach")
    other = tuner(str(tmp_path), "other", [2], service_name, trainable=noisy_descent)
    with pytest.raises(ValueError, match="another trainable identity"):
        other.fit()
    # The same name on another storage is refused: its plan is not this study's storage.
    elsewhere = tuner(str(tmp_path / "elsewhere"), "elsewhere", [2], service_name)
    with pytest.raises(ValueError, match="keeps its plan at"):
        elsewhere.fit()
    running.kill()
    running.wait()


def test_an_idle_service_ends_itself_but_not_while_a_study_is_attached(ray_session, tmp_path, counter, service_name):
    idle_timeout_s = 1.0
    driver, _ = start_driver(tmp_path, "slow", [2, 3], service_name, counter, sleep=1.0, idle_timeout_s=idle_timeout_s)
    wait_for(lambda: attached(service_name), what="the study to attach")
    time.sleep(3 * idle_timeout_s)  # several idle timeouts pass while the study trains: the service stays
    assert driver.poll() is None, "the study should still be training (6 iterations of 1 s each)"
    assert attached(service_name), "the service ended, or lost its study, while the study was attached"
    assert driver.wait(timeout=120) == 0
    # Its last study detached: it ends after the idle timeout.
    wait_for(lambda: not service_exists(service_name), what="the idle service to end")


def service_exists(name):
    try:
        ray.get_actor(name)
    except ValueError:
        return False
    return True


def test_colliding_trial_ids_of_two_studies_stay_apart(ray_session, tmp_path, counter, service_name, monkeypatch):
    # Both drivers draw the same trial ids; the first study is still attached
    # (its trials in the plan) when the second proposes them.
    first, first_out = start_driver(tmp_path, "first", [2, 30], service_name, counter, sleep=0.3, same_trial_ids=True)
    wait_for(lambda: attached(service_name), what="the first study to attach")
    same_trial_ids(monkeypatch.setattr)
    second = tuner(str(tmp_path), "second", [3, 4], service_name, counter=counter).fit()
    assert second.num_errors == 0
    assert summary(second) == {3: expected_total(3), 4: expected_total(4)}
    assert first.wait(timeout=120) == 0
    first_totals = {int(k): v for k, v in json.loads(first_out.read_text()).items()}
    assert first_totals == {2: expected_total(2), 30: expected_total(30)}
    ids = [result.metrics["trial_id"] for result in second]
    assert all(trial_id.startswith("00000_") for trial_id in ids) and len(set(ids)) == 2


def test_tuner_restore_of_an_attached_study_attaches_again(ray_session, tmp_path, counter, service_name):
    first = tuner(str(tmp_path), "monday", [2, 3], service_name, counter=counter).fit()
    trained = count_of(counter)
    restored = Tuner.restore(first.experiment_path, sum_of_lr)
    assert restored.plan_service is not None and restored.plan_service.name == service_name
    again = restored.fit()
    # On the same service and plan: every trial answered from it, nothing trained.
    assert summary(again) == summary(first) and count_of(counter) == trained
    assert again.experiment_path == first.experiment_path
