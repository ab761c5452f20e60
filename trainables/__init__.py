"""Trainable APIs for stage execution (installed as ``ray_stagetree.trainables``).

`StageTrainable` is the class API. The PyTorch helpers (`apply_hparams`,
`ResumableLoader`, `ResumableSampler`) live in ``ray_stagetree.trainables.torch``
and are also reachable from here; torch is imported only when one is used.
"""

from ray_stagetree.trainables.stage_trainable import StageTrainable

_TORCH_HELPERS = ("apply_hparams", "ResumableLoader", "ResumableSampler", "OPTIMIZER_HPARAMS")

__all__ = ["StageTrainable", *_TORCH_HELPERS]


def __getattr__(name: str):
    if name in _TORCH_HELPERS:
        from ray_stagetree.trainables import torch as torch_helpers

        return getattr(torch_helpers, name)
    raise AttributeError(f"module 'ray_stagetree.trainables' has no attribute {name!r}")
