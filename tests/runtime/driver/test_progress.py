import dataclasses
import os

from ray import tune
from ray.tune import CLIReporter
from ray.tune.utils import log as tune_log
from ray.tune.utils.log import Verbosity
from trainables_for_tests import noisy_descent, sum_of_lr

from ray_stagetree import MultiStep, Tuner
from ray_stagetree.runtime.control.messages import Progress
from ray_stagetree.runtime.driver.callbacks import CallbackRunner
from ray_stagetree.runtime.driver.progress import ProgressReporter


def progress(rows=(), **changes):
    figures = Progress(
        status={"RUNNING": 2, "TERMINATED": 1, "PENDING": 0},
        iterations=30,
        unique_iterations=50,
        total_iterations=120,
        rows=list(rows),
        elapsed=12.3,
    )
    return dataclasses.replace(figures, **changes)


def test_line_shows_trials_iterations_and_best_metric():
    reporter = ProgressReporter("accuracy", "max", verbose=0)
    reporter.update(progress([{"accuracy": 0.5}, {"accuracy": 0.7}, {"accuracy": float("nan")}]))
    line = reporter.line(progress())
    assert "2 running, 1 terminated" in line
    assert "iterations: 30 executed of 50 requested, 120 trial by trial |" in line
    assert "best accuracy: 0.7" in line


def test_line_before_any_trial_says_so():
    reporter = ProgressReporter(None, None, verbose=0)
    start = progress(status={}, iterations=0, unique_iterations=0, total_iterations=0)
    assert "trials: none yet | iterations: 0 executed" in reporter.line(start)


def test_final_line_compares_executed_iterations_with_trial_by_trial():
    reporter = ProgressReporter(None, None, verbose=0)
    assert "120 trial by trial (4.00x fewer executed)" in reporter.line(progress(), final=True)
    retrained = progress(iterations=240)
    assert "(2.00x more executed: retrained, or run past a trial's end)" in reporter.line(retrained, final=True)


def test_line_says_where_trainables_restart_at_changed_values():
    """A trainable that holds config's values restarts where one changes
    (issue 57): the line says so, and how often by key; live, it says nothing."""
    reporter = ProgressReporter(None, None, verbose=0)
    assert "restarts" not in reporter.line(progress())
    line = reporter.line(progress(restarts={"lr": 3, "bs": 1}), final=True)
    assert "(4.00x fewer executed) | restarts where a config value changed: bs 1x, lr 3x" in line


def test_line_names_trials_that_have_not_reported():
    reporter = ProgressReporter(None, None, verbose=0)
    assert "not reported" not in reporter.line(progress())
    stalled = progress(stalled=[("trial_a", 75.2), ("trial_b, trial_c", 61.0)])
    line = reporter.line(stalled)
    assert line.endswith(" | trial_a has not reported for 75s | trial_b, trial_c have not reported for 61s")


def test_terminal_output_is_rate_limited(capsys):
    reporter = ProgressReporter(None, None, interval_seconds=3600)
    reporter.update(progress())
    reporter.update(progress())
    reporter.update(progress(), final=True)
    assert capsys.readouterr().err.count("trials:") == 2


def test_best_is_over_trials_last_results_as_get_best_result_picks():
    reporter = ProgressReporter("accuracy", "max", verbose=0)
    # trial a peaked at 0.9413 and ended at 0.9350; b errored at 0.99
    rows = [
        {"trial_id": "a", "accuracy": 0.9413},
        {"trial_id": "a", "accuracy": 0.9350},
        {"trial_id": "b", "accuracy": 0.99},
        {"trial_id": "c", "accuracy": 0.92},
    ]
    reporter.update(progress(rows, events=[{"event": "error", "trial_id": "b"}]))
    assert reporter.best == 0.935
    assert "best accuracy: 0.935" in reporter.line(progress())


def failure(kind, trial, error, iterations):
    return {"event": kind, "trial_id": trial, "name": f"train_{trial}", "error": error, "iterations": iterations}


class ErroredView:
    def __init__(self, trial_id):
        self.trial_id, self.error_file = trial_id, f"/results/{trial_id}/error.txt"


def test_each_failure_is_reported_as_tune_reports_it(capsys, caplog):
    """The traceback (once for trials that failed together in a shared
    stage), then how far the trial got, and its error file or its retry."""
    shared = "Traceback (most recent call last):\nValueError: shared stage failed\n"
    events = [
        failure("error", "a", shared, 3),
        failure("error", "b", shared, 3),
        failure("recover", "c", "Traceback (most recent call last):\nOSError: disk\n", 2),
    ]
    reporter = ProgressReporter(None, None)
    reporter.update(progress(events=events), trials=[ErroredView(t) for t in "abc"])
    logged = [record.getMessage() for record in caplog.records]
    assert logged[0] == f"Trial task failed for trial train_a\n{shared.rstrip()}"
    assert logged[1] == "Trial task failed for trial train_b, with trial train_a's error above"
    assert logged[2].startswith("Trial task failed for trial train_c\n") and logged[2].endswith("OSError: disk")
    err = capsys.readouterr().err
    assert "Trial train_a errored after 3 iterations at " in err
    assert "Error file: /results/a/error.txt" in err and "Error file: /results/b/error.txt" in err
    assert "Trial train_c errored after 2 iterations" in err and "It is retried" in err
    assert "/results/c/" not in err


def test_verbose_zero_still_logs_a_failures_traceback(capsys, caplog):
    reporter = ProgressReporter(None, None, verbose=0)
    reporter.update(progress(events=[failure("error", "a", "ValueError: boom", 1)]), trials=[])
    assert [record.getMessage() for record in caplog.records] == [
        "Trial task failed for trial train_a\nValueError: boom"
    ]
    assert capsys.readouterr().err == ""


def fails_at_second_iteration(config):
    tune.report({"loss": 1.0})
    raise ValueError(f"boom at lr={config['lr']}")


def test_a_studys_failed_trial_is_reported_with_its_error_file(tmp_path, ray_session, capsys, caplog):
    (result,) = Tuner(
        fails_at_second_iteration, param_space={"lr": 0.5}, run_config=tune.RunConfig(storage_path=str(tmp_path))
    ).fit()
    assert isinstance(result.error, ValueError)
    (logged,) = [record.getMessage() for record in caplog.records if "Trial task failed" in record.getMessage()]
    assert logged.rstrip().endswith("ValueError: boom at lr=0.5")
    err = capsys.readouterr().err
    assert "errored after 1 iterations" in err
    error_file = os.path.join(result.path, "error.txt")
    assert f"Error file: {error_file}" in err and os.path.exists(error_file)


def table_trials(tmp_path):
    """Three trials as Tune's reporters see them, through the callback runner."""
    config = {"lr": {"family": "MultiStep", "init": 0.1, "milestones": [4], "gamma": 0.5}, "seed": 0}
    runner = CallbackRunner([], str(tmp_path), param_space={"lr": tune.grid_search([])})
    events = [{"event": "start", "trial_id": t, "name": f"train_{t}", "dirname": t, "config": config} for t in "abc"]
    rows = [
        {"trial_id": t, "training_iteration": 2, "loss": loss, "config": config}
        for t, loss in zip("abc", (0.5, 0.2, 0.9))
    ]
    ends = [{"event": "complete", "trial_id": t, "name": f"train_{t}", "dirname": t} for t in "abc"]
    runner.update(Progress(rows=rows, events=events + ends))
    return runner.reported_trials()


def test_tunes_cli_reporter_renders_the_trials_with_the_sharing_line(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    # Tune's default verbosity: a Ray Tune run earlier in this process sets it to 0
    monkeypatch.setattr(tune_log, "verbosity", Verbosity.V3_TRIAL_DETAILS)
    table = CLIReporter(
        metric_columns=["loss"],
        parameter_columns=["lr/milestones"],
        max_progress_rows=2,
        sort_by_metric=True,
        max_report_frequency=3600,
    )
    table.setup(start_time=0, total_samples=3, metric="loss", mode="min")
    reporter = ProgressReporter("loss", "min", table=table)
    trials = table_trials(tmp_path)
    reporter.update(progress(), trials=trials)
    reporter.update(progress(), trials=trials)  # within max_report_frequency: not shown
    out = capsys.readouterr().out
    assert out.count("== Status ==") == 1
    assert "iterations: 30 executed of 50 requested, 120 trial by trial" in out
    assert "lr/milestones" in out and "loss" in out
    # finished trials sorted by loss, two rows at most while running: b (0.2), a (0.5)
    assert out.index("train_b") < out.index("train_a") and "train_c" not in out
    reporter.update(progress(), final=True, trials=trials)
    final = capsys.readouterr().out
    assert "120 trial by trial (4.00x fewer executed)" in final and "train_c" in final


def test_verbose_zero_prints_nothing_even_with_a_reporter(tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("TUNE_DISABLE_AUTO_CALLBACK_LOGGERS", "1")
    table = CLIReporter()
    table.setup(metric="loss", mode="min")
    reporter = ProgressReporter("loss", "min", verbose=0, table=table)
    reporter.update(progress(), final=True, trials=table_trials(tmp_path))
    captured = capsys.readouterr()
    assert captured.out == captured.err == ""


# -- end to end ------------------------------------------------------------------------

LRS = [MultiStep(0.1, [2], 0.5), MultiStep(0.1, [4], 0.5), MultiStep(0.1, [4], 0.2)]


def fit(tmp_path, name, **run_kwargs):
    return Tuner(
        noisy_descent,
        param_space={"lr": tune.grid_search(LRS)},
        tune_config=tune.TuneConfig(metric="loss", mode="min"),
        run_config=tune.RunConfig(name=name, storage_path=str(tmp_path), stop={"training_iteration": 6}, **run_kwargs),
    ).fit()


def test_the_line_and_get_best_result_agree(tmp_path, ray_session, capsys):
    grid = fit(tmp_path, "line")
    last_line = capsys.readouterr().err.strip().splitlines()[-1]
    assert "trial by trial (" in last_line
    assert last_line.endswith(f"best loss: {grid.get_best_result().metrics['loss']:.4g}")


def test_a_study_reports_through_tunes_cli_reporter(tmp_path, ray_session, capsys, monkeypatch):
    monkeypatch.setattr(tune_log, "verbosity", Verbosity.V0_MINIMAL)  # as a Ray Tune run in this process leaves it
    reporter = CLIReporter(metric_columns=["loss"], parameter_columns=["lr/milestones", "lr/gamma"])
    grid = fit(tmp_path, "cli", progress_reporter=reporter)
    out = capsys.readouterr().out
    final = out[out.rindex("== Status ==") :]
    assert "trial by trial (" in final, "the stage-sharing figures"
    assert "lr/milestones" in final and "lr/gamma" in final
    for result in grid:
        assert f"{result.metrics['trial_id']}" in final


def test_verbose_zero_prints_nothing(tmp_path, ray_session, capfd):
    fit(tmp_path, "quiet", verbose=0, progress_reporter=CLIReporter())
    captured = capfd.readouterr()
    assert "== Status ==" not in captured.out and "trial by trial" not in captured.err


def test_an_interrupted_studys_final_line_claims_no_saving():
    reporter = ProgressReporter(None, None, verbose=0)
    line = reporter.line(progress(), final=True, partial=True)
    assert "120 trial by trial (interrupted: figures of a partial study)" in line and "fewer" not in line


def test_a_restored_studys_best_counts_the_trials_that_ended_before_the_interrupt():
    """After a restore, the line's best still knows the trials that had
    finished (their rows are not sent again); a trial that stays errored
    is left out, one restarted counts again only from its new rows."""
    from types import SimpleNamespace

    from ray_stagetree.runtime.control.experiment_state import Restore, restored_progress
    from ray_stagetree.runtime.control.trials import TrialState

    def trial(trial_id, status, loss):
        state = TrialState(trial_id=trial_id, config={})
        state.status, state.reported = status, [{"loss": loss + 1}, {"loss": loss}]
        return state

    trials = [trial("done", "TERMINATED", 0.3), trial("failed", "ERROR", 0.1), trial("paused", "PAUSED", 0.2)]
    reporter = ProgressReporter("loss", "min", verbose=0)
    reporter.observe(*restored_progress(Restore(SimpleNamespace(trials=trials))))
    assert reporter.best == 0.2, "the errored trial's 0.1 is left out, as get_best_result leaves it out"
    restarted = ProgressReporter("loss", "min", verbose=0)
    restarted.observe(*restored_progress(Restore(SimpleNamespace(trials=trials), restart_errored=True)))
    assert restarted.best == 0.2
    resumed = ProgressReporter("loss", "min", verbose=0)
    resumed.observe(*restored_progress(Restore(SimpleNamespace(trials=trials), resume_errored=True)))
    assert resumed.best == 0.1, "a resumed trial's results go on counting"


def test_trials_waiting_for_a_worker_are_shown_pending_not_running(tmp_path, ray_session, monkeypatch):
    """Four trials share their first two iterations, then fork onto the
    session's two workers: the progress line never shows more trials running
    than the workers hold (the others wait for one, PENDING, as Tune shows a
    trial without an actor)."""
    shown = []
    line = ProgressReporter.line

    def recording(self, progress, *args, **kwargs):
        shown.append(dict(progress.status))
        return line(self, progress, *args, **kwargs)

    monkeypatch.setattr(ProgressReporter, "line", recording)
    Tuner(
        sum_of_lr,
        param_space={
            "lr": tune.grid_search([MultiStep(1.0, [2], gamma) for gamma in (0.1, 0.2, 0.3, 0.4)]),
            "sleep": 0.2,
        },
        tune_config=tune.TuneConfig(max_concurrent_trials=4),
        run_config=tune.RunConfig(name="pending", storage_path=str(tmp_path), stop={"training_iteration": 6}),
    ).fit()
    assert shown, "the study printed progress lines"
    assert max(status.get("RUNNING", 0) for status in shown) <= 2, shown
    assert any(status.get("PENDING", 0) >= 2 for status in shown), shown
