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
    assert "iterations: 30 executed, 50 unique, 120 trial by trial |" in line
    assert "best accuracy: 0.7" in line


def test_final_line_compares_executed_iterations_with_trial_by_trial():
    reporter = ProgressReporter(None, None, verbose=0)
    assert "120 trial by trial (4.00x fewer executed)" in reporter.line(progress(), final=True)
    retrained = {**progress(), "iterations": 240}
    assert "(2.00x more executed: prefixes retrained)" in reporter.line(retrained, final=True)


def test_terminal_output_is_rate_limited(capsys):
    reporter = ProgressReporter(None, None, interval_seconds=3600)
    reporter.update(progress())
    reporter.update(progress())
    reporter.update(progress(), final=True)
    assert capsys.readouterr().err.count("trials:") == 2
