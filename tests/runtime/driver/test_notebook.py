"""A study in Jupyter: a notebook executed with ``nbconvert --execute``
keeps one display per study, updated in place, ending on the stage-sharing
figures; it shows no Ray INFO lines and no widget hints, a trial's error
still shows, and the kernel shuts its own Ray down without a stack trace."""

import pytest
from notebooks import displays, execute, noise, stream

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbconvert")
pytest.importorskip("ipykernel")
pytest.importorskip("ipywidgets")  # the notebook extra: without it tqdm and Ray ask for it at `import ray`

# Both notebooks' trainable: a loss decaying by the learning rate, checkpointed; a trial whose config says so fails.
TRAIN = """
def train(config):
    if config.get("fail"):
        raise ValueError("this trial fails on purpose")
    loss = 1.0
    checkpoint = get_checkpoint()
    if checkpoint:
        with checkpoint.as_directory() as folder, open(f"{folder}/loss") as file:
            loss = float(file.read())
    while True:
        loss *= 1 - get_hparams()["lr"]
        with tempfile.TemporaryDirectory() as folder:
            with open(f"{folder}/loss", "w") as file:
                file.write(repr(loss))
            report({"loss": loss}, checkpoint=tune.Checkpoint.from_directory(folder))
"""

SETUP = (
    """
import os, tempfile
import ray
from ray import tune
from ray_stagetree import MultiStep, Tuner, get_checkpoint, get_hparams, report

ray.init(address=os.environ["STAGETREE_TEST_RAY_ADDRESS"])

"""
    + TRAIN
    + """

def study(name, **run_config):
    return Tuner(
        train,
        param_space={"lr": tune.grid_search([MultiStep(0.1, [2], 0.5), MultiStep(0.1, [4], 0.5)])},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(name=name, storage_path=os.environ["STAGETREE_TEST_STORAGE"],
                                  stop={"training_iteration": 6}, **run_config),
    ).fit()
"""
)

LINE = "grid = study('line')\nprint('BEST', grid.get_best_result().metrics['loss'])"

TABLE = """from ray.tune import JupyterNotebookReporter
grid = study('table', progress_reporter=JupyterNotebookReporter(metric_columns=['loss']))"""


def test_a_notebook_shows_one_display_updated_in_place(tmp_path, ray_session):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in (SETUP, LINE, TABLE)]
    path = tmp_path / "study.ipynb"
    nbformat.write(notebook, path)
    env = {
        "STAGETREE_TEST_RAY_ADDRESS": ray_session.get_runtime_context().gcs_address,
        "STAGETREE_TEST_STORAGE": str(tmp_path),
    }
    cells, _ = execute(path, env, timeout=300)

    line_cell = displays(cells[1])
    assert len(line_cell) == 1, "one display, updated in place"
    text = "".join(line_cell[0]["data"]["text/plain"])
    assert "iterations:" in text and "trial by trial (" in text and "fewer executed)" in text
    best = next(o for o in cells[1]["outputs"] if o["output_type"] == "stream" and "BEST" in "".join(o["text"]))
    best_loss = float("".join(best["text"]).split("BEST")[1].split()[0])
    assert text.rstrip().endswith(f"best loss: {best_loss:.4g}")

    table_cell = displays(cells[2])
    assert len(table_cell) == 1, "Tune's reporter: one display, updated in place"
    html = "".join(table_cell[0]["data"]["text/html"])
    assert "trial by trial (" in html and "loss" in html and "TERMINATED" in html


FAILING = (
    """
import tempfile

from ray import tune

from ray_stagetree import MultiStep, Tuner, get_checkpoint, get_hparams, report


"""
    + TRAIN
    + """


grid = Tuner(
    train,
    param_space={"lr": tune.grid_search([MultiStep(0.1, [2], 0.5), MultiStep(0.1, [4], 0.5)]),
                 "fail": tune.grid_search([False, True])},
    tune_config=tune.TuneConfig(metric="loss", mode="min"),
    run_config=tune.RunConfig(name="quiet", storage_path=STORAGE, stop={"training_iteration": 6}),
).fit()
print("ERRORS", grid.num_errors)
"""
)


@pytest.mark.long
@pytest.mark.slow
def test_a_notebook_is_quiet_shows_errors_and_shuts_its_ray_down_cleanly(tmp_path):
    # The Tuner starts the kernel's own Ray, as in a user's notebook: ipykernel's shutdown then
    # has Ray's processes to stop (RAY_ADDRESS=local: never a cluster another test started).
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(f"STORAGE = {str(tmp_path)!r}\n" + FAILING)]
    path = tmp_path / "quiet.ipynb"
    nbformat.write(notebook, path)
    cells, kernel_stderr = execute(path, {"RAY_ADDRESS": "local"}, timeout=300)

    assert noise(cells, kernel_stderr) == []
    (study,) = cells
    assert "ERRORS 2" in stream(study, "stdout")
    assert "ValueError: this trial fails on purpose" in stream(study, "stderr")
    (progress,) = displays(study)
    assert "2 error, 2 terminated" in "".join(progress["data"]["text/plain"])
