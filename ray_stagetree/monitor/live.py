"""The monitor of the study a `Tuner` runs (``Tuner(..., monitor=True)``):
served from the driver while ``fit()`` runs, reading the live controller."""

from __future__ import annotations

import contextlib
import errno
from collections.abc import Iterator
from typing import Any

from ray_stagetree._extras import MONITOR_MODULES, require_all

#: Seconds the page waits for the controller's view before showing the directory's.
VIEW_TIMEOUT_S = 10.0


@contextlib.contextmanager
def live_monitor(
    experiment_path: str, controller: Any, metric: str | None, mode: str | None, storage_filesystem: Any = None
) -> Iterator[Any]:
    """Serve the monitor for ``controller``'s study until the block ends;
    its URL is printed. Flask and matplotlib are imported only here: the
    monitor is an optional extra (``pip install ray_stagetree[monitor]``)."""
    import ray

    require_all(MONITOR_MODULES, "Tuner(monitor=True)", "monitor")
    from ray_stagetree.monitor.options import DEFAULT_PORT
    from ray_stagetree.monitor.server import serve

    def view() -> dict[str, Any] | None:
        try:
            return ray.get(controller.monitor_view.remote(), timeout=VIEW_TIMEOUT_S)
        except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
            return None  # the study ended (or its controller is busy): the directory still shows it

    options = dict(
        metric=metric, mode=mode or "min", storage_filesystem=storage_filesystem, block=False, live_view=view
    )
    try:
        server = serve(experiment_path, port=DEFAULT_PORT, **options)
    except OSError as error:  # another study's monitor has the port: any free one
        if error.errno != errno.EADDRINUSE:
            raise
        server = serve(experiment_path, port=0, **options)
    print(f"ray_stagetree monitor: {server.url}", flush=True)
    try:
        yield server
    finally:
        server.stop()
