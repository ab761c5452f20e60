"""PB2 and PBT replay hosted on the plan, written from Ray's docs.

PB2 (``ray.tune.schedulers.pb2.PB2``): PBT whose explore picks the values by
a GP-bandit over each trial's reward gain per interval, within
``hyperparam_bounds``. ``PopulationBasedTrainingReplay`` replays the policy
file a PBT run logs (``log_config=True``, the default): one trial, its config
changed at each recorded iteration. Here the replay is the trial's
sequences, and the replayed trial shares nothing it need not retrain.
"""

import json
import math
import os
import tempfile

import pytest
from ray import tune
from ray.tune.schedulers import PopulationBasedTrainingReplay
from ray.tune.schedulers.pb2 import PB2

from ray_stagetree import Concat, Constant, Tuner
from ray_stagetree.planning.decisions import Exploit
from ray_stagetree.trial_schedulers.host import SchedulerHost
from ray_stagetree.trial_schedulers.replay import replayed

BOUNDS = {"lr": [0.0001, 0.02]}


def pbt_function(config):
    """Ray's pbt_function shape: ``config["lr"]`` read as a number, the
    accuracy gaining most at lr == 0.01, a checkpoint every iteration."""
    lr, accuracy, step = config["lr"], 0.0, 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder, open(os.path.join(folder, "state.json")) as file:
            accuracy, step = json.load(file)
    while True:
        step += 1
        accuracy += min(lr, 0.01) / max(lr, 0.01)
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "state.json"), "w") as file:
                json.dump([accuracy, step], file)
            tune.report({"mean_accuracy": accuracy, "cur_lr": lr}, checkpoint=tune.Checkpoint.from_directory(folder))


def test_pb2_explores_within_its_bounds_from_the_data_it_recorded():
    """Ray's PB2 object records every trial's values and score at each
    perturbation point and picks the explored value by its GP-bandit."""
    pb2 = PB2(time_attr="training_iteration", perturbation_interval=2, hyperparam_bounds=BOUNDS)
    host = SchedulerHost(pb2, "score", "max", horizon=8, on_stop=lambda trial_id: None)
    configs = {f"t{index}": {} for index in range(4)}
    for trial_id, config in configs.items():
        host.on_add(trial_id, config)
        assert BOUNDS["lr"][0] <= config["lr"] <= BOUNDS["lr"][1]  # sampled within the bounds, as Ray's
    exploits = {}
    for iteration in (1, 2, 3, 4):
        for index, (trial_id, config) in enumerate(configs.items()):
            row = {"training_iteration": iteration, "score": index * iteration}
            decision = host.on_result(trial_id, row, {"lr": config["lr"]})
            if isinstance(decision, Exploit):
                exploits[trial_id] = decision
    assert len(pb2.data) == 4 * 2  # Ray's own bookkeeping: a row per trial per perturbation point
    assert set(pb2.data.columns) >= {"Trial", "Time", "lr", "Reward"}
    assert set(exploits) == {"t0"}  # the bottom quantile of four: one trial
    exploit = exploits["t0"]
    assert exploit.source == "t3" and exploit.iteration in (2, 4)
    assert BOUNDS["lr"][0] <= exploit.values["lr"] <= BOUNDS["lr"][1]


def test_a_replayed_policy_is_the_trials_sequences():
    """Ray's replay starts from the policy's first config and changes it once
    the trial reported each recorded iteration: a value that changes becomes a
    Concat of constants switching there; one that never changes stays as it is."""
    first = {"lr": 0.1, "model": {"width": 8, "act": "relu"}, "batch": 32}
    policy = [(4, {**first, "lr": 0.01, "model": {"width": 8, "act": "tanh"}}), (9, {**first, "lr": 0.001})]
    schedule = replayed(first, policy)
    assert schedule["batch"] == 32 and schedule["model"]["width"] == 8
    assert schedule["lr"] == Concat([Constant(0.1), Constant(0.01), Constant(0.001)], [4, 9])
    assert [schedule["lr"].value(index) for index in (3, 4, 8, 9)] == [0.1, 0.01, 0.01, 0.001]
    # a value the last change sets back is a change too
    assert schedule["model"]["act"] == Concat([Constant("relu"), Constant("tanh"), Constant("relu")], [4, 9])


def test_a_pb2_study_logs_its_policy_and_the_replay_follows_it(ray_session, tmp_path):
    """A PB2 study of Ray's pbt_function shape writes Ray's policy files; Ray's
    PopulationBasedTrainingReplay of an exploited trial's file then trains
    one trial whose learning rate changes where the policy says."""
    pb2 = PB2(time_attr="training_iteration", perturbation_interval=3, hyperparam_bounds=BOUNDS, synch=True)
    results = Tuner(
        pbt_function,
        param_space={"lr": tune.grid_search([0.0003, 0.001, 0.01, 0.02]), "units": 3},
        tune_config=tune.TuneConfig(scheduler=pb2, metric="mean_accuracy", mode="max"),
        run_config=tune.RunConfig(name="pb2", storage_path=str(tmp_path), stop={"training_iteration": 9}, verbose=0),
    ).fit()
    assert not results.errors
    # The user's object holds the study's state after fit(), as under Tune.
    assert len(pb2.data) >= 4 and pb2.metric == "mean_accuracy"
    experiment = tmp_path / "pb2"
    logged = [json.loads(line) for line in (experiment / "pbt_global.txt").read_text().splitlines()]
    assert logged, "synchronous PB2 exploits the bottom quantile at each perturbation point"
    # Ray's rows name the trials by their tags as added; an exploited trial's tag (in its last result) appends
    # its explored values, as Ray's PBT sets it.
    tags = {result.metrics["experiment_tag"].split("@perturbed[")[0]: result for result in results}
    for trial_tag, source_tag, trial_iteration, source_iteration, source_config, new_config in logged:
        assert {trial_tag, source_tag} <= tags.keys() and trial_iteration in (3, 6) and source_iteration in (3, 6)
        assert source_config["units"] == new_config["units"] == 3
        assert BOUNDS["lr"][0] <= new_config["lr"] <= BOUNDS["lr"][1]
    exploited = logged[-1][0]
    trial = tags[exploited]
    assert trial.metrics["experiment_tag"] == f"{exploited}@perturbed[lr={trial.config['lr']:.4f}]"
    policy_file = experiment / f"pbt_policy_{trial.metrics['trial_id']}.txt"
    last = json.loads(policy_file.read_text().splitlines()[-1])
    changed_at, replayed_lr = last[3], last[5]["lr"]

    replay = Tuner(
        pbt_function,
        tune_config=tune.TuneConfig(scheduler=PopulationBasedTrainingReplay(str(policy_file))),
        run_config=tune.RunConfig(name="replay", storage_path=str(tmp_path), stop={"training_iteration": 9}, verbose=0),
    ).fit()
    rows = replay[0].metrics_dataframe.set_index("training_iteration")
    assert len(replay) == 1 and len(rows) == 9
    assert all(math.isclose(lr, replayed_lr) for lr in rows.loc[changed_at + 1 :, "cur_lr"])
    assert not math.isclose(rows.loc[changed_at, "cur_lr"], replayed_lr)


def test_a_replay_takes_one_trial_as_rays_does(ray_session, tmp_path):
    policy_file = tmp_path / "pbt_policy_a.txt"
    policy_file.write_text(json.dumps(["0_lr=0.1", "1_lr=0.2", 2, 2, {"lr": 0.1}, {"lr": 0.05}]) + "\n")
    with pytest.raises(Exception, match="More than one trial added to PBT replay run"):
        Tuner(
            pbt_function,
            tune_config=tune.TuneConfig(scheduler=PopulationBasedTrainingReplay(str(policy_file)), num_samples=2),
            run_config=tune.RunConfig(storage_path=str(tmp_path), stop={"training_iteration": 3}, verbose=0),
        ).fit()
