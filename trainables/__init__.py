"""Trainable APIs for stage execution (installed as ``ray_stagetree.trainables``).

`StageTrainable` is the class API; PyTorch helpers are in
``ray_stagetree.trainables.torch`` (imported on demand, so torch stays optional).
"""

from ray_stagetree.trainables.stage_trainable import StageTrainable

__all__ = ["StageTrainable"]
