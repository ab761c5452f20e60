"""RunConfig(log_to_file=...) as Tune's: what a trial's trainable prints to
stdout and stderr, and Ray's logger, in files of the trial's folder, written
from Tune's docs and its test of tune.run(log_to_file=...)."""

import os
import sys
import tempfile

import pytest
from ray import tune

from ray_stagetree import MultiStep, Tuner, get_hparams, run


def printing(config):
    """Prints once per iteration where each stream and Ray's logger go; checkpoints each iteration."""
    from ray import logger

    step = 0
    checkpoint = tune.get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder:
            step = int(read(folder, "step"))
    while step < 3:
        step += 1
        lr = get_hparams()["lr"]
        print(f"PRINT_STDOUT step {step} lr {lr:g}")
        print(f"PRINT_STDERR step {step}", file=sys.stderr)
        logger.info(f"LOG_STDERR step {step}")
        with tempfile.TemporaryDirectory() as folder:
            with open(os.path.join(folder, "step"), "w") as file:
                file.write(str(step))
            tune.report({"loss": lr * step}, checkpoint=tune.Checkpoint.from_directory(folder))


def read(folder, name):
    with open(os.path.join(folder, name)) as file:
        return file.read()


def fit(tmp_path, log_to_file, lr=0.1):
    return Tuner(
        printing,
        param_space={"lr": lr},
        run_config=tune.RunConfig(storage_path=str(tmp_path), log_to_file=log_to_file, verbose=0),
    ).fit()


def test_each_stream_goes_to_its_file_and_nothing_is_written_without_it(ray_session, tmp_path):
    (result,) = fit(tmp_path / "default", True)
    stdout, stderr = read(result.path, "stdout"), read(result.path, "stderr")
    assert [line for line in stdout.splitlines() if "PRINT" in line] == [
        f"PRINT_STDOUT step {step} lr 0.1" for step in (1, 2, 3)
    ]
    assert "PRINT_STDERR step 3" in stderr and "LOG_STDERR step 3" in stderr and "PRINT_STDOUT" not in stderr
    (plain,) = fit(tmp_path / "off", False)
    assert not {"stdout", "stderr"} & set(os.listdir(plain.path))


def test_one_file_for_both_or_two_named_files(ray_session, tmp_path):
    (combined,) = fit(tmp_path / "one", "combined")
    text = read(combined.path, "combined")
    assert all(marker in text for marker in ("PRINT_STDOUT", "PRINT_STDERR", "LOG_STDERR"))
    (named,) = fit(tmp_path / "two", ("alt.stdout", "alt.stderr"))
    assert "PRINT_STDOUT" in read(named.path, "alt.stdout") and "PRINT_STDERR" in read(named.path, "alt.stderr")


def test_a_shared_stages_output_is_in_every_folder_it_serves(ray_session, tmp_path):
    """Two trials share iteration 1: each folder holds it, then its own."""
    results = Tuner(
        printing,
        param_space={"lr": tune.grid_search([MultiStep(0.1, [1], 0.5), MultiStep(0.1, [1], 0.2)])},
        run_config=tune.RunConfig(
            storage_path=str(tmp_path), log_to_file=True, stop={"training_iteration": 3}, verbose=0
        ),
    ).fit()
    assert results.iterations_executed == 5, "the first iteration trained once"
    for result, lr in zip(results, (0.05, 0.02)):
        stdout = read(result.path, "stdout")
        assert "PRINT_STDOUT step 1 lr 0.1\n" in stdout and f"PRINT_STDOUT step 3 lr {lr:g}" in stdout


def test_a_value_tune_does_not_take_is_refused_with_tunes_error():
    with pytest.raises(ValueError, match="has to have a length of 2"):
        Tuner(printing, run_config=tune.RunConfig(log_to_file=("a", "b", "c")))


def test_tune_run_takes_it_too(ray_session, tmp_path):
    (trial,) = run(printing, config={"lr": 0.1}, storage_path=str(tmp_path), log_to_file=True, verbose=0).trials
    assert "PRINT_STDOUT step 3" in read(trial.path, "stdout")
