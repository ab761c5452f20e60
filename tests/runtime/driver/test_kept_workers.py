"""A driver's next study runs on the stage workers its last one ended with
(`runtime.driver.kept_workers`): the same results as on new ones, and the
workers' resources go back as soon as anything else waits for them, after
RAY_STAGETREE_KEEP_WORKERS_S, or when the next study cannot run on them."""

import importlib.util
import os
import sys
import time

import ray
from ray import tune
from trainables_for_tests import noisy_descent, ray_processes

from ray_stagetree import MultiStep, Tuner
from ray_stagetree.runtime.workers.kept_process import modules_changed_since

STAGE_WORKER = "ray::StageWorker"
LRS = [MultiStep(0.05, [2], 0.1), 0.02]


def fit(tmp_path, name, trainable=noisy_descent):
    return Tuner(
        trainable,
        param_space={"lr": tune.grid_search(LRS)},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(name=name, storage_path=str(tmp_path), stop={"training_iteration": 4}, verbose=0),
    ).fit()


def losses(grid):
    assert grid.num_errors == 0
    return {repr(result.config["lr"]): result.metrics_dataframe["loss"].tolist() for result in grid}


def stage_workers(expected=None):
    """This session's stage worker processes (once they are ``expected`` in number: ray.kill ends them a moment later)."""
    deadline = time.monotonic() + 60
    found = set(ray_processes(STAGE_WORKER))
    while expected is not None and len(found) != expected and time.monotonic() < deadline:
        time.sleep(0.2)
        found = set(ray_processes(STAGE_WORKER))
    return found


def test_a_drivers_next_study_runs_on_its_last_studys_workers_with_the_results_of_new_ones(tmp_path, ray_session):
    first = losses(fit(tmp_path, "first"))
    kept = stage_workers()  # each that Ray had placed by the study's end (on a loaded machine one may do both trials)
    assert kept, "the workers are kept for the next study"
    assert losses(fit(tmp_path, "next")) == first
    assert kept <= stage_workers(), "the next study ran on them, and they are kept again"


def test_kept_workers_give_their_resources_back_to_whatever_waits_for_them(tmp_path, ray_session):
    fit(tmp_path, "before_a_task")
    assert stage_workers()

    @ray.remote(num_cpus=2)
    def takes_every_cpu():
        return "ran"

    # The workers hold the session's CPUs: the task runs once they are given back.
    assert ray.get(takes_every_cpu.remote(), timeout=60) == "ran"
    assert stage_workers(expected=0) == set()


def test_no_workers_are_kept_with_keep_workers_s_zero_and_none_past_it(tmp_path, ray_session, monkeypatch):
    monkeypatch.setenv("RAY_STAGETREE_KEEP_WORKERS_S", "0")
    fit(tmp_path, "keeps_none")
    assert stage_workers(expected=0) == set()
    monkeypatch.setenv("RAY_STAGETREE_KEEP_WORKERS_S", "1")
    fit(tmp_path, "keeps_a_second")
    time.sleep(1)
    assert stage_workers(expected=0) == set()


def test_a_study_asking_for_other_resources_starts_workers_of_its_own(tmp_path, ray_session):
    fit(tmp_path, "on_cpus")
    kept = stage_workers()
    on_gpus = fit(tmp_path, "on_gpus", tune.with_resources(noisy_descent, {"cpu": 1, "gpu": 1}))
    assert len(on_gpus) == 2 and on_gpus.num_errors == 0
    assert not stage_workers() & kept, "the CPU study's workers were stopped, not given GPUs they do not see"


def reads_an_edited_module(config):
    """Reports VALUE of the module at ``config["module"]``, imported once per process as a notebook's helper is."""
    if "edited_between_fits" not in sys.modules:
        spec = importlib.util.spec_from_file_location("edited_between_fits", config["module"])
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        sys.modules["edited_between_fits"] = module
    tune.report({"value": sys.modules["edited_between_fits"].VALUE})


def test_the_next_study_runs_a_module_edited_since_as_it_is_now(tmp_path, ray_session):
    module = tmp_path / "helper.py"
    module.write_text("VALUE = 1\n")

    def value():
        (result,) = Tuner(
            reads_an_edited_module,
            param_space={"module": str(module)},
            run_config=tune.RunConfig(storage_path=str(tmp_path), verbose=0),
        ).fit()
        return result.metrics["value"]

    assert value() == 1
    module.write_text("VALUE = 2\n")
    edited = time.time() + 2  # later than any process that imported it, whatever the file system's clock resolution
    os.utime(module, (edited, edited))
    assert value() == 2, "the worker that imported it before the edit was not kept for the next study"


def test_a_module_edited_after_a_worker_started_keeps_it_from_the_next_study(tmp_path, monkeypatch):
    module = tmp_path / "edited_between_fits.py"
    module.write_text("VALUE = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    started = time.time()
    import edited_between_fits  # noqa: F401

    try:
        assert not modules_changed_since(started)
        later = started + 5
        os.utime(module, (later, later))
        assert modules_changed_since(started)
    finally:
        sys.modules.pop("edited_between_fits", None)
