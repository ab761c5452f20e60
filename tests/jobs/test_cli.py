"""The ``stagetree`` command line, run as users run it: in a subprocess,
checking exit codes, stdout and stderr."""

import json
import os
import re
import subprocess
import sys
import time
from types import SimpleNamespace

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


def test_version_names_the_package_and_its_version(capsys):
    import ray_stagetree

    with pytest.raises(SystemExit) as raised:
        main(["--version"])
    assert raised.value.code == 0
    assert capsys.readouterr().out.strip() == f"stagetree (ray_stagetree) {ray_stagetree.__version__}"


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
    result = stagetree("monitor", tmp_path / "nothing", "--wait", "0.5")
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
    # The figures the docs give for this study (docs/guides/cli.md): 14 trials, 130 unique epochs of 224 (merge rate 1.72).
    assert (figures["trials"], figures["unique_iterations"], figures["trial_by_trial_iterations"]) == (14, 130, 224)
    assert figures["merge_rate"] == pytest.approx(224 / 130) and figures["stages"] == 21
    assert figures["worker_hours"] == pytest.approx(130 * 2 / 3600)
    assert figures["trial_by_trial_worker_hours"] == pytest.approx(224 * 2 / 3600)
    assert figures["makespan_bound_hours"] == pytest.approx(max(16 * 2, 130 * 2 / 4) / 3600)
    drawn = picture.read_text()
    # The picture is labelled: each stage's id, hyper-parameters and trials, as the monitor names them.
    assert "<svg" in drawn and "H0:0-8 batch_size=128 lr=0.1 seed=0 \u00d78" in drawn
    assert len(re.findall(r"H\d+:\d+-\d+ ", drawn)) == figures["stages"]
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


@pytest.mark.long
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
    # While it runs, status reads what its driver last wrote.
    while running.poll() is None and not list(path.glob("*/result.json")):
        time.sleep(0.2)
    assert main(["status", str(path)]) == 0
    assert ": running" in capsys.readouterr().out
    output = running.communicate(timeout=300)[0]
    ran = subprocess.CompletedProcess(running.args, running.returncode, output, "")
    assert ran.returncode == 1, ran.stdout
    assert "2 trials: 1 finished, 1 errors" in ran.stdout
    assert f"experiment: {path}" in ran.stdout

    # Inspection reads files only: run in this process, as the run's subprocess left them.
    assert main(["status", str(path)]) == 0
    status = capsys.readouterr().out
    assert "ended" in status and "1 ERROR, 1 TERMINATED" in status and "best (min loss, last result):" in status
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

    # The same spec again: refused (before Ray), then --resume continues the ended study (nothing left to
    # train) and --overwrite starts it over; neither mixes two runs' trials.
    assert main(["run", str(spec), "--storage-path", str(storage), "--address", address]) == 2
    assert "already holds an experiment of this name" in capsys.readouterr().err
    resumed = stagetree("run", spec, "--storage-path", storage, "--address", address, "--resume")
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"stagetree: continuing {path}" in resumed.stdout and "2 trials: 2 finished, 0 errors" in resumed.stdout
    again = stagetree("run", spec, "--storage-path", storage, "--address", address, "--overwrite")
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"deleted the earlier experiment in {path} (--overwrite)" in again.stdout
    assert "2 trials: 2 finished, 0 errors" in again.stdout  # the marker is there: no trial dies this time
    assert (
        "best (min loss, last result):" in again.stdout
        and "  config: die_once_at=2, lr=Exponential(init=0." in again.stdout
    )


def _noop(config):
    pass


def test_restore_uses_only_a_job_file_this_experiment_sealed(tmp_path, monkeypatch):
    """stagetree_job.json names code to import: `stagetree restore` uses it
    only when the experiment's key verifies it, or the folder is trusted."""
    from types import SimpleNamespace

    from ray_stagetree.cli.common import CommandError, save_job, saved_job

    data = {"trainable": "trainables_for_tests:noisy_descent", "param_space": {"lr": 0.1}}
    spec = SimpleNamespace(data=data, base_dir=str(tmp_path), source=str(tmp_path / "job.yaml"))
    study = tmp_path / "study"
    study.mkdir()
    save_job(str(study), spec)
    assert saved_job(str(study)).data["trainable"] == "trainables_for_tests:noisy_descent"

    job_file = study / "stagetree_job.json"
    edited = json.loads(job_file.read_text())
    edited["base_dir"] = "/somewhere/else"
    job_file.write_text(json.dumps(edited))
    with pytest.raises(CommandError, match="not authenticated by this experiment's key.*--spec"):
        saved_job(str(study))

    planted = tmp_path / "planted"
    planted.mkdir()
    (planted / "stagetree_job.json").write_text(json.dumps({**data, "spec": data, "source": "x", "seal": "00"}))
    with pytest.raises(CommandError, match="not authenticated"):
        saved_job(str(planted))

    monkeypatch.setenv("RAY_STAGETREE_TRUST_STORAGE", "1")
    assert saved_job(str(study)).base_dir == "/somewhere/else", "a trusted folder's file is used as it is"


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


# -- a second run, the summary, status without a path, restore hints, extras (issue 33) ---------


TINY_SPEC = {
    "trainable": "trainables_for_tests:noisy_descent",
    "param_space": {"lr": {"grid_search": [0.1, 0.2]}},
    "tune_config": {"metric": "loss", "mode": "min"},
    "run_config": {"name": "tiny", "stop": {"training_iteration": 3}, "verbose": 0},
}


def fake_study(folder, trials, finished=True, metric="loss", mode="min"):
    """An experiment folder as a study leaves it, without running one: the
    Tuner's files and one trial folder per ``trials`` entry (its losses)."""
    folder.mkdir(parents=True)
    (folder / "stagetree_tuner.pkl").write_bytes(b"settings")
    (folder / "stagetree_study.json").write_text(json.dumps({"metric": metric, "mode": mode}))
    for name, losses in trials.items():
        (folder / name).mkdir()
        (folder / name / "params.json").write_text(json.dumps({"lr": 0.1}))
        rows = [
            {"training_iteration": i + 1, metric: loss, "trial_id": name, "done": finished and i + 1 == len(losses)}
            for i, loss in enumerate(losses)
        ]
        (folder / name / "result.json").write_text("".join(json.dumps(row) + "\n" for row in rows))
    return folder


def test_a_second_run_refuses_the_first_ones_folder_and_offers_resume_and_overwrite(tmp_path, capsys):
    """Never a silent merge into an experiment of the same name (its trials
    would count with the new ones); refused before Ray starts."""
    spec = tmp_path / "tiny.yaml"
    spec.write_text(yaml.safe_dump(TINY_SPEC))
    storage = tmp_path / "results"
    fake_study(storage / "tiny", {"t0": [1.0, 0.5]})
    before = sorted(path.name for path in (storage / "tiny").iterdir())
    result = stagetree("run", spec, "--storage-path", storage)
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr
    assert f"{storage / 'tiny'} already holds an experiment of this name" in result.stderr
    assert f"--resume to continue it (as `stagetree restore {storage / 'tiny'}` does)" in result.stderr
    assert "--overwrite to delete it and start again, or --name with another folder name" in result.stderr
    assert sorted(path.name for path in (storage / "tiny").iterdir()) == before

    # Files that are not an experiment are neither merged into nor deleted.
    other = tmp_path / "other"
    (other / "tiny").mkdir(parents=True)
    (other / "tiny" / "notes.txt").write_text("mine")
    for flags in ([], ["--overwrite"]):
        assert main(["run", str(spec), "--storage-path", str(other), *flags]) == 2
        assert "holds files that are not a ray_stagetree experiment" in capsys.readouterr().err
    assert (other / "tiny" / "notes.txt").read_text() == "mine"
    with pytest.raises(SystemExit) as raised:
        main(["run", str(spec), "--resume", "--overwrite"])
    assert raised.value.code == 2 and "not allowed with argument" in capsys.readouterr().err


class FakeResults(list):
    """What `finish` reads of a ResultGrid."""

    def __init__(self, count, path, best):
        super().__init__(range(count))
        self.experiment_path, self._best = str(path), best
        self.iterations_executed, self.trial_by_trial_iterations = 30, 60

    def get_best_result(self):
        return self._best


def test_the_run_summary_counts_no_negative_trials_and_names_the_best_config(tmp_path, capsys):
    from ray_stagetree import Exponential
    from ray_stagetree.cli.common import finish

    study = fake_study(tmp_path / "study", {f"t{i}": [1.0, 0.5 - i / 100] for i in range(20)})
    best = SimpleNamespace(path=str(study / "t19"), metrics={"loss": 0.31}, config={"lr": Exponential(0.1, 0.9)})
    assert finish(FakeResults(14, study, best), SimpleNamespace(metric="loss", mode="min")) == 0
    out = capsys.readouterr().out
    assert "20 trials: 20 finished, 0 errors\n" in out and "-" not in out.split("trials:")[1].split("\n")[0]
    assert "best (min loss, last result): 0.31 in t19\n  config: lr=Exponential(init=0.1, gamma=0.9)" in out
    assert "iterations executed: 30; trial by trial: 60" in out


def test_an_interrupted_run_says_its_figures_are_partial(tmp_path, capsys):
    from ray_stagetree.cli.common import INTERRUPTED, finish

    study = fake_study(tmp_path / "study", {"t0": [1.0, 0.5], "t1": [0.9]}, finished=False)
    best = SimpleNamespace(path=str(study / "t1"), metrics={"loss": 0.9}, config={"lr": 0.1})
    assert finish(FakeResults(2, study, best), SimpleNamespace(metric="loss", mode="min")) == INTERRUPTED
    out = capsys.readouterr().out
    assert "2 trials: 0 finished, 0 errors, 2 unfinished" in out
    assert "iterations executed so far: 30 (partial: the study stopped before its end)" in out
    assert "trial by trial" not in out and "fewer" not in out
    assert f"stopped early: stagetree restore {study} continues it" in out


def test_status_without_a_path_shows_the_latest_study(tmp_path, capsys, monkeypatch):
    import ray.train.constants

    older = fake_study(tmp_path / "older", {"t0": [1.0]})
    newer = fake_study(tmp_path / "newer", {"t0": [2.0, 0.2]})
    os.utime(older / "t0" / "result.json", (time.time() + 60, time.time() + 60))  # updated last
    assert main(["status", "--storage-path", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"{older}: ") and "best (min loss, last result): 1" in out
    os.utime(newer / "t0" / "result.json", (time.time() + 120, time.time() + 120))
    monkeypatch.setattr(ray.train.constants, "DEFAULT_STORAGE_PATH", str(tmp_path))  # where `run` puts studies
    assert main(["status"]) == 0 and capsys.readouterr().out.startswith(f"{newer}: ")
    assert main(["show"]) == 0 and f"{newer}: " in capsys.readouterr().out
    assert main(["status", "--storage-path", str(tmp_path / "empty")]) == 2
    assert "pass an experiment folder, or --storage-path" in capsys.readouterr().err


def test_a_cli_study_says_stagetree_restore_and_a_script_tuner_restore():
    from ray_stagetree.cli.common import fit
    from ray_stagetree.runtime.driver.run import how_to_continue

    tuner = SimpleNamespace(fit=lambda: how_to_continue("/studies/my study"))
    assert fit(tuner) == "stagetree restore '/studies/my study'"
    assert tuner.fit() == "Tuner.restore('/studies/my study', trainable)"


def without_module(tmp_path, name):
    """A PYTHONPATH entry on which ``import name`` fails, as where it is not installed."""
    folder = tmp_path / f"without_{name}"
    (folder / name).mkdir(parents=True)
    message = f"No module named {name!r}"
    (folder / name / "__init__.py").write_text(f"raise ModuleNotFoundError({message!r}, name={name!r})\n")
    return str(folder)


def test_features_without_their_extra_name_it(tmp_path, capsys, monkeypatch):
    study = fake_study(tmp_path / "study", {"t0": [1.0]})
    env = environment()
    env["PYTHONPATH"] = os.pathsep.join([without_module(tmp_path, "werkzeug"), env["PYTHONPATH"]])
    result = subprocess.run(
        [STAGETREE, "monitor", str(study), "--port", "0"], capture_output=True, text=True, env=env, timeout=300
    )
    assert result.returncode == 1 and "Traceback" not in result.stderr, result.stderr
    expected = 'stagetree monitor needs werkzeug, which is not installed: pip install "ray_stagetree[monitor]"'
    assert expected in result.stderr

    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now fails
    spec = os.path.join(EXAMPLES, "mnist1d_study.yaml")
    assert main(["plan", spec, "--draw", str(tmp_path / "tree.svg")]) == 1
    assert 'stagetree plan --draw needs matplotlib, which is not installed: pip install "ray_stagetree[monitor]"' in (
        capsys.readouterr().err
    )


def test_submit_to_a_cluster_that_wants_a_token_says_how_to_give_it(monkeypatch, capsys):
    import ray.job_submission
    from ray.exceptions import AuthenticationError

    def refused(address):
        raise AuthenticationError("Authentication required: Unauthorized: Missing authentication token")

    monkeypatch.setattr(ray.job_submission, "JobSubmissionClient", refused)
    spec = os.path.join(EXAMPLES, "mnist1d_study.yaml")
    assert main(["submit", spec, "--address", "http://127.0.0.1:9", "--working-dir", EXAMPLES]) == 1
    err = capsys.readouterr().err
    assert "the cluster asks for its token. Set RAY_AUTH_MODE=token here" in err
    assert "RAY_AUTH_TOKEN" in err and "ray get-auth-token" in err
