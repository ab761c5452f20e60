"""``tune.with_parameters`` objects stay resident on a stage worker
(`runtime.workers.parameters`): each batch it runs gets the object the
first one got, not another copy out of the object store."""

import os

from ray import tune
from trainables_for_tests import report_step, restored_step

from ray_stagetree import MultiStep, Tuner
from ray_stagetree.planning.plan import SearchPlan
from ray_stagetree.runtime.workers.parameters import ResidentObjects


def test_an_object_is_got_once_and_the_least_recently_used_goes_first():
    got = []

    def get(ref):
        got.append(ref)
        return [ref]  # a fresh object per get, as a deserialized one is

    resident = ResidentObjects(get, size=2)
    first = resident.get("a")
    assert resident.get("a") is first and got == ["a"]
    resident.get("b")
    resident.get("a")  # "a" used after "b": "b" goes when a third comes
    resident.get("c")
    assert resident.get("a") is first
    resident.get("b")
    assert got == ["a", "b", "c", "b"]


def test_a_worker_lets_go_of_every_object_when_its_study_ends():
    got = []
    resident = ResidentObjects(lambda ref: got.append(ref) or [ref])
    first = resident.get("a")
    resident.clear()  # StageWorker.close: a kept worker's next study passes its own objects
    assert resident.get("a") is not first and got == ["a", "a"]


def forked(config, data):
    """Reports which object it got as ``data``, in which process; forks
    start from its checkpoint, each in a batch of its own."""
    step = restored_step()
    while True:
        step += 1
        report_step({"loss": sum(data) / step, "data_id": id(data), "pid": os.getpid()}, step)


def test_the_batches_a_worker_runs_share_one_copy_of_each_object(ray_session, tmp_path):
    results = Tuner(
        tune.with_parameters(forked, data=list(range(1000))),
        param_space={"lr": tune.grid_search([MultiStep(0.1, [1], gamma) for gamma in (0.1, 0.2, 0.3, 0.4)])},
        run_config=tune.RunConfig(storage_path=str(tmp_path), stop={"training_iteration": 3}, verbose=0),
    ).fit()
    assert not results.errors
    seen: dict[int, set[int]] = {}
    for result in results:
        frame = result.metrics_dataframe
        for pid, data_id in zip(frame["pid"], frame["data_id"]):
            seen.setdefault(pid, set()).add(data_id)
    assert all(len(ids) == 1 for ids in seen.values()), f"a worker got the object more than once: {seen}"
    runs = SearchPlan.load(f"{results.experiment_path}/plan").runs
    assert len(runs) > len(seen), "some worker ran several batches"
    assert results.phase_seconds.get("parameters", 0.0) > 0
