"""Data-parallel stages: trials trained by a group of 2 ranks (gloo on CPU,
half a CPU each), sharing stages as trials on one worker do."""

import os
import subprocess
import sys
import textwrap

import pytest
from data_parallel_trainables import ddp_regression, unsharded_batches
from ray import tune
from ray.train import ScalingConfig

from ray_stagetree import MultiStep, Tuner, Values

HORIZON = 4
BATCH_SIZES = Values([8, 8, 6, 6])  # the global batch; it changes mid-trial, after the shared prefix
TWO_RANKS = ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5})
LRS = [MultiStep(0.1, [2], 0.5), MultiStep(0.1, [2], 0.1)]  # equal for iterations [0, 2): shared


def _fit(tmp_path, name, lrs, scaling=TWO_RANKS, **options):
    return Tuner(
        ddp_regression,
        param_space={"lr": tune.grid_search(lrs), "batch_size": BATCH_SIZES, **options.pop("config", {})},
        run_config=tune.RunConfig(
            name=name,
            stop={"training_iteration": HORIZON},
            storage_path=str(tmp_path),
            verbose=0,
            failure_config=tune.FailureConfig(max_failures=options.pop("max_failures", 0)),
        ),
        scaling_config=scaling,
        **options,
    ).fit()


def _history(result):
    frame = result.metrics_dataframe.drop_duplicates("training_iteration", keep="last")
    return frame[["training_iteration", "loss", "seen", "draws", "world_size"]].to_dict("records")


#: Ranks of 0.75 CPU on the tests' 2-CPU cluster: two ranks fit, so one group of two does, not two groups.
ONE_GROUP = ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.75})


@pytest.fixture(scope="module")
def merged_and_alone(ray_session, tmp_path_factory):
    """Two trials sharing iterations [0, 2) on the one group the cluster
    places, and the second trained alone (with ranks of half a CPU)."""
    tmp_path = tmp_path_factory.mktemp("data_parallel")
    merged = _fit(tmp_path, "merged", LRS, scaling=ONE_GROUP)
    alone = _fit(tmp_path, "alone", LRS[1:])
    return merged, alone


def test_a_merged_trial_reports_what_it_reports_trained_alone(merged_and_alone):
    merged, alone = merged_and_alone
    assert all(result.error is None for result in [*merged, *alone])
    assert merged.iterations_executed < sum(len(_history(result)) for result in merged), "the trials share stages"
    shared = next(result for result in merged if result.config["lr"] == LRS[1])
    history = _history(shared)
    assert [row["world_size"] for row in history] == [2] * HORIZON
    assert history == _history(alone[0])  # losses, every rank's samples and random draws, exactly


def test_the_sharded_loader_covers_the_samples_of_an_unsharded_one(merged_and_alone):
    """The global batch size changes at iteration 2 (a sequence), after a
    checkpoint the ranks resume from: the two ranks together still train on
    exactly the samples one unsharded loader hands out."""
    merged, _ = merged_and_alone
    expected = unsharded_batches([int(BATCH_SIZES.value(i)) for i in range(HORIZON)])
    for result in merged:
        assert [row["seen"] for row in _history(result)] == expected


def test_a_rank_killed_mid_stage_retries_and_ends_identical(merged_and_alone, tmp_path):
    """Rank 1's process dies at iteration 3 once: the batch fails as a dead
    worker's does, the trial retries on a fresh group, and it reports what
    the trial trained without a failure reports."""
    _, alone = merged_and_alone
    flag = str(tmp_path / "died")
    retried = _fit(tmp_path, "killed", LRS[1:], config={"die_at": (flag, 3)}, max_failures=1)
    assert os.path.exists(flag), "rank 1 died"
    assert retried[0].error is None
    assert _history(retried[0]) == _history(alone[0])


def test_groups_are_admitted_only_where_the_cluster_places_them_whole(merged_and_alone):
    """Counted per rank, 0.75-CPU ranks would make two groups on 2 CPUs, and
    the second group's placement group would wait forever: the merged
    study's trials all ran, on its one group."""
    merged, _ = merged_and_alone
    assert all(result.error is None for result in merged)
    assert len({row for result in merged for row in result.metrics_dataframe["pid"]}) == 1


TORCH_TRAINER_SCRIPT = """
import json, sys, tempfile
import ray
from ray import train, tune
from ray.train import ScalingConfig
from ray.train.torch import TorchTrainer
import ray_stagetree
from ray_stagetree import MultiStep, get_hparams

ray.init(address="local", num_cpus=2, include_dashboard=False)  # its own, whatever else runs here

def train_loop_per_worker(config):
    import os
    import torch.distributed as dist
    context = train.get_context()
    checkpoint = train.get_checkpoint()  # stages forked from a shared one start from it
    if checkpoint:
        with checkpoint.as_directory() as path:
            json.load(open(os.path.join(path, "state.json")))
    for _ in range(10):
        lr = get_hparams()["lr"]
        with tempfile.TemporaryDirectory() as path:
            json.dump({"lr": lr}, open(os.path.join(path, "state.json"), "w"))
            saved = train.Checkpoint.from_directory(path) if context.get_world_rank() == 0 else None
            train.report({"lr": lr, "scale": config["scale"], "world": context.get_world_size(),
                          "initialized": dist.is_initialized()}, checkpoint=saved)

trainer = TorchTrainer(train_loop_per_worker, train_loop_config={"scale": 2},
                       scaling_config=ScalingConfig(num_workers=2, resources_per_worker={"CPU": 0.5}))
grid = ray_stagetree.Tuner(
    trainer,
    param_space={"train_loop_config": {"lr": tune.grid_search([MultiStep(0.1, [2], 0.5), MultiStep(0.1, [2], 0.1)])}},
    run_config=tune.RunConfig(stop={"training_iteration": 3}, storage_path=tempfile.mkdtemp(), verbose=0),
).fit()
print(json.dumps({
    "executed": grid.iterations_executed,
    "reported": sum(len(result.metrics_dataframe) for result in grid),
    "last": sorted([round(r.metrics["lr"], 9), r.metrics["scale"], r.metrics["world"], r.metrics["initialized"]] for r in grid),
    "errors": [str(r.error) for r in grid if r.error],
}))
"""


@pytest.mark.release
@pytest.mark.long
def test_tuner_of_a_torch_trainer_shares_prefixes_on_the_legacy_engine(tmp_path):
    """``Tuner(TorchTrainer(loop, scaling_config=...), param_space={"train_loop_config": ...})``
    with sequences runs on data-parallel stages (RAY_TRAIN_V2_ENABLED=0,
    read when Ray Train is imported: a process of its own)."""
    import json

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["RAY_TRAIN_V2_ENABLED"] = "0"
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [os.getcwd(), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(TORCH_TRAINER_SCRIPT)],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = json.loads(result.stdout.strip().splitlines()[-1])
    assert summary["errors"] == []
    assert summary["reported"] == 6 and summary["executed"] < 6, "the trials share iterations [0, 2)"
    assert summary["last"] == [[0.01, 2, 2, True], [0.05, 2, 2, True]]
