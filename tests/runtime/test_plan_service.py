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

from ray_stagetree.runtime.service_client import shutdown, status
from service_study import HORIZON, expected_total, summary, tuner
from trainables_for_tests import count_of, noisy_descent

STUDY = os.path.join(os.path.dirname(os.path.abspath(__file__)), "service_study.py")


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


def wait_for(condition, timeout=60.0, what="condition"):
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
    # Only milestone 4's path from Monday's nearest stored checkpoint (its branch point, iteration 2).
    assert count_of(counter) - trained == HORIZON - 2
    assert all(result.checkpoint is not None for result in later)


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
