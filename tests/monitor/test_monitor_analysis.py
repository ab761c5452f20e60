"""The monitor's study-wide views (`ray_stagetree.monitor.analysis`) and the
data behind them, without a browser or Ray: best so far, parallel
coordinates, importance, curves, the worker timeline from the plan's
recorded runs, the honest live numbers and the quiet server."""

import json
import logging
import urllib.request

import pytest

from ray_stagetree import MultiStep
from ray_stagetree.monitor import analysis, serve
from ray_stagetree.monitor.view import ExperimentReader, stage_tree, study_state
from ray_stagetree.planning import SearchPlan
from ray_stagetree.planning.plan import CheckpointInfo

pytest.importorskip("flask")


def trial(name, config, values, done=True, error=False, start=100.0):
    rows = [{"training_iteration": i + 1, "loss": value} for i, value in enumerate(values)]
    return {
        "name": name,
        "config": config,
        "rows": rows,
        "times": [start + i for i in range(len(values))],
        "done": done,
        "error": error,
    }


def multistep(init, milestones, gamma):
    return {"family": "MultiStep", "init": init, "milestones": milestones, "gamma": gamma, "values": None}


@pytest.fixture
def trials():
    return [
        trial("a", {"lr": multistep(0.1, [4], 0.1), "opt": "sgd", "seed": 1}, [3.0, 2.0], start=100),
        trial("b", {"lr": multistep(0.1, [6], 0.5), "opt": "adam", "seed": 1}, [3.0, 1.0, 1.5], start=101),
        trial("c", {"lr": multistep(0.1, [4], 0.9), "opt": "sgd", "seed": 1}, [2.5, 0.5], start=105),
        trial("d", {"lr": multistep(0.1, [6], 0.1), "opt": "adam", "seed": 1}, [4.0], done=False, start=99),
        trial("e", {"lr": multistep(0.1, [4], 0.5), "opt": "sgd", "seed": 1}, [5.0], error=True, start=102),
    ]


def test_best_so_far_follows_the_ended_trials_in_the_order_they_ended(trials):
    points = analysis.best_so_far(trials, "loss", "min")
    # d is still running: no point; the others by the time of their last result, from the first result (99).
    assert [(p["trial"], p["at"], p["count"], p["value"], p["best"]) for p in points] == [
        ("a", 2.0, 1, 2.0, 2.0),
        ("e", 3.0, 2, 5.0, 2.0),
        ("b", 4.0, 3, 1.5, 1.5),
        ("c", 7.0, 4, 0.5, 0.5),
    ]
    assert [p["best"] for p in analysis.best_so_far(trials, "loss", "max")] == [2.0, 5.0, 5.0, 5.0]


def test_parallel_coordinates_show_sequences_by_their_parameters(trials):
    parallel = analysis.parallel_coordinates(trials, "loss")
    axes = {axis["name"]: axis for axis in parallel["axes"]}
    # What varies: gamma (a number), milestones (a list: categories), opt (a choice). init, family, seed do not.
    assert sorted(axes) == ["lr.gamma", "lr.milestones", "opt"]
    assert axes["lr.gamma"] == {"name": "lr.gamma", "kind": "number", "low": 0.1, "high": 0.9, "log": False}
    assert axes["lr.milestones"]["categories"] == ["[4]", "[6]"] and axes["opt"]["categories"] == ["adam", "sgd"]
    rows = {row["trial"]: row for row in parallel["rows"]}
    names = [axis["name"] for axis in parallel["axes"]]
    assert dict(zip(names, rows["b"]["values"])) == {"lr.gamma": 0.5, "lr.milestones": 1, "opt": 0}
    assert rows["b"]["metric"] == 1.5 and rows["d"]["metric"] == 4.0
    wide = analysis.parallel_coordinates([trial("x", {"wd": 1e-5}, [1.0]), trial("y", {"wd": 1e-2}, [2.0])], "loss")
    assert wide["axes"][0]["log"]  # spanning 3 decades: a log axis


def test_importance_names_its_method_and_ranks_what_explains_the_metric():
    # loss follows gamma; seed is noise.
    trials = [
        trial(f"t{i}", {"lr": multistep(0.1, [4], gamma), "seed": seed}, [gamma * 10 + 0.01 * seed])
        for i, (gamma, seed) in enumerate([(0.1, 3), (0.2, 1), (0.3, 4), (0.5, 1), (0.7, 5), (0.9, 2)])
    ]
    result = analysis.importance(analysis.parallel_coordinates(trials, "loss"), "loss")
    assert result["method"].startswith("random-forest impurity importance (scikit-learn")
    assert result["trials"] == 6 and [p["name"] for p in result["params"]][0] == "lr.gamma"
    assert sum(p["importance"] for p in result["params"]) == pytest.approx(1.0, abs=1e-3)
    assert analysis._rank_importance(((1.0, 3.0), (2.0, 1.0), (3.0, 2.0)), (10.0, 20.0, 30.0)) == [1.0, 0.5]
    few = analysis.importance(analysis.parallel_coordinates(trials[:2], "loss"), "loss")
    assert few["params"] == [] and "importance needs 3" in few["reason"]


def test_importance_counts_trials_whose_sequences_have_different_parameters():
    # The learning rate is a MultiStep in some trials and a Warmup in others: each trial lacks the
    # other family's parameters, and every trial still counts (the MNIST-1D example's space).
    def warmup(period):
        return {"family": "Warmup", "init": 0.02, "period": period, "func": multistep(0.1, [8], 0.1), "values": None}

    trials = [trial(f"m{i}", {"lr": multistep(0.1, [4], gamma)}, [gamma]) for i, gamma in enumerate((0.1, 0.3, 0.5))]
    trials += [trial(f"w{i}", {"lr": warmup(period)}, [1.0 + period]) for i, period in enumerate((2, 3, 4))]
    result = analysis.importance(analysis.parallel_coordinates(trials, "loss"), "loss")
    assert result["trials"] == 6 and result["reason"] is None
    assert {p["name"] for p in result["params"]} >= {"lr.gamma", "lr.period"}
    assert sum(p["importance"] for p in result["params"]) == pytest.approx(1.0, abs=1e-3)


def test_importance_without_scikit_learn_uses_rank_correlation(monkeypatch):
    import builtins

    real_import = builtins.__import__

    def no_sklearn(name, *args, **kwargs):
        if name.startswith("sklearn"):
            raise ImportError(name)
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_sklearn)
    trials = [trial(f"t{i}", {"x": x, "y": y}, [x]) for i, (x, y) in enumerate([(1, 2), (2, 1), (3, 3), (4, 2)])]
    result = analysis.importance(analysis.parallel_coordinates(trials, "loss"), "loss")
    assert result["method"].startswith("|Spearman rank correlation|")
    assert result["params"][0] == {"name": "x", "importance": pytest.approx(1 / (1 + 1.5 / 22.5**0.5), abs=1e-3)}


def test_curves_of_the_trials_asked_for(trials):
    assert analysis.curves(trials, "loss", ["c", "missing", "a"]) == [  # labelled by what differs between them
        {"trial": "c", "label": "c lr.gamma=0.9", "points": [[1, 2.5], [2, 0.5]]},
        {"trial": "a", "label": "a lr.gamma=0.1", "points": [[1, 3.0], [2, 2.0]]},
    ]
    assert len(analysis.curves(trials, "loss", None, limit=3)) == 3


def plan_with_runs():
    """b and c fork at 4 off a's node, the root (three_trials of test_monitor_view); worker 1 trains
    the root to 8, worker 2 then b's branch from the checkpoint at 4."""
    plan = SearchPlan()
    plan.add_trials(
        [
            ("a", {"lr": MultiStep(0.1, [4], 0.1)}, 8),
            ("b", {"lr": MultiStep(0.1, [4], 0.5)}, 8),
            ("c", {"lr": MultiStep(0.1, [6], 0.1)}, 8),
        ]
    )
    root = plan.trials["a"].request.node.parent or plan.trials["a"].request.node
    node_a, node_b = plan.trials["a"].request.node.node_id, plan.trials["b"].request.node.node_id
    plan.record_checkpoint(root.node_id, 4, CheckpointInfo(path="checkpoints/0_4.ckpt", size_bytes=1, checksum="x"))
    for step in range(1, 9):
        plan.record_metrics(root.node_id, step, {"loss": 1.0})
    plan.record_run(0, 1, [(root.node_id, 0, 8)], began=1000.0, ended=1008.0)
    plan.record_run(1, 2, [(node_b, 4, 8)], began=1004.5, ended=1008.5)
    return plan, root.node_id, node_a, node_b


def test_a_plans_runs_are_saved_and_loaded_and_an_older_plan_has_none(tmp_path):
    plan, root, _, node_b = plan_with_runs()
    plan.save(str(tmp_path / "plan"))
    loaded = SearchPlan.load(str(tmp_path / "plan"))
    assert loaded.runs == plan.runs and loaded.runs[1].segments == ((node_b, 4, 8),)
    (tmp_path / "plan" / "runs.parquet").unlink()  # a plan saved before runs were recorded
    assert SearchPlan.load(str(tmp_path / "plan")).runs == []
    with pytest.raises(ValueError, match="began <= ended"):
        plan.record_run(2, 1, [(root, 0, 1)], began=5.0, ended=4.0)
    with pytest.raises(KeyError):
        plan.record_run(2, 1, [(99, 0, 1)], began=4.0, ended=5.0)


def test_the_timeline_shows_each_workers_batches_their_stages_checkpoints_and_forks():
    plan, root, _, node_b = plan_with_runs()
    node_c = plan.trials["c"].request.node.node_id
    records = plan.records()
    running = [{"worker": 1, "batch": 2, "began": 1009.0, "segments": [[node_c, 4, 8]]}]
    stages = stage_tree(records, running)
    view = analysis.timeline(records, running, stages, now=1011.0)
    assert view["recorded"] and view["workers"] == [1, 2] and (view["start"], view["end"]) == (1000.0, 1011.0)
    first, second, third = view["runs"]
    # The root's batch, cut into the stages it trained: [0, 4), shared by all, then the root node's own [4, 8).
    assert [piece["stages"] for piece in first["segments"]] == [[f"H{root}:0-4"], [f"H{root}:4-8"]]
    assert first["checkpoints"] == [[root, 4, 1004.0]] and first["source"] is None
    # b's branch forks off the root at 4, which worker 1 trained at 1004 s.
    assert second["source"] == {"worker": 1, "time": 1004.0, "kind": "fork"}
    assert second["segments"] == [{"node": node_b, "start": 4, "stop": 8, "stages": [f"H{node_b}:4-8"]}]
    assert (third["outcome"], third["ended"], third["source"]) == (
        "running",
        1011.0,
        {"worker": 1, "time": 1004.0, "kind": "fork"},
    )
    assert analysis.timeline(None, [], [], 0.0) == {
        "runs": [],
        "workers": [],
        "start": None,
        "end": None,
        "recorded": False,
    }


def write_trial(root, name, config, losses, done=True):
    folder = root / name
    folder.mkdir(parents=True)
    (folder / "params.json").write_text(json.dumps(config))
    rows = [
        {"training_iteration": i + 1, "loss": loss, "timestamp": 1000 + i, "done": done and i + 1 == len(losses)}
        for i, loss in enumerate(losses)
    ]
    (folder / "result.json").write_text("".join(json.dumps(row) + "\n" for row in rows))


def test_live_state_is_honest_running_means_held_and_figures_are_partial(tmp_path):
    """12 trials admitted on 2 workers: only the trials of the running batches are RUNNING; the sharing
    figures compare what ran with what the trials reached so far, and say they are partial."""
    plan, root, node_a, node_b = plan_with_runs()
    for name in ("a", "b", "c"):
        write_trial(tmp_path, name, {"lr": 0.1}, [2.0, 1.0], done=False)
    live_view = {
        "plan": plan.records(),
        "running": [{"batch": 2, "segments": [[node_a, 4, 8]], "trials": ["a"], "began": 1009.0}],
        "workers": [
            {"worker": 1, "batch": 2, "segments": [[node_a, 4, 8]], "trials": ["a"], "seconds": 1.0, "began": 1009.0},
            {"worker": 2},
        ],
        "trials": {"a": "RUNNING", "b": "RUNNING", "c": "RUNNING"},
        "iterations": 4,
    }
    state = study_state(ExperimentReader(str(tmp_path)), "loss", "min", live_view)
    assert {row["name"]: row["status"] for row in state["trials"]} == {"a": "RUNNING", "b": "PENDING", "c": "PENDING"}
    assert state["sharing"] == {"executed": 4, "trial_by_trial": 6, "saving": 1.5, "partial": True}
    assert state["workers"][0]["stages"] == [[f"H{node_a}:4-8"]]
    ids = [stage["id"] for stage in state["stages"]]
    assert len(ids) == len(set(ids))
    assert [run["outcome"] for run in state["timeline"]["runs"]] == ["done", "done", "running"]
    assert state["history"] == []  # nothing ended yet
    assert {"axes", "rows"} <= state["parallel"].keys() and "importance" not in state  # its own endpoint


def test_the_curves_endpoint_answers_best_n_a_selection_or_all(tmp_path):
    from ray_stagetree.monitor.app import create_app

    for name, losses in {"a": [3.0, 2.0], "b": [3.0, 1.0], "c": [2.0, 0.5]}.items():
        write_trial(tmp_path, name, {"lr": 0.1}, losses)
    client = create_app(ExperimentReader(str(tmp_path)), "loss", "min").test_client()

    def names(query):
        answer = client.get(f"/api/curves?{query}").get_json()
        return [curve["trial"] for curve in answer["curves"]]

    assert names("best=2") == ["c", "b"] and names("") == ["c", "b", "a"]
    assert names("trials=a,c") == ["a", "c"] and names("trials=") == []
    assert sorted(names("all=1")) == ["a", "b", "c"]
    assert client.get("/api/curves?best=0").status_code == 400
    assert client.get("/api/curves?best=1").get_json()["curves"][0]["points"] == [[1, 2.0], [2, 0.5]]
    importance = client.get("/api/importance").get_json()
    assert importance["trials"] == 3 and importance["params"] == [{"name": "lr", "importance": 0.0}]  # it never varies


@pytest.mark.parametrize("verbose", [False, True])
def test_the_server_logs_requests_only_when_verbose(tmp_path, caplog, verbose):
    write_trial(tmp_path, "a", {"lr": 0.1}, [1.0])
    caplog.set_level(logging.INFO, logger="werkzeug")
    with serve(str(tmp_path), port=0, block=False, verbose=verbose) as server:
        with urllib.request.urlopen(server.url + "api/state", timeout=10) as response:
            assert response.status == 200
    logged = [record for record in caplog.records if record.name == "werkzeug" and "api/state" in record.getMessage()]
    assert bool(logged) == verbose


def test_a_taken_port_is_an_os_error_not_an_exit(tmp_path):
    """werkzeug exits the process when its port is taken; Tuner(monitor=True) must get an OSError to
    take another port (and `stagetree monitor` reports it as a usage error)."""
    import errno

    write_trial(tmp_path, "a", {"lr": 0.1}, [1.0])
    with serve(str(tmp_path), port=0, block=False) as first:
        with pytest.raises(OSError) as error:
            serve(str(tmp_path), port=first.port, block=False)
        assert error.value.errno == errno.EADDRINUSE
