"""The ``stagetree`` command line, run as users run it: in a subprocess,
checking exit codes, stdout and stderr."""

import json
import os
import subprocess
import sys
import time

import pytest
import yaml

from ray_stagetree.cli import main

TESTS = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
EXAMPLES = os.path.join(os.path.dirname(TESTS), "examples")
STAGETREE = os.path.join(os.path.dirname(sys.executable), "stagetree")  # the console script setup.cfg declares


def environment():
    """Ray's workers import the test trainables by name."""
    return dict(os.environ, PYTHONPATH=os.pathsep.join([TESTS, os.environ.get("PYTHONPATH", "")]))


def stagetree(*args, timeout=300):
    return subprocess.run(
        [STAGETREE, *map(str, args)], capture_output=True, text=True, env=environment(), timeout=timeout
    )


def test_help_everywhere(capsys):
    top = stagetree("--help")
    assert top.returncode == 0 and "exit codes:" in top.stdout
    for command in ("run", "submit", "plan", "status", "show", "ls", "restore", "monitor"):
        assert command in top.stdout
        with pytest.raises(SystemExit) as raised:
            main([command, "--help"])
        out = capsys.readouterr().out
        assert raised.value.code == 0 and f"usage: stagetree {command}" in out and "exit codes:" in out
    with pytest.raises(SystemExit) as raised:
        main([])
    assert raised.value.code == 2  # a subcommand is required


def test_a_bad_spec_exits_2_with_every_problem_and_no_traceback(tmp_path):
    spec = tmp_path / "bad.yaml"
    shape = {"trainable": "trainables_for_tests:noisy_descent", "tune_config": {"mode": "minimize", "metric": 3}}
    spec.write_text(yaml.safe_dump(shape))
    result = stagetree("run", spec)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert f"stagetree: error: {spec}: 2 problems" in result.stderr
    assert "tune_config.metric: must be a string, got 3" in result.stderr
    assert "tune_config.mode: 'minimize' is not allowed; allowed: 'min', 'max'" in result.stderr
    # The shape is checked first, then what needs Tune and imports to judge.
    spec.write_text(
        yaml.safe_dump({"trainable": "trainables_for_tests:nothing", "tune_config": {"scheduler": "ashaa"}})
    )
    result = stagetree("plan", spec)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert (
        "trainable: 'trainables_for_tests:nothing': 'trainables_for_tests' has no attribute 'nothing'" in result.stderr
    )
    assert "tune_config.scheduler.name: unknown scheduler 'ashaa'" in result.stderr


def test_monitor_refuses_a_missing_experiment_with_its_usage(tmp_path):
    result = stagetree("monitor", tmp_path / "nothing")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "stagetree monitor: error: path" in result.stderr and "is not a directory" in result.stderr


def test_bad_arguments_and_paths_exit_2(tmp_path, capsys):
    with pytest.raises(SystemExit) as raised:
        main(["plan", "x.yaml", "--draw", "tree.gif"])
    assert raised.value.code == 2 and "must end in .svg, .png or .pdf, got 'tree.gif'" in capsys.readouterr().err
    assert main(["status", str(tmp_path / "nothing")]) == 2
    assert "is not a ray_stagetree experiment directory" in capsys.readouterr().err
    assert main(["ls", str(tmp_path / "nothing")]) == 2
    assert main(["ls", str(tmp_path)]) == 0
    assert capsys.readouterr().out.startswith("no ray_stagetree experiments in")
    assert main(["restore", str(tmp_path)]) == 2
    assert "is not a ray_stagetree experiment directory that can be restored" in capsys.readouterr().err


def test_plan_is_a_dry_run_of_the_example_study(tmp_path, capsys):
    spec = os.path.join(EXAMPLES, "mnist1d_study.yaml")
    picture = tmp_path / "tree.svg"
    assert main(["plan", spec, "--json", "--draw", str(picture), "--seconds-per-iteration", "2", "--workers", "4"]) == 0
    figures = json.loads(capsys.readouterr().out)
    # The README's figures for this study: 14 trials, 130 unique epochs of 224 (merge rate 1.72).
    assert (figures["trials"], figures["unique_iterations"], figures["trial_by_trial_iterations"]) == (14, 130, 224)
    assert figures["merge_rate"] == pytest.approx(224 / 130) and figures["stages"] == 21
    assert figures["worker_hours"] == pytest.approx(130 * 2 / 3600)
    assert figures["trial_by_trial_worker_hours"] == pytest.approx(224 * 2 / 3600)
    assert figures["makespan_bound_hours"] == pytest.approx(max(16 * 2, 130 * 2 / 4) / 3600)
    assert "<svg" in picture.read_text()
    assert main(["plan", spec, "--max-lines", "3"]) == 0
    text = capsys.readouterr().out
    assert "merge rate 1.72: 130 unique iterations, 224 trial by trial" in text
    assert "[0, 8) batch_size=128 lr=0.1 seed=0  (8 trials)" in text
    assert "... 18 more stages (--max-lines shows more)" in text


def test_plan_of_a_searcher_draws_an_estimate_and_needs_a_horizon(tmp_path, capsys):
    def write(milestones):
        spec.write_text(
            yaml.safe_dump(
                {
                    "trainable": "trainables_for_tests:noisy_descent",
                    "param_space": {"lr": {"family": "MultiStep", "init": 0.1, "milestones": milestones, "gamma": 0.1}},
                    "tune_config": {
                        "metric": "loss",
                        "mode": "min",
                        "num_samples": 6,
                        "search_alg": {"name": "optuna", "seed": 0},
                    },
                }
            )
        )

    spec = tmp_path / "search.yaml"
    write({"choice": [[4], [6]]})
    assert main(["plan", str(spec)]) == 2
    assert "sets no horizon" in capsys.readouterr().err
    assert main(["plan", str(spec), "--horizon", "10", "--samples", "4"]) == 0
    assert capsys.readouterr().out.startswith("4 trials of 10 iterations, drawn at random from the space")
    # A drawn config that cannot be a sequence is named, without a traceback.
    write({"choice": [[-4]]})
    assert main(["plan", str(spec), "--horizon", "10"]) == 2
    assert "MultiStep: milestones must be a list of strictly increasing positive ints" in capsys.readouterr().err


def test_submit_checks_before_it_submits(tmp_path, capsys):
    spec = os.path.join(EXAMPLES, "mnist1d_study.yaml")
    assert main(["submit", spec, "--address", "http://127.0.0.1:9", "--working-dir", str(tmp_path)]) == 2
    assert "must be inside the working directory" in capsys.readouterr().err
    assert (
        main(
            [
                "submit",
                spec,
                "--address",
                "http://127.0.0.1:9",
                "--working-dir",
                EXAMPLES,
                "--requirements",
                str(tmp_path / "missing.txt"),
            ]
        )
        == 2
    )
    assert "--requirements" in capsys.readouterr().err
    assert (
        main(
            ["submit", spec, "--address", "http://127.0.0.1:9", "--working-dir", EXAMPLES, "--storage-path", "results"]
        )
        == 2
    )
    assert "--storage-path: must be an absolute path" in capsys.readouterr().err
    # Nothing listens on port 9: a message and exit 1, not a traceback.
    assert main(["submit", spec, "--address", "http://127.0.0.1:9", "--working-dir", EXAMPLES]) == 1
    assert "cannot submit to 'http://127.0.0.1:9'" in capsys.readouterr().err


def test_run_inspect_and_restore_a_study(ray_session, tmp_path, capsys):
    """A tiny study whose one trial's worker dies: run exits 1, status/show/ls
    see it; restore (from the spec saved with the study) finishes it. Both
    commands join the test session's Ray by --address (starting one each
    would double the test's time)."""
    address = ray_session.get_runtime_context().gcs_address
    marker = tmp_path / "died"
    spec = tmp_path / "tiny.yaml"
    spec.write_text(
        yaml.safe_dump(
            {
                "trainable": "trainables_for_tests:noisy_descent",
                "param_space": {
                    "lr": {
                        "grid_search": [
                            {"family": "Exponential", "init": 0.1, "gamma": 0.9},
                            {"family": "Exponential", "init": 0.2, "gamma": 0.9},
                        ]
                    },
                    "die_once_at": 2,
                    "marker": str(marker),
                    "sleep": 0.5,
                },
                "tune_config": {"metric": "loss", "mode": "min", "max_concurrent_trials": 1},  # one dies, the other not
                "run_config": {"name": "tiny", "stop": {"training_iteration": 3}, "verbose": 0},
            }
        )
    )
    storage = tmp_path / "results"
    path = storage / "tiny"
    running = subprocess.Popen(
        [STAGETREE, "run", spec, "--storage-path", storage, "--address", address],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=environment(),
    )
    # While it runs, status reads the trial folders as they stand.
    while running.poll() is None and not list(path.glob("*/result.json")):
        time.sleep(0.2)
    assert main(["status", str(path)]) == 0
    assert "running, or stopped before its end" in capsys.readouterr().out
    output = running.communicate(timeout=300)[0]
    ran = subprocess.CompletedProcess(running.args, running.returncode, output, "")
    assert ran.returncode == 1, ran.stdout
    assert "2 trials: 1 finished, 1 errors" in ran.stdout
    assert f"experiment: {path}" in ran.stdout

    # Inspection reads files only: run in this process, as the run's subprocess left them.
    assert main(["status", str(path)]) == 0
    status = capsys.readouterr().out
    assert "ended" in status and "1 ERROR, 1 TERMINATED" in status and "best (min loss):" in status
    assert main(["show", str(path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert sorted(trial["status"] for trial in shown["trials"]) == ["ERROR", "TERMINATED"]
    assert {trial["config"]["lr"]["init"] for trial in shown["trials"]} == {0.1, 0.2}
    assert main(["ls", str(storage)]) == 0
    listed = capsys.readouterr().out
    assert "tiny" in listed and "ended" in listed and "loss=" in listed

    restored = stagetree("restore", path, "--resume-errored", "--address", address)
    assert restored.returncode == 0, restored.stdout + restored.stderr
    assert "2 trials: 2 finished, 0 errors" in restored.stdout
    assert main(["show", str(path), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert [trial["status"] for trial in shown["trials"]] == ["TERMINATED", "TERMINATED"]
    assert all(trial["iterations"] == 3 for trial in shown["trials"])
    assert main(["plan", str(spec), "--cost-from", str(path)]) == 0
    assert f"seconds per iteration fitted to {path}" in capsys.readouterr().out


def _noop(config):
    pass


def test_restore_uses_only_a_job_file_this_experiment_sealed(tmp_path, monkeypatch):
    """stagetree_job.json names code to import: `stagetree restore` uses it
    only when the experiment's key verifies it, or the folder is trusted."""
    from types import SimpleNamespace

    from ray_stagetree.cli import CommandError, _save_job, _saved_job

    data = {"trainable": "trainables_for_tests:noisy_descent", "param_space": {"lr": 0.1}}
    spec = SimpleNamespace(data=data, base_dir=str(tmp_path), source=str(tmp_path / "job.yaml"))
    study = tmp_path / "study"
    study.mkdir()
    _save_job(str(study), spec)
    assert _saved_job(str(study)).data["trainable"] == "trainables_for_tests:noisy_descent"

    job_file = study / "stagetree_job.json"
    edited = json.loads(job_file.read_text())
    edited["base_dir"] = "/somewhere/else"
    job_file.write_text(json.dumps(edited))
    with pytest.raises(CommandError, match="not authenticated by this experiment's key.*--spec"):
        _saved_job(str(study))

    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "stagetree_job.json").write_text(json.dumps({**data, "spec": data, "source": "x", "seal": "00"}))
    with pytest.raises(CommandError, match="not authenticated"):
        _saved_job(str(planted))

    monkeypatch.setenv("RAY_STAGETREE_TRUST_STORAGE", "1")
    assert _saved_job(str(study)).base_dir == "/somewhere/else", "a trusted folder's file is used as it is"


def test_stagetree_restore_of_a_planted_job_file_runs_nothing(tmp_path, capsys, monkeypatch):
    """Issue 30 point 3, as an attacker plants it: a job file beside a real
    study whose trainable is a module of the attacker's folder. Nothing is
    imported, nothing goes on sys.path, and the message names the remedy."""
    monkeypatch.delenv("RAY_STAGETREE_TRUST_STORAGE", raising=False)
    from ray import tune

    from ray_stagetree import Tuner

    Tuner(
        _noop,
        run_config=tune.RunConfig(name="study", storage_path=str(tmp_path), verbose=0),
    )
    attacker = tmp_path / "attacker"
    attacker.mkdir()
    marker = tmp_path / "ran"
    (attacker / "planted_module.py").write_text(f"open({str(marker)!r}, 'w').write('ran')\ndef train(config): pass\n")
    job = {"spec": {"trainable": "planted_module:train", "param_space": {}}, "base_dir": str(attacker), "source": "x"}
    (tmp_path / "study" / "stagetree_job.json").write_text(json.dumps({**job, "seal": "0" * 64}))
    path_before = list(sys.path)
    assert main(["restore", str(tmp_path / "study")]) == 2
    assert "not authenticated by this experiment's key" in capsys.readouterr().err
    assert not marker.exists() and "planted_module" not in sys.modules
    assert sys.path == path_before
