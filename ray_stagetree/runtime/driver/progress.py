"""Live progress of a study, in a terminal or a Jupyter notebook.

Shows trials running / done / errored, iterations executed next to the
unique iterations (what sharing needs) and the trial-by-trial total (what
Ray Tune would run; the final line compares it with what was executed), and
the best metric so far: the best of the trials' last results, the trial
``ResultGrid.get_best_result()`` picks by default (Tune's scope "last").

``RunConfig(progress_reporter=...)`` (Tune's ``CLIReporter``,
``JupyterNotebookReporter`` or any ``ray.tune.ProgressReporter``) renders
Tune's trial table instead, asked as Tune's loop asks it (``should_report``,
then ``report``), with that line as its system information.
"""

from __future__ import annotations

import logging
import math
import sys
import time
from typing import Any

from ray_stagetree.runtime.control.messages import Progress
from ray_stagetree.runtime.driver.notebook import in_notebook
from ray_stagetree.validation import duration

logger = logging.getLogger("ray_stagetree")


class ProgressReporter:
    """Parameters
    ----------
    metric, mode:
        The metric to show the best value of (from ``TuneConfig``), if any.
    interval_seconds:
        Minimum time between two terminal lines (a notebook updates in place).
    verbose:
        0 prints nothing; anything else prints progress (Tune's convention).
    table:
        ``RunConfig.progress_reporter``: a ``ray.tune.ProgressReporter`` that
        renders the trials (`update` then takes them), or None for the line.
    """

    def __init__(
        self,
        metric: str | None,
        mode: str | None,
        interval_seconds: float = 5.0,
        verbose: int = 1,
        table: Any = None,
    ):
        self.metric, self.mode = metric, mode
        self.interval_seconds = interval_seconds
        self.verbose = verbose
        self.table = table
        self._last: dict[Any, float] = {}  # trial id -> its last finite metric value
        self._errored: set[Any] = set()  # get_best_result leaves errored trials out
        self._failed_with: dict[str, str] = {}  # a failure's traceback -> the first trial that failed with it
        self._last_print = -float("inf")  # monotonic time may start near 0 after boot
        self._notebook = in_notebook()
        self._handle = None

    @property
    def best(self) -> float | None:
        values = [value for trial, value in self._last.items() if trial not in self._errored]
        if not values:
            return None
        return max(values) if self.mode == "max" else min(values)

    def observe(self, rows: list[dict[str, Any]], events: list[dict[str, Any]] = ()) -> None:
        self._errored.update(event["trial_id"] for event in events if event["event"] == "error")
        if self.metric is None or self.mode is None:
            return
        for row in rows:
            value = row.get(self.metric)
            if isinstance(value, (int, float)) and math.isfinite(value):
                self._last[row.get("trial_id")] = float(value)

    def line(self, progress: Progress, final: bool = False, partial: bool = False) -> str:
        """The progress line; ``final`` compares what was executed with trial
        by trial, unless the study is ``partial`` (interrupted: its trials'
        remaining iterations are neither executed nor counted, so a ratio
        would overstate the saving)."""
        status = progress.status
        trials = ", ".join(f"{count} {name.lower()}" for name, count in sorted(status.items()) if count) or "none yet"
        executed, unique, total = progress.iterations, progress.unique_iterations, progress.total_iterations
        best = ""
        if self.best is not None:
            best = f" | best {self.metric}: {self.best:.4g}"
        stalled = "".join(
            f" | {names} {'has' if ',' not in names else 'have'} not reported for {seconds:.0f}s"
            for names, seconds in progress.stalled
        )
        return (
            f"[{duration(progress.elapsed)}] trials: {trials} | iterations: {executed} executed of {unique} requested, "
            f"{total} trial by trial{_ending(executed, total, final, partial)}{_restarts(progress)}{best}{stalled}"
        )

    def update(
        self, progress: Progress, final: bool = False, trials: list[Any] | None = None, partial: bool = False
    ) -> None:
        self.observe(progress.rows, progress.events)
        for warning in progress.warnings:  # shown whatever the verbosity, once each
            logger.warning(warning)
        for line in progress.scheduler_log:  # PBT's exploits, logged where Ray's PBT logs them
            logging.getLogger("ray.tune.schedulers.pbt").info(line)
        self._report_failures(progress, trials or ())
        if not self.verbose:
            return
        text = self.line(progress, final, partial)
        if self.table is not None:
            trials = list(trials or ())
            if self.table.should_report(trials, done=final):
                self.table.report(trials, final, text)
            return
        if self._notebook:
            from IPython.display import display

            if self._handle is None:
                self._handle = display({"text/plain": text}, raw=True, display_id=True)
            else:
                self._handle.update({"text/plain": text}, raw=True)
            return
        now = time.monotonic()
        if final or now - self._last_print >= self.interval_seconds:
            self._last_print = now
            print(text, file=sys.stderr, flush=True)

    def _report_failures(self, progress: Progress, trials: list[Any]) -> None:
        """Each failure of a trial, as Tune reports it: the traceback
        (whatever the verbosity), then where the trial stood and its error
        file, or that it is retried."""
        views = {getattr(trial, "trial_id", None): trial for trial in trials}
        for event in progress.events:
            if event["event"] not in ("error", "recover") or not event.get("error"):
                continue  # a restored study's errored trials were reported by the run that failed them
            name = event.get("name") or event["trial_id"]
            first = self._failed_with.setdefault(event["error"], name)
            if first == name:
                logger.error("Trial task failed for trial %s\n%s", name, event["error"].rstrip())
            else:  # trials that shared the failed stage fail with one error: its traceback once
                logger.error("Trial task failed for trial %s, with trial %s's error above", name, first)
            if not self.verbose:
                continue
            when = time.strftime("%Y-%m-%d %H:%M:%S")
            text = f"Trial {name} errored after {event.get('iterations', 0)} iterations at {when}. Total running time: "
            text += f"{progress.elapsed:.0f}s"
            error_file = getattr(views.get(event["trial_id"]), "error_file", None)
            if event["event"] == "recover":
                text += "\nIt is retried (FailureConfig.max_failures), from its latest checkpoint if it has one."
            elif error_file:
                text += f"\nError file: {error_file}"
            print(text, file=sys.stderr, flush=True)


def _restarts(progress: Progress) -> str:
    """The mode trainables run in: restarted where a config value they hold
    changes (how often, by key), or, without that, live."""
    restarts = progress.restarts
    if not restarts:
        return ""
    counts = ", ".join(f"{key} {count}x" for key, count in sorted(restarts.items()))
    return f" | restarts where a config value changed: {counts}"


def _ending(executed: int, trial_by_trial: int, final: bool, partial: bool) -> str:
    if not final:
        return ""
    return " (interrupted: figures of a partial study)" if partial else _saving(executed, trial_by_trial)


def _saving(executed: int, trial_by_trial: int) -> str:
    """Executed iterations against what trial-by-trial execution would run."""
    if not executed or not trial_by_trial:
        return ""
    if executed == trial_by_trial:
        return " (no shared prefix)"
    if executed < trial_by_trial:
        return f" ({trial_by_trial / executed:.2f}x fewer executed)"
    # Retrained where no checkpoint was kept or a trial was retried, or run after a trial ended (a time
    # budget, a stop the worker heard of after it went on): the last are not its results.
    return f" ({executed / trial_by_trial:.2f}x more executed: retrained, or run past a trial's end)"
