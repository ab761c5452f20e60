"""DESIGN invariant 4 with real PyTorch training: the example's CNN trainable
(resumable loader, batch-size change, RNG state in checkpoints) gives the
same metrics through shared stages as trial by trial."""

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("mnist1d")

from ray import tune  # noqa: E402

from ray_stagetree import MultiStep, Tuner  # noqa: E402

HORIZON = 5


def run(tmp_path, name, sharing):
    import mnist1d_study as study

    space = {
        "lr": tune.grid_search([MultiStep(0.1, [3], 0.1), MultiStep(0.1, [3], 0.3)]),
        "batch_size": tune.grid_search([64, MultiStep(values=(64, 128), milestones=[2])]),
        "seed": 0,
    }
    tuner = Tuner(
        tune.with_parameters(study.train_mnist1d, data=study.make_data(num_samples=600)),
        param_space=space,
        tune_config=tune.TuneConfig(metric="accuracy", mode="max"),
        run_config=tune.RunConfig(
            name=name, storage_path=str(tmp_path), stop={"training_iteration": HORIZON}, verbose=0
        ),
        stage_sharing=sharing,
    )
    return tuner.fit()


@pytest.mark.long
def test_cnn_through_shared_stages_equals_trial_by_trial(tmp_path, ray_session):
    shared = run(tmp_path, "shared", True)
    alone = run(tmp_path, "alone", False)
    # 4 trials x 5 epochs; [0,2) shared by all, [2,3) by pairs, the rest alone
    assert shared.iterations_executed == 2 + 2 * 1 + 4 * 2 < alone.iterations_executed == 20

    def curves(grid):
        return {
            (repr(r.config["lr"]), repr(r.config["batch_size"])): r.metrics_dataframe[
                ["accuracy", "loss"]
            ].values.tolist()
            for r in grid
        }

    assert curves(shared) == curves(alone)


def test_the_quick_start_runs_and_shares(ray_session, tmp_path):
    import quick_start

    results = quick_start.main(str(tmp_path))
    assert [result.metrics["training_iteration"] for result in results] == [16, 16, 16] and not results.errors
    assert results.iterations_executed == 16 + 12 + 8 < results.trial_by_trial_iterations == 48
