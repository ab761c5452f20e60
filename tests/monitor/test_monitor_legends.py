"""What the monitor draws is readable: legend labels tell the curves shown
apart (short ids, the parameters that differ), nested sequences are shown by
their parameters, and the command line waits for a study about to appear."""

from __future__ import annotations

import threading
import time

from ray_stagetree import MultiStep, Warmup
from ray_stagetree.monitor.__main__ import wait_for_study
from ray_stagetree.monitor.analysis import LABEL_WIDTH, hyperparameters, legend_labels, parallel_coordinates

LONG = "train_mnist1d_1e9e0_{index:05d}_{index}_lr=MultiStep_init_0_1_milestones_{m}_gamma_0_1_" + "x" * 90


def trial(index, milestone, seed=0):
    config = {"lr": MultiStep(0.1, [milestone], 0.1).to_json(), "seed": seed, "batch_size": 64}
    return {"name": LONG.format(index=index, m=milestone), "config": config, "rows": [{"training_iteration": 1}]}


def test_legend_labels_name_the_trial_and_only_what_differs():
    trials = [trial(3, 30), trial(7, 60)]
    assert len(trials[0]["name"]) > 150
    assert legend_labels(trials) == {
        trials[0]["name"]: "#3 lr.milestones=[30]",
        trials[1]["name"]: "#7 lr.milestones=[60]",
    }
    many = [trial(i, 10 * i, seed=i) for i in range(1, 4)]
    labels = legend_labels(many, width=20)
    assert all(len(label) <= 20 for label in labels.values()) and len(set(labels.values())) == 3


def test_the_curves_figure_puts_short_labels_in_its_legend(tmp_path):
    from ray_stagetree.monitor.app import _curves_svg

    trials = [trial(3, 30), trial(7, 60)]
    for each in trials:
        each["rows"] = [{"training_iteration": 1, "loss": 1.0}, {"training_iteration": 2, "loss": 0.5}]
    svg = _curves_svg(trials, "loss", "min").decode()
    assert "<!-- #3 lr.milestones=[30] -->" in svg and "<!-- #7 lr.milestones=[60] -->" in svg, "drawn as text"
    assert "x" * 90 not in svg, "no folder name in the legend"
    assert max(len(label) for label in legend_labels(trials).values()) <= LABEL_WIDTH


def test_a_sequence_inside_a_sequence_is_shown_by_its_parameters():
    configs = [{"lr": Warmup(0.0, 5, MultiStep(0.1, [m], 0.1)).to_json()} for m in (30, 60)]
    assert hyperparameters(configs[0])["lr.func.milestones"] == [30]
    parallel = parallel_coordinates(
        [{"name": f"t{i}", "config": config, "rows": [{"loss": 1.0}]} for i, config in enumerate(configs)], "loss"
    )
    (axis,) = parallel["axes"]
    assert axis["name"] == "lr.func.milestones" and axis["categories"] == ["[30]", "[60]"]


def test_the_command_line_waits_for_a_study_about_to_appear(tmp_path, capsys):
    folder = tmp_path / "study"
    threading.Timer(0.5, folder.mkdir).start()
    began = time.monotonic()
    wait_for_study(str(folder), wait_s=30, poll_s=0.05)
    assert folder.is_dir() and 0.4 <= time.monotonic() - began < 30
    assert f"waiting up to 30s for a study to appear in {folder}" in capsys.readouterr().out
    wait_for_study(str(folder), wait_s=30)  # there: at once, silently
    assert capsys.readouterr().out == ""


def test_the_command_line_gives_up_on_a_study_that_does_not_appear(tmp_path):
    began = time.monotonic()
    wait_for_study(str(tmp_path / "never"), wait_s=0.3, poll_s=0.05)
    assert 0.3 <= time.monotonic() - began < 5
