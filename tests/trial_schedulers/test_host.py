"""Hosted Tune schedulers decide exactly as Ray's own on the same results."""

import random

import numpy as np
import pytest
from ray import tune
from ray.tune.schedulers import (
    ASHAScheduler,
    FIFOScheduler,
    HyperBandScheduler,
    MedianStoppingRule,
    PopulationBasedTraining,
    TrialScheduler,
)

from ray_stagetree.trial_schedulers.host import SchedulerHost
from ray_stagetree.trial_schedulers.tune_fed import TrialProxy

HORIZON = 16


def recorded_stream(trials=12, seed=0):
    """Interleaved (trial, iteration, loss) results, as a study produces them."""
    rnd = random.Random(seed)
    quality = {f"t{i}": rnd.random() for i in range(trials)}
    progress = {trial: 0 for trial in quality}
    stream = []
    while any(step < HORIZON for step in progress.values()):
        trial = rnd.choice([t for t, step in progress.items() if step < HORIZON])
        progress[trial] += 1
        stream.append((trial, progress[trial], quality[trial] / progress[trial] + rnd.random() * 0.05))
    return stream


def decisions_by_ray(scheduler, stream):
    """Ray's scheduler fed directly, as TuneController feeds it."""
    trials, stopped, out = {}, set(), []
    for trial_id, step, loss in stream:
        if trial_id in stopped:
            continue
        if trial_id not in trials:
            trials[trial_id] = TrialProxy(trial_id, {})
            scheduler.on_trial_add(None, trials[trial_id])
        decision = scheduler.on_trial_result(None, trials[trial_id], {"training_iteration": step, "loss": loss})
        out.append((trial_id, step, decision))
        if decision == TrialScheduler.STOP:
            stopped.add(trial_id)
    return out


def decisions_hosted(scheduler, stream):
    host = SchedulerHost(scheduler, "loss", "min", HORIZON)
    added, stopped, out = set(), set(), []
    for trial_id, step, loss in stream:
        if trial_id in stopped:
            continue
        if trial_id not in added:
            added.add(trial_id)
            host.on_add(trial_id, {})
        decision = host.on_result(trial_id, {"training_iteration": step, "loss": loss})
        out.append((trial_id, step, decision))
        if decision == TrialScheduler.STOP:
            stopped.add(trial_id)
    return out


@pytest.mark.parametrize(
    "make",
    [
        lambda: ASHAScheduler(metric="loss", mode="min", max_t=HORIZON, grace_period=1, reduction_factor=2),
        lambda: ASHAScheduler(metric="loss", mode="min", max_t=HORIZON, grace_period=2, reduction_factor=3, brackets=3),
        lambda: MedianStoppingRule(metric="loss", mode="min", grace_period=3, min_samples_required=3),
        lambda: FIFOScheduler(),
    ],
    ids=["asha", "asha-3-brackets", "median", "fifo"],
)
def test_same_decisions_as_rays_own_scheduler(make):
    stream = recorded_stream()
    np.random.seed(1)
    expected = decisions_by_ray(make(), stream)
    np.random.seed(1)
    assert decisions_hosted(make(), stream) == expected
    if "STOP" in {d for _, _, d in expected}:
        assert sum(d == "STOP" for _, _, d in expected) >= 1


def test_requests_are_sized_to_the_next_asha_rung():
    host = SchedulerHost(ASHAScheduler(max_t=HORIZON, grace_period=1, reduction_factor=2), "loss", "min", HORIZON)
    host.on_add("t", {})
    assert [host.next_decision("t", step) for step in (0, 1, 3, 4, 8, 15)] == [1, 2, 4, 8, 16, 16]
    fifo = SchedulerHost(None, None, None, HORIZON)
    fifo.on_add("t", {})
    assert fifo.next_decision("t", 0) == HORIZON


def test_schedulers_without_a_metric_are_rejected_before_the_study_starts():
    with pytest.raises(ValueError, match="AsyncHyperBandScheduler needs a metric"):
        SchedulerHost(ASHAScheduler(), None, None, HORIZON)
    with pytest.raises(ValueError, match=r"PopulationBasedTraining needs a mode \('min' or 'max'\)"):
        SchedulerHost(PopulationBasedTraining(hyperparam_mutations={"lr": [0.1]}), "loss", None, HORIZON)
    SchedulerHost(FIFOScheduler(), None, None, HORIZON)


def test_pbt_samples_the_mutated_hyperparameters_a_config_lacks_as_ray_does():
    host = SchedulerHost(pbt(), "loss", "min", HORIZON)
    config = {"lr": 0.1}
    host.on_add("t", config)
    assert config["lr"] == 0.1 and 0.8 <= config["momentum"] <= 0.99


def pbt(**overrides):
    settings = dict(
        time_attr="training_iteration",
        perturbation_interval=2,
        hyperparam_mutations={"lr": [0.05, 0.1, 0.2, 0.4], "momentum": tune.uniform(0.8, 0.99)},
        quantile_fraction=0.25,
        log_config=False,
    )
    return PopulationBasedTraining(**{**settings, **overrides}, metric="loss", mode="min")


def test_pbt_requests_end_at_perturbation_points():
    host = SchedulerHost(pbt(perturbation_interval=4, burn_in_period=6), "loss", "min", HORIZON)
    host.on_add("a", {})
    assert [host.next_decision("a", step) for step in (0, 3)] == [6, 6], "Ray perturbs first after the burn-in"
    host.on_result("a", {"training_iteration": 6, "loss": 1.0}, {"lr": 0.1})
    assert [host.next_decision("a", step) for step in (6, 9, 14)] == [10, 10, 15]
    assert host.next_decision("a", 15) == HORIZON


def pbt_stream(trials=6, steps=12, seed=0):
    rnd = random.Random(seed)
    quality = {f"t{i}": 0.5 + rnd.random() for i in range(trials)}
    return [(t, step, quality[t] / step + rnd.random() * 0.01) for step in range(1, steps + 1) for t in quality]


def exploits_by_ray(stream, seed):
    """Ray's PBT object on the stream, with the controller calls it makes."""
    from unittest import mock

    scheduler = pbt()
    controller = mock.MagicMock(search_alg=None)
    trials, out, current = {}, [], {}

    def set_config(config, trial):
        current["config"] = (trial, config)
        trial.config = config

    for trial_id in dict.fromkeys(t for t, _, _ in stream):
        trial = mock.MagicMock(trial_id=trial_id, status="RUNNING", config={"lr": 0.1, "momentum": 0.9})
        trial.experiment_tag = f"{trial_id}_tag"
        trial.set_experiment_tag.side_effect = lambda tag, trial=trial: setattr(trial, "experiment_tag", tag)
        trial.is_finished.return_value = False
        trial.temporary_state.saving_to = None
        trial.run_metadata.checkpoint_manager.checkpoint_config.num_to_keep = None
        trial.set_config.side_effect = lambda config, trial=trial: set_config(config, trial)
        trials[trial_id] = trial
        scheduler.on_trial_add(controller, trial)
    controller.get_trials.return_value = list(trials.values())
    controller._schedule_trial_save.side_effect = lambda trial, result: f"checkpoint of {trial.trial_id}"
    random.seed(seed)
    np.random.seed(seed)
    for trial_id, step, loss in stream:
        trial = trials[trial_id]
        current.clear()
        scheduler.on_trial_result(controller, trial, {"training_iteration": step, "loss": loss})
        if current:
            cloned = trial.run_metadata.checkpoint_manager._latest_checkpoint_result.checkpoint
            source = cloned.removeprefix("checkpoint of ")
            momentum = round(trial.config["momentum"], 12)
            out.append((trial_id, step, source, trial.config["lr"], momentum, trial.experiment_tag))
    return out


def exploits_hosted(stream, seed, log=None):
    """``log``: a list that gets the adapter's log lines."""
    host = SchedulerHost(pbt(), "loss", "min", HORIZON)
    values = {}
    for trial_id in dict.fromkeys(t for t, _, _ in stream):
        host.on_add(trial_id, {})
        values[trial_id] = {"lr": 0.1, "momentum": 0.9}
    random.seed(seed)
    np.random.seed(seed)
    out = []
    for trial_id, step, loss in stream:
        decision = host.on_result(trial_id, {"training_iteration": step, "loss": loss}, values[trial_id])
        if log is not None:
            log.extend(host.population.take_log())
        if decision != "CONTINUE":
            values[trial_id] = {**values[decision.source], **decision.values}
            momentum, tag = round(decision.values["momentum"], 12), f"{trial_id}_tag{decision.perturbed}"
            out.append((trial_id, step, decision.source, decision.values["lr"], momentum, tag))
    return out


@pytest.mark.parametrize("seed", [0, 1, 3, 4])
def test_pbt_exploits_and_explores_as_rays_own(seed):
    stream = pbt_stream(seed=seed)
    expected = exploits_by_ray(stream, seed)
    assert expected, "the stream makes PBT exploit"
    assert exploits_hosted(stream, seed) == expected


def test_pbt_logs_its_exploits_as_rays_own():
    """The driver logs the adapter's lines where Ray's PBT logs them."""
    import logging

    class Kept(logging.Handler):
        def __init__(self):
            super().__init__(logging.INFO)
            self.lines = []

        def emit(self, record):
            self.lines.append(record.getMessage())

    stream, kept, ray_log = pbt_stream(seed=0), Kept(), logging.getLogger("ray.tune.schedulers.pbt")
    level = ray_log.level
    ray_log.addHandler(kept)
    ray_log.setLevel(logging.INFO)  # Ray's loggers do not propagate: pytest's caplog never hears them
    try:
        exploits_by_ray(stream, 0)
    finally:
        ray_log.removeHandler(kept)
        ray_log.setLevel(level)
    expected = [line for line in kept.lines if "[Exploit]" in line or "[Explore]" in line]
    log = []
    exploits_hosted(stream, 0, log)
    assert expected and log == expected


def shared_workers_by_ray(trial_ids, slots, seed):
    """Ray's asynchronous PBT with more trials than ``slots``: TuneController
    runs the first ``slots``, the others wait (PENDING), and a freed place
    goes to `choose_trial_to_run`'s trial. Each running trial steps in turn;
    the log is every step trained and every exploit."""
    from unittest import mock

    scheduler = pbt(perturbation_interval=4)
    controller = mock.MagicMock(search_alg=None)
    trials = {}
    for index, trial_id in enumerate(trial_ids):
        trial = mock.MagicMock(trial_id=trial_id, status="RUNNING" if index < slots else "PENDING")
        trial.config = {"lr": 0.1, "momentum": 0.9}
        trial.is_finished.return_value = False
        trial.temporary_state.saving_to = None
        trial.run_metadata.checkpoint_manager.checkpoint_config.num_to_keep = None
        trial.set_config.side_effect = lambda config, trial=trial: setattr(trial, "config", config)
        trials[trial_id] = trial
        scheduler.on_trial_add(controller, trial)
    controller.get_trials.return_value = list(trials.values())
    controller._schedule_trial_save.side_effect = lambda trial, result: f"checkpoint of {trial.trial_id}"
    controller.pause_trial.side_effect = lambda trial, should_checkpoint=True: setattr(trial, "status", "PAUSED")
    random.seed(seed)
    np.random.seed(seed)
    steps, log, exploited = dict.fromkeys(trial_ids, 0), [], {}
    while running := [t for t in trial_ids if trials[t].status == "RUNNING"]:
        trial_id = min(running, key=lambda t: steps[t])
        trial, config = trials[trial_id], trials[trial_id].config
        steps[trial_id] += 1
        result = {"training_iteration": steps[trial_id], "loss": loss_of(trial_id, steps[trial_id])}
        log.append((trial_id, steps[trial_id]))
        if steps[trial_id] == HORIZON:  # Tune's stop criterion: the scheduler is not asked
            scheduler.on_trial_complete(controller, trial, result)
            trial.status = "TERMINATED"
        elif scheduler.on_trial_result(controller, trial, result) == TrialScheduler.PAUSE:
            trial.status = "PAUSED"
        if trial.config is not config:  # exploited (and paused): it goes on from the source's checkpoint
            steps[trial_id] = int(scheduler._trial_state[trial].last_train_time)
            exploited[trial_id] = ("exploit", trial_id, steps[trial_id], trial.config["lr"])
        while sum(t.status == "RUNNING" for t in trials.values()) < slots:
            chosen = scheduler.choose_trial_to_run(controller)
            if chosen is None:
                break
            chosen.status = "RUNNING"
            if chosen.trial_id in exploited:
                log.append(exploited.pop(chosen.trial_id))
    return log


def shared_workers_hosted(trial_ids, slots, seed):
    host = SchedulerHost(pbt(perturbation_interval=4), "loss", "min", HORIZON)
    statuses, values = {}, {}
    for index, trial_id in enumerate(trial_ids):
        host.on_add(trial_id, {})
        statuses[trial_id] = "RUNNING" if index < slots else "PENDING"
        values[trial_id] = {"lr": 0.1, "momentum": 0.9}
    random.seed(seed)
    np.random.seed(seed)
    steps, log = dict.fromkeys(trial_ids, 0), []

    def resume(trial_id, exploit):
        statuses[trial_id] = "RUNNING"
        if exploit is not None:
            values[trial_id] = {**values[exploit.source], **exploit.values}
            steps[trial_id] = exploit.iteration
            log.append(("exploit", trial_id, steps[trial_id], values[trial_id]["lr"]))

    while running := [t for t in trial_ids if statuses[t] == "RUNNING"]:
        trial_id = min(running, key=lambda t: steps[t])
        steps[trial_id] += 1
        row = {"training_iteration": steps[trial_id], "loss": loss_of(trial_id, steps[trial_id])}
        log.append((trial_id, steps[trial_id]))
        if steps[trial_id] == HORIZON:
            host.on_complete(trial_id, row)
            statuses[trial_id] = "TERMINATED"
        elif (decision := host.on_result(trial_id, row, values[trial_id])) == TrialScheduler.PAUSE:
            statuses[trial_id] = "PAUSED"
        elif decision != TrialScheduler.CONTINUE:
            resume(trial_id, decision)
        for resumed, exploit in host.resumable():
            resume(resumed, exploit)
        pending = [t for t in trial_ids if statuses[t] == "PENDING"]
        for trial_id in pending[: slots - sum(status == "RUNNING" for status in statuses.values())]:
            statuses[trial_id] = "RUNNING"
    return log


@pytest.mark.parametrize("seed", [0, 1])
def test_asynchronous_pbt_shares_the_workers_among_more_trials_as_rays_own(seed):
    """Six trials on two places: at a perturbation point a trial makes way
    for one that waits, the least trained first, so the whole population
    trains (without it, the first two would train to the end first)."""
    trial_ids = [f"t{i}" for i in range(6)]
    expected = shared_workers_by_ray(trial_ids, slots=2, seed=seed)
    assert any(event[0] == "exploit" for event in expected), "the population exploits"
    first_steps = [event for event in expected if event[0] != "exploit"][:24]
    assert {trial_id for trial_id, _ in first_steps} == set(trial_ids), "every trial trains early on"
    assert shared_workers_hosted(trial_ids, slots=2, seed=seed) == expected


def test_an_exploited_trial_waits_behind_trials_as_trained_as_it():
    """Asynchronous PBT, three trials taking turns: the one exploited at its
    perturbation point takes its source's train time. Ray's tie-break (trial
    order) would run it first again; here it would retrain the same iterations
    from the same checkpoint and random state to the same result, and be
    exploited again forever. It goes behind the trials that waited first."""
    host = SchedulerHost(pbt(perturbation_interval=4), "loss", "min", HORIZON)
    for trial_id in "abc":
        host.on_add(trial_id, {})
    values = {"lr": 0.1, "momentum": 0.9}
    assert [
        host.on_result(t, {"training_iteration": 4, "loss": loss}, values) for t, loss in zip("abc", (3, 2, 1))
    ] == [TrialScheduler.PAUSE] * 3, "each makes way for those that wait"
    assert host.resumable() == [("a", None)], "the least trained, the first to wait among equals"
    assert host.on_result("a", {"training_iteration": 8, "loss": 5}, values) == TrialScheduler.PAUSE
    assert host.resumable() == [("b", None)]
    assert host.resumable() == []
    assert host.on_result("b", {"training_iteration": 8, "loss": 2}, values) == TrialScheduler.PAUSE
    assert host.resumable() == [("c", None)]
    assert host.on_result("c", {"training_iteration": 8, "loss": 1}, values) == TrialScheduler.PAUSE
    (resumed, exploit), *rest = host.resumable()
    assert (resumed, rest, exploit.source, exploit.iteration) == ("a", [], "c", 4), "a resumes, exploited"


def loss_of(trial_id, step):
    return (int(trial_id[1:]) % 7 + 1) / step


class FakeTuneController:
    """What Ray's TuneController does with a scheduler's answers (its
    stop_trial and choose_trial_to_run use), for trials stepping in turn."""

    def __init__(self, scheduler, trial_ids):
        self.scheduler = scheduler
        self.trials = {t: TrialProxy(t, {}, status="RUNNING") for t in trial_ids}
        self.log = []
        for proxy in self.trials.values():
            scheduler.on_trial_add(self, proxy)

    def get_live_trials(self):
        return [t for t in self.trials.values() if t.status == "RUNNING"]

    def stop_trial(self, trial):
        if trial.status in ("PENDING", "PAUSED"):
            self.scheduler.on_trial_remove(self, trial)
        elif trial.status == "RUNNING":
            self.scheduler.on_trial_complete(self, trial, trial.last_result)
        trial.status = "TERMINATED"
        self.log.append(("stop", trial.trial_id))

    def run(self):
        steps = {t: 0 for t in self.trials}
        while True:
            running = [t for t, p in self.trials.items() if p.status == "RUNNING" and steps[t] < HORIZON]
            if not running:
                return self.log
            trial_id = running[0]
            steps[trial_id] += 1
            proxy = self.trials[trial_id]
            proxy.last_result = {"training_iteration": steps[trial_id], "loss": loss_of(trial_id, steps[trial_id])}
            decision = self.scheduler.on_trial_result(self, proxy, proxy.last_result)
            self.log.append((trial_id, steps[trial_id], decision))
            if decision == TrialScheduler.STOP:
                self.stop_trial(proxy)
            elif decision == TrialScheduler.PAUSE:
                proxy.status = "PAUSED"
            elif steps[trial_id] == HORIZON:
                self.stop_trial(proxy)
            while (chosen := self.scheduler.choose_trial_to_run(self)) is not None and chosen.status == "PAUSED":
                chosen.status = "RUNNING"
                self.log.append(("resume", chosen.trial_id))


def hosted_run(scheduler, trial_ids):
    log = []
    statuses = {t: "RUNNING" for t in trial_ids}

    def on_stop(trial_id):
        host.on_complete(trial_id, None)
        statuses[trial_id] = "TERMINATED"
        log.append(("stop", trial_id))

    host = SchedulerHost(scheduler, "loss", "min", HORIZON, on_stop=on_stop)
    for trial_id in trial_ids:
        host.on_add(trial_id, {})
    steps = {t: 0 for t in trial_ids}
    while True:
        running = [t for t in trial_ids if statuses[t] == "RUNNING" and steps[t] < HORIZON]
        if not running:
            return log
        trial_id = running[0]
        steps[trial_id] += 1
        row = {"training_iteration": steps[trial_id], "loss": loss_of(trial_id, steps[trial_id])}
        decision = host.on_result(trial_id, row)
        log.append((trial_id, steps[trial_id], decision))
        if decision == TrialScheduler.STOP or (decision == TrialScheduler.CONTINUE and steps[trial_id] == HORIZON):
            host.on_complete(trial_id, row)
            statuses[trial_id] = "TERMINATED"
            log.append(("stop", trial_id))
        elif decision == TrialScheduler.PAUSE:
            statuses[trial_id] = "PAUSED"
        for resumed, _ in host.resumable():
            statuses[resumed] = "RUNNING"
            log.append(("resume", resumed))


def test_synchronous_hyperband_pauses_stops_and_promotes_as_in_ray():
    trial_ids = [f"t{i}" for i in range(9)]
    make = lambda: HyperBandScheduler(metric="loss", mode="min", max_t=HORIZON, reduction_factor=3)  # noqa: E731
    expected = FakeTuneController(make(), trial_ids).run()
    assert {d for *_, d in expected if d in ("PAUSE", "STOP")} == {"PAUSE", "STOP"}
    assert any(event[0] == "resume" for event in expected)
    assert hosted_run(make(), trial_ids) == expected


def test_hyperband_requests_end_at_the_bracket_milestone():
    host = SchedulerHost(HyperBandScheduler(max_t=HORIZON, reduction_factor=3), "loss", "min", HORIZON)
    for index in range(9):
        host.on_add(f"t{index}", {})
    milestones = {host.next_decision(f"t{index}", 0) for index in range(9)}
    assert HORIZON in milestones, "the first bracket runs its trials to max_t"
    assert min(milestones) < HORIZON, "later brackets halve at earlier milestones"


def synch_loss(trial_id, step, lr):
    """Depends on the trial's current learning rate, so exploits show."""
    return (1 + abs(np.log10(lr) + 1) + int(trial_id[1:]) * 0.01) / step


def synch_pbt_by_ray(trial_ids, seed):
    """Ray's synchronous PBT with the controller calls it makes: trials step
    in turn, pause at perturbation points and resume as it chooses."""
    from unittest import mock

    scheduler = pbt(synch=True, perturbation_interval=4)
    controller = mock.MagicMock(search_alg=None)
    trials, log, exploits = {}, [], []
    for trial_id in trial_ids:
        trial = mock.MagicMock(trial_id=trial_id, status="RUNNING", config={"lr": 0.1, "momentum": 0.9})
        trial.is_finished.side_effect = lambda trial=trial: trial.status == "TERMINATED"
        trial.temporary_state.saving_to = None
        trial.checkpoint = f"checkpoint of {trial_id}"
        trial.run_metadata.checkpoint_manager.checkpoint_config.num_to_keep = None
        trials[trial_id] = trial
        scheduler.on_trial_add(controller, trial)

    def exploit(config, trial):
        exploits.append((trial.trial_id, trial, config["lr"], round(config["momentum"], 12)))
        trial.config = config

    for trial in trials.values():
        trial.set_config.side_effect = lambda config, trial=trial: exploit(config, trial)
    controller.get_trials.return_value = list(trials.values())
    controller.get_live_trials.side_effect = lambda: [t for t in trials.values() if t.status != "TERMINATED"]
    controller._schedule_trial_save.side_effect = lambda trial, result: f"checkpoint of {trial.trial_id}"
    controller.pause_trial.side_effect = lambda trial, should_checkpoint: setattr(trial, "status", "PAUSED")
    random.seed(seed)
    np.random.seed(seed)
    steps = dict.fromkeys(trial_ids, 0)
    while running := [t for t in trial_ids if trials[t].status == "RUNNING"]:
        trial_id = running[0]
        trial = trials[trial_id]
        steps[trial_id] += 1
        if steps[trial_id] == HORIZON:
            trial.status = "TERMINATED"
            scheduler.on_trial_complete(controller, trial, {})
            log.append(("done", trial_id))
        else:
            loss = synch_loss(trial_id, steps[trial_id], trial.config["lr"])
            decision = scheduler.on_trial_result(
                controller, trial, {"training_iteration": steps[trial_id], "loss": loss}
            )
            for index, (exploited, cloned, *values) in enumerate(exploits):
                if not isinstance(cloned, str):  # Ray hands over the checkpoint after the config
                    checkpoint = cloned.run_metadata.checkpoint_manager._latest_checkpoint_result.checkpoint
                    exploits[index] = (exploited, checkpoint, *values)
            if decision in (TrialScheduler.PAUSE, TrialScheduler.NOOP):
                trial.status = "PAUSED"
            log.append((trial_id, steps[trial_id], "PAUSE" if trial.status == "PAUSED" else decision))
        while (chosen := scheduler.choose_trial_to_run(controller)) is not None and chosen.status == "PAUSED":
            chosen.status = "RUNNING"
            log.append(("resume", chosen.trial_id, chosen.config["lr"]))
    return log, sorted(exploits)


def synch_pbt_hosted(trial_ids, seed):
    host = SchedulerHost(pbt(synch=True, perturbation_interval=4), "loss", "min", HORIZON)
    values, statuses, log, exploits = {}, {}, [], []
    for trial_id in trial_ids:
        host.on_add(trial_id, {})
        values[trial_id], statuses[trial_id] = {"lr": 0.1, "momentum": 0.9}, "RUNNING"
    random.seed(seed)
    np.random.seed(seed)
    steps = dict.fromkeys(trial_ids, 0)
    while running := [t for t in trial_ids if statuses[t] == "RUNNING"]:
        trial_id = running[0]
        steps[trial_id] += 1
        if steps[trial_id] == HORIZON:
            statuses[trial_id] = "TERMINATED"
            host.on_complete(trial_id, {})
            log.append(("done", trial_id))
        else:
            row = {
                "training_iteration": steps[trial_id],
                "loss": synch_loss(trial_id, steps[trial_id], values[trial_id]["lr"]),
            }
            decision = host.on_result(trial_id, row, values[trial_id])
            if decision == TrialScheduler.PAUSE:
                statuses[trial_id] = "PAUSED"
            log.append((trial_id, steps[trial_id], decision))
        for resumed, exploit in host.resumable():
            statuses[resumed] = "RUNNING"
            if exploit is not None:
                values[resumed] = {**values[exploit.source], **exploit.values}
                steps[resumed] = exploit.iteration
                exploits.append(
                    (
                        resumed,
                        f"checkpoint of {exploit.source}",
                        exploit.values["lr"],
                        round(exploit.values["momentum"], 12),
                    )
                )
            log.append(("resume", resumed, values[resumed]["lr"]))
    return log, sorted(exploits)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_synchronous_pbt_pauses_ranks_and_exploits_as_rays_own(seed):
    trial_ids = [f"t{i}" for i in range(6)]
    expected_log, expected_exploits = synch_pbt_by_ray(trial_ids, seed)
    assert expected_exploits, "the population exploits"
    assert sum(1 for event in expected_log if event[-1] == "PAUSE") >= 3 * len(trial_ids)
    log, exploits = synch_pbt_hosted(trial_ids, seed)
    assert exploits == expected_exploits
    assert log == expected_log


def test_synchronous_pbt_goes_on_when_the_trial_it_waits_for_ends():
    host = SchedulerHost(pbt(synch=True, perturbation_interval=4), "loss", "min", HORIZON)
    for trial_id in ("a", "b", "c"):
        host.on_add(trial_id, {})
    for trial_id, loss in (("a", 1.0), ("b", 2.0)):
        assert (
            host.on_result(trial_id, {"training_iteration": 4, "loss": loss}, {"lr": 0.1, "momentum": 0.9}) == "PAUSE"
        )
    assert host.resumable() == [], "a and b wait for c at the perturbation point"
    host.on_error("c")
    resumed = dict(host.resumable())
    assert sorted(resumed) == ["a", "b"]
    assert resumed["b"] is not None and resumed["b"].source == "a" and resumed["b"].iteration == 4
    assert host.next_decision("a", 4) == 8
