"""Serving the monitor: `serve` for a study's directory, blocking or in a
background thread (what ``Tuner(monitor=True)`` uses)."""

from __future__ import annotations

import errno
import socket
import threading
from collections.abc import Callable
from typing import Any

from werkzeug.serving import WSGIRequestHandler, make_server

from ray_stagetree.monitor.app import create_app
from ray_stagetree.monitor.options import DEFAULT_PORT
from ray_stagetree.monitor.view import ExperimentReader
from ray_stagetree.validation import Int, Options, check

#: How trials rank when neither the caller nor the study names a mode.
DEFAULT_MODE = "min"


class _QuietRequestHandler(WSGIRequestHandler):
    """No line per request: a monitor served beside a study (the page polls
    every 2 s) would bury the study's own output."""

    def log_request(self, *args: Any, **kwargs: Any) -> None:
        pass


def _check_free(host: str, port: int) -> None:
    """Raise OSError (EADDRINUSE) when ``host:port`` is taken, as werkzeug's
    server would exit the process instead (``Tuner(monitor=True)`` then takes any free port)."""
    family, kind, _, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
    with socket.socket(family, kind) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as werkzeug binds
        probe.bind(address)


class MonitorServer:
    """A running monitor: its ``url``; `stop` ends it."""

    def __init__(self, app: Any, host: str, port: int, quiet: bool = False) -> None:
        handler = _QuietRequestHandler if quiet else WSGIRequestHandler
        if port:
            _check_free(host, port)
        try:
            self._server = make_server(host, port, app, threaded=True, request_handler=handler)
        except SystemExit as error:  # werkzeug exits when it cannot bind: taken since the check
            raise OSError(errno.EADDRINUSE, f"cannot listen on {host}:{port}") from error
        self.host = host
        self.port = self._server.server_port  # the port chosen when 0 was asked for
        shown = f"[{host}]" if ":" in host else host
        self.url = f"http://{shown}:{self.port}/"
        self._thread: threading.Thread | None = None

    def start(self) -> MonitorServer:
        """Serve in a daemon thread and return at once."""
        self._thread = threading.Thread(target=self._server.serve_forever, name="stagetree-monitor", daemon=True)
        self._thread.start()
        return self

    def serve_forever(self) -> None:
        """Serve in this thread until interrupted."""
        self._server.serve_forever()

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        if self._thread is not None:
            self._thread.join()

    def __enter__(self) -> MonitorServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.stop()


def serve(
    path: str,
    host: str = "127.0.0.1",
    port: int = DEFAULT_PORT,
    *,
    metric: str | None = None,
    mode: str | None = None,
    storage_filesystem: Any = None,
    block: bool = True,
    live_view: Callable[[], dict[str, Any] | None] | None = None,
    verbose: bool = False,
) -> MonitorServer:
    """Serve the web monitor of the study in the experiment directory ``path``.

    The page shows the trials (status, config, latest and best ``metric``;
    sortable), the learning curves of the best trials, the stage tree
    (finished, running and pending stages, and their stored checkpoints),
    the workers and the stage-sharing figures, and refreshes itself. It
    works on a finished study and on one that is running: trials and curves
    come from the trial folders as they are written, the stage tree from
    the plan (saved when the study ends; live with ``Tuner(monitor=True)``).

    Parameters
    ----------
    path:
        The experiment directory (``ResultGrid.experiment_path``): a path or
        any fsspec URL.
    host, port:
        Where to listen; the default serves this machine only. ``port=0``
        picks a free port (see the returned server's ``url``).
    metric, mode:
        The metric the table ranks and the curves show ("min" or "max");
        by default the study's own (``TuneConfig``'s, stored beside its
        trials), else the first metric the trials report, minimised.
    storage_filesystem:
        The filesystem ``path`` is in, as in ``RunConfig``.
    block:
        Serve until Ctrl-C (the default), or return a started server to `stop` later.
    live_view:
        A running study's ``controller.monitor_view`` (``Tuner(monitor=True)`` passes it).
    verbose:
        Log each HTTP request to the terminal (werkzeug's request log); off by
        default: the page polls every 2 s.

    Examples
    --------
    >>> server = serve(results.experiment_path, port=0, block=False)   # doctest: +SKIP
    >>> print(server.url); server.stop()                                # doctest: +SKIP
    """
    if not isinstance(host, str) or not host:
        raise ValueError(f"host must be a host name or address to listen on, got {host!r}")
    check("port", port, Int(low=0, high=65535), meaning=" (0: any free port)")
    if metric is not None and (not isinstance(metric, str) or not metric):
        raise ValueError(f"metric must be a reported metric's name or None, got {metric!r}")
    check("mode", mode, Options(("min", "max")), None, meaning=" (None: the study's own)")
    reader = ExperimentReader(path, storage_filesystem)
    stored_metric, stored_mode = reader.stored_metric_and_mode()
    metric, mode = metric or stored_metric, mode or stored_mode or DEFAULT_MODE
    server = MonitorServer(create_app(reader, metric, mode, live_view), host, port, quiet=not verbose)
    if not block:
        return server.start()
    print(f"ray_stagetree monitor for {reader.path} at {server.url} (Ctrl-C stops it)", flush=True)
    try:
        server.serve_forever()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return server
