"""The release benchmarks' shared harness (`release/harness.py`) and the
assembly of RESULTS.md (`release/run_all.py`): pure functions, no benchmark run."""

import argparse
import sys
from pathlib import Path

import pytest

RELEASE = Path(__file__).resolve().parent.parent / "release"
sys.path.insert(0, str(RELEASE))

import harness  # noqa: E402
import run_all  # noqa: E402


def test_systems_run_interleaved_and_figures_are_medians_with_ranges():
    calls = []

    def system(name, seconds):
        values = iter(seconds)
        return lambda: calls.append(name) or {"wall": next(values)}

    runs = harness.interleaved({"A": system("A", [3.0, 1.0, 2.0]), "B": system("B", [1.0, 1.0, 4.0])}, repeats=3)
    assert calls == ["A", "B", "A", "B", "A", "B"]
    assert [run["wall"] for run in runs["A"]] == [3.0, 1.0, 2.0]
    assert all("load" in run for run in runs["A"])  # each run's load is kept
    assert harness.median_range(harness.values(runs["A"], "wall")) == "2.0 [1.0-3.0]"
    # Ratios pair runs made next to each other: 3/1, 1/1, 2/4.
    assert harness.ratio(harness.values(runs["A"], "wall"), harness.values(runs["B"], "wall")) == "1.00x [0.50-3.00]"
    assert harness.fastest(runs, ["A", "B"], "wall") == "B"  # median 1.0 against 2.0


def test_missing_figures_are_counted_not_averaged():
    assert harness.median_range([1.0, float("nan"), 3.0]) == "2.0 [1.0-3.0] (1 not reached)"
    assert harness.median_range([float("nan")], missing="-") == "-"


def test_a_section_states_commit_date_machine_load_and_repeats_first():
    args = argparse.Namespace(quick=True, repeats=2)
    section = harness.Section("A benchmark", args, model=True)
    section.table(["system", "wall s"], [["A", "1.0"]])
    text = section.render()
    assert text.startswith("## A benchmark (model)\n\n_Commit `")
    meta = text.split("\n\n")[1]
    for words in ("UTC", "2 repeat(s)", "CPUs", "load (1/5/15 min)"):
        assert words in meta
    assert "| system | wall s |\n| --- | ---: |\n| A | 1.0 |" in text
    assert run_all.check_section("bench_x.py", text) == text


def test_parse_sends_repeats_by_mode_and_refuses_bad_ones(monkeypatch):
    monkeypatch.setattr(harness, "_stdout_to_stderr", lambda: None)
    parser = harness.parser("doc", quick_repeats=1, full_repeats=3)
    assert harness.parse(parser, ["--quick"]).repeats == 1
    assert harness.parse(parser, []).repeats == 3
    assert harness.parse(parser, ["--full", "--repeats", "5"]).repeats == 5
    with pytest.raises(SystemExit):
        harness.parse(parser, ["--repeats", "0"])


def test_a_time_budget_starts_no_repeat_that_would_end_past_it(monkeypatch):
    """Each run takes 3 s of a 10-s budget: the second repeat (6 s more) would end at 12."""
    monkeypatch.setattr(harness, "_stdout_to_stderr", lambda: None)
    clock = [100.0]
    monkeypatch.setattr(harness.time, "monotonic", lambda: clock[0])
    monkeypatch.setattr(harness, "_DEADLINE", None)
    monkeypatch.setattr(harness, "_PARSED", None)
    args = harness.parse(harness.parser("doc"), ["--repeats", "5", "--time-budget", "10"])

    def system():
        clock[0] += 3.0
        return {"wall": 3.0}

    runs = harness.interleaved({"A": system, "B": system}, repeats=args.repeats)
    assert [len(outcomes) for outcomes in runs.values()] == [1, 1]
    assert args.repeats == 1, "the section's header says how many ran"
    with pytest.raises(SystemExit):
        harness.parse(harness.parser("doc"), ["--time-budget", "0"])


@pytest.mark.parametrize(
    "output, message",
    [
        ("wall 1.0 s\n", "exactly one markdown section"),
        ("## A\n\ntext\n\n## B\n", "exactly one markdown section"),
        ("## A\n\nno meta line\n", "commit, date, machine"),
    ],
)
def test_run_all_refuses_output_that_breaks_the_convention(output, message):
    with pytest.raises(ValueError, match=message):
        run_all.check_section("bench_x.py", output)


def test_results_keep_measured_and_modelled_apart_and_a_section_survives_a_rerun():
    sections = {
        "bench_tune.py": "## Tune\n\n_Commit `a`_\n",
        "bench_gpu.py": "## GPU\n\n_Commit `old`, measured on an H200_\n",
        "bench_simulator.py": "## Simulator (model)\n\n_Commit `a`_\n",
    }
    text = run_all.render(sections)
    measured, gpu, modelled = (text.index(f"<!-- part: {part} -->") for part in ("measured", "gpu", "modelled"))
    assert measured < text.index("## Tune") < gpu < text.index("## GPU") < modelled < text.index("## Simulator")
    assert "calibrated model" in text[modelled:]
    assert "Not measured yet" in text  # every other benchmark has its place
    # Read back, every section is as written: a rerun of one keeps the others (the GPU's from its machine).
    again = run_all.sections_of(text)
    assert {script: again[script] for script in sections} == sections
