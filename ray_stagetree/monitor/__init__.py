"""The web monitor: a live page of a study's trials, learning curves, stage
tree, workers and stage-sharing figures, read from its experiment directory
and, while it runs, its controller.

>>> from ray_stagetree.monitor import serve
>>> serve("/tmp/studies/my_study")          # doctest: +SKIP
ray_stagetree monitor for /tmp/studies/my_study at http://127.0.0.1:8277/ (Ctrl-C stops it)

From a shell: ``python -m ray_stagetree.monitor PATH [--port N] [--metric M --mode min|max]``;
for the study a Tuner runs: ``Tuner(..., monitor=True)``.

Flask and matplotlib (the ``monitor`` extra) load on first use of `serve`:
importing the runtime, which imports `live`, never needs them.
"""

__all__ = ["DEFAULT_PORT", "MonitorServer", "serve"]


def __getattr__(name: str):
    if name in __all__:
        from ray_stagetree.monitor import server

        return getattr(server, name)
    raise AttributeError(f"module 'ray_stagetree.monitor' has no attribute {name!r}")
