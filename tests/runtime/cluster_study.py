"""A study on a three-node ``ray.cluster_utils.Cluster`` (a head without CPUs,
two worker nodes with one CPU and one fake GPU each). `test_cluster.py` runs
it in a subprocess, so its cluster never meets the test session's Ray.

    python tests/runtime/cluster_study.py WORKDIR

1. Storage that only the driver sees (``memory://``, per process) is refused
   before anything trains.
2. One worker node is removed while a batch runs on it (the trainable blocks
   there until it is gone): with ``FailureConfig(max_failures=...)`` the
   trials of that batch are retried on the other node and the study ends
   with every trial complete.
3. Without retries (``max_failures=0``), the trials of a batch on a removed
   node end in error at once and the others complete.
4. The node is removed while the other node is busy: a worker starts in
   place of the lost one, which Ray cannot place (the lost node is still
   counted for a while); the lost batch's retry does not wait for it but
   for the busy node's worker, and the study ends complete on that node.
"""

import os
import sys
import threading
import time

import ray
from fsspec.implementations.local import LocalFileSystem
from ray import tune
from ray.cluster_utils import Cluster

from ray_stagetree import MultiStep, Tuner

HORIZON = 6
BLOCK_AT = 4


def train(config):
    import json
    import tempfile

    from ray_stagetree import get_checkpoint, get_hparams, get_iteration, report, should_checkpoint

    node = ray.get_runtime_context().get_node_id()
    x = 1.0
    checkpoint = get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as path, open(os.path.join(path, "x.json")) as file:
            x = json.load(file)["x"]
    if config["doomed"]:
        open(os.path.join(config["signals"], f"trained_{node}"), "w").close()
    while True:
        x -= get_hparams()["lr"] * x
        if config["doomed"] and node != config["doomed"] and get_iteration() + 1 == BLOCK_AT - 1:
            # Batches go only to workers Ray has placed: on a loaded machine this node's worker could
            # train every trial before the doomed node's has started. Wait (a while) for it to train too.
            doomed_trained = os.path.join(config["signals"], f"trained_{config['doomed']}")
            deadline = time.monotonic() + 120
            while not os.path.exists(doomed_trained) and time.monotonic() < deadline:
                time.sleep(0.05)
        if node == config["doomed"] and get_iteration() + 1 == BLOCK_AT:
            gamma = round(get_hparams()["lr"] / 0.1, 9)  # past the milestone: lr = 0.1 * gamma
            open(os.path.join(config["signals"], f"blocked_{gamma}"), "w").close()
            time.sleep(600)  # until the node is removed under this worker
        release = os.path.join(config["signals"], "release")
        if config.get("hold") and get_iteration() + 1 == BLOCK_AT and not os.path.exists(release):
            open(os.path.join(config["signals"], "held"), "w").close()
            while not os.path.exists(release):  # the other node stays busy while the node is lost
                time.sleep(0.05)
        metrics = {"x": x, "node": node, "gpus": os.environ.get("CUDA_VISIBLE_DEVICES", "")}
        if should_checkpoint():
            with tempfile.TemporaryDirectory() as path:
                with open(os.path.join(path, "x.json"), "w") as file:
                    json.dump({"x": x}, file)
                report(metrics, checkpoint=tune.Checkpoint.from_directory(path))
        else:
            report(metrics)


class DriverOnlyFileSystem(LocalFileSystem):
    """Local files that only the driver's process can read back: storage
    the other nodes cannot see, as an unshared disk on a real cluster (the
    nodes of a `Cluster` on one machine share its disk)."""

    def __init__(self, driver: int, **kwargs):
        super().__init__(driver=driver, **kwargs)
        self.driver = driver

    def cat_file(self, path, start=None, end=None, **kwargs):
        if os.getpid() != self.driver:
            raise FileNotFoundError(path)
        return super().cat_file(path, start=start, end=end, **kwargs)


def tuner(storage_path, name, doomed="", signals="", max_failures=0, storage_filesystem=None, hold=False):
    return Tuner(
        tune.with_resources(train, {"cpu": 1, "gpu": 1}),
        param_space={
            "lr": tune.grid_search([MultiStep(0.1, [2], gamma) for gamma in (0.5, 0.4, 0.3, 0.2)]),
            "doomed": doomed,
            "signals": signals,
            "hold": hold,
        },
        run_config=tune.RunConfig(
            name=name,
            storage_path=storage_path,
            storage_filesystem=storage_filesystem,
            stop={"training_iteration": HORIZON},
            failure_config=tune.FailureConfig(max_failures=max_failures),
            verbose=0,
        ),
    )


def fit_losing_node(cluster, doomed, workdir, name, max_failures, hold=False):
    """Run a study and remove node ``doomed`` once a batch blocks on it; the
    study's results and the trials (their lr gammas) that were blocked there.
    With ``hold``, the other node's batch is held busy for a while after
    the node goes (a worker started in place of the lost one cannot be
    placed; the lost batch's retry waits for the busy worker)."""
    signals = os.path.join(workdir, f"signals_{name}")
    os.makedirs(signals)
    study = tuner(workdir, name, doomed=doomed.node_id, signals=signals, max_failures=max_failures, hold=hold)
    outcome = {}
    fit = threading.Thread(target=lambda: outcome.setdefault("grid", study.fit()), daemon=True)
    fit.start()
    deadline = time.monotonic() + 180
    awaited = {"blocked", "held"} if hold else {"blocked"}
    while not awaited <= {entry.split("_")[0] for entry in os.listdir(signals)}:
        assert fit.is_alive() and time.monotonic() < deadline, f"no batch reached {awaited}: {os.listdir(signals)}"
        time.sleep(0.2)
    cluster.remove_node(doomed, allow_graceful=not hold)  # a node that vanishes: Ray sees it gone late
    if hold:
        time.sleep(3)  # the lost batch's retry must not go to the new worker, which Ray cannot place
        open(os.path.join(signals, "release"), "w").close()
    fit.join(timeout=240)
    assert not fit.is_alive(), "the study hung after the node was removed"
    blocked = {float(entry.split("_")[1]) for entry in os.listdir(signals) if entry.startswith("blocked_")}
    return outcome["grid"], blocked


def main(workdir):
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    cluster.add_node(num_cpus=1, num_gpus=1)
    doomed = cluster.add_node(num_cpus=1, num_gpus=1)
    cluster.wait_for_nodes()
    # Workers import this module by name (its trainable and file system class).
    here = os.path.dirname(os.path.abspath(__file__))
    ray.init(address=cluster.address, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": here}})
    try:
        try:
            tuner(workdir, "unshared", storage_filesystem=DriverOnlyFileSystem(driver=os.getpid())).fit()
        except RuntimeError as error:
            assert "is not shared storage: 3 of the 3 nodes" in str(error), error
            assert "storage_path" in str(error), error
        else:
            raise AssertionError("a study on storage the nodes cannot see started")

        grid, blocked = fit_losing_node(cluster, doomed, workdir, "lost_node", max_failures=2)
        assert grid.num_errors == 0, grid.errors
        assert len(grid) == 4
        for result in grid:
            # A retry reports again what it trains again (as Tune's progress.csv): each iteration's last row counts.
            frame = result.metrics_dataframe.drop_duplicates("training_iteration", keep="last")
            assert frame["training_iteration"].tolist() == list(range(1, HORIZON + 1)), result.config
            assert (frame["gpus"] != "").all()  # each worker held one of the fake GPUs
            if result.config["lr"].gamma in blocked:
                # it was in the batch that died with the node: trained again elsewhere
                assert (frame.loc[frame["training_iteration"] >= BLOCK_AT, "node"] != doomed.node_id).all()
        print(f"OK: blocked {sorted(blocked)}, {grid.iterations_executed} iterations executed")

        # Without retries, the lost node's trials end in error at once and the others complete.
        doomed = cluster.add_node(num_cpus=1, num_gpus=1)
        cluster.wait_for_nodes()
        grid, blocked = fit_losing_node(cluster, doomed, workdir, "lost_node_no_retry", max_failures=0)
        errored = {result.config["lr"].gamma for result in grid if result.error is not None}
        assert errored == blocked, (errored, blocked)
        for result in grid:
            if result.error is None:
                assert result.metrics_dataframe["training_iteration"].tolist() == list(range(1, HORIZON + 1))
        print(f"OK without retries: {sorted(errored)} ended in error, the others complete")

        # The other node busy when the node goes: the retry must not wait for a worker Ray cannot place.
        doomed = cluster.add_node(num_cpus=1, num_gpus=1)
        cluster.wait_for_nodes()
        started = time.monotonic()
        grid, blocked = fit_losing_node(cluster, doomed, workdir, "lost_node_busy", max_failures=2, hold=True)
        assert grid.num_errors == 0, grid.errors
        for result in grid:
            frame = result.metrics_dataframe.drop_duplicates("training_iteration", keep="last")
            assert frame["training_iteration"].tolist() == list(range(1, HORIZON + 1))
        print(f"OK with the other node busy: {len(grid)} trials complete in {time.monotonic() - started:.0f} s")
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    import cluster_study  # by its name, so that Ray's workers import what it defines rather than a copy

    cluster_study.main(sys.argv[1])
