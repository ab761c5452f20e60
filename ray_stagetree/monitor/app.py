"""The monitor's Flask application: the page, its JSON state and the
learning curves (``/api/curves``, drawn by the page; ``/curves.svg``, a
matplotlib figure for a report).

Flask (with Jinja2 for the page) because it is the small, well-kept
standard for a read-only local page: three routes, no database, no
asynchronous code; it runs in a thread of the driver under werkzeug's
threaded server. The curves are drawn server-side by matplotlib as SVG, so
the page needs no JavaScript library and works offline; the page's own
script polls ``/api/state`` and re-renders.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from typing import Any

from flask import Flask, Response, jsonify, render_template, request

import ray_stagetree.monitor.analysis as analysis
from ray_stagetree.monitor.view import ExperimentReader, best_trials, default_metric, study_state

#: Trials drawn in the learning-curve figure unless ``?trials=`` says otherwise.
CURVES = 5
#: The most curves ``/api/curves?all=1`` returns (a browser draws a few hundred lines at ease).
MAX_CURVES = 500
#: How often the page asks for new state, in milliseconds.
POLL_MS = 2000


def create_app(
    reader: ExperimentReader,
    metric: str | None = None,
    mode: str = "min",
    live_view: Callable[[], dict[str, Any] | None] | None = None,
) -> Flask:
    """The monitor's app for the study ``reader`` reads; ``live_view``
    returns the running controller's `monitor_view` (None once it is gone)."""
    app = Flask(__name__)

    def state() -> dict[str, Any]:
        return study_state(reader, metric, mode, live_view() if live_view is not None else None)

    @app.get("/")
    def index() -> str:
        return render_template("index.html", path=reader.path, poll_ms=POLL_MS)

    @app.get("/api/state")
    def api_state() -> Response:
        return jsonify(state())

    @app.get("/api/importance")
    def api_importance() -> Response:
        """Parameter importance (`analysis.importance`), apart from the state:
        its first call imports scikit-learn, which the state never waits for."""
        trials = reader.trials()
        chosen = metric or default_metric(trials)
        return jsonify(analysis.importance(analysis.parallel_coordinates(trials, chosen), chosen))

    @app.get("/api/curves")
    def api_curves() -> Response:
        """Learning curves for the page to draw: ``?best=N`` (the N best by
        their last result), ``?trials=a,b`` (those trial folders) or ``?all=1``
        (at most `MAX_CURVES`)."""
        trials = reader.trials()
        chosen = metric or default_metric(trials)
        names: list[str] | None
        if request.args.get("trials") is not None:
            names = [name for name in request.args["trials"].split(",") if name]
        elif request.args.get("all") == "1":
            names = None
        else:
            count = request.args.get("best", default=CURVES, type=int)
            if count is None or count < 1:
                return Response(f"best must be an int >= 1, got {request.args.get('best')!r}", status=400)
            names = [trial["name"] for trial in best_trials(trials, chosen, mode, count)]
        return jsonify({"metric": chosen, "mode": mode, "curves": analysis.curves(trials, chosen, names, MAX_CURVES)})

    @app.get("/curves.svg")
    def curves() -> Response:
        count = request.args.get("trials", default=CURVES, type=int)
        if count is None or count < 1:
            return Response(f"trials must be an int >= 1, got {request.args.get('trials')!r}", status=400)
        trials = reader.trials()
        chosen = metric or default_metric(trials)
        return Response(_curves_svg(best_trials(trials, chosen, mode, count), chosen, mode), mimetype="image/svg+xml")

    return app


def _curves_svg(trials: list[dict[str, Any]], metric: str | None, mode: str) -> bytes:
    """Learning curves of ``trials`` (``metric`` by iteration) as SVG."""
    from matplotlib.figure import Figure  # no pyplot: no global state, safe in server threads

    figure = Figure(figsize=(7.0, 3.4), layout="constrained")
    axes = figure.add_subplot()
    labels = analysis.legend_labels(trials)
    for trial in trials:
        points = [(row["training_iteration"], row[metric]) for row in trial["rows"] if metric in row]
        if points:
            iterations, values = zip(*points)
            axes.plot(iterations, values, marker="o", markersize=3, label=labels[trial["name"]])
    axes.set_xlabel("iteration")
    axes.set_ylabel(metric or "no metric reported yet")
    axes.set_title(f"best {len(trials)} trials by {metric} ({mode})" if metric else "learning curves")
    axes.grid(alpha=0.3)
    if trials:
        axes.legend(fontsize="small")
    buffer = io.BytesIO()
    figure.savefig(buffer, format="svg")
    return buffer.getvalue()
