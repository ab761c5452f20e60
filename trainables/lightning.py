"""PyTorch Lightning on shared stages (``ray_stagetree.trainables.lightning``;
``pip install "ray_stagetree[lightning]"``).

A Tune + Lightning script (Ray's documented pattern: a function trainable
that builds a ``Trainer`` with Tune's ``TuneReportCheckpointCallback`` and
resumes with ``trainer.fit(model, ckpt_path=...)`` from
``tune.get_checkpoint()``) shares stages as written: on a stage worker
Ray's callback is this one. Each report (one per validation, so one per
epoch by default) is an iteration, and a stage boundary is an epoch's end,
where Lightning's checkpoint holds everything the next epoch needs: the
model, optimizers, schedulers and loop counters. This callback adds:

* the optimizer hyper-parameters of ``param_space`` that are sequences
  (``lr`` or ``learning_rate``, ``momentum``, ``weight_decay``, ...) are
  applied to ``trainer.optimizers`` as each epoch starts
  (`ray_stagetree.trainables.torch.follow_optimizer_hparams`): the
  trainable continues live across their changes, and a run resumed at a
  fork gets the new value, not the one Lightning restored with the
  optimizer's state;
* the random generators are set to their states at the checkpoint's report
  as the first epoch after a resume starts, after the model and the data
  loaders were built: the resumed run shuffles and drops out as the
  uninterrupted one did.

Under ``ray.tune.Tuner`` it does the same from the trial's config, so one
script runs on both Tuners. Reports mid-epoch (``val_check_interval`` below
1) work, but Lightning resumes a mid-epoch checkpoint at the next epoch's
start: keep one report per epoch where trials fork.
"""

from __future__ import annotations

from typing import Any

from ray_stagetree._extras import require
from ray_stagetree.trainables.live import restore_resumed_rng
from ray_stagetree.trainables.torch import follow_optimizer_hparams

require("lightning", "ray_stagetree.trainables.lightning", "lightning")

from ray.tune.integration import pytorch_lightning as tune_lightning  # noqa: E402  (after the extra's check)

__all__ = ["TuneReportCheckpointCallback"]


class TuneReportCheckpointCallback(tune_lightning.TuneReportCheckpointCallback):
    """Ray Tune's ``TuneReportCheckpointCallback`` (same arguments: ``metrics``,
    ``filename``, ``save_checkpoints``, ``on``), which also applies the
    optimizer hyper-parameters' sequence values and restores the random
    states where a resumed run's first epoch starts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._resumed = False

    def on_fit_start(self, trainer: Any, pl_module: Any) -> None:
        self._resumed = trainer.ckpt_path is not None
        super().on_fit_start(trainer, pl_module)

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        if self._resumed:
            self._resumed = False
            restore_resumed_rng()
        follow_optimizer_hparams(trainer.optimizers, [config.scheduler for config in trainer.lr_scheduler_configs])
        super().on_train_epoch_start(trainer, pl_module)
