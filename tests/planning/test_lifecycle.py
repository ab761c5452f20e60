"""The trial lifecycle (`planning.lifecycle`), without Ray: a scripted trial
scheduler and searcher drive trials through every transition, and the plan
shows what each decision did to the trials' requests."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from ray_stagetree import MultiStep
from ray_stagetree.planning import SearchPlan
from ray_stagetree.planning import lifecycle as lifecycle_module
from ray_stagetree.planning.decisions import CONTINUE, PAUSE, STOP, Exploit
from ray_stagetree.planning.lifecycle import (
    ERROR,
    PAUSED,
    PENDING,
    RUNNING,
    TERMINATED,
    WAIT,
    Refused,
    Trial,
    TrialLifecycle,
)
from ray_stagetree.planning.policies import CriticalPathPolicy

HORIZON, RUNG = 12, 4


class ScriptedHost:
    """A trial scheduler that decides every ``RUNG`` iterations, answers from
    ``decisions`` (CONTINUE otherwise) and records what it is told."""

    def __init__(self, decisions: dict[tuple[str, int], Any] | None = None, population: Any = None) -> None:
        self.decisions = decisions or {}
        self.population = population
        self.to_resume: list[tuple[str, Any]] = []
        self.calls: list[tuple] = []

    def on_add(self, trial_id: str, config: dict[str, Any]) -> None:
        self.calls.append(("add", trial_id))

    def on_result(self, trial_id: str, row: dict[str, Any], values: dict[str, Any] | None = None) -> Any:
        iteration = row["training_iteration"]
        self.calls.append(("result", trial_id, iteration, values))
        return self.decisions.get((trial_id, iteration), CONTINUE)

    def on_complete(self, trial_id: str, row: dict[str, Any] | None) -> None:
        self.calls.append(("complete", trial_id, row and row["training_iteration"]))

    def on_error(self, trial_id: str) -> None:
        self.calls.append(("error", trial_id))

    def resumable(self) -> list[tuple[str, Any]]:
        chosen, self.to_resume = self.to_resume, []
        return chosen

    def next_decision(self, trial_id: str, iteration: int) -> int:
        return min((iteration // RUNG + 1) * RUNG, HORIZON)


class RecordingTrialSource:
    def __init__(self) -> None:
        self.completed: list[tuple[str, Any, bool]] = []
        self.proposals: list[tuple[str, dict[str, Any]] | str] = []

    def next_trial(self) -> tuple[str, dict[str, Any]] | str | None:
        return self.proposals.pop(0) if self.proposals else None

    def on_complete(self, trial_id: str, result: dict[str, Any] | None, error: bool = False) -> None:
        self.completed.append((trial_id, result and result["training_iteration"], error))


class Study:
    """A lifecycle on a fresh plan, with what its callbacks heard."""

    def __init__(self, host: ScriptedHost | None = None) -> None:
        self.plan = SearchPlan()
        self.host = host or ScriptedHost()
        self.trial_source = RecordingTrialSource()
        self.requested: list[tuple[str, int, int]] = []  # (trial, request iteration, from iteration)
        self.ended: list[tuple[str, str]] = []  # (trial, status)
        self.lifecycle = TrialLifecycle(
            self.plan,
            self.host,
            self.trial_source,
            share_key=lambda trial_id: "study",
            next_request=self.host.next_decision,
            on_request=lambda trial, request, iteration: self.requested.append(
                (trial.trial_id, request.iteration, iteration)
            ),
            on_end=lambda trial: self.ended.append((trial.trial_id, trial.status)),
        )

    def admit(self, trial_id: str, config: dict[str, Any] | None = None) -> Trial:
        self.trial_source.proposals.append((trial_id, config or {"lr": MultiStep(0.1, [6], 0.1)}))
        return self.lifecycle.admit_next(lambda trial_id, config, trial_config: Trial(trial_id=trial_id, config=config))

    def result(self, trial: Trial, iteration: int) -> None:
        row = {"training_iteration": iteration, "loss": 1.0 / iteration}
        self.lifecycle.record(trial, iteration, row)
        self.lifecycle.decide(trial, iteration, row)
        self.lifecycle.resume()

    def request_iteration(self, trial_id: str) -> int:
        return self.plan.trials[trial_id].request.iteration


def test_admission_requests_the_trial_up_to_its_first_decision_point():
    study = Study()
    trial = study.admit("a")
    assert trial.status == PENDING
    assert study.lifecycle.live() == 1 and study.lifecycle.counts() == {PENDING: 1}
    assert study.request_iteration("a") == RUNG
    assert study.requested == [("a", RUNG, 0)]
    assert trial.node is study.plan.trials["a"].request.node
    # Parsed once, under the plan's sharing key: the plan holds that parse.
    assert study.plan.trials["a"].config.static_key == trial.trial_config.static_key
    assert '"study": "study"' in trial.trial_config.static_key


def test_admission_asks_the_source_and_tells_the_scheduler_before_parsing():
    study = Study()
    assert study.lifecycle.admit_next(lambda *made: pytest.fail("nothing was proposed")) is None
    study.trial_source.proposals.append(WAIT)
    assert study.lifecycle.admit_next(lambda *made: pytest.fail("the searcher waits")) is None
    assert study.lifecycle.source_waits, "the owner asks it again later (Tune waits for a searcher)"
    made = []
    study.trial_source.proposals.append(("a", {"lr": 0.1}))
    trial = study.lifecycle.admit_next(lambda *arguments: made.append(arguments) or Trial(trial_id="a", config={}))
    assert not study.lifecycle.source_waits
    assert study.host.calls == [("add", "a")]
    [(trial_id, config, trial_config)] = made
    assert (trial_id, config) == ("a", {"lr": 0.1}) and trial_config.names == ("lr",)
    assert trial.config == {"lr": 0.1} and trial.trial_config is trial_config, "the lifecycle configures the trial"


def test_a_config_that_cannot_be_planned_or_a_maker_that_raises_is_refused_with_the_trial():
    study = Study()
    study.trial_source.proposals.append(("bad", ["lr", 0.1]))  # a config is a dict
    with pytest.raises(Refused) as refused:
        study.lifecycle.admit_next(lambda *made: pytest.fail("an unplannable config makes no trial"))
    assert refused.value.trial_id == "bad" and isinstance(refused.value.error, TypeError)

    def hook_raises(*made):
        raise KeyError("name")

    study.trial_source.proposals.append(("b", {"lr": 0.1}))
    with pytest.raises(Refused, match="KeyError") as refused:
        study.lifecycle.admit_next(hook_raises)
    assert refused.value.config == {"lr": 0.1}
    assert study.lifecycle.counts() == {} and "b" not in study.plan.trials


def test_abort_ends_unfinished_trials_in_error_without_telling_their_scheduler_or_searcher():
    study = Study()
    trial = study.admit("a")
    study.lifecycle.abort(trial)
    assert trial.status == ERROR and study.lifecycle.counts() == {ERROR: 1}
    assert "a" not in study.plan.trials
    assert study.trial_source.completed == [] and study.ended == []


def test_close_terminates_a_paused_trial_as_it_stands():
    study = Study(ScriptedHost({("a", RUNG): PAUSE}))
    trial = study.admit("a")
    for iteration in range(1, RUNG + 1):
        study.result(trial, iteration)
    assert trial.status == PAUSED
    study.lifecycle.close(trial)
    assert trial.status == TERMINATED and study.lifecycle.counts() == {TERMINATED: 1}
    assert study.request_iteration("a") == RUNG, "its results stand"


def test_a_result_runs_the_trial_and_continue_moves_the_request_on_at_its_end():
    study = Study()
    trial = study.admit("a")
    study.result(trial, 1)
    assert trial.status == RUNNING and study.lifecycle.counts() == {RUNNING: 1}
    assert study.request_iteration("a") == RUNG, "a result before the decision point moves nothing"
    study.result(trial, RUNG)
    assert study.request_iteration("a") == 2 * RUNG
    assert study.requested[-1] == ("a", 2 * RUNG, RUNG)


def test_stop_ends_the_trial_at_its_last_result_and_tells_scheduler_and_searcher():
    study = Study(ScriptedHost({("a", RUNG): STOP}))
    trial = study.admit("a")
    study.result(trial, RUNG)
    assert trial.status == TERMINATED and study.lifecycle.live() == 0
    assert study.request_iteration("a") == RUNG, "the plan keeps the iterations the trial trained"
    assert study.ended == [("a", TERMINATED)]
    assert ("complete", "a", RUNG) in study.host.calls
    assert study.trial_source.completed == [("a", RUNG, False)]
    study.lifecycle.stop(trial)  # stopping an ended trial changes nothing
    assert study.trial_source.completed == [("a", RUNG, False)]


def test_pause_holds_the_trial_until_the_scheduler_resumes_it():
    study = Study(ScriptedHost({("a", RUNG): PAUSE}))
    trial = study.admit("a")
    study.result(trial, RUNG)
    assert trial.status == PAUSED and study.lifecycle.live() == 0
    assert study.request_iteration("a") == RUNG
    study.host.to_resume = [("a", None)]
    study.lifecycle.resume()
    assert trial.status == RUNNING
    assert study.request_iteration("a") == 2 * RUNG


def test_pause_before_the_end_of_a_request_moves_it_back_to_the_pause():
    study = Study(ScriptedHost({("a", 2): PAUSE}))
    trial = study.admit("a")
    study.result(trial, 2)
    assert trial.status == PAUSED
    assert study.request_iteration("a") == 2 and trial.node is study.plan.trials["a"].request.node


def test_an_exploit_forks_the_trial_from_the_source_checkpoint_with_the_explored_values():
    study = Study()
    source = study.admit("a", {"lr": MultiStep(0.1, [6], 0.1), "momentum": 0.9})
    trial = study.admit("b", {"lr": MultiStep(0.3, [6], 0.1), "momentum": 0.9})
    for iteration in range(1, RUNG + 1):
        study.result(source, iteration)
        study.result(trial, iteration)
    study.host.decisions[("b", 2 * RUNG)] = Exploit("a", RUNG, {"lr": 0.05})
    for iteration in range(RUNG + 1, 2 * RUNG + 1):
        study.result(trial, iteration)
    assert trial.trial_config.hparams_at(RUNG - 1)["lr"] == pytest.approx(0.1), "the source's values up to the fork"
    assert trial.trial_config.hparams_at(RUNG)["lr"] == 0.05, "the explored value after"
    assert trial.config["momentum"] == 0.9 and trial.config is not source.config
    assert max(trial.rows) == RUNG, "results past the fork belong to the path it left"
    assert study.request_iteration("b") == 2 * RUNG
    assert study.requested[-1] == ("b", 2 * RUNG, RUNG)
    assert study.plan.path("b")[0] is study.plan.path("a")[0], "it shares the source's prefix"


def test_pbt_members_that_start_alike_train_apart_and_exploits_of_them_fork_from_them():
    """Ray's pb2_example starts every member from one config: under Tune the
    trainable's randomness sets them apart, so here each is a path of its
    own, and a trial exploiting one forks from that member's checkpoint."""
    study = Study(ScriptedHost(population=SimpleNamespace()))
    a, b, c = (study.admit(name, {"lr": 0.1}) for name in "abc")
    assert len({study.plan.path(name)[0].node_id for name in "abc"}) == 3, "three members, three paths"
    for iteration in range(1, RUNG + 1):
        for trial in (a, b, c):
            study.result(trial, iteration)
    study.host.decisions[("c", 2 * RUNG)] = Exploit("b", RUNG, {"lr": 0.05})
    for iteration in range(RUNG + 1, 2 * RUNG + 1):
        study.result(c, iteration)
    assert study.plan.path("c")[0] is study.plan.path("b")[0], "the exploit forks from b's own path"
    assert study.plan.path("c")[0] is not study.plan.path("a")[0]


def test_exploits_given_their_sources_very_values_still_train_apart_after_the_fork():
    """PB2 explores nothing while it has no data on the source (Ray's
    pb2_example at its first perturbations): the clone keeps the source's
    values. Under Tune the two then train on apart, so here each clone
    forks from the source's checkpoint onto a path of its own (as does the
    source's own continuation), and the shared prefix is still shared."""
    study = Study(ScriptedHost(population=SimpleNamespace()))
    source, b, c = (study.admit(name, {"lr": 0.1 * (k + 1)}) for k, name in enumerate("abc"))
    for iteration in range(1, RUNG + 1):
        for trial in (source, b, c):
            study.result(trial, iteration)
    for name in "bc":
        study.host.decisions[(name, 2 * RUNG)] = Exploit("a", RUNG, {"lr": 0.1})
    for iteration in range(RUNG + 1, 2 * RUNG + 1):
        for trial in (source, b, c):
            study.result(trial, iteration)
    paths = {name: study.plan.path(name) for name in "abc"}
    assert paths["b"][0] is paths["c"][0] is paths["a"][0], "both fork from the source's checkpoint"
    assert paths["b"][-1].fork_iteration == paths["c"][-1].fork_iteration == RUNG
    assert len({paths[name][-1].node_id for name in "abc"}) == 3, "three trajectories after the fork"
    assert b.trial_config.hparams_at(RUNG) == c.trial_config.hparams_at(RUNG) == source.trial_config.hparams_at(RUNG)


def test_without_pbt_trials_that_start_alike_share_one_path():
    study = Study()
    study.admit("a", {"lr": 0.1})
    study.admit("b", {"lr": 0.1})
    assert study.plan.path("a") == study.plan.path("b")


def test_pbt_hears_the_hyper_parameters_and_which_trials_wait_for_a_worker():
    """Asynchronous PBT makes way for trials no batch runs yet (Ray's PENDING)."""
    study = Study(ScriptedHost(population=SimpleNamespace()))
    trial = study.admit("a")
    study.admit("b")
    study.result(trial, 1)
    assert study.host.calls[-1] == ("result", "a", 1, {"lr": 0.1})
    assert study.host.population.queued == {"b"}


def test_pbt_counts_a_running_trial_no_batch_trains_as_waiting_for_a_worker():
    """Under Tune a running trial holds its worker. Here trials share the
    workers: one whose request no batch trains (its batch ended, or PBT
    exploited it) waits for one as a pending trial does, and PBT makes way
    for it; else the trials with workers run ahead and the rest starve."""
    study = Study(ScriptedHost(population=SimpleNamespace()))
    a, b = study.admit("a"), study.admit("b")
    study.result(b, 1)
    study.result(a, 1)
    assert a.status == b.status == RUNNING
    assert study.host.population.queued == {"b"}


def test_finish_keeps_the_request_where_it_ended():
    study = Study()
    trial = study.admit("a")
    for iteration in range(1, HORIZON + 1):
        study.lifecycle.record(trial, iteration, {"training_iteration": iteration})
    study.lifecycle.finish(trial)
    assert trial.status == TERMINATED and study.request_iteration("a") == RUNG
    assert study.trial_source.completed == [("a", HORIZON, False)]


def test_a_failed_trial_leaves_the_plan():
    study = Study()
    trial = study.admit("a")
    study.result(trial, 1)
    study.lifecycle.fail(trial)
    assert trial.status == ERROR and "a" not in study.plan.trials
    assert study.ended == [("a", ERROR)]
    assert ("error", "a") in study.host.calls
    assert study.trial_source.completed == [("a", None, True)]
    assert study.lifecycle.counts() == {ERROR: 1}


def test_a_trial_that_ends_without_having_started_leaves_the_plan():
    study = Study()
    trial = study.admit("a")
    study.lifecycle.stop(trial)
    assert trial.status == TERMINATED and "a" not in study.plan.trials
    assert ("complete", "a", None) in study.host.calls
    assert study.trial_source.completed == [("a", None, False)]


def test_a_refused_trial_ends_in_error_without_entering_the_plan():
    study = Study()
    trial = Trial(trial_id="bad", config={"lr": object()})
    study.lifecycle.refuse(trial)
    assert trial.status == ERROR and "bad" not in study.plan.trials
    assert study.lifecycle.counts() == {ERROR: 1}
    assert study.trial_source.completed == [("bad", None, True)]


def test_an_errored_trial_reruns_from_its_last_result():
    study = Study()
    trial = study.admit("a")
    for iteration in range(1, RUNG + 1):
        study.result(trial, iteration)
    study.lifecycle.fail(trial)
    study.lifecycle.rerun(trial, max(trial.rows))
    assert trial.status == PENDING and study.lifecycle.counts() == {PENDING: 1}
    assert study.host.calls.count(("add", "a")) == 2, "its scheduler sees it again"
    assert study.request_iteration("a") == 2 * RUNG


def test_a_stop_frees_a_trial_the_scheduler_held():
    study = Study(ScriptedHost({("a", RUNG): PAUSE, ("b", RUNG): STOP}))
    held, stopped = study.admit("a"), study.admit("b")
    study.result(held, RUNG)
    study.host.to_resume = [("a", None)]  # what a synchronous scheduler chooses once b is stopped
    study.result(stopped, RUNG)
    assert (held.status, stopped.status) == (RUNNING, TERMINATED)
    assert study.request_iteration("a") == 2 * RUNG


def test_a_trial_waits_for_a_worker_until_a_batch_trains_its_path():
    """What a searcher's pending-trial limit counts (Tune's pending trials):
    admitted trials without a result that no running batch trains towards,
    the trial forking from another's running stage included."""
    study = Study()
    study.admit("a", {"lr": MultiStep(0.1, [6], 0.1)})
    study.admit("b", {"lr": MultiStep(0.1, [2], 0.1)})  # shares a's first 2 iterations, then forks
    assert study.lifecycle.waiting() == {"a", "b"}
    (batch,) = CriticalPathPolicy().select(study.plan, 1)
    assert study.lifecycle.waiting() == set(), "one is dispatched, the other waits for the prefix it trains"
    study.admit("c", {"lr": 0.5})
    assert study.lifecycle.waiting() == {"c"}
    study.plan.release_batch(batch.batch_id)
    assert study.lifecycle.waiting() == {"a", "b", "c"}
    a = study.lifecycle.trials["a"]
    study.result(a, RUNG)
    assert study.lifecycle.waiting() == {"b", "c"}, "a trial with a result is running, as under Tune"


def test_a_study_holds_at_most_max_live_trials_whatever_its_source(monkeypatch):
    """A grid of 100,000 has no pending limit (the plan merges what it holds)
    but is held MAX_LIVE_TRIALS at a time; max_concurrent_trials bounds below it."""
    monkeypatch.setattr(lifecycle_module, "MAX_LIVE_TRIALS", 3)
    study = Study()
    for name in "abc":
        assert not study.lifecycle.full(None)
        study.admit(name, {"lr": float(ord(name))})
    assert study.lifecycle.full(None) and study.lifecycle.full(5)
    assert study.lifecycle.full(2) and not Study().lifecycle.full(2)
    study.lifecycle.stop(study.lifecycle.trials["a"])
    assert not study.lifecycle.full(None), "an ended trial makes room for the next"


def test_a_pending_limit_bounds_the_trials_riding_on_a_running_prefix_too():
    """Under a pending-trial limit the source waits once the limit's trials
    wait for a worker, or once the workers plus the limit are live: trials
    forking from a running batch's prefix wait for no worker yet, but each
    needs one after its fork (an endless source of them was admitted without
    end while the prefix trained)."""
    study = Study()
    study.admit("a", {"lr": MultiStep(0.1, [6], 0.01)})
    CriticalPathPolicy().select(study.plan, 1)
    for name, decay in (("b", 0.02), ("c", 0.03)):
        assert not study.lifecycle.pending_full(1, workers=2)
        study.admit(name, {"lr": MultiStep(0.1, [6], decay)})  # forks from a's running prefix at 6
    assert study.lifecycle.waiting() == set() and study.lifecycle.live() == 3
    assert study.lifecycle.pending_full(1, workers=2), "2 workers + 1 pending are live"
    assert not study.lifecycle.pending_full(None, workers=2), "no limit (grid and random variants)"
    study.admit("d", {"lr": 0.5})
    assert study.lifecycle.pending_full(2, workers=4) is False and study.lifecycle.pending_full(1, workers=4)
