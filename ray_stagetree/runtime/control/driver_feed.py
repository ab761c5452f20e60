"""What the driver hears from the study controller at each poll
(``StudyController.progress``): the new result rows, the trials' lifecycle
events and the warnings since the last poll, each once and in order.

Ray-free; the driver's callbacks and reporter read it
(`runtime.driver.callbacks`, `runtime.driver.progress`).
"""

from __future__ import annotations

from typing import Any

from ray_stagetree.runtime.control.trials import TrialState


class DriverFeed:
    """A study's news for its driver, kept until the driver takes it.

    ``events`` are dicts with ``event`` ("start" with the trial's
    ``config``, "complete", "error" with its ``error`` text, "recover" (it
    failed with ``error`` and is retried), "checkpoint" with a checkpoint's
    ``path`` in its folder: each as it is registered where a callback wants
    them, else the final one), ``trial_id``, ``name`` and ``dirname``. A trial's
    "start" comes before its rows, which come before its "complete" or "error".
    A row at an iteration the trial reported before (a retry, a PBT
    exploit's) carries `messages.REPORTED_AGAIN` (the driver takes it out).
    """

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self.events: list[dict[str, Any]] = []
        self.warnings: list[str] = []  # for the driver to show, once each
        self.outputs: list[tuple[str, list[tuple[str, str]]]] = []  # (trial id, [(file, text)]): log_to_file

    def warn(self, warning: str) -> None:
        self.warnings.append(warning)

    def row(self, row: dict[str, Any]) -> None:
        self.rows.append(row)

    def event(self, kind: str, state: TrialState, **fields: Any) -> None:
        self.events.append(
            {
                "event": kind,
                "trial_id": state.trial_id,
                "name": state.name,
                "dirname": state.dirname,
                "experiment_tag": state.shown_tag,
                **fields,
            }
        )

    def announce(self, state: TrialState) -> None:
        """A trial starts (Tune's on_trial_start) when a batch serving it is
        dispatched, or at its first result if that comes first: not when it
        is admitted, since the driver's loggers open files for each started
        trial and a study admits all its trials at once. A trial that ends
        before either (the time budget, ``stop_all``) ends without starting,
        as a pending trial does in Tune. Once per trial (``state.announced``)."""
        if not state.announced:
            state.announced = True
            self.event("start", state, config=state.shown_config())

    def output(self, trial_id: str, chunks: list[tuple[str, str]]) -> None:
        self.outputs.append((trial_id, chunks))

    def take(self) -> dict[str, Any]:
        """``rows``, ``events``, ``warnings`` and ``output`` since the last call."""
        taken = {"rows": self.rows, "events": self.events, "warnings": self.warnings, "output": self.outputs}
        self.rows, self.events, self.warnings, self.outputs = [], [], [], []
        return taken
