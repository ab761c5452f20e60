"""Job specs: every mistake is named before anything runs, and a spec builds
the study its Python twin builds (no Ray started)."""

import json
import os

import mnist1d_study
import pytest
import yaml
from ray import tune
from ray.tune.schedulers import AsyncHyperBandScheduler, MedianStoppingRule, PopulationBasedTraining
from ray.tune.search.optuna import OptunaSearch

from ray_stagetree import Exponential, MultiStep, Warmup
from ray_stagetree.jobs import JobSpec, SpecError, to_declarative, to_param_space
from ray_stagetree.runtime.driver.trial_sources import trial_source
from ray_stagetree.searchers import AskTellSearcher, generate_trials

EXAMPLES = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))), "examples")
MINIMAL = {
    "trainable": "trainables_for_tests:noisy_descent",
    "param_space": {"lr": {"family": "Exponential", "init": 0.1, "gamma": 0.9}},
    "tune_config": {"metric": "loss", "mode": "min"},
    "run_config": {"stop": {"training_iteration": 4}},
}


def spec_with(**changes):
    """MINIMAL with ``changes`` applied: ``{"tune_config.mode": "x"}``-style keys; None deletes."""
    data = json.loads(json.dumps(MINIMAL))
    for dotted, value in changes.items():
        *parents, last = dotted.split(".")
        node = data
        for key in parents:
            node = node.setdefault(key, {})
        if value is None:
            node.pop(last, None)
        else:
            node[last] = value
    return data


def problems_of(data):
    with pytest.raises(SpecError) as raised:
        JobSpec(data, base_dir=EXAMPLES)
    return raised.value.problems


# (spec changes, substrings every one of which the message must hold: the field, the value, what is allowed)
MALFORMED = [
    ({"trainable": None}, ["(top level): missing required key 'trainable'"]),
    ({"trainable": "no_colon"}, ["trainable: 'no_colon' is not allowed", "'module:function'"]),
    ({"trainable": 3}, ["trainable: must be a string, got 3"]),
    ({"trainable": "no_such_module_xyz:train"}, ["trainable:", "'no_such_module_xyz' cannot be imported"]),
    ({"trainable": "trainables_for_tests:no_such_function"}, ["trainable:", "has no attribute 'no_such_function'"]),
    ({"trainable": "missing_script.py:train"}, ["trainable:", "missing_script.py", "does not exist"]),
    ({"tune_cfg": {}}, ["(top level): unknown key 'tune_cfg' (did you mean 'tune_config'?); allowed:", "tune_config"]),
    ({"tune_config.mode": "minimize"}, ["tune_config.mode: 'minimize' is not allowed; allowed: 'min', 'max'"]),
    ({"tune_config.num_samples": 0}, ["tune_config.num_samples: 0 is not allowed", "an int >= 1, or -1"]),
    ({"tune_config.num_samples": "ten"}, ["tune_config.num_samples: must be an int, got 'ten'"]),
    ({"tune_config.time_budget_s": -5}, ["tune_config.time_budget_s: must be > 0, got -5"]),
    (
        {"tune_config.max_concurrent_trials": 0},
        ["tune_config.max_concurrent_trials: 0 is not allowed", "an int >= 1, or null"],
    ),
    (
        {"tune_config.scheduler": "ashaa"},
        ["tune_config.scheduler.name: unknown scheduler 'ashaa' (did you mean 'asha'?); allowed:", "asha", "pbt"],
    ),
    (
        {"tune_config.scheduler": {"name": "asha", "max_tt": 5}},
        [
            "tune_config.scheduler.max_tt: AsyncHyperBandScheduler has no argument 'max_tt' (did you mean 'max_t'?); "
            "allowed:",
            "max_t",
            "grace_period",
        ],
    ),
    (
        {"tune_config.scheduler": {"name": "asha", "reduction_factor": 1}},
        ["tune_config.scheduler.reduction_factor: 1 is not allowed: Reduction Factor not valid!"],
    ),
    (
        {"tune_config.scheduler": {"name": "asha", "max_t": "sixteen"}},
        ["tune_config.scheduler.max_t: 'sixteen' is not allowed; expected a number", "default 100"],
    ),
    ({"tune_config.scheduler": {"max_t": 5}}, ["tune_config.scheduler: {'max_t': 5} is not allowed", "{name: ..."]),
    (
        {"tune_config.search_alg": "nevergrad_es"},
        [
            "tune_config.search_alg.name: unknown searcher 'nevergrad_es' (did you mean 'nevergrad'?); allowed:",
            "optuna",
            "module:Class",
        ],
    ),
    (
        {"tune_config.search_alg": "trainables_for_tests:noisy_descent"},
        ["tune_config.search_alg.name:", "must be a ray.tune.search.Searcher or an AskTellAlgorithm subclass"],
    ),
    ({"run_config.stop.training_iteration": 0}, ["run_config.stop.training_iteration: must be >= 1, got 0"]),
    ({"run_config.stop.accuracy": "high"}, ["run_config.stop.accuracy: must be a number or true or false, got 'high'"]),
    (
        {"run_config.storage_path": "relative/results"},
        ["run_config.storage_path: must be an absolute path", "'relative/results'"],
    ),
    ({"run_config.name": "a/b"}, ["run_config.name: 'a/b' is not allowed; expected a folder name"]),
    (
        {"run_config.failure_config": {"max_failures": -2}},
        ["run_config.failure_config.max_failures: must be >= -1, got -2"],
    ),
    (
        {"run_config.checkpoint_config": {"checkpoint_score_order": "up"}},
        ["run_config.checkpoint_config.checkpoint_score_order: 'up' is not allowed; allowed: 'min', 'max'"],
    ),
    (
        {"run_config.checkpoint_config": {"num_to_keep": 0}},
        ["run_config.checkpoint_config.num_to_keep: 0 is not allowed"],
    ),
    (
        {"stagetree": {"execution_policy": "fastest"}},
        [
            "stagetree.execution_policy.name: unknown execution policy 'fastest'; allowed: bfs, critical_path, fifo, hermes, round_robin, slaq, thr, or an import path 'module:Class'"
        ],
    ),
    (
        {"stagetree": {"execution_policy": {"name": "round_robin", "quantum": 3}}},
        [
            "stagetree.execution_policy.quantum: RoundRobinPolicy has no argument 'quantum' (did you mean 'quantum_s'?)",
            "allowed:",
        ],
    ),
    (
        {"stagetree": {"execution_policy": "ray_stagetree.planning.stage_tree:Stage"}},
        [
            "stagetree.execution_policy.name: 'ray_stagetree.planning.stage_tree:Stage' must be an ExecutionPolicy subclass"
        ],
    ),
    ({"stagetree": {"stage_sharing": "yes"}}, ["stagetree.stage_sharing: must be true or false, got 'yes'"]),
    ({"resources": {"cpu": -1}}, ["resources.cpu: must be >= 0, got -1"]),
    ({"repeats": 0}, ["repeats: must be >= 1, got 0"]),
    ({"reproducible": "no"}, ["reproducible: must be true or false, got 'no'"]),
    ({"seed": -1}, ["seed: must be >= 0, got -1"]),
    ({"monitor": 1}, ["monitor: must be true or false, got 1"]),
    (
        {"with_parameters": {"data": {"call": "nocolon"}}},
        ["with_parameters.data: {'call': 'nocolon'} is not allowed", "{call: 'module:function'"],
    ),
    ({"param_space.lr": {"loguniform": [1e-4]}}, ["param_space.lr.loguniform:", "missing", "upper"]),
    (
        {"param_space.lr": {"loguniform": [0.1, 1e-4]}},
        ["param_space.lr.loguniform: lower must be < upper, got lower=0.1, upper=0.0001"],
    ),
    (
        {"param_space.lr": {"uniform": {"low": 0, "high": 1}}},
        ["param_space.lr.uniform: unknown argument(s) 'high', 'low' (did you mean 'lower'?); allowed: lower, upper"],
    ),
    ({"param_space.lr": {"choice": []}}, ["param_space.lr.choice: must be a non-empty list of values, got []"]),
    ({"param_space.lr": {"randint": ["a", 3]}}, ["param_space.lr.randint.lower: must be a finite number, got 'a'"]),
    (
        {"param_space.lr": {"family": "Expo", "init": 0.1}},
        ["param_space.lr.family: unknown sequence family 'Expo'; allowed:", "Exponential"],
    ),
    (
        {"param_space.lr": {"family": "Exponential", "init": 0.1, "gamma": -1}},
        ["param_space.lr: Exponential: gamma must be", "-1"],
    ),
    (
        {"param_space.lr": {"family": "Exponential", "init": {"uniform": [1, "x"]}, "gamma": 0.9}},
        ["param_space.lr.init.uniform.upper: must be a finite number, got 'x'"],
    ),
    ({"tune_config.metric": None, "tune_config.scheduler": "asha"}, ["AsyncHyperBandScheduler", "metric"]),
]


@pytest.mark.parametrize("changes,expected", MALFORMED, ids=[str(i) for i in range(len(MALFORMED))])
def test_a_malformed_spec_names_the_field_the_value_and_what_is_allowed(changes, expected):
    message = "\n".join(problems_of(spec_with(**changes)))
    for text in expected:
        assert text in message, f"{text!r} not in:\n{message}"


def test_every_problem_is_reported_at_once():
    problems = problems_of(spec_with(**{"tune_config.mode": "up", "run_config.verbose": 7, "extra": 1}))
    assert len(problems) == 3
    assert [problem.split(":")[0] for problem in problems] == ["(top level)", "run_config.verbose", "tune_config.mode"]


def test_a_spec_that_is_not_a_dict():
    assert problems_of(["trainable"]) == ["(top level): must be a dict, got ['trainable']"]


def test_file_errors_name_the_file_and_the_line(tmp_path):
    broken = tmp_path / "broken.yaml"
    broken.write_text("trainable: a:b\nparam_space: {lr: [1, 2}\n")
    with pytest.raises(SpecError, match=r"broken.yaml: 1 problem\n  not valid YAML: .* at line 2"):
        JobSpec.from_file(str(broken))
    broken_json = tmp_path / "broken.json"
    broken_json.write_text('{"trainable": }')
    with pytest.raises(SpecError, match="not valid JSON: .* at line 1, column 15"):
        JobSpec.from_file(str(broken_json))
    with pytest.raises(SpecError, match="cannot read the file"):
        JobSpec.from_file(str(tmp_path / "missing.yaml"))


def test_the_example_spec_draws_the_python_studys_trials():
    spec = JobSpec.from_file(os.path.join(EXAMPLES, "mnist1d_study.yaml"))
    from_spec = [config for _, config in iter(trial_source(spec.dry_tuner()).next_trial, None)]
    assert len(from_spec) == 14
    assert from_spec == generate_trials(mnist1d_study.param_space(), 1)
    tuner = spec.dry_tuner()
    assert tuner.horizon == mnist1d_study.EPOCHS
    assert (tuner.tune_config.metric, tuner.tune_config.mode) == ("accuracy", "max")
    assert spec.function is mnist1d_study.train_mnist1d


def test_a_python_space_written_as_a_spec_draws_the_same_trials():
    space = {
        "lr": tune.grid_search(
            [Exponential(tune.loguniform(1e-3, 1e-1), 0.9), Warmup(0.01, tune.randint(2, 6), MultiStep(0.1, [8], 0.1))]
        ),
        "batch_size": tune.choice([64, 128]),
        "momentum": tune.quniform(0.8, 0.99, 0.01),
        "width": tune.qlograndint(8, 64, 8),
        "noise": tune.qrandn(0.0, 1.0, 0.1),
        "optimizer": {"name": "sgd", "nesterov": True},
    }
    declarative = json.loads(json.dumps(to_declarative(space)))  # only JSON survives a file
    rebuilt, problems = to_param_space(declarative)
    assert problems == []
    assert generate_trials(rebuilt, 3, seed=7) == generate_trials(space, 3, seed=7)
    with pytest.raises(ValueError, match="no declarative form"):
        to_declarative({"x": tune.sample_from(lambda config: 1)})


def test_schedulers_and_searchers_by_name_are_tunes_own_with_their_arguments():
    spec = JobSpec(
        spec_with(
            **{
                "tune_config.scheduler": {"name": "asha", "max_t": 4, "grace_period": 2},
                "tune_config.search_alg": {"name": "optuna", "seed": 3},
            }
        ),
        base_dir=EXAMPLES,
    )
    assert isinstance(spec.tune_config.scheduler, AsyncHyperBandScheduler)
    assert spec.tune_config.scheduler._max_t == 4
    assert isinstance(spec.tune_config.search_alg, OptunaSearch)
    pbt = JobSpec(
        spec_with(
            **{
                "tune_config.scheduler": {
                    "name": "pbt",
                    "perturbation_interval": 2,
                    "hyperparam_mutations": {"momentum": {"uniform": [0.8, 0.99]}},
                }
            }
        ),
        base_dir=EXAMPLES,
    ).tune_config.scheduler
    assert isinstance(pbt, PopulationBasedTraining)
    assert isinstance(pbt._hyperparam_mutations["momentum"], tune.search.sample.Float)
    median = JobSpec(spec_with(**{"tune_config.scheduler": "median_stopping"}), base_dir=EXAMPLES).tune_config.scheduler
    assert isinstance(median, MedianStoppingRule)


def test_an_argument_may_be_a_python_object_by_import_path(tmp_path):
    (tmp_path / "filters.py").write_text("def short_decay(config):\n    return config['lr'].milestones[0] < 10\n")
    data = spec_with(
        **{
            "param_space.lr": {
                "family": "MultiStep",
                "init": 0.1,
                "milestones": {"grid_search": [[5], [15]]},
                "gamma": 0.1,
            },
            "tune_config.search_alg": {"name": "grid", "filter": {"import": "filters:short_decay"}},
        }
    )
    spec = JobSpec(data, base_dir=str(tmp_path))
    trials = [config for _, config in iter(trial_source(spec.dry_tuner()).next_trial, None)]
    assert [config["lr"].milestones for config in trials] == [(5,)]
    data["tune_config"]["search_alg"]["filter"] = {"import": "filters:nothing"}
    assert problems_of(data) == [
        "tune_config.search_alg.filter.import: 'filters:nothing': 'filters' has no attribute 'nothing'"
    ]


def test_an_ask_tell_algorithm_named_by_import_path_runs_through_the_adapter():
    spec = JobSpec(
        spec_with(
            **{
                "param_space.lr": {"family": "Exponential", "init": {"loguniform": [1e-3, 1e-1]}, "gamma": 0.9},
                "tune_config.num_samples": 6,
                "tune_config.search_alg": {"name": "evolution_search:RegularizedEvolution", "batch_size": 3, "seed": 0},
            }
        ),
        base_dir=EXAMPLES,
    )
    searcher = spec.tune_config.search_alg
    assert isinstance(searcher, AskTellSearcher) and searcher.batch_size == 3
    assert searcher.algorithm.population_size == 8


def test_a_script_path_trainable_and_spec_keys_for_the_tuner(tmp_path):
    (tmp_path / "train.py").write_text("def train(config):\n    pass\n")
    data = spec_with(trainable="train.py:train", resources={"cpu": 2}, stagetree={"execution_policy": "bfs"})
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    spec = JobSpec.from_file(str(path))
    assert spec.function.__name__ == "train"
    tuner = spec.dry_tuner()
    assert tuner.execution_policy == "bfs"
    assert tuner.trainable._resources.required_resources == {"CPU": 2.0}


@pytest.mark.parametrize(
    "entry",
    [
        {"name": "round_robin", "quantum_s": 30.0},
        {"name": "ray_stagetree.planning.time_sharing:RoundRobinPolicy", "quantum_s": 30.0},
    ],
    ids=["name-and-arguments", "import-path"],
)
def test_an_execution_policy_with_arguments_reaches_the_tuner_as_an_instance(entry):
    from ray_stagetree import RoundRobinPolicy

    tuner = JobSpec(spec_with(stagetree={"execution_policy": entry}), base_dir=EXAMPLES).dry_tuner()
    assert isinstance(tuner.execution_policy, RoundRobinPolicy) and tuner.execution_policy.quantum_s == 30.0


def test_reproducible_and_repeats_reach_the_tuner_only_when_given(monkeypatch):
    seen = {}
    from ray_stagetree.jobs import spec as spec_module

    monkeypatch.setattr(spec_module, "Tuner", lambda *args, **kwargs: seen.update(kwargs))
    JobSpec(spec_with(), base_dir=EXAMPLES)
    assert "reproducible" not in seen and "repeats" not in seen
    JobSpec(spec_with(reproducible=True, seed=7, repeats=3, deterministic_algorithms=True), base_dir=EXAMPLES)
    assert seen["reproducible"] is True and seen["repeats"] == 3 and seen["seed"] == 7
    assert seen["deterministic_algorithms"] is True


def test_a_spec_with_typos_is_answered_in_one_round_with_suggestions():
    """The issue's file: misspelt keys, a misspelt family hiding nothing of
    its own, a misspelt parameter; every problem at once, each with a "did you
    mean", and no internal function's name."""
    data = {
        "trainable": "trainables_for_tests:noisy_descent",
        "param_space": {
            "lr": {"family": "Multistep", "init": 0.1, "milestones": [4], "gamma": {"uniform": [1, "x"]}},
            "momentum": {"family": "Exponential", "init": 0.9, "gama": 0.99},
        },
        "tune_config": {"metric": "loss", "mode": "maxx", "scheduler": {"name": "ashaa"}},
        "run_confg": {"stop": {"training_iteration": 4}},
    }
    problems = problems_of(data)
    assert problems == [
        "(top level): unknown key 'run_confg' (did you mean 'run_config'?); allowed: deterministic_algorithms, "
        "monitor, param_space, repeats, reproducible, resources, run_config, seed, stagetree, trainable, "
        "tune_config, with_parameters",
        "tune_config.mode: 'maxx' is not allowed (did you mean 'max'?); allowed: 'min', 'max'",
        "param_space.lr.gamma.uniform.upper: must be a finite number, got 'x'",
        "param_space.lr.family: unknown sequence family 'Multistep' (did you mean 'MultiStep'?); allowed: Concat, "
        "Constant, Cosine, CyclicLR, Exponential, InverseSqrt, Linear, MultiStep, OneCycle, Polynomial, Step, "
        "Values, Warmup",
        "param_space.momentum: Exponential has no parameter 'gama' (did you mean 'gamma'?); it takes init, gamma",
        "tune_config.scheduler.name: unknown scheduler 'ashaa' (did you mean 'asha'?); allowed: asha, "
        "async_hyperband, fifo, hb_bohb, hyperband, median_stopping, median_stopping_rule, pb2, pbt, pbt_replay, promoting_asha",
    ]


def test_the_tuners_own_checks_come_in_the_same_round_as_the_spaces():
    momentum = {"family": "Exponential", "init": 0.9, "gama": 0.99}
    problems = problems_of(spec_with(**{"param_space.momentum": momentum, "tune_config": {"scheduler": "asha"}}))
    assert len(problems) == 2 and problems[0].startswith("param_space.momentum: Exponential has no parameter 'gama'")
    assert "AsyncHyperBandScheduler needs a metric" in problems[1]


def test_checking_or_planning_a_spec_writes_nothing(tmp_path):
    """A spec's dry Tuner leaves no experiment folder behind, nor overwrites
    the settings of an experiment that has the spec's name."""
    storage = tmp_path / "results"
    spec = JobSpec(spec_with(**{"run_config.name": "named", "run_config.storage_path": str(storage)}), EXAMPLES)
    spec.dry_tuner()
    assert spec.experiment_path() == f"{storage}/named"
    assert not storage.exists()


def test_every_problem_of_one_scheduler_is_reported_at_once_by_its_field():
    scheduler = {"name": "asha", "max_t": "sixteen", "grace_period": -1, "reduction_factor": 0}
    problems = problems_of(spec_with(**{"tune_config.scheduler": scheduler}))
    assert problems == [
        "tune_config.scheduler.max_t: 'sixteen' is not allowed; expected a number (AsyncHyperBandScheduler's max_t, "
        "default 100)",
        "tune_config.scheduler.grace_period: -1 is not allowed: grace_period must be positive!",
        "tune_config.scheduler.reduction_factor: 0 is not allowed: Reduction Factor not valid!",
    ]
