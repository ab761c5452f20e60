"""A trial as the controller keeps it (`TrialState`: its lifecycle state
and what Tune shows of it), `TrialInfo`, what Tune's user hooks
(``trial_name_creator``, ``trial_dirname_creator``) read from a trial, and
Tune's default trial names and folder names when there is no hook."""

from __future__ import annotations

import os
import re
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ray_stagetree.execution.retention import kept_checkpoints
from ray_stagetree.planning.config import TrialConfig, unflatten
from ray_stagetree.planning.lifecycle import ERROR, TERMINATED, Trial
from ray_stagetree.runtime.control.shown_config import scheduled, shown_config

#: Tune's key (``ray.train.constants.CHECKPOINT_DIR_NAME``, whose module imports
#: all of Ray Train) in a function trainable's results: the folder in the
#: trial's folder its checkpoint went to, None where the report had none.
CHECKPOINT_DIR_NAME = "checkpoint_dir_name"


def checkpoint_folder_name(index: int) -> str:
    """Tune's name of a trial's checkpoint folder: ``checkpoint_000000`` its first."""
    return f"checkpoint_{index:06d}"


@dataclass(kw_only=True)
class TrialState(Trial):
    """A trial's lifecycle state (`planning.lifecycle.Trial`) and what Tune
    shows of it: every row reported, failures, checkpoints, its names.
    (Snapshots pickle it; those written before it moved here name it in
    `runtime.control.controller`, which imports it.)"""

    config_json: dict[str, Any] = field(default_factory=dict)  # nested, the stored form (objects as PickledValue JSON)
    reported: list[dict[str, Any]] = field(default_factory=list)  # every row, in order
    failures: int = 0
    error: str | None = None
    error_pickle: bytes | None = None  # the trainable's exception for Result.error (runtime.workers.trial_errors)
    checkpoints: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # in the trial's folder, oldest first
    best_checkpoints: list[tuple[str, dict[str, Any]]] = field(default_factory=list)  # Tune's order: best last
    plain: frozenset[str] = frozenset()  # names the user gave plain values (PBT may make them sequences)
    name: str = ""  # TuneConfig.trial_name_creator's, for messages
    # Tune's (`experiment_tag`) as it was added, PBT's ``orig_tag``: `shown_tag` is the tag Tune shows now
    experiment_tag: str = ""
    dirname: str = ""  # the trial's folder under the experiment path
    restored_at: int = 0  # the iteration it went on from when its study was restored or it was resumed
    final_retrains: int = 0  # times its final checkpoint was found damaged and trained again
    # (node, iteration) of the checkpoint it reported just before it raised: restart_errored does not load it
    error_checkpoint: tuple[int, int] | None = None
    restore_failures: int = 0  # failed loads of its starting checkpoint since it last trained (TUNE_RESTORE_RETRY_NUM)
    announced: bool = False  # its "start" event went out (Tune's on_trial_start): see `DriverFeed.announce`
    saves: int = 0  # checkpoints registered on its path while it ran (Tune's on_trial_save)
    reported_checkpoints: int = 0  # the checkpoints its function reported, Tune's numbering of its folders
    # Checkpoint folders already announced to the driver (on_checkpoint) as they were registered.
    announced_checkpoints: frozenset[str] = frozenset()
    # Tune's last result of a function that returned having reported nothing (`StudyTrials.trainable_returned`).
    returned_result: dict[str, Any] | None = None
    # A class trainable's iterations where Tune saves it (`TrialCheckpoints.decided`, `.ended`): only those show in its
    # folder and results; the plan's other checkpoints there are the runtime's own (forks, decision points).
    # None: every checkpoint on its path shows (a function's, each one it reported; a study saved before).
    tune_saves: frozenset[int] | None = None
    # What the trial asked for from its config (`StudySpec.trial_request`), a PlacementGroupFactory; None: the study's.
    resources: Any = None
    # A failed trial is retried: the iterations it trains again until it passes this one are shown again,
    # as Tune's retry reports them again (Result.metrics_dataframe, the loggers); its scheduler hears each once.
    retrying_until: int = 0

    def configure(self, config: dict[str, Any], trial_config: TrialConfig) -> None:
        super().configure(config, trial_config)
        self.config_json = unflatten(trial_config.to_json())

    @property
    def shown_tag(self) -> str:
        """Tune's experiment tag now: PBT's exploits append the explored values'
        to the original one. In its last result only, where Tune adds it after the
        loggers and callbacks had the row (`messages.tagged`); not in its rows nor
        its checkpoints' metrics."""
        return self.experiment_tag + self.perturbed

    def shown_config(self, iteration: int | None = None) -> dict[str, Any]:
        """Its config as Tune shows it (`shown_config`), after ``iteration`` (default: its last result)."""
        at = max(self.rows, default=0) if iteration is None else iteration
        return shown_config(self.config, self.trial_config, self.scheduled(), at)

    def scheduled(self) -> frozenset[str]:
        """The names it was given plain that PBT made schedules (`shown_config.scheduled`),
        worked out once per config (PBT's exploits give it a new one): asked at every result."""
        cached = self.__dict__.get("_scheduled")
        if cached is None or cached[0] is not self.config:
            cached = self.__dict__["_scheduled"] = (self.config, scheduled(self.config, self.plain))
        return cached[1]

    def reported_checkpoint_folder(self, iteration: int) -> str:
        """The folder a checkpoint its function reported at ``iteration`` is
        named for (its row's ``checkpoint_dir_name``), numbered as Tune numbers
        them: the next, or the one it had where the iteration is reported
        again (a retry trains it again), so that the row names its folder."""
        earlier = self.rows.get(iteration, {}).get(CHECKPOINT_DIR_NAME)
        if earlier is not None:
            return earlier
        self.reported_checkpoints += 1
        return checkpoint_folder_name(self.reported_checkpoints - 1)

    def checkpoint_folders(self, iterations: list[int]) -> list[str]:
        """The folder names of its checkpoints at ``iterations`` (those on
        its path, oldest first): those its rows name (a function trainable's,
        numbered among every checkpoint it reported, as Tune numbers them),
        else a class trainable's position among the saves Tune makes of it
        (`tune_saves`: some may have gone under ``num_to_keep``), else their
        positions among these (a study restored from before rows named them)."""
        named = [self.rows.get(iteration, {}).get(CHECKPOINT_DIR_NAME) for iteration in iterations]
        if all(named):
            return named
        saves = sorted(self.tune_saves | set(iterations)) if self.tune_saves is not None else iterations
        position = {iteration: index for index, iteration in enumerate(saves)}
        return [checkpoint_folder_name(position[iteration]) for iteration in iterations]

    # -- its checkpoints

    def path_checkpoints(self) -> list[tuple[Any, int]]:
        """`trained_checkpoints` of an ended trial (finished or errored); none
        for the others."""
        if self.status not in (TERMINATED, ERROR):
            return []
        return self.trained_checkpoints()

    def trained_checkpoints(self) -> list[tuple[Any, int]]:
        """(node, iteration) of the plan's checkpoints on the paths the trial
        trained on, up to its last result, oldest first, those Tune would
        have saved (`shows_checkpoint`). Before a PBT exploit they are its
        own, as its results are (as under Tune), not the source's it forked from;
        where it trained an iteration again after an exploit, the later one."""
        if not self.rows:
            return []
        points = []
        for node, start, stop in [*self.earlier_paths, (self.node, self.forked_at, max(self.rows))]:
            top = stop
            while node is not None and top > start:
                after = max(node.fork_iteration, start)
                points += [(node, iteration) for iteration in node.checkpoints if after < iteration <= top]
                node, top = node.parent, min(node.fork_iteration, stop)
        # An iteration on an earlier path and on this one (an exploit took it back before it): the row
        # shown there is this path's, and so is the checkpoint beside it.
        latest = {iteration: (node, iteration) for node, iteration in sorted(points, key=lambda point: point[1])}
        return [point for iteration, point in latest.items() if self.shows_checkpoint(iteration)]

    def note_tune_save(self, iteration: int) -> None:
        """Tune saves the trial at ``iteration`` (a class trainable's: `tune_saves`)."""
        if self.tune_saves is not None:
            self.tune_saves |= {iteration}

    def shows_checkpoint(self, iteration: int) -> bool:
        """Whether a checkpoint on its path at ``iteration`` is one Tune would have saved (`tune_saves`)."""
        return self.tune_saves is None or iteration in self.tune_saves

    def final_checkpoint(self) -> tuple[Any, int] | None:
        """(node, iteration) of the plan's checkpoint at a finished trial's
        last result: what Tune returns as its result's checkpoint. None
        while it runs, when it errored, or when its last result had none."""
        points = self.path_checkpoints() if self.status == TERMINATED else []
        return points[-1] if points and points[-1][1] == max(self.rows) else None

    def checkpoint_metrics(self, iteration: int) -> dict[str, Any]:
        """The metrics a checkpoint at ``iteration`` of its paths is shown
        with: its own result there (`path_checkpoints` lists checkpoints
        only where it reported)."""
        return self.rows.get(iteration, {"training_iteration": iteration})

    def exposed_checkpoints(self, checkpoint_config: Any) -> tuple[list[tuple[Any, int, str]], list[int]]:
        """What it keeps in its folder (`kept_checkpoints` under Tune's
        ``CheckpointConfig``): (node, iteration, folder name) oldest first,
        and the iterations of ``Result.best_checkpoints``. The plan keeps the
        stage checkpoints other trials need whatever this says.

        Folders are named as `checkpoint_folders` names them: as Tune
        numbers them, among all the trial reported."""
        points = self.path_checkpoints()
        iterations = [at for _, at in points]
        kept, best = kept_checkpoints(iterations, self.checkpoint_metrics, checkpoint_config)
        names = self.checkpoint_folders(iterations)
        folders = [(node, at, name) for (node, at), name in zip(points, names, strict=True) if at in kept]
        return folders, best


def returned_result(state: TrialState, facts: dict[str, Any]) -> dict[str, Any]:
    """Tune's last result of a trial whose function returned having reported
    nothing: its bookkeeping alone, ``facts`` of the worker's process."""
    where = {key: facts[key] for key in ("date", "timestamp", "pid", "hostname", "node_ip")}
    return {"trial_id": state.trial_id, **where, "config": state.shown_config(), "done": True}


@dataclass
class TrialInfo:
    """The attributes of a ``ray.tune.experiment.Trial`` that user hooks use."""

    trial_id: str
    config: dict[str, Any]
    trainable_name: str
    #: Tune's experiment tag: the trial's index, then its tuned values ("3_lr=0.0100,units=64").
    experiment_tag: str = ""
    #: ``TuneConfig.trial_name_creator``'s name for it, once made.
    custom_name: str | None = None

    @classmethod
    def tagged(
        cls, trial_id: str, config: dict[str, Any], trainable_name: str, paths: frozenset[tuple[str, ...]] | None
    ) -> TrialInfo:
        """A new trial's, with its `experiment_tag` (``paths``: the tuned ones)."""
        return cls(trial_id, config, trainable_name, experiment_tag(trial_id, config, paths))

    def __str__(self) -> str:
        """Tune's ``Trial.__str__``: the ``trial_name_creator``'s name, else
        ``<trainable>[_<env>]_<trial id>``, "/" replaced."""
        if self.custom_name is not None:
            return self.custom_name
        identifier = self.trainable_name
        env = self.config.get("env") if isinstance(self.config, Mapping) else None
        if env is not None:
            identifier += f"_{env.__name__ if isinstance(env, type) else env}"
        return f"{identifier}_{self.trial_id}".replace("/", "_")


def experiment_tag(trial_id: str, config: Mapping[str, Any], paths: frozenset[tuple[str, ...]] | None) -> str:
    """Tune's experiment tag: the trial's counter (its id's number) and
    ``format_vars`` of its tuned values (``paths``: `searchers.variants.tuned_paths`;
    every value for a searcher's trial, ``paths`` None, as Tune's search
    generator tags them)."""
    from ray.tune.search.variant_generator import format_vars
    from ray.tune.utils import flatten_dict

    counter = trial_id.rsplit("_", 1)[-1]
    counter = str(int(counter)) if counter.isdigit() else trial_id
    if paths is None:
        resolved = {tuple(key.split("/")): value for key, value in flatten_dict(dict(config)).items()}
    else:
        resolved = {path: _at(config, path) for path in paths}
    return f"{counter}_{format_vars(resolved)}" if resolved else counter


def _at(config: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    for key in path:
        config = config[key]
    return config


def default_dirname(trial: TrialInfo) -> str:
    """Tune's ``Trial._generate_dirname``: ``<str(trial)>_<experiment tag>``
    cut to ``TUNE_MAX_LEN_IDENTIFIER`` (130), then the date; characters
    that are not portable in a folder name become ``_``."""
    limit = int(os.environ.get("TUNE_MAX_LEN_IDENTIFIER", "130"))
    name = f"{trial}_{trial.experiment_tag}"[:limit] + time.strftime("_%Y-%m-%d_%H-%M-%S")  # local time, as Tune's
    return re.sub(r'[/()<>:"\\|?*]', "_", name)


class FolderNames:
    """The study's trial folder names, each unique: a name
    ``trial_dirname_creator`` gives again gets ``_`` and four hex digits, as
    Tune names a trial whose folder exists (trials would share one folder)."""

    def __init__(self, trials: dict[str, TrialState]) -> None:
        self._trials = trials  # the study's, restored ones included
        self._taken: set[str] | None = None

    def named(self, creator: Callable[[Any], Any] | None, trial: TrialInfo) -> str:
        """``trial``'s folder name (`trial_name`), unique in the study."""
        name = trial_name(creator, trial, "trial_dirname_creator", folder=True)
        if self._taken is None:  # at the first new trial, after a restore added the old ones
            self._taken = {state.dirname for state in self._trials.values()}
        while name in self._taken:
            name = f"{name}_{uuid.uuid4().hex[:4]}"
        self._taken.add(name)
        return name


def trial_name(creator: Callable[[Any], Any] | None, trial: TrialInfo, hook: str, folder: bool) -> str:
    """``creator(trial)`` checked to be a usable name (a folder name when
    ``folder``), or Tune's default without a creator."""
    if creator is None:
        return default_dirname(trial) if folder else str(trial)
    name = creator(trial)
    usable = isinstance(name, str) and name.strip() != ""
    if folder:
        usable = usable and name not in (".", "..") and "/" not in name and "\\" not in name
    if not usable:
        allowed = "a non-empty str usable as a folder name (no '/')" if folder else "a non-empty str"
        raise ValueError(f"TuneConfig.{hook} must return {allowed}, got {name!r} for trial {trial.trial_id}")
    return name
