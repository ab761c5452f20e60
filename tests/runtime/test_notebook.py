"""Progress in Jupyter: a notebook executed with ``nbconvert --execute``
keeps one display per study, updated in place, ending on the stage-sharing
figures. The notebook's kernel joins the session's Ray cluster."""

import json
import os
import subprocess
import sys

import pytest

nbformat = pytest.importorskip("nbformat")
pytest.importorskip("nbconvert")
pytest.importorskip("ipykernel")

SETUP = """
import os, tempfile
import ray
from ray import tune
from ray_stagetree import MultiStep, Tuner, get_checkpoint, get_hparams, report

ray.init(address=os.environ["STAGETREE_TEST_RAY_ADDRESS"])

def train(config):
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

def study(name, **run_config):
    return Tuner(
        train,
        param_space={"lr": tune.grid_search([MultiStep(0.1, [2], 0.5), MultiStep(0.1, [4], 0.5)])},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(name=name, storage_path=os.environ["STAGETREE_TEST_STORAGE"],
                                  stop={"training_iteration": 6}, **run_config),
    ).fit()
"""

LINE = "grid = study('line')\nprint('BEST', grid.get_best_result().metrics['loss'])"

TABLE = """from ray.tune import JupyterNotebookReporter
grid = study('table', progress_reporter=JupyterNotebookReporter(metric_columns=['loss']))"""


def displays(cell):
    return [output for output in cell["outputs"] if output["output_type"] in ("display_data", "update_display_data")]


def test_a_notebook_shows_one_display_updated_in_place(tmp_path, ray_session):
    notebook = nbformat.v4.new_notebook()
    notebook.cells = [nbformat.v4.new_code_cell(source) for source in (SETUP, LINE, TABLE)]
    path = tmp_path / "study.ipynb"
    nbformat.write(notebook, path)
    env = {
        **os.environ,
        "STAGETREE_TEST_RAY_ADDRESS": ray_session.get_runtime_context().gcs_address,
        "STAGETREE_TEST_STORAGE": str(tmp_path),
    }
    subprocess.run(
        [
            sys.executable,
            "-m",
            "nbconvert",
            "--to",
            "notebook",
            "--execute",
            "--inplace",
            "--ExecutePreprocessor.timeout=300",
            str(path),
        ],
        check=True,
        env=env,
        capture_output=True,
    )
    with open(path) as file:
        cells = json.load(file)["cells"]

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
