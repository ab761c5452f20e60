"""Time-sharing on the Ray runtime: trials outnumber the one worker, batches
are pre-empted at quantum ends and resumed from their checkpoints."""

import time

import pytest
from ray import tune
from ray.tune.schedulers import ASHAScheduler
from trainables_for_tests import noisy_descent

from ray_stagetree import HermesPolicy, MultiStep, RoundRobinPolicy, Tuner, get_hparams, report

# Two roots of two trials each, sharing 8 iterations: 2 x 8 + 4 x 12 unique iterations.
SPACE = {
    "lr": tune.grid_search([MultiStep(base, [8], gamma) for base in (0.05, 0.1) for gamma in (0.5, 0.1)]),
    # Long enough that a trial's own 12 iterations (1.8 s) span several report
    # flushes (FLUSH_SECONDS), where a batch past its quantum is pre-empted: at
    # 0.05 s they spanned one, and a full suite's load once let every batch end
    # before it.
    "sleep": 0.15,
}
HORIZON = 20


class ResultOrder(tune.Callback):
    def __init__(self):
        self.order = []

    def on_trial_result(self, iteration, trials, trial, result, **info):
        if result["training_iteration"] > 8:  # past the shared prefixes, whose results fan out to two trials
            self.order.append(trial.trial_id)


def _fit(tmp_path, name, policy, callbacks=(), **tune_config):
    return Tuner(
        tune.with_resources(noisy_descent, {"cpu": 2}),  # one worker on the session's 2 CPUs
        param_space=SPACE,
        tune_config=tune.TuneConfig(metric="loss", mode="min", **tune_config),
        run_config=tune.RunConfig(
            storage_path=str(tmp_path),
            name=name,
            stop={"training_iteration": HORIZON},
            callbacks=list(callbacks),
            verbose=0,
        ),
        execution_policy=policy,
    ).fit()


def _losses(grid):
    return {str(r.config["lr"]): list(r.metrics_dataframe["loss"]) for r in grid}


def test_preempted_trials_resume_from_their_checkpoint_and_report_what_they_report_uninterrupted(tmp_path, ray_session):
    orders = ResultOrder(), ResultOrder()
    shared = _fit(tmp_path, "rr", RoundRobinPolicy(quantum_s=0.6), [orders[0]])
    alone = _fit(tmp_path, "cp", "critical_path", [orders[1]])
    assert _losses(shared) == _losses(alone)
    assert all(len(losses) == HORIZON for losses in _losses(shared).values())
    # Pre-empted: on the one worker, a trial's own iterations alternate with others' ...
    switches = [sum(1 for a, b in zip(o.order, o.order[1:]) if a != b) for o in orders]
    assert switches[0] > switches[1] == 3, switches  # uninterrupted: the 4 trials one after another
    # ... yet each shared prefix trained once, nothing was trained twice.
    assert shared.iterations_executed == alone.iterations_executed == 2 * 8 + 4 * 12


def test_convergence_priority_composes_with_asha(tmp_path, ray_session):
    grid = _fit(
        tmp_path,
        "asha",
        HermesPolicy(quantum_s=0.15),
        scheduler=ASHAScheduler(max_t=HORIZON, grace_period=4, reduction_factor=2),
    )
    iterations = sorted(len(r.metrics_dataframe) for r in grid)
    assert iterations[-1] == HORIZON and iterations[0] < HORIZON  # ASHA stopped some, one trained to the end
    assert grid.iterations_executed <= sum(iterations)


def no_checkpoints(config):
    loss = 1.0
    while True:
        time.sleep(0.1)  # workers report every 0.5 s: the policy hears of a quantum's end mid-trial
        loss *= 1 - get_hparams()["lr"]
        report({"loss": loss})


def test_a_trainable_without_checkpoints_is_not_preempted_into_retraining(tmp_path, ray_session):
    grid = Tuner(
        tune.with_resources(no_checkpoints, {"cpu": 2}),
        param_space={"lr": tune.grid_search([0.1, 0.2, 0.3])},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(storage_path=str(tmp_path), name="plain", stop={"training_iteration": 10}, verbose=0),
        execution_policy=RoundRobinPolicy(quantum_s=0.05),
    ).fit()
    # Pre-empting it would retrain from scratch, again and again (each quantum ends before the trial does):
    # the batch asked to stop goes on instead, and the study stops time-sharing.
    assert grid.iterations_executed == 30
    assert [len(r.metrics_dataframe) for r in grid] == [10, 10, 10]


def test_a_loss_priority_without_a_metric_is_refused_by_name():
    refused = r"execution_policy=HermesPolicy.*ranks trials by their loss: set TuneConfig\(metric"
    with pytest.raises(ValueError, match=refused):
        Tuner(noisy_descent, param_space=SPACE, execution_policy="hermes")
    with pytest.raises(ValueError, match=r"execution_policy must be an ExecutionPolicy or one of \[.*'hermes'"):
        Tuner(noisy_descent, param_space=SPACE, execution_policy="convergence")
