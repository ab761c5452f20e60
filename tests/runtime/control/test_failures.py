"""How the controller counts failures (runtime.control.failures), without
Ray: FailureConfig's max_failures and fail_fast, TUNE_RESTORE_RETRY_NUM,
the one retry of a shared stage, and the study's stop."""

from __future__ import annotations

import math

from ray_stagetree.runtime.control.failures import Failures, SharedStageRetries
from ray_stagetree.runtime.control.trials import TrialState


def trial() -> TrialState:
    return TrialState(trial_id="t0", config={})


def test_a_trial_retries_max_failures_times_then_ends_in_error():
    failures = Failures(max_failures=2)
    state = trial()
    assert [failures.retried(state) for _ in range(3)] == [True, True, False]
    assert state.failures == 3


def test_without_max_failures_the_first_failure_ends_the_trial_and_with_minus_one_none_does():
    state = trial()
    assert not Failures().retried(state)
    forever = Failures(max_failures=math.inf)
    assert all(forever.retried(state) for _ in range(1000))


def test_a_failure_that_a_retry_would_repeat_ends_the_trial_but_still_counts():
    failures = Failures(max_failures=5)
    state = trial()
    assert not failures.retried(state, retry=False)
    assert state.failures == 1


def test_a_failed_restore_is_retried_without_counting_first():
    failures = Failures(max_failures=1, restore_retries=2)
    state = trial()
    assert failures.retried(state, in_restore=True) and failures.retried(state, in_restore=True)
    assert (state.restore_failures, state.failures) == (2, 0)
    assert failures.retried(state, in_restore=True)  # now it counts: the first of max_failures
    assert not failures.retried(state, in_restore=True)
    assert (state.restore_failures, state.failures) == (2, 2)
    # The trial trained again (the controller resets the count): its loads are retried afresh.
    state.restore_failures = 0
    state2 = trial()
    assert not Failures(restore_retries=2).retried(state2, retry=False, in_restore=True)
    assert (state2.restore_failures, state2.failures) == (0, 1)


def test_a_shared_stage_error_is_retried_once_per_stage_and_trials():
    retries = SharedStageRetries()
    assert not retries.retry(3, {"a"})  # one trial: its failure counts at once
    assert retries.retry(3, {"a", "b"})
    assert not retries.retry(3, {"b", "a"})  # the same stage and trials: once
    assert retries.retry(3, {"a", "b", "c"})  # another set of trials on it
    assert retries.retry(4, {"a", "b"})  # another stage


def test_fail_fast_ends_the_study_at_an_errored_trial():
    assert not Failures().ends_study()
    assert Failures(fail_fast=True).ends_study() and Failures(fail_fast="raise").ends_study()


def test_the_study_halts_once_and_an_abort_says_why():
    failures = Failures()
    assert not failures.halted and failures.study_error is None
    assert failures.halt() and failures.halted
    assert not failures.halt()  # its trials were stopped already
    aborted = Failures()
    aborted.abort("the trainable cannot be unpickled")
    assert aborted.halted and aborted.study_error == "the trainable cannot be unpickled"
    assert not aborted.halt()
