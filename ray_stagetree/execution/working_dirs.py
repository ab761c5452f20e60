"""Trials' working directories on the stage workers, laid out as Tune lays
them out: ``<Ray session>/artifacts/<fit's timestamp>/<experiment>/working_dirs/<trial folder>``.

Tune changes each trial's process into its own folder, so files a trainable
writes by a relative path (Lightning's ``lightning_logs``, a Hugging Face
``output_dir``, a model saved as ``"best.pt"``) stay the trial's own. A
stage batch runs in the folder of the trial it is named after (the one its
deepest stage was made for). A trial whose own stages fork from a stage it
shared starts from what that stage left: the files are kept where trials
fork (``stage_ends/<node and iteration>``: at each checkpoint the plan
needs and at each batch's end), and a trial folder that does not exist yet
on the node is seeded from the point its batch starts at, if it was kept there.
The kept files go when the study ends, leaving Tune's layout. Tune's ``RAY_CHDIR_TO_TRIAL_DIR=0`` keeps the workers where they are.
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

#: Tune's variable (``ray.train.constants.RAY_CHDIR_TO_TRIAL_DIR``): 0 keeps trainables in the worker's directory.
CHDIR_VARIABLE = "RAY_CHDIR_TO_TRIAL_DIR"
#: Where the driver's directory is kept for trainables (``ray.tune.Trainable``'s name for it).
ORIGINAL_DIR_VARIABLE = "TUNE_ORIG_WORKING_DIR"
#: The study's folder of the files kept where trials fork.
STAGE_ENDS = "stage_ends"


@dataclass(frozen=True)
class WorkingDir:
    """A batch's working directory, relative to the Ray session's artifacts folder.

    Parameters
    ----------
    root:
        The study's folder there, ``<fit's timestamp>/<experiment folder>``.
    trial_folder:
        The folder name of the trial the batch is named after.
    upload:
        ``SyncConfig(sync_artifacts=True)``: the folder's files go to the trial's folder in storage
        when a batch ends, at a report once ``upload_period_s`` passed since the last upload (Tune's
        ``sync_period``), and with ``upload_at_checkpoints`` (``sync_artifacts_on_checkpoint``,
        Tune's default) at each checkpoint.
    """

    root: str
    trial_folder: str
    upload: bool = False
    upload_at_checkpoints: bool = False
    upload_period_s: float = 300.0

    @property
    def folder(self) -> str:
        return f"{self.root}/working_dirs/{self.trial_folder}"

    def stage_end(self, node_id: int, iteration: int) -> str:
        """Where the files are kept as they were at ``iteration`` of node ``node_id`` (`drop_kept` removes them)."""
        return f"{self.root}/{STAGE_ENDS}/node{node_id:06d}_step{iteration:07d}"


def changes_directory() -> bool:
    """Whether trainables run in their trial's folder (Tune's default), per ``RAY_CHDIR_TO_TRIAL_DIR``."""
    return os.environ.get(CHDIR_VARIABLE, "1").strip() not in ("0", "false", "False")


def enter(working_dir: WorkingDir, artifacts: str, starts_at: tuple[int, int] | None) -> str:
    """Change into the batch's folder under ``artifacts``; returns it. A
    folder new on this node starts as a copy of the files kept where the
    batch starts (``starts_at``: node and iteration), if this node kept them."""
    folder = os.path.join(artifacts, working_dir.folder)
    if not os.path.isdir(folder):
        kept = None if starts_at is None else os.path.join(artifacts, working_dir.stage_end(*starts_at))
        if kept is not None and os.path.isdir(kept):
            shutil.copytree(kept, folder, symlinks=True)
        os.makedirs(folder, exist_ok=True)
    os.chdir(folder)
    return folder


def keep(working_dir: WorkingDir, artifacts: str, point: tuple[int, int]) -> None:
    """Keep the files of the batch's folder as they are at ``point`` (node
    and iteration, a checkpoint other trials fork from), for the stages
    that start there; an empty folder keeps nothing."""
    folder = os.path.join(artifacts, working_dir.folder)
    if os.path.isdir(folder) and os.listdir(folder):
        kept = os.path.join(artifacts, working_dir.stage_end(*point))
        shutil.rmtree(kept, ignore_errors=True)  # a retried batch's replaces the failed attempt's
        shutil.copytree(folder, kept, symlinks=True)


def drop_kept(root: str, artifacts: str) -> None:
    """Remove the files kept where trials forked in the study at ``root``
    (`WorkingDir.root`): once it is over, none starts there again."""
    shutil.rmtree(os.path.join(artifacts, root, STAGE_ENDS), ignore_errors=True)


def leave(artifacts: str) -> None:
    """Change back to the directory the worker started in."""
    os.chdir(os.environ.get(ORIGINAL_DIR_VARIABLE) or artifacts)
