"""A Ray upgrade that drops a private field an adapter reads fails clearly:
the field, the scheduler and the Ray versions tested are named."""

import inspect
import os
import shutil

import pytest
import ray
from ray import tune
from ray.tune.schedulers import ASHAScheduler, HyperBandScheduler, PopulationBasedTraining

from ray_stagetree.trial_schedulers.host import SchedulerHost
from ray_stagetree.trial_schedulers.ray_fields import TESTED_WITH, RayFieldMissing, ray_field
from ray_stagetree.trial_schedulers.registry import scheduler_max_t

HORIZON = 16


def missing(field: str, owner: str, scheduler: str):
    """What the error says for ``owner``'s missing ``field``."""
    return pytest.raises(
        RayFieldMissing,
        match=rf"hosts {scheduler} by reading {owner}\.{field}, a private field of Ray Tune that Ray "
        rf"{ray.__version__} does not have; the adapter was tested against Ray {', '.join(TESTED_WITH)}",
    )


def test_the_accessor_reads_a_field_or_names_what_is_missing():
    scheduler = ASHAScheduler(max_t=5)
    assert ray_field(scheduler, "_max_t", scheduler) == 5
    with missing("_no_such_field", "AsyncHyperBandScheduler", "AsyncHyperBandScheduler"):
        ray_field(scheduler, "_no_such_field", scheduler)


def test_asha_without_its_trial_info():
    host = SchedulerHost(ASHAScheduler(max_t=HORIZON, grace_period=1), "loss", "min", HORIZON)
    host.on_add("t", {})
    del host.scheduler._trial_info
    with missing("_trial_info", "AsyncHyperBandScheduler", "AsyncHyperBandScheduler"):
        host.next_decision("t", 0)


def test_asha_brackets_without_rungs():
    host = SchedulerHost(ASHAScheduler(max_t=HORIZON, grace_period=1), "loss", "min", HORIZON)
    host.on_add("t", {})
    del host.scheduler._trial_info["t"]._rungs
    with missing("_rungs", "_Bracket", "AsyncHyperBandScheduler"):
        host.next_decision("t", 0)


def test_hyperband_brackets_without_their_milestone():
    host = SchedulerHost(HyperBandScheduler(max_t=HORIZON), "loss", "min", HORIZON)
    host.on_add("t", {})
    for bracket, _ in host.scheduler._trial_info.values():
        del bracket._cumul_r
    with missing("_cumul_r", "_Bracket", "HyperBandScheduler"):
        host.next_decision("t", 0)


def test_max_t_missing():
    scheduler = HyperBandScheduler(max_t=HORIZON)
    del scheduler._max_t_attr
    with missing("_max_t_attr", "HyperBandScheduler", "HyperBandScheduler"):
        scheduler_max_t(scheduler)


def test_time_attr_missing_fails_when_the_study_starts():
    scheduler = ASHAScheduler(max_t=HORIZON)
    del scheduler._time_attr
    with missing("_time_attr", "AsyncHyperBandScheduler", "AsyncHyperBandScheduler"):
        SchedulerHost(scheduler, "loss", "min", HORIZON)


def pbt():
    return PopulationBasedTraining(time_attr="training_iteration", hyperparam_mutations={"lr": tune.uniform(0, 1)})


@pytest.mark.parametrize("field", ["_synch", "_perturbation_interval", "_custom_explore_fn"])
def test_pbt_settings_missing(field):
    scheduler = pbt()
    delattr(scheduler, field)
    with missing(field, "PopulationBasedTraining", "PopulationBasedTraining"):
        SchedulerHost(scheduler, "loss", "min", HORIZON)


def test_pbt_explore_function_missing(monkeypatch):
    from ray.tune.schedulers import pbt as ray_pbt

    monkeypatch.delattr(ray_pbt, "_explore")
    with missing("_explore", "ray.tune.schedulers.pbt", "PopulationBasedTraining"):
        SchedulerHost(pbt(), "loss", "min", HORIZON)


# The fields the runtime and the simulator read, one test each, on the installed Ray.


def test_with_resources_keeps_the_request_where_the_runtime_reads_it():
    from ray_stagetree.trial_schedulers.ray_fields import trainable_resources

    def wrapped(config):
        pass

    def plain(config):
        pass

    assert trainable_resources(tune.with_resources(wrapped, {"cpu": 2, "gpu": 1})).required_resources == {
        "CPU": 2.0,
        "GPU": 1.0,
    }
    assert trainable_resources(plain) is None


def test_a_searchers_metric_is_where_the_runtime_reads_it():
    from ray.tune.search import BasicVariantGenerator
    from ray.tune.search.optuna import OptunaSearch

    from ray_stagetree.trial_schedulers.ray_fields import searcher_metric

    assert searcher_metric(OptunaSearch(metric="loss", mode="min")) == "loss"
    assert searcher_metric(OptunaSearch(metric=["loss", "gain"], mode=["min", "max"])) == ["loss", "gain"]
    assert searcher_metric(ASHAScheduler(metric="acc", mode="max")) == "acc"
    assert searcher_metric(BasicVariantGenerator()) is None


def test_tunes_session_test_answers_outside_a_trial():
    from ray_stagetree.trial_schedulers.ray_fields import in_tune_session

    assert in_tune_session() is False


def test_the_bootstrap_address_is_none_with_no_cluster_to_join(monkeypatch):
    from ray._private import services

    from ray_stagetree.trial_schedulers.ray_fields import bootstrap_address

    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    monkeypatch.setattr(services, "find_bootstrap_address", lambda temp_dir=None: None)
    assert bootstrap_address() is None
    monkeypatch.setenv("RAY_ADDRESS", "10.0.0.1:6379")
    assert bootstrap_address() == "10.0.0.1:6379"


def test_hyperbands_bracket_class_builds_a_bracket():
    from ray_stagetree.trial_schedulers.ray_fields import hyperband_bracket_class

    bracket = hyperband_bracket_class()(
        time_attr="training_iteration", max_trials=3, init_t_attr=1, max_t_attr=9, eta=3, s=2
    )
    assert bracket._cumul_r == 1


def test_a_maximum_iteration_stoppers_limit():
    from ray.tune.stopper import MaximumIterationStopper

    from ray_stagetree.trial_schedulers.ray_fields import maximum_iterations

    assert maximum_iterations(MaximumIterationStopper(7)) == 7


def test_a_variant_generators_settings_draw_as_it_draws():
    import numpy as np
    from ray.tune.search import BasicVariantGenerator

    from ray_stagetree.trial_schedulers.ray_fields import variant_generator_settings

    settings = variant_generator_settings(
        BasicVariantGenerator(random_state=3, constant_grid_search=True, points_to_evaluate=[{"a": 1}])
    )
    assert isinstance(settings["seed"], np.random.Generator)
    assert settings["constant_grid_search"] is True and settings["points_to_evaluate"] == [{"a": 1}]
    assert variant_generator_settings(BasicVariantGenerator())["seed"] is None


def test_a_registered_function_is_found_in_its_wrapper():
    from ray.tune.registry import get_trainable_cls

    from ray_stagetree.trial_schedulers.ray_fields import registered_function

    def train_loop(config):
        pass

    tune.register_trainable("stagetree_ray_fields_loop", train_loop)
    found = registered_function(get_trainable_cls("stagetree_ray_fields_loop"))
    assert callable(found) and found.__name__ == "train_loop"  # the registry keeps a copy


def test_tunes_config_interface_is_what_tune_takes_as_a_param_space():
    from ray_stagetree.trial_schedulers.ray_fields import config_interface

    class Space(config_interface()):
        def to_dict(self):
            return {"lr": 0.1}

    assert Space().to_dict() == {"lr": 0.1}


def test_tunes_checkpoint_manager_holds_the_checkpoints_as_given(tmp_path):
    from ray_stagetree.trial_schedulers.ray_fields import tune_checkpoint_manager

    folders = [tmp_path / f"checkpoint_00000{i}" for i in range(3)]
    for folder in folders:
        folder.mkdir()
    ranked = [(tune.Checkpoint(str(folder)), {"score": score}) for folder, score in zip(folders, (3, 1, 2))]
    config = tune.CheckpointConfig(num_to_keep=1)  # registering would delete two folders
    manager = tune_checkpoint_manager(config, ranked, ranked[1])
    assert [result.checkpoint.path for result in manager.best_checkpoint_results] == [str(folders[-1])]  # best last
    assert manager.latest_checkpoint_result.metrics == {"score": 1}
    assert all(folder.exists() for folder in folders)
    assert tune_checkpoint_manager(config, [], None).latest_checkpoint_result is None


def test_a_scaling_configs_per_worker_resources_are_ray_trains():
    from ray.train import ScalingConfig

    from ray_stagetree.trial_schedulers.ray_fields import scaling_resources_per_worker

    assert scaling_resources_per_worker(ScalingConfig(num_workers=2)) == {"CPU": 1}
    assert scaling_resources_per_worker(ScalingConfig(num_workers=2, use_gpu=True)) == {"GPU": 1}
    per_worker = {"CPU": 0.5, "GPU": 0}
    assert scaling_resources_per_worker(ScalingConfig(num_workers=2, resources_per_worker=per_worker)) == {"CPU": 0.5}


def test_a_legacy_trainers_loop_and_config_are_where_the_tuner_reads_them():
    from ray.train.data_parallel_trainer import DataParallelTrainer

    from ray_stagetree.trial_schedulers.ray_fields import legacy_train_loop

    def loop(config):
        pass

    # The legacy class's constructor refuses to run under Train v2 (the default): it sets the fields it reads,
    source = inspect.getsource(DataParallelTrainer.__init__)
    assert "self._train_loop_per_worker = " in source and "self._train_loop_config = " in source
    trainer = DataParallelTrainer.__new__(DataParallelTrainer)
    trainer._train_loop_per_worker, trainer._train_loop_config = loop, {"a": 1}
    assert legacy_train_loop(trainer) == (loop, {"a": 1})
    with pytest.raises(RayFieldMissing, match="_train_loop_per_worker"):
        legacy_train_loop(object())


def test_a_stage_worker_counts_as_a_tune_session_for_rays_integrations(monkeypatch):
    from ray.tune.trainable import trainable_fn_utils

    from ray_stagetree.trial_schedulers.ray_fields import in_tune_session, treat_as_tune_session

    monkeypatch.setattr(trainable_fn_utils, "_in_tune_session", trainable_fn_utils._in_tune_session)
    in_stage = [False]
    treat_as_tune_session(lambda: in_stage[0])
    assert not in_tune_session()
    in_stage[0] = True
    assert in_tune_session()


def test_a_class_trainables_iteration_is_set_where_train_reads_it():
    from ray_stagetree.trial_schedulers.ray_fields import set_trainable_iteration

    class Counting(tune.Trainable):
        def step(self):
            return {"seen": self.iteration}

    trainable = Counting(config={})
    try:
        set_trainable_iteration(trainable, 7)
        assert trainable.iteration == 7
        assert trainable.train()["training_iteration"] == 8
    finally:
        trainable.stop()


def test_tunes_storage_names_filesystems_and_json_as_tune_does(tmp_path):
    import json

    import numpy as np
    import pyarrow.fs

    from ray_stagetree.trial_schedulers.ray_fields import (
        arrow_filesystem_of,
        deprecated_default,
        json_encoder_class,
        storage_context_class,
    )

    assert storage_context_class().get_experiment_dir_name("train_fn").startswith("train_fn_")
    assert isinstance(arrow_filesystem_of(str(tmp_path), None), pyarrow.fs.LocalFileSystem)
    assert json.loads(json.dumps({"loss": np.float32(0.5), "n": np.int64(3)}, cls=json_encoder_class())) == {
        "loss": 0.5,
        "n": 3,
    }
    assert tune.TuneConfig().chdir_to_trial_dir == deprecated_default()
    assert tune.TuneConfig(chdir_to_trial_dir=False).chdir_to_trial_dir != deprecated_default()


def test_tunes_artifacts_folder_is_in_the_ray_session(ray_session):
    from ray_stagetree.trial_schedulers.ray_fields import ray_artifacts_folder

    folder = ray_artifacts_folder()
    assert os.path.basename(folder) == "artifacts"
    assert os.path.basename(os.path.dirname(folder)).startswith("session_")


def test_a_trainable_made_in_a_trial_folder_takes_it_as_its_logdir(tmp_path, monkeypatch):
    from ray_stagetree.trial_schedulers.ray_fields import use_trial_logdir

    class Plain(tune.Trainable):
        def step(self):
            return {}

    monkeypatch.setattr(tune.Trainable, "_setup_logdir", tune.Trainable._setup_logdir)
    folder = [str(tmp_path)]
    use_trial_logdir(tune.Trainable, lambda: folder[0])
    inside = Plain(config={})
    folder[0] = None
    outside = Plain(config={})  # outside a trial folder: Tune's own temporary folder
    try:
        assert inside.logdir == str(tmp_path)
        assert outside.logdir != str(tmp_path) and os.path.isdir(outside.logdir)
    finally:
        inside.stop()
        outside.stop()
        shutil.rmtree(outside.logdir, ignore_errors=True)
