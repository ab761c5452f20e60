from ray_stagetree.runtime.progress import ProgressReporter


def progress(rows=()):
    return {
        "status": {"RUNNING": 2, "TERMINATED": 1, "PENDING": 0},
        "iterations": 30,
        "unique_iterations": 50,
        "total_iterations": 120,
        "rows": list(rows),
        "elapsed": 12.3,
    }


def test_line_shows_trials_iterations_and_best_metric():
    reporter = ProgressReporter("accuracy", "max", verbose=0)
    reporter.update(progress([{"accuracy": 0.5}, {"accuracy": 0.7}, {"accuracy": float("nan")}]))
    line = reporter.line(progress())
    assert "2 running, 1 terminated" in line
    assert "iterations executed 30 of 50 unique (trial by trial: 120, 2.40x fewer)" in line
    assert "best accuracy: 0.7" in line


def test_terminal_output_is_rate_limited(capsys):
    reporter = ProgressReporter(None, None, interval_seconds=3600)
    reporter.update(progress())
    reporter.update(progress())
    reporter.update(progress(), final=True)
    assert capsys.readouterr().err.count("trials:") == 2
