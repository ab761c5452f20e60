"""The monitor's data without a browser or Ray: the stage tree of a plan,
the trials read from an experiment directory, the app's routes and the
checks on serve()'s arguments."""

import json
from types import SimpleNamespace

import pytest

from ray_stagetree import MultiStep
from ray_stagetree.monitor import serve
from ray_stagetree.monitor.__main__ import main
from ray_stagetree.monitor.view import ExperimentReader, sharing, stage_tree, study_state, trial_table
from ray_stagetree.planning import SearchPlan
from ray_stagetree.planning.plan import CheckpointInfo

pytest.importorskip("flask")


def three_trials():
    """a: lr 0.1 then 0.01 from 4; b: then 0.05 from 4; c: then 0.01 from 6. Horizon 8."""
    plan = SearchPlan()
    plan.add_trials(
        [
            ("a", {"lr": MultiStep(0.1, [4], 0.1)}, 8),
            ("b", {"lr": MultiStep(0.1, [4], 0.5)}, 8),
            ("c", {"lr": MultiStep(0.1, [6], 0.1)}, 8),
        ]
    )
    return plan


def test_stage_tree_cuts_nodes_where_trials_fork_and_tracks_progress():
    plan = three_trials()
    root = plan.trials["a"].request.node.parent or plan.trials["a"].request.node
    for step in range(1, 5):  # the shared prefix is trained, checkpointed at the fork
        plan.record_metrics(root.node_id, step, {"loss": 1.0 / step})
    plan.record_checkpoint(root.node_id, 4, CheckpointInfo(path="checkpoints/0_4.ckpt", size_bytes=10, checksum="x"))
    node_b = plan.trials["b"].request.node.node_id
    stages = stage_tree(plan.records(), running=[{"segments": [[node_b, 4, 8]]}])

    by_id = {stage["id"]: stage for stage in stages}
    assert len(stages) == 4  # [0, 4) shared by all three, then one [4, 8) each (at 4, c keeps 0.1 and a does not)
    assert len(by_id) == len(stages)  # no id names two stages
    first = by_id[f"H{root.node_id}:0-4"]
    assert (first["start"], first["stop"], first["status"], first["checkpoints"], first["trials"]) == (
        0,
        4,
        "finished",
        [4],
        3,
    )
    assert first["parent"] is None and first["hparams"] == {"lr": 0.1}
    assert by_id[f"H{node_b}:4-8"]["status"] == "running" and by_id[f"H{node_b}:4-8"]["hparams"] == {"lr": 0.05}
    children = [stage for stage in stages if stage["parent"] == first["id"]]
    assert len(children) == 3 and sorted(stage["status"] for stage in children) == ["pending", "pending", "running"]
    assert [stage["trials"] for stage in children] == [1, 1, 1]
    assert sharing(plan.records(), executed=4) == {"executed": 4, "trial_by_trial": 24, "saving": 6.0, "partial": False}
    # Mid-run: against what the trials reached so far (4 each, the shared prefix), never their whole horizons.
    assert sharing(plan.records(), executed=4, reached=12) == {
        "executed": 4,
        "trial_by_trial": 12,
        "saving": 3.0,
        "partial": True,
    }


def write_trial(root, name, config, rows, error=False, partial_line=False):
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "params.json").write_text(json.dumps(config))
    lines = [
        json.dumps({"training_iteration": i + 1, "done": i + 1 == len(rows) and not error, **row})
        for i, row in enumerate(rows)
    ]
    (folder / "result.json").write_text("\n".join(lines) + ('\n{"loss": 0.' if partial_line else "\n"))
    if error:
        (folder / "error.txt").write_text("boom")


@pytest.fixture
def experiment(tmp_path):
    lr = {"family": "MultiStep", "init": 0.1, "milestones": [4], "gamma": 0.1, "values": None}
    write_trial(tmp_path, "t0", {"lr": lr, "seed": 1}, [{"loss": 3.0, "date": "x"}, {"loss": 1.0}, {"loss": 2.0}])
    write_trial(tmp_path, "t1", {"lr": 0.2}, [{"loss": 0.5}], error=True)
    write_trial(tmp_path, "t2", {"lr": 0.3}, [{"loss": 4.0}], partial_line=True)
    (tmp_path / "checkpoints").mkdir()  # not a trial
    return tmp_path


def test_reader_reads_trial_folders_and_the_table_ranks_them(experiment):
    reader = ExperimentReader(str(experiment))
    trials = {trial["name"]: trial for trial in reader.trials()}
    assert sorted(trials) == ["t0", "t1", "t2"]
    assert trials["t0"]["rows"][0] == {"training_iteration": 1, "loss": 3.0}  # bookkeeping keys dropped
    table = {row["name"]: row for row in trial_table(reader.trials(), "loss", "min", live={"t2": "RUNNING"})}
    assert (table["t0"]["status"], table["t0"]["latest"], table["t0"]["best"], table["t0"]["iterations"]) == (
        "TERMINATED",
        2.0,
        1.0,
        3,
    )
    assert table["t0"]["config"] == {"lr": "MultiStep(init=0.1, milestones=[4], gamma=0.1)", "seed": "1"}
    assert table["t1"]["status"] == "ERROR" and table["t2"]["status"] == "RUNNING"
    assert trial_table(reader.trials(), "loss", "max", live={})[0]["best"] == 3.0

    state = study_state(reader, metric=None, mode="min")
    assert state["metric"] == "loss" and not state["live"] and state["stages"] == [] and not state["plan_saved"]


def test_a_trial_that_failed_and_was_retried_to_its_end_reads_terminated(tmp_path):
    """Its folder keeps error.txt, as Tune keeps a retried trial's failures;
    its last result says it ended."""
    write_trial(tmp_path, "retried", {"lr": 0.1}, [{"loss": 1.0}, {"loss": 0.5}])
    (tmp_path / "retried" / "error.txt").write_text("Failure # 1 (occurred at 2026-12-06_07-26-43)\nboom\n")
    (row,) = trial_table(ExperimentReader(str(tmp_path)).trials(), "loss", "min", live={})
    assert row["status"] == "TERMINATED"


def test_app_serves_state_page_and_curves(experiment):
    from ray_stagetree.monitor.app import create_app

    client = create_app(ExperimentReader(str(experiment)), "loss", "min").test_client()
    page = client.get("/")
    assert page.status_code == 200 and b'id="trials"' in page.data and b"monitor.js" in page.data
    assert [trial["name"] for trial in client.get("/api/state").get_json()["trials"]] == ["t0", "t1", "t2"]
    curves = client.get("/curves.svg?trials=2")
    assert curves.mimetype == "image/svg+xml" and b"<svg" in curves.data and b"t1" in curves.data
    bad = client.get("/curves.svg?trials=0")
    assert bad.status_code == 400 and b"trials must be an int >= 1" in bad.data
    assert client.get("/static/monitor.css").status_code == 200


@pytest.mark.parametrize(
    "arguments, message",
    [
        ({"port": -1}, "port must be an int >= 0 and <= 65535 (0: any free port), got -1"),
        ({"port": "80"}, "port must be an int >= 0 and <= 65535"),
        ({"mode": "median"}, "mode must be 'min', 'max' or None (None: the study's own), got 'median'"),
        ({"host": ""}, "host must be a host name or address"),
        ({"metric": ""}, "metric must be a reported metric's name or None, got ''"),
    ],
)
def test_serve_refuses_bad_arguments(experiment, arguments, message):
    with pytest.raises(ValueError) as error:
        serve(str(experiment), block=False, **arguments)
    assert message in str(error.value)


def test_serve_refuses_a_path_that_is_no_directory(tmp_path, capsys):
    with pytest.raises(FileNotFoundError, match="is not a directory"):
        serve(str(tmp_path / "missing"), block=False)
    (tmp_path / "a_file").write_text("")
    with pytest.raises(SystemExit):  # the command line waits for a missing folder, not for a file to become one
        main([str(tmp_path / "a_file"), "--port", "0", "--wait", "5"])
    assert "is not a directory: give a study's experiment directory" in capsys.readouterr().err


def test_a_started_server_answers_until_stopped(experiment):
    import urllib.request

    server = serve(str(experiment), port=0, block=False)
    with urllib.request.urlopen(server.url + "api/state", timeout=10) as response:
        assert len(json.load(response)["trials"]) == 3
    server.stop()
    with pytest.raises(OSError):
        urllib.request.urlopen(server.url + "api/state", timeout=2)


def test_the_command_line_serves_a_study_until_interrupted(experiment):
    import re
    import signal
    import subprocess
    import sys
    import urllib.request

    process = subprocess.Popen(
        [sys.executable, "-m", "ray_stagetree.monitor", str(experiment), "--port", "0", "--metric", "loss"],
        stdout=subprocess.PIPE,
        text=True,
        # As from a terminal: a pytest-xdist worker ignores SIGINT, and its
        # children would inherit that (Python then raises no KeyboardInterrupt).
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        url = re.search(r"at (http://\S+) ", process.stdout.readline()).group(1)
        with urllib.request.urlopen(url + "api/state", timeout=10) as response:
            state = json.load(response)
        assert state["metric"] == "loss" and len(state["trials"]) == 3
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()
        process.stdout.close()


def test_reader_reads_a_study_on_an_fsspec_url():
    import fsspec

    filesystem = fsspec.filesystem("memory")
    filesystem.pipe("/monitor_study/t0/params.json", json.dumps({"lr": 0.1}).encode())
    filesystem.pipe(
        "/monitor_study/t0/result.json", json.dumps({"training_iteration": 1, "loss": 2.0, "done": True}).encode()
    )
    try:
        state = study_state(ExperimentReader("memory://monitor_study"), metric=None, mode="min")
        assert [(t["name"], t["status"], t["best"]) for t in state["trials"]] == [("t0", "TERMINATED", 2.0)]
    finally:
        filesystem.rm("/monitor_study", recursive=True)


def accuracy_study(root, stored):
    """Two trials of a `mode: max` study: a peaked at 0.94 and ended at 0.90,
    b ended at 0.92 (the best by its last result, as Tune ranks by default);
    ``stored`` names the file that says so: the Tuner's study file, or (in a
    folder from before it) the job spec `stagetree run` saved."""
    write_trial(root, "a", {"lr": 0.1}, [{"accuracy": 0.5}, {"accuracy": 0.94}, {"accuracy": 0.90}])
    write_trial(root, "b", {"lr": 0.2}, [{"loss": 1.0, "accuracy": 0.6}, {"loss": 0.5, "accuracy": 0.92}])
    if stored == "study":
        (root / "stagetree_study.json").write_text(json.dumps({"metric": "accuracy", "mode": "max"}))
    else:
        spec = {"trainable": "m:f", "tune_config": {"metric": "accuracy", "mode": "max"}}
        (root / "stagetree_job.json").write_text(json.dumps({"spec": spec, "base_dir": "/", "source": "s.yaml"}))
    return root


def state_of(server):
    """The state a served monitor's page polls."""
    import urllib.request

    with urllib.request.urlopen(server.url + "api/state", timeout=10) as response:
        return json.load(response)


def test_stagetree_monitor_ranks_by_the_studys_metric_and_mode(tmp_path):
    """`stagetree monitor PATH`, as the README writes it, on a `mode: max` study:
    the study's metric and mode, not the first metric minimised."""
    import os
    import re
    import signal
    import subprocess
    import sys

    study = accuracy_study(tmp_path, "study")
    process = subprocess.Popen(
        [os.path.join(os.path.dirname(sys.executable), "stagetree"), "monitor", str(study), "--port", "0"],
        stdout=subprocess.PIPE,
        text=True,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )
    try:
        url = re.search(r"at (http://\S+) ", process.stdout.readline()).group(1)
        state = state_of(SimpleNamespace(url=url))
        assert (state["metric"], state["mode"]) == ("accuracy", "max")
        assert {trial["name"]: trial["best"] for trial in state["trials"]} == {"a": 0.94, "b": 0.92}
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=60) == 0
    finally:
        process.kill()
        process.stdout.close()


def test_the_monitor_reads_an_older_studys_job_spec_and_the_callers_choice_wins(tmp_path):
    study = str(accuracy_study(tmp_path, "job"))
    with serve(study, port=0, block=False) as server:
        assert (state_of(server)["metric"], state_of(server)["mode"]) == ("accuracy", "max")
    with serve(study, port=0, block=False, metric="loss", mode="min") as server:
        assert (state_of(server)["metric"], state_of(server)["mode"]) == ("loss", "min")


def test_the_best_trials_are_those_with_the_best_last_result(tmp_path):
    """One "best" everywhere: Tune's get_best_result (scope "last"), as the
    CLI's summary and `stagetree status`; a trial that peaked once is not it."""
    from ray_stagetree.monitor.view import best_trials

    trials = ExperimentReader(str(accuracy_study(tmp_path, "study"))).trials()
    assert [trial["name"] for trial in best_trials(trials, "accuracy", "max", 2)] == ["b", "a"]
