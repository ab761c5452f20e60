"""A study in a Jupyter notebook: quiet by default, its errors still shown.

What a study's cell printed besides its progress, and what is done about it
when ``fit()`` runs in an IPython kernel:

* Ray's INFO lines ("Started a local Ray instance. View the dashboard ...",
  "Missing packages: ['ipywidgets'] ..."): the ``ray`` logger is raised from
  Ray's default INFO to WARNING once per kernel, and a Ray the Tuner starts
  is started at that level. Warnings, errors and every trial's error still
  show; ``logging.getLogger("ray").setLevel(logging.INFO)`` after the first
  ``fit()`` brings the INFO lines back.
* The kernel's shutdown: ipykernel terminates the kernel's child processes
  (the local Ray's GCS, raylet, dashboard and workers) with rounds of
  signals that take longer than Jupyter waits (half of
  ``shutdown_wait_time``: 2.5 s by default) before it sends the kernel
  SIGTERM, on which Ray's crash handler prints a stack trace to the
  terminal. The kernel's shutdown now shuts Ray down first (Ray stops its
  own processes), and a SIGTERM after that ends the kernel silently: it
  was asked to exit.

The progress itself is one display updated in place (`progress`). tqdm's
"IProgress not found" warning, which ``import ray`` gives in a kernel
without ipywidgets, comes before any of this can run: the ``notebook``
extra installs ipywidgets, which silences it at its source.
"""

from __future__ import annotations

import inspect
import logging
import signal
from typing import Any

import ray

#: Kernels whose shutdown already shuts Ray down first (by id: a kernel is not hashable by value).
_PREPARED: set[int] = set()


def in_notebook() -> bool:
    """True in a Jupyter kernel (ipykernel's shell), False in a terminal,
    a script or a terminal IPython."""
    shell = _shell()
    return shell is not None and shell.__class__.__name__ == "ZMQInteractiveShell"


def _shell() -> Any:
    try:
        from IPython import get_ipython
    except ImportError:
        return None
    return get_ipython()


def prepare_notebook() -> None:
    """Quiet Ray's INFO lines and make the kernel's shutdown clean; once per
    kernel, nothing outside one."""
    if not in_notebook():
        return
    kernel = getattr(_shell(), "kernel", None)
    if kernel is None or id(kernel) in _PREPARED:
        return
    _PREPARED.add(id(kernel))
    ray_logger = logging.getLogger("ray")
    if ray_logger.level in (logging.NOTSET, logging.INFO):
        ray_logger.setLevel(logging.WARNING)
    _shut_ray_down_first(kernel)


def ray_init_options() -> dict[str, Any]:
    """What the Tuner passes to the ``ray.init()`` it makes: in a notebook,
    the ``ray`` logger's level, which ``ray.init`` would otherwise reset to
    INFO."""
    if not in_notebook():
        return {}
    return {"logging_level": logging.getLogger("ray").getEffectiveLevel()}


def _shut_ray_down_first(kernel: Any) -> None:
    """Wrap the kernel's ``do_shutdown``, the one step of its shutdown that
    runs before ipykernel signals the kernel's children."""
    original = kernel.do_shutdown

    async def do_shutdown(restart: bool) -> Any:
        # The control thread runs this; signal handlers are set on the main thread.
        kernel.io_loop.add_callback(signal.signal, signal.SIGTERM, signal.SIG_DFL)
        ray.shutdown()
        reply = original(restart)
        return await reply if inspect.isawaitable(reply) else reply

    kernel.do_shutdown = do_shutdown
