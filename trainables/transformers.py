"""Hugging Face Transformers' ``Trainer`` on shared stages
(``ray_stagetree.trainables.transformers``; ``pip install "ray_stagetree[transformers]"``).

A Tune + ``Trainer`` script (Ray's documented pattern: ``RayTrainReportCallback``
in the trainer's callbacks, and ``trainer.train(resume_from_checkpoint=...)``
from the folder ``ray.train.get_checkpoint()`` holds) shares stages as
written: on a stage worker Ray's callback is this one. Each save is a
report, so an iteration is a group of ``save_steps`` optimizer steps (or an
epoch with ``save_strategy="epoch"``), and a stage boundary is a save.
The Trainer's checkpoint holds everything the next group needs (model,
optimizer, scheduler, step counters, random states), and it resumes at
the same batch of the same epoch. This callback adds:

* the optimizer hyper-parameters of ``param_space`` that are sequences
  (``learning_rate`` or ``lr``, ``weight_decay``, ...) are applied as each
  step group starts (`ray_stagetree.trainables.torch.follow_optimizer_hparams`):
  a sequence sets the base learning rate, which the Trainer's own
  scheduler (``lr_scheduler_type``, warm-up) still scales; use
  ``lr_scheduler_type="constant"`` for the sequence's values as they are;
* each report's checkpoint is the folder this save wrote
  (``checkpoint-<global_step>``), where Ray's callback takes the newest
  one in ``output_dir``, another trial's when two trials share the folder.

Under ``ray.tune.Tuner`` it does the same from the trial's config, so one
script runs on both Tuners.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

from ray_stagetree._extras import require
from ray_stagetree.trainables.torch import follow_optimizer_hparams
from ray_stagetree.trial_schedulers.ray_fields import in_tune_session

require("transformers", "ray_stagetree.trainables.transformers", "transformers")

import ray.train  # noqa: E402  (after the extra's check)
import ray.tune  # noqa: E402
from ray.train.huggingface import transformers as train_transformers  # noqa: E402
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR  # noqa: E402

__all__ = ["RayTrainReportCallback"]


class RayTrainReportCallback(train_transformers.RayTrainReportCallback):
    """Ray's ``RayTrainReportCallback`` for a ``transformers.Trainer``: reports
    the logged metrics with each save's checkpoint (in a ``checkpoint``
    folder, as Ray's does), and applies the optimizer hyper-parameters'
    sequence values as each step group starts."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._group_starts = True  # the next step is a step group's first (an iteration's start)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._group_starts = True

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        optimizer, scheduler = kwargs.get("optimizer"), kwargs.get("lr_scheduler")
        if self._group_starts and optimizer is not None:
            follow_optimizer_hparams(optimizer, [scheduler] if scheduler is not None else [])
        self._group_starts = False

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._group_starts = True
        metrics: dict[str, Any] = {}
        for logged in state.log_history:
            metrics.update(logged)
        saved = os.path.join(args.output_dir, f"{PREFIX_CHECKPOINT_DIR}-{state.global_step}")
        with tempfile.TemporaryDirectory() as folder:
            checkpoint = None
            if os.path.isdir(saved):
                shutil.copytree(saved, os.path.join(folder, self.CHECKPOINT_NAME))
                checkpoint = ray.train.Checkpoint.from_directory(folder)
            # Under ray.tune.Tuner a function trainable reports to Tune; in a Ray Train worker, to Train.
            report = ray.tune.report if in_tune_session() else ray.train.report
            report(metrics, checkpoint=checkpoint)
