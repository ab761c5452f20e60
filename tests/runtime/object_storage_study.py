"""A study whose storage is an S3-compatible object store, on a two-node
``ray.cluster_utils.Cluster``, then restored from it. `test_cluster.py`
runs it in a subprocess, so its cluster never meets the test session's Ray.

    python tests/runtime/object_storage_study.py

moto's server (``moto.server.ThreadedMotoServer``) plays S3 on a local
port, which every node of the local cluster reaches; the study reaches it
through pyarrow's ``S3FileSystem`` in ``RunConfig.storage_filesystem``, as
on a real cluster. The stored study is then read back by
``Tuner.restore``: the same trials, the same results, and every stage
checkpoint a fork started from was written to the bucket.
"""

import os
import sys

import ray
from ray import tune
from ray.cluster_utils import Cluster

from ray_stagetree import MultiStep, Tuner

HORIZON = 5
BUCKET = "studies"


def train(config):
    import json
    import tempfile

    x = 1.0
    start = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as path, open(os.path.join(path, "x.json")) as file:
            x, start = json.load(file)
    for iteration in range(start, HORIZON):
        x -= config["lr"] * x
        with tempfile.TemporaryDirectory() as path:
            with open(os.path.join(path, "x.json"), "w") as file:
                json.dump([x, iteration + 1], file)
            tune.report({"x": x}, checkpoint=tune.Checkpoint.from_directory(path))


def object_store():
    """A moto S3 server on a free local port, with an empty bucket; the server and a pyarrow file system on it."""
    import boto3
    from moto.server import ThreadedMotoServer
    from pyarrow import fs

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    credentials = {"aws_access_key_id": "testing", "aws_secret_access_key": "testing", "region_name": "us-east-1"}
    boto3.client("s3", endpoint_url=endpoint, **credentials).create_bucket(Bucket=BUCKET)
    filesystem = fs.S3FileSystem(
        access_key="testing",
        secret_key="testing",
        region="us-east-1",
        endpoint_override=endpoint,
        scheme="http",
        allow_bucket_creation=False,
    )
    return server, filesystem


def final_x(grid):
    return {str(result.config["lr"]): round(result.metrics["x"], 12) for result in grid}


def main():
    server, filesystem = object_store()
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0, "include_dashboard": False})
    cluster.add_node(num_cpus=1)
    cluster.add_node(num_cpus=1)
    cluster.wait_for_nodes()
    here = os.path.dirname(os.path.abspath(__file__))
    ray.init(address=cluster.address, log_to_driver=False, runtime_env={"env_vars": {"PYTHONPATH": here}})
    try:
        grid = Tuner(
            train,
            param_space={"lr": tune.grid_search([MultiStep(0.1, [2], gamma) for gamma in (0.5, 0.3, 0.2)])},
            run_config=tune.RunConfig(
                name="on_s3",
                storage_path=f"{BUCKET}/experiments",
                storage_filesystem=filesystem,
                stop={"training_iteration": HORIZON},
                verbose=0,
            ),
        ).fit()
        assert grid.num_errors == 0, grid.errors
        assert grid.iterations_executed == 2 + 3 * 3 < 3 * HORIZON, grid.iterations_executed
        from pyarrow import fs

        workers = {pid for result in grid for pid in result.metrics_dataframe["pid"]}
        path = f"{BUCKET}/experiments/on_s3"
        stored = [info.path for info in filesystem.get_file_info(fs.FileSelector(path, recursive=True))]
        assert Tuner.can_restore(path, storage_filesystem=filesystem), stored
        restored = Tuner.restore(path, train, storage_filesystem=filesystem)
        assert final_x(restored.get_results()) == final_x(grid)
        again = restored.fit()  # the stored study is complete: nothing trains again
        assert final_x(again) == final_x(grid) and again.num_errors == 0
        print(f"OK: {len(grid)} trials by {len(workers)} worker(s), {len(stored)} objects stored, restored identical")
    finally:
        ray.shutdown()
        cluster.shutdown()
        server.stop()


if __name__ == "__main__":
    import object_storage_study  # by its name, so that Ray's workers import what it defines rather than a copy

    object_storage_study.main()
    sys.exit(0)
