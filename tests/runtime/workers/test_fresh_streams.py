"""A trial that starts from scratch draws a stream of its own. A stage
worker is a long-lived process, and a stage checkpoint carries the global
generators' states: a trial starting where the worker's last batch ended
would draw the very numbers that batch's trial draws when it resumes from
its checkpoint there, so trials whose progress is driven by noise (Ray's
``pbt_function.py`` under PBT) would replay each other's luck."""

import random

from ray import tune

from ray_stagetree import RoundRobinPolicy, Tuner

ITERATIONS = 8


def noisy(config):
    """Reports a fresh random number each iteration; checkpoints each one."""
    import json
    import os
    import tempfile
    import time

    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as path, open(os.path.join(path, "step.json")) as file:
            start = json.load(file)["step"]
    for step in range(start + 1, ITERATIONS + 1):
        time.sleep(0.1)
        with tempfile.TemporaryDirectory() as path:
            with open(os.path.join(path, "step.json"), "w") as file:
                json.dump({"step": step}, file)
            tune.report({"draw": random.random()}, checkpoint=tune.Checkpoint.from_directory(path))


def test_trials_taking_turns_on_one_worker_never_replay_each_others_numbers(ray_session, tmp_path):
    # Round robin pre-empts each trial at a quantum's end: the next one starts from scratch where the
    # pre-empted one's checkpoint was taken, and that one resumes from it later.
    results = Tuner(
        tune.with_resources(noisy, {"cpu": 2}),
        param_space={"x": tune.grid_search([1, 2, 3])},
        run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0),
        execution_policy=RoundRobinPolicy(quantum_s=0.3),
    ).fit()
    assert results.num_errors == 0
    draws = [result.metrics_dataframe["draw"].tolist() for result in results]
    assert all(len(trial) == ITERATIONS for trial in draws)
    every = [draw for trial in draws for draw in trial]
    assert len(set(every)) == len(every), f"a number drawn twice: {draws}"
