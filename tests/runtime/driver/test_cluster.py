"""Clusters: a study on several nodes (one of them lost mid-study), storage
that not every node sees, and `ray job submit` of the MNIST-1D example (and
`stagetree submit` of its job spec, and a job attaching to a plan service).
Each runs its own Ray cluster in a subprocess, apart from the session's."""

import http.client
import os
import random
import secrets
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import pytest
import ray

HERE = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))  # tests/runtime, beside cluster_study.py
REPO = os.path.dirname(os.path.dirname(HERE))


def run(command, timeout, env=None):
    completed = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=env, cwd=REPO, check=False)
    return completed.returncode, completed.stdout + completed.stderr


def environment():
    env = dict(os.environ)
    env.pop("RAY_ADDRESS", None)  # a cluster of its own, whatever the session joined
    return env


@pytest.mark.release
@pytest.mark.long
@pytest.mark.slow
def test_study_on_a_multi_node_cluster_survives_a_lost_node(tmp_path):
    code, output = run([sys.executable, os.path.join(HERE, "cluster_study.py"), str(tmp_path)], 300, environment())
    assert code == 0, output[-6000:]
    assert "OK: blocked" in output
    assert "OK without retries" in output
    assert "OK with the other node busy" in output


@pytest.mark.release
@pytest.mark.long
@pytest.mark.slow
def test_a_study_on_object_storage_on_two_nodes_restores_identical(tmp_path):
    """An S3-compatible server (moto's), pyarrow's S3FileSystem as the
    study's storage, a two-node cluster; then Tuner.restore reads it back."""
    pytest.importorskip("moto.server")
    code, output = run([sys.executable, os.path.join(HERE, "object_storage_study.py")], 300, environment())
    assert code == 0, output[-6000:]
    assert "restored identical" in output


def free_port():
    """A free port between Ray's worker ports (10002-19999) and the kernel's
    ephemeral range (32768 up): a port from `bind(("", 0))` may be taken, between
    this probe and `ray start` binding it, by any process binding port 0 (every
    Ray of the test session picks its ports so), and the dashboard's then
    answered a `ray job` client in gRPC."""
    while True:
        port = random.randint(20000, 32767)
        with socket.socket() as probe:
            try:
                probe.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port


def dashboard_answers(url, head, token, seconds=120):
    deadline = time.monotonic() + seconds
    asked = urllib.request.Request(f"{url}/api/version", headers={"Authorization": f"Bearer {token}"})
    while time.monotonic() < deadline and head.poll() is None:
        try:
            with urllib.request.urlopen(asked, timeout=2):
                return True
        except http.client.HTTPException:
            return False  # not a dashboard: another process holds the port
        except OSError:
            time.sleep(1)
    return False


def start_head_node(ray_cli, env, temp_dir, token, attempts=3):
    """`ray start --head --block` with ports of its own (the defaults may be
    held by the test session's Ray on this machine); `(head process, dashboard
    URL, GCS port)`, or a skip when no attempt's dashboard answers. --block,
    so that stopping this process stops this cluster and nothing else (`ray
    stop` would stop every Ray on the machine)."""
    for _ in range(attempts):
        gcs_port, dashboard_port = free_port(), free_port()
        head = subprocess.Popen(
            [
                *ray_cli, "start", "--head", "--block", "--num-cpus", "2", "--port", str(gcs_port),
                "--dashboard-port", str(dashboard_port), "--include-dashboard", "true", "--temp-dir", temp_dir,
                "--dashboard-agent-listen-port", str(free_port()), "--dashboard-agent-grpc-port", str(free_port()),
                "--runtime-env-agent-port", str(free_port()), "--metrics-export-port", str(free_port()),
                "--ray-client-server-port", str(free_port()), "--disable-usage-stats",
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            # On SIGTERM, Ray 2.60 drains the node for up to this many seconds first (for Serve replicas on
            # Kubernetes); this node has none, and with the default 30 its teardown alone took half a minute.
            env={**env, "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0"},
            cwd=REPO,
        )  # fmt: skip
        dashboard = f"http://127.0.0.1:{dashboard_port}"
        if dashboard_answers(dashboard, head, token):
            return head, dashboard, gcs_port
        head.terminate()  # ray start's SIGTERM handler stops the processes it started
        output = head.communicate(timeout=120)[0]
        shutil.rmtree(temp_dir, ignore_errors=True)
    pytest.skip(f"`ray start --head` is impossible here ({attempts} attempts): {output[-2000:]}")


@pytest.mark.release
@pytest.mark.long
@pytest.mark.slow
def test_ray_job_submit_runs_the_mnist1d_example_and_attaches_to_a_plan_service(tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("mnist1d")
    pytest.importorskip("aiohttp", reason="`ray job submit` needs Ray's dashboard: pip install 'ray[default]'")
    from ray._private.services import get_node_ip_address

    ray_cli = [sys.executable, "-c", "from ray.scripts.scripts import main; main()"]
    env = environment()
    env["PATH"] = os.pathsep.join([os.path.dirname(sys.executable), env.get("PATH", "")])  # the job's `python`
    # The clusters guide's recipe (docs/guides/clusters.md) on Ray 2.60: token authentication on, and RAY_AUTH_MODE=token for every client (`ray
    # job submit` sends the token only then); the token in a file of this test's, not the user's ~/.ray/auth_token.
    token = secrets.token_hex(32)
    (tmp_path / "auth_token").write_text(token)
    env["RAY_AUTH_MODE"] = "token"
    env["RAY_AUTH_TOKEN_PATH"] = str(tmp_path / "auth_token")
    # The plan-service study's trainable, imported by name in the drivers and the cluster's workers: its
    # module alone (with the whole tests folder on its path, this cluster's dashboard dies after starting).
    modules = tmp_path / "modules"
    modules.mkdir()
    shutil.copy(os.path.join(os.path.dirname(HERE), "trainables_for_tests.py"), modules)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(modules), env.get("PYTHONPATH")]))
    # `ray start` records its address there, apart from the session's: the latest `ray start` for drivers with
    # RAY_TMPDIR its parent
    temp_dir = f"/tmp/rst_{uuid.uuid4().hex[:8]}/ray"
    head, dashboard, gcs_port = start_head_node(ray_cli, env, temp_dir, token)
    try:
        # A driver on the head's machine, as a user runs one (no RAY_ADDRESS, no RAY_AUTH_MODE): init_ray joins
        # the latest `ray start`, with the token Ray 2.60's `ray start` asks for.
        on_the_machine = {key: value for key, value in env.items() if key != "RAY_AUTH_MODE"}
        on_the_machine["RAY_TMPDIR"] = os.path.dirname(temp_dir)
        recorded = os.path.join(temp_dir, "ray_current_cluster")
        for _ in range(60):  # `ray start --block` records the address after its dashboard answers
            if os.path.exists(recorded):
                break
            time.sleep(0.5)
        join = "import ray, ray_stagetree; print(ray_stagetree.init_ray(num_cpus=1), ray.get_runtime_context().gcs_address)"
        code, output = run([sys.executable, "-c", join], 120, on_the_machine)
        assert code == 0 and f"True {get_node_ip_address()}:{gcs_port}" in output, output[-3000:]
        # Without RAY_AUTH_MODE=token the cluster refuses a submission; `stagetree submit` says what to set.
        tokenless = {key: value for key, value in env.items() if key != "RAY_AUTH_MODE"}
        spec = os.path.join(REPO, "examples", "mnist1d_study.yaml")
        code, output = run(
            [sys.executable, "-m", "ray_stagetree.cli", "submit", spec, "--address", dashboard, "--working-dir",
             os.path.join(REPO, "examples")],
            120,
            tokenless,
        )  # fmt: skip
        assert code == 1 and "the cluster asks for its token. Set RAY_AUTH_MODE=token here" in output, output[-3000:]
        for _ in range(30):  # the dashboard answers before its job agent is up ("No available agent")
            code, output = run(
                [
                    *ray_cli,
                    "job",
                    "submit",
                    "--address",
                    dashboard,
                    "--working-dir",
                    "examples",
                    "--",
                    "python",
                    "mnist1d_study.py",
                    "--epochs",
                    "3",
                    "--storage-path",
                    str(tmp_path),
                ],
                300,
                env,
            )
            if "No available agent" not in output:
                break
            time.sleep(2)
        assert code == 0, output[-6000:]
        assert "14 trials, 0 errors" in output, output[-6000:]
        assert "best accuracy" in output
        assert len([entry for entry in os.listdir(tmp_path) if entry.startswith("mnist1d_shared_")]) == 1

        # The same study from its job spec, through `stagetree submit` (3 epochs: a copy of the spec).
        working_dir = tmp_path / "job"
        shutil.copytree(os.path.join(REPO, "examples"), working_dir, ignore=shutil.ignore_patterns("__pycache__"))
        spec = (working_dir / "mnist1d_study.yaml").read_text()
        assert "stop: {training_iteration: 16}" in spec
        (working_dir / "short.yaml").write_text(spec.replace("training_iteration: 16", "training_iteration: 3"))
        stagetree = [sys.executable, "-m", "ray_stagetree.cli"]
        code, output = run(
            [
                *stagetree,
                "submit",
                str(working_dir / "short.yaml"),
                "--address",
                dashboard,
                "--working-dir",
                str(working_dir),
                "--storage-path",
                str(tmp_path / "specs"),
            ],
            300,
            env,
        )
        assert code == 0, output[-6000:]
        assert os.listdir(tmp_path / "specs") == ["mnist1d_spec"], output[-6000:]
        code, output = run([*stagetree, "status", str(tmp_path / "specs" / "mnist1d_spec")], 120, env)
        assert code == 0 and "trials: 14 TERMINATED" in output, output[-6000:]

        a_job_and_a_driver_attach_to_one_plan_service(ray_cli, dashboard, gcs_port, env, tmp_path / "service")
    finally:
        head.terminate()  # ray start's SIGTERM handler stops the processes it started
        head.communicate(timeout=120)
        shutil.rmtree(os.path.dirname(temp_dir), ignore_errors=True)


def a_job_and_a_driver_attach_to_one_plan_service(ray_cli, dashboard, gcs_port, env, storage):
    """A `ray job submit` job and a plain driver process, both in namespace
    "team", run `service_study` on plan service "team" of the cluster: the
    same service actor serves both, and each gets its own trials' results."""
    import json

    from ray._private.services import get_node_ip_address
    from service_study import expected_total

    def arguments(name, milestones, **where):
        return dict(where, namespace="team", storage=str(storage), name=name, milestones=milestones, service="team",
                    out=str(storage / f"{name}.json"), service_out=str(storage / f"{name}.service"))  # fmt: skip

    study = os.path.join(HERE, "service_study.py")
    storage.mkdir()
    job = subprocess.Popen(  # no address: the job's driver joins its cluster (RAY_ADDRESS); `ray job` quotes arguments
        [*ray_cli, "job", "submit", "--address", dashboard, "--",
         "python", study, json.dumps(arguments("job", [2, 3, 4]))],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=REPO,
    )  # fmt: skip
    address = f"{get_node_ip_address()}:{gcs_port}"
    code, output = run([sys.executable, study, json.dumps(arguments("driver", [2, 3, 5], address=address))], 300, env)
    job_output = job.communicate(timeout=300)[0]
    assert code == 0, output[-6000:]
    assert job.returncode == 0, job_output[-6000:]
    for name, milestones in (("job", [2, 3, 4]), ("driver", [2, 3, 5])):
        totals = json.loads((storage / f"{name}.json").read_text())
        assert totals == {str(m): expected_total(m) for m in milestones}
    assert (storage / "job.service").read_text() == (storage / "driver.service").read_text()


# -- init_ray: which ray.init call it makes (Ray itself is faked here) ------------


@pytest.fixture
def fake_init(monkeypatch):
    import ray

    calls = []
    monkeypatch.setattr(ray, "is_initialized", lambda: False)
    monkeypatch.setattr(ray, "init", lambda **kwargs: calls.append(kwargs))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    return calls


def test_init_ray_joins_the_cluster_in_ray_address_without_sizing_it(fake_init, monkeypatch, caplog):
    from ray_stagetree import init_ray

    monkeypatch.setenv("RAY_ADDRESS", "10.1.2.3:6390")  # as `ray job submit` sets it
    with caplog.at_level("INFO", logger="ray_stagetree"):
        assert init_ray(num_cpus=2, num_gpus=1, object_store_memory=10**8, include_dashboard=False) is True
    # "auto": Ray finds the same cluster, and its token where a local `ray start` keeps one
    assert fake_init == [{"address": "auto", "include_dashboard": False}]
    assert (
        "joining the Ray cluster at 10.1.2.3:6390: its own resources count, not object_store_memory, num_cpus, num_gpus"
        in caplog.text
    )


def test_init_ray_starts_a_local_ray_when_no_cluster_runs(fake_init, monkeypatch):
    from ray._private import services

    from ray_stagetree import init_ray

    monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir: None)  # no `ray start` here
    assert init_ray(num_cpus=2, include_dashboard=False) is False
    assert fake_init == [{"address": "local", "num_cpus": 2, "num_gpus": None, "include_dashboard": False}]


def test_init_ray_joins_the_latest_ray_start_on_this_machine(fake_init, monkeypatch):
    from ray._private import services

    from ray_stagetree import init_ray

    monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir: "10.1.2.3:6391")
    assert init_ray(num_cpus=2) is True
    assert fake_init == [{"address": "auto"}]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"num_cpus": -1}, "num_cpus must be an int >= 0 or None, got -1"),
        ({"num_gpus": 0.5}, "num_gpus must be an int >= 0 or None, got 0.5"),
        ({"address": "auto"}, "init_ray finds the cluster itself .* got address='auto'"),
    ],
)
def test_init_ray_refuses_bad_arguments(fake_init, kwargs, message):
    from ray_stagetree import init_ray

    with pytest.raises(ValueError, match=message):
        init_ray(**kwargs)
    assert fake_init == []


# -- a checkpoint whose in-memory copy went down with its node ---------------------


def test_a_lost_checkpoint_object_is_read_back_from_its_durable_copy(tmp_path, ray_session, monkeypatch):
    """The object of a checkpoint that lived on a lost node raises
    ObjectLostError (an OwnerDiedError here: on one node Ray may still serve
    a local copy of a dead owner's object, so the loss is simulated). A batch
    starting from it reports so before the trainable runs; the store then
    reads the durable copy, or forgets a checkpoint that has none (it is
    retrained). The multi-node study above loses real nodes."""
    import asyncio

    from ray_stagetree.execution.batches import BatchSpec
    from ray_stagetree.execution.payload import CheckpointPayload
    from ray_stagetree.execution.storage import CheckpointStorage
    from ray_stagetree.planning import SearchPlan, TrialConfig
    from ray_stagetree.runtime.control.checkpoint_store import CheckpointStore
    from ray_stagetree.runtime.workers.worker import StageWorker

    plan = SearchPlan()
    node = plan.add_trial("a", {"lr": 0.1}, 20).node
    store = CheckpointStore(CheckpointStorage(str(tmp_path)), budget_bytes=10**9)
    payload = CheckpointPayload(step=10, rng={}, directory=None, state={"weights": [1.0, 2.0]})
    store.add(plan, node, 10, ray.put(payload), size_bytes=100)
    (write,) = store.pending_writes
    asyncio.run(store.finish_write(plan, write))  # the durable copy
    store.add(plan, node, 15, ray.put(payload), size_bytes=100)  # still being written
    lost = ray.put(payload)
    real_get = ray.get

    def get(refs, *args, **kwargs):
        if refs is lost:
            raise ray.exceptions.OwnerDiedError(lost.hex(), "", "")
        return real_get(refs, *args, **kwargs)

    monkeypatch.setattr(ray, "get", get)

    def never_runs(config):
        raise AssertionError("the trainable ran from a lost checkpoint")

    worker = StageWorker(ray.cloudpickle.dumps(never_runs), None)
    spec = BatchSpec(
        batch_id=1,
        config={"lr": 0.1},
        trial_config=TrialConfig.from_config({"lr": 0.1}),
        segments=[(node.node_id, 10, 12)],
        save_iterations=set(),
        source=lost,
    )
    outcome = worker.run_batch(spec)
    assert outcome.error is None and outcome.records == []
    assert "the checkpoint batch 1 starts from is lost" in outcome.source_lost
    monkeypatch.undo()

    store.forget_copy(plan, node, 10)
    reloaded = asyncio.run(store.handle(plan, node, 10))
    assert store.in_memory(node, 10) and ray.get(reloaded).state == {"weights": [1.0, 2.0]}
    store.forget_copy(plan, node, 15)  # no durable copy yet: nothing to start from
    assert 15 not in node.checkpoints
