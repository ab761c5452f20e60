"""The web monitor: a live page of a study's trials, learning curves, stage
tree, workers and stage-sharing figures, read from its experiment directory
and, while it runs, its controller.

>>> from ray_stagetree.monitor import serve
>>> serve("/tmp/studies/my_study")          # doctest: +SKIP
ray_stagetree monitor for /tmp/studies/my_study at http://127.0.0.1:8277/ (Ctrl-C stops it)

From a shell: ``python -m ray_stagetree.monitor PATH [--port N] [--metric M --mode min|max]``;
for the study a Tuner runs: ``Tuner(..., monitor=True)``.
"""

from ray_stagetree.monitor.server import DEFAULT_PORT, MonitorServer, serve

__all__ = ["DEFAULT_PORT", "MonitorServer", "serve"]
