"""The per-batch state a trainable runs against on a stage worker.

`StageContext` is what the function API (`ray_stagetree.runtime.workers.session`) and
the class-API driver call into: this iteration's hyper-parameters, where to
checkpoint, and the recording of each iteration's metrics, which it streams
to the controller. `report` ends the trainable at the batch's last iteration
by raising `BatchEnd`, a BaseException, so ``except Exception`` in user code
does not swallow it.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from ray_stagetree.execution.batches import REPORTED_CHECKPOINT, BatchOutcome, BatchSpec, reported_checkpoint_key
from ray_stagetree.execution.payload import (
    CheckpointPayload,
    pack_directory,
    size_of,
    tree_entries,
    unpack_directory,
)
from ray_stagetree.execution.rng import capture_rng_state, fork_rng_state, restore_rng_state
from ray_stagetree.planning.config import LINEAGE_KEY, HParams, hparam_keys, replaced, split_path
from ray_stagetree.planning.plan_records import CheckpointInfo
from ray_stagetree.runtime.workers import scratch, trial_output, trial_workdir
from ray_stagetree.runtime.workers.phases import PhaseClock
from ray_stagetree.runtime.workers.user_generators import UserGenerators
from ray_stagetree.runtime.workers.visible_config import values_at
from ray_stagetree.sequences.base import changes_at, next_change

FLUSH_SECONDS = 0.5
#: Where a stage checkpoint's RNG states hold the trainable's own generators'.
USER_GENERATORS = "user_generators"

_local = threading.local()


class BatchEnd(BaseException):
    """Raised by `report` when the stage batch is complete; the worker catches it."""


class ConfigChange(BaseException):
    """Raised by `report` where a plain config value changes inside the batch
    (PBT explored it): the worker restarts the function with the new config
    from the checkpoint just reported, as Tune restarts an exploited trial."""


class ReportError(TypeError):
    """`report` got a value it cannot pass on. A bug in the trainable's code,
    which a retry would repeat: the trial errors without retries."""


@dataclass
class LatestCheckpoint:
    """The last checkpoint a function reported: after its ``iteration`` on
    plan node ``node_id``, copied to ``folder``, with the RNG states then
    (in a group, ``rank_rng``: ranks 1..N-1's)."""

    iteration: int
    node_id: int
    folder: str
    rng: dict[str, Any]
    rank_rng: list[dict[str, Any]] | None = None


# Metric values that always pickle: the common case skips the check.
_PLAIN_METRICS = (int, float, str, bool, type(None), np.number)


def check_picklable(metrics: dict[str, Any], iteration: int) -> None:
    """Raise `ReportError` naming the first metric that cannot be pickled:
    metrics travel to the study's controller, and a value that cannot would
    otherwise fail there, for every trial on the worker's batch."""
    import ray.cloudpickle

    for key, value in metrics.items():
        if isinstance(value, _PLAIN_METRICS):
            continue
        try:
            ray.cloudpickle.dumps(value)
        except Exception as error:  # each type refuses in its own way
            raise ReportError(
                f"the trial reported {key}={value!r} ({type(value).__name__}) at iteration {iteration}, which cannot "
                f"be pickled ({type(error).__name__}: {error}); metrics are sent to the study's controller: "
                "report numbers, strings, or other picklable values"
            ) from None


def current() -> StageContext | None:
    """The context of the batch running on this thread, if any."""
    return getattr(_local, "context", None)


def activate(context: StageContext | None) -> None:
    _local.context = context


class StageContext:
    """Per-batch state behind the function API and the class-API driver."""

    def __init__(
        self,
        spec: BatchSpec,
        controller: Any,
        put: Callable[[str, Any], None],
        park: Callable[[BatchOutcome], BatchSpec | None] | None = None,
        group: Any = None,
    ) -> None:
        self.returned_at: int | None = None  # set when a function trainable returns before `stop`
        self._controller = controller
        self._put = put
        # Hands the worker a parked batch's outcome and waits for the batch
        # that continues it (None: the trainable ends).
        self._park = park
        # A data-parallel batch's rank, a `runtime.workers.group.RankGroup` (which builds on this
        # module, hence not named in the annotation): None on a worker of its own.
        self.group = group
        # On a worker of its own: makes it rank 0 of a group of a `Scaling`, mid-batch (`StageWorker._grow`).
        self.grow_group: Callable[[Any], None] | None = None
        # The config entry whose values get_hparams() keys from (a hosted trainer's train_loop_config).
        self.hparams_root = ""
        # The trainable reads get_hparams() (or is a class told of each change): it follows values live.
        # Until then it holds config's values as they were at its start, and restarts where one changes.
        self.follows_values = False
        # Config names whose values a framework integration applies itself each iteration (`follow`):
        # live for those alone, while the trainable still restarts where another held value changes.
        self.followed: set[str] = set()
        self.user_generators = UserGenerators()  # the trainable's own generators, carried in its checkpoints
        self.phases = PhaseClock()  # where the batch's time goes (`phases`)
        self.output: list[tuple[str, str]] = []  # what the trainable printed since its last report (`trial_output`)
        self._printed: list[trial_output.Tagged] = []  # and before, by the iteration it printed in
        self._begin(spec)
        self._restart_payload: CheckpointPayload | None = None
        self._source: CheckpointPayload | None = None
        self._restored_dir: str | None = None
        self._ended = False  # a report said done
        self._parking = False  # the controller's reply at the batch's end said park
        self._put_iterations: set[int] = set()  # iterations whose checkpoint went to the outbox or to storage
        self._stored_iterations: set[int] = set()  # those that went to storage (`_store`)
        # The last checkpoint report() got, kept (hard-linked) past the user's
        # temporary folder: if the function ends the trial after it, it is
        # the trial's final checkpoint, as in Tune.
        self._latest: LatestCheckpoint | None = None
        self.restoring = False  # a class trainable is loading the starting checkpoint (`class_trainables`)

    def _begin(self, spec: BatchSpec) -> None:
        """Take ``spec`` as the batch to train (also a batch that continues a parked one)."""
        self.spec = spec
        self.iteration = spec.start
        self.stop = spec.stop
        self._config = spec.trial_config
        self._keys, self._ambiguous = hparam_keys(self._config.names)
        self._followed = self._following()
        self._config_change = self._next_fixed_value_change()
        self.save_iterations = set(spec.save_iterations) | self._config_changes()
        self._pending = BatchOutcome(spec.batch_id)
        self._last_flush = self._iteration_started = time.monotonic()
        # branch points since the last outcome whose checkpoint report() did not get
        self.missing_checkpoints: list[int] = []
        self.last_metrics: dict[str, Any] = {}  # the last iteration's, as reported (a Train run's Result)

    def _next_fixed_value_change(self, after: int | None = None) -> int | None:
        """The next iteration of the batch after ``after`` (by default the
        current one) where a value the trainable holds fixed changes: one
        handed over as plain (PBT explored it), or any sequence's while it
        does not follow values live. The trainable restarts there from a
        checkpoint. Only the next one, found from the sequences' structure: a
        batch may span a horizon of 10**9 iterations, never expanded."""
        after = self.iteration if after is None else after
        sequences = self._fixed_sequences()
        changes = (next_change(sequence, after, self.spec.stop) for sequence in sequences.values())
        return min((change for change in changes if change is not None), default=None)

    def _fixed_sequences(self) -> dict[str, Any]:
        """The sequences whose values the running trainable holds as they were at its start, by name."""
        declared = () if self.follows_values else set(self._config.declared) - self.followed
        return {
            name: sequence
            for name, sequence in zip(self._config.names, self._config.sequences)
            if name in self.spec.plain or name in declared
        }

    def _following(self) -> tuple[bool, frozenset[str]]:
        return self.follows_values, frozenset(self.followed)

    def _sync_restarts(self) -> None:
        """Where the trainable restarts next, once it follows values live."""
        if self._followed == self._following():
            return
        self._followed = self._following()
        self._config_change = self._next_fixed_value_change()
        self.save_iterations = set(self.spec.save_iterations) | self._config_changes()

    def _plain_sequences(self) -> dict[str, Any]:
        """The sequences of the values handed over as plain (PBT explores them), by name."""
        return {
            name: sequence
            for name, sequence in zip(self._config.names, self._config.sequences)
            if name in self.spec.plain
        }

    def capture_rng(self) -> dict[str, Any]:
        """The global generators' states, and the trainable's own (`UserGenerators`)."""
        rng = capture_rng_state()
        rng[USER_GENERATORS] = self.user_generators.capture()
        return rng

    def restore_rng(self, rng: dict[str, Any]) -> None:
        """Set the generators to a checkpoint's ``rng`` (a path trains as it would
        from scratch), then fork them where PBT changed a plain value."""
        restore_rng_state(rng)
        self.user_generators.restore(rng.get(USER_GENERATORS, {}))
        self.fork_rng_at_config_change()

    def fork_rng_at_config_change(self) -> None:
        """Where PBT changed a plain value at this iteration (a clone's first
        after its fork), a stream of the clone's own, derived from the state
        here and the new values: under Tune a clone draws from its own
        process's generators, and with its source's numbers it would only
        replay its source's noise (an objective driven by noise, as Ray's
        `pbt_function.py`, stops exploring). It depends on the state and the
        values only: a reproducible study stays reproducible."""
        changed = sorted(
            name for name, sequence in self._plain_sequences().items() if changes_at(sequence, self.iteration)
        )
        values = self._config.hparams_at(self.iteration) if changed else {}
        label: dict[str, Any] = {name: values[name] for name in changed}
        # A clone that PBT gave its source's very values (PB2 does when it has no data on the source yet)
        # branches here all the same (`TrialConfig.lineage`): its own numbers set it apart.
        branch = next((token for at, token in self._config.lineage if at == self.iteration), None)
        if branch is not None:
            label[LINEAGE_KEY] = branch
        if label:
            fork_rng_state(json.dumps(label, default=repr))

    def _config_changes(self) -> set[int]:
        """The iterations where the trainable must save for a config change (the next one)."""
        return set() if self._config_change is None else {self._config_change}

    # -- function API ------------------------------------------------------

    def trial_dir(self) -> str:
        path = self.spec.trial_dir or os.path.join(tempfile.gettempdir(), "stagetree_trials", self.spec.trial_id)
        os.makedirs(path, exist_ok=True)
        return path

    def trainable_config(self) -> dict[str, Any]:
        """The config the trainable gets as it (re)starts: each sequence's
        value at this iteration (what the trials sharing this batch's stages
        all have), and where the user gave a plain value that PBT explored,
        this iteration's value, as Tune has it."""
        config = values_at(self.spec.config, self._config, self.spec.plain, self.iteration)
        if not self.spec.plain:
            return config
        values = self._config.hparams_at(self.iteration)
        changed = {name: values[name] for name in self.spec.plain if _differs(self.spec.config, name, values[name])}
        return replaced(config, changed) if changed else config

    def hparams(self, live: bool = False) -> HParams:
        """This iteration's values, keyed as the config's keys are written
        (`hparam_keys`); ``live``: the trainable asked (``get_hparams()``),
        so it follows every value from iteration to iteration."""
        if live:
            self.follows_values = True
        values = {self._key(name): value for name, value in self._config.hparams_at(self.iteration).items()}
        return HParams(values, self._ambiguous)

    def _key(self, name: str) -> str:
        """A config name as the trainable's config writes its key (`hparam_keys`)."""
        key = self._keys[name]
        # a hosted TorchTrainer's loop reads its train_loop_config as its config
        return key.removeprefix(f"{self.hparams_root}/") if self.hparams_root else key

    def follow(self, follows: Callable[[str], bool]) -> dict[str, Any]:
        """The values of the keys ``follows`` picks that change at this
        iteration (from the last one's), for a caller that applies them
        itself now (a framework integration setting an optimizer's learning
        rate). The trainable follows those keys live: no restart where they
        change, while it still restarts where another value it holds does."""
        names = {name for name in self._config.names if follows(self._key(name))}
        self.followed |= names
        if self.iteration == 0:
            return {}
        now, before = self._config.hparams_at(self.iteration), self._config.hparams_at(self.iteration - 1)
        return {self._key(name): now[name] for name in sorted(names) if now[name] != before[name]}

    def resumed_rng(self) -> dict[str, Any] | None:
        """The random states saved with the checkpoint this run started
        from; None on a fresh start."""
        payload = self.source_payload()
        return None if payload is None else payload.rng

    def should_checkpoint(self) -> bool:
        self._sync_restarts()
        return self.iteration + 1 in self.save_iterations

    def source_payload(self) -> CheckpointPayload | None:
        import ray

        if self._restart_payload is not None:
            return self._restart_payload
        if self.spec.source is None:
            return None
        if self._source is None:  # fetched once: the worker checks it is there before the trainable starts
            with self.phases.phase("fetch"):
                self._source = ray.get(self.spec.source)
        payload = self._source
        if payload.step != self.spec.start:
            raise RuntimeError(f"checkpoint holds iteration {payload.step}, batch starts at {self.spec.start}")
        return payload

    def get_checkpoint(self):
        from ray.tune import Checkpoint

        payload = self.source_payload()
        if payload is None:
            return None
        self.restore_rng(payload.rng)
        if payload.directory is None:
            raise RuntimeError("this checkpoint was saved with get_state(); use a StageTrainable to restore it")
        if self._restored_dir is None:
            self._restored_dir = scratch.mkdtemp("stagetree_restore_")
            with self.phases.phase("restore"):
                unpack_directory(payload.directory, self._restored_dir)
        return Checkpoint.from_directory(self._restored_dir)

    def report(self, metrics: Any, checkpoint: Any = None) -> None:
        if not isinstance(metrics, dict):
            raise ReportError(f"report() takes a dict of metrics, got {type(metrics).__name__}: {metrics!r}")
        if checkpoint is not None and not callable(getattr(checkpoint, "as_directory", None)):
            raise ReportError(
                f"report()'s checkpoint must be a ray.tune.Checkpoint (tune.Checkpoint.from_directory(path)) or "
                f"None, got {type(checkpoint).__name__}: {checkpoint!r}"
            )

        def payload(iteration: int) -> CheckpointPayload | None:
            if checkpoint is None:
                if iteration < self.stop:  # a branch point: forks will retrain (the end only serves a later resume)
                    self.missing_checkpoints.append(iteration)
                return None
            with checkpoint.as_directory() as path:
                return CheckpointPayload(iteration, self.capture_rng(), directory=pack_directory(path))

        if checkpoint is not None:
            with self.phases.phase("save"):
                self._keep_latest(checkpoint)
        self.record(metrics, payload, can_checkpoint=checkpoint is not None, reported=checkpoint is not None)

    def _keep_latest(self, checkpoint: Any) -> None:
        kept = scratch.mkdtemp("stagetree_latest_")
        with checkpoint.as_directory() as path:
            _check_links(path)
            # Links are followed now, as Tune's upload follows them: what they point to may not outlive the report.
            shutil.copytree(path, kept, copy_function=_link_or_copy, dirs_exist_ok=True, symlinks=False)
        self._drop_latest()
        iteration = self.iteration + 1
        self._latest = LatestCheckpoint(iteration, self.spec.node_at(iteration), kept, self.capture_rng())

    def _drop_latest(self) -> None:
        if self._latest is not None:
            shutil.rmtree(self._latest.folder, ignore_errors=True)
            self._latest = None

    def _put_final_checkpoint(self, outcome: BatchOutcome, failed: bool) -> None:
        """The batch ends (the function returned, reported ``done`` or
        raised, or the plan's stop came) or parks after a reported checkpoint
        the plan had not asked for: put it, the latest, in the outbox. Tune keeps it
        for ``Result.checkpoint`` even when later reports carried none; after
        an error it is where Tune resumes the trial (a retry under
        ``FailureConfig``, ``Tuner.restore(resume_errored=True)``), and where
        the plan's stop got no checkpoint it is the closest the plan has."""
        latest = self._latest
        raised = failed and self.returned_at is None and not self._ended
        if latest.iteration in self._put_iterations:
            if raised and latest.iteration in self._stored_iterations:
                outcome.error_checkpoint = (latest.node_id, latest.iteration)
            return
        try:
            with self.phases.phase("save"):
                directory = pack_directory(latest.folder)
        except (ValueError, OSError):
            if failed:  # the trial errors with the trainable's own error; this one would hide it (and end the thread)
                return
            raise
        # Where the function returned at its last iteration the RNG states are those at its end (a later
        # resume continues from there), else those at the report: a failed attempt may have drawn since.
        returned_here = latest.iteration == self.iteration and not failed
        rng = self.capture_rng() if returned_here else latest.rng
        payload = CheckpointPayload(latest.iteration, rng, directory=directory, rank_rng=latest.rank_rng)
        key = f"{self.spec.batch_id}:{latest.iteration}"
        self._put(key, payload)
        self._put_iterations.add(latest.iteration)
        outcome.checkpoints.append((latest.node_id, latest.iteration, key, size_of(payload)))
        if raised:
            outcome.error_checkpoint = (latest.node_id, latest.iteration)

    # -- shared by both APIs ------------------------------------------------

    def record(
        self,
        metrics: dict[str, Any],
        make_payload: Callable[[int], CheckpointPayload | None],
        can_checkpoint: bool = True,
        reported: bool | None = None,
        asks_save: bool = False,
    ) -> None:
        """One iteration done: stream its metrics, and a checkpoint (made by
        ``make_payload(iteration)``) where the plan needs one, where a class
        trainable's result ``asks_save`` (Tune's ``should_checkpoint``) and
        wherever the function ``reported`` one, as Tune keeps them all (None:
        a class trainable's result, which reports none). At the batch's end
        the controller's reply says whether the batch goes on (live
        continuation); the end's checkpoint is made only if it does not."""
        check_picklable(metrics, self.iteration + 1)
        self.last_metrics = metrics
        self._sync_restarts()
        self.user_generators.setup_done()
        now = time.monotonic()
        self.iteration += 1
        row = dict(metrics)
        row["training_iteration"] = self.iteration
        row["time_this_iter_s"] = now - self._iteration_started
        for key, value in worker_facts().items():  # Tune's auto-filled keys
            row.setdefault(key, value)
        if reported is not None:
            row[REPORTED_CHECKPOINT] = reported
        self._iteration_started = now
        node_id = self.spec.node_at(self.iteration)
        self._tag_output(node_id)
        self._pending.records.append((node_id, self.iteration, row))
        if row.get("done") is True:  # the trial ends here, as Tune ends it: so does the batch
            self.stop = self.iteration
            self._ended = True
        ask = reported is None and self.spec.ask_callbacks  # a class trainable's result: a callback may ask to save
        if self.iteration >= self.stop or ask:
            # Without a checkpoint here, stopping would mean retraining: the controller continues live.
            self._pending.can_checkpoint = can_checkpoint
            self.flush(ask)
        needed = self.iteration in self.save_iterations or asks_save
        wanted = needed or (bool(reported) and self.spec.reported_storage is not None)
        # Every rank's RNG states at each reported checkpoint too: it may become the one a retry resumes from.
        ranks_rng = self.group.checkpoint(needed or bool(reported)) if self.group is not None else []
        if reported and ranks_rng:
            self._latest.rank_rng = ranks_rng
        with self.phases.phase("save"):
            payload = make_payload(self.iteration) if wanted else None
        if payload is not None and ranks_rng:
            payload.rank_rng = ranks_rng
        if payload is not None:
            with self.phases.phase("save"):
                if needed or not self._store(node_id, payload):
                    key = f"{self.spec.batch_id}:{self.iteration}"
                    self._put(key, payload)
                    self._pending.checkpoints.append((node_id, self.iteration, key, size_of(payload)))
            self._put_iterations.add(self.iteration)
        # Trials forking here start from the working directory's files; a report may sync them (sync_artifacts).
        trial_workdir.reported(self.spec, node_id, self.iteration, fork=needed, saved=payload is not None)
        # Each checkpoint reaches the controller before the function goes on, as each reaches Tune's
        # driver: forks start from it, and a retry after the process dies resumes from it.
        if self.iteration < self.stop and (payload is not None or now - self._last_flush >= FLUSH_SECONDS):
            self.flush()
        restart = self.iteration == self._config_change and self.iteration < self.stop
        if self.group is not None:
            self._lead(restart, payload)
        if self.iteration >= self.stop:
            if not self._parking:
                raise BatchEnd()
            self._wait_parked()
            # The batch it continues into may change a held value right here: a fork whose value changes at
            # the park point (PBT's exploit continues the source's parked trainable with the explored values).
            if self._held_value_changes_now():
                restart = True
                payload = payload or make_payload(self.iteration)
        if restart:
            self._restart(payload)

    def _store(self, node_id: int, payload: CheckpointPayload) -> bool:
        """Write a checkpoint the function reported where the plan asked for
        none straight to the study's storage, as Tune's report() persists
        each one: the trial's folder keeps it (`execution.retention`), and
        it never waits in memory. False when storage refused it: the caller
        hands it to the controller instead, which keeps it in memory until
        storage takes it."""
        from ray_stagetree.execution.storage import StoredCheckpoint

        key = reported_checkpoint_key(node_id, self.iteration, self.spec.batch_id)
        stored = self.spec.reported_storage.write(key, payload)
        if not isinstance(stored, StoredCheckpoint):  # storage refused it (`WriteFailed`)
            return False
        info = CheckpointInfo(key, stored.size_bytes, stored.checksum)
        self._pending.stored_checkpoints.append((node_id, self.iteration, info))
        self._stored_iterations.add(self.iteration)
        return True

    def _held_value_changes_now(self) -> bool:
        return any(changes_at(sequence, self.iteration) for sequence in self._fixed_sequences().values())

    def reported_any(self) -> bool:
        """Whether the trainable reported in this batch."""
        return self.iteration != self.spec.start or bool(self._pending.records)

    def join_group(self, group: Any) -> None:
        """This batch's worker became rank 0 of ``group`` (a `RankGroup`) before the batch reported anything:
        it reports for the group from here on, and never parks (each rank would hold a live trainable)."""
        self.group, self._park, self.grow_group = group, None, None
        group.connect()

    def _lead(self, restart: bool, payload: CheckpointPayload | None) -> None:
        """Rank 0 of a group, its flushes done: the batch's end, next checkpoints and restart point, to every rank."""
        self.group.lead(self.stop, frozenset(self.save_iterations), self.spec.stop, payload if restart else None)

    def _wait_parked(self) -> None:
        """End the batch with the trainable alive: the worker hands its outcome
        back and this thread waits for the batch that continues it (then
        returns into the trainable's loop with the random states it had
        here) or for its release (then the trainable ends)."""
        rng = capture_rng_state()
        outcome, self._pending = self._pending, BatchOutcome(self.spec.batch_id)
        outcome.parked = True
        if self._latest is not None:  # the trial may end parked (its bracket stops it): Tune's Result.checkpoint
            self._put_final_checkpoint(outcome, failed=False)
        outcome.missing_checkpoints, self.missing_checkpoints = self.missing_checkpoints, []
        self._stamp(outcome)
        self._parking = False
        follow_up = self._park(outcome)
        if follow_up is None:
            raise BatchEnd()
        if follow_up.start != self.iteration:
            raise RuntimeError(
                f"batch {follow_up.batch_id} starts at {follow_up.start}, the parked trainable is at {self.iteration}"
            )
        self._begin(follow_up)
        restore_rng_state(rng)

    def _restart(self, payload: CheckpointPayload | None) -> None:
        """Restart the trainable here, from ``payload``, with this iteration's
        values: a value it holds fixed changes (PBT explored a plain one, or
        a sequence's, while it does not follow values live)."""
        changed = sorted(
            self._keys[name]
            for name, sequence in self._fixed_sequences().items()
            if changes_at(sequence, self.iteration)
        )
        held = [key for key in changed if key not in self._plain_keys()]  # sequences, not PBT's values
        if payload is None:
            raise ReportError(self._restart_without_checkpoint(changed, held))
        if held:
            self._pending.restarts.append((self.iteration, tuple(held)))
        self._restart_payload = payload
        self._config_change = self._next_fixed_value_change()  # the restarted trainable trains up to it
        self.save_iterations |= self._config_changes()
        self._drop_restored()
        raise ConfigChange()

    def _plain_keys(self) -> set[str]:
        return {self._keys[name] for name in self.spec.plain if name in self._keys}

    def _restart_without_checkpoint(self, changed: list[str], held: list[str]) -> str:
        names = ", ".join(f"config[{key!r}]" for key in changed)
        why = (
            "the trainable holds config's values as they were when it started (it does not call get_hparams()), "
            "so it must restart there with the new value, as Tune's PBT restarts a trial"
            if held
            else "PBT explored it, and the trainable must restart there with the new value"
        )
        fix = (
            f"; or read the value each iteration with get_hparams()[{held[0]!r}], which continues live" if held else ""
        )
        return (
            f"{names} changes at iteration {self.iteration}: {why}, from the checkpoint it reports there, but "
            f"report() got none at iteration {self.iteration}. Report a checkpoint where should_checkpoint() is "
            "True (every iteration is fine) and restore it from tune.get_checkpoint() when the trainable starts"
            f"{fix}"
        )

    def flush(self, ask_callbacks: bool = False) -> None:
        """Send pending records; take the controller's updated instructions:
        where to checkpoint, and where the batch now ends (earlier when no
        live trial needs the rest, later when it continues live). With
        ``ask_callbacks`` (a class trainable's result) the reply comes once
        the driver's callbacks had the result, as Tune's trainable waits for
        its driver, and says whether one asked for a checkpoint here."""
        import ray

        if not (self._pending.records or self._pending.checkpoints or self._pending.stored_checkpoints):
            return
        outcome, self._pending = self._pending, BatchOutcome(self.spec.batch_id)
        self._stamp(outcome)
        outcome.missing_checkpoints, self.missing_checkpoints = self.missing_checkpoints, []
        self._last_flush = time.monotonic()
        if self._controller is None:
            return
        with self.phases.phase("report"):
            if ask_callbacks:
                ask = self._controller.report_and_ask.remote(outcome, self.spec.node_at(self.iteration), self.iteration)
                reply, asked = ray.get(ask)
            else:
                reply, asked = ray.get(self._controller.worker_report.remote(outcome)), False
        save_iterations, needed, batch_stop, park = reply
        self._parking = park and self._park is not None and batch_stop == self.iteration and not self._ended
        if batch_stop > self.spec.stop:
            self._extend_path(batch_stop)
        self.save_iterations = set(save_iterations) | self._config_changes() | ({self.iteration} if asked else set())
        if not self._ended:
            self.stop = max(min(needed, batch_stop), self.iteration)

    def _extend_path(self, path_stop: int) -> None:
        """The batch continues live on its last node up to ``path_stop``."""
        node_id, start, _ = self.spec.segments[-1]
        self.spec.segments[-1] = (node_id, start, path_stop)
        # It continues live past its old end, which may be where a held value changes (a stage boundary).
        self._config_change = self._next_fixed_value_change(after=self.iteration - 1)

    def finish(self, failed: bool = False) -> BatchOutcome:
        """The batch's last outcome; ``failed``: the trainable raised."""
        outcome = self._pending
        outcome.returned_at = self.returned_at
        if self._latest is not None:
            self._put_final_checkpoint(outcome, failed)
            self._drop_latest()
        outcome.missing_checkpoints, self.missing_checkpoints = self.missing_checkpoints, []
        self._stamp(outcome)
        self._drop_restored()
        return outcome

    def _stamp(self, outcome: BatchOutcome) -> None:
        """The seconds since the last outcome, in all and by phase."""
        outcome.seconds = time.monotonic() - self._last_flush
        outcome.phases = self.phases.take(outcome.seconds)
        self._tag_output(self.spec.node_at(max(self.iteration, self.spec.start + 1)))  # printed after the last report
        outcome.output = trial_output.take(self._printed)

    def _tag_output(self, node_id: int) -> None:
        """What the trainable printed since its last report belongs to this iteration."""
        if self.output:
            self._printed.append((node_id, self.iteration, list(self.output)))
            self.output.clear()

    def _drop_restored(self) -> None:
        if self._restored_dir is not None:
            shutil.rmtree(self._restored_dir, ignore_errors=True)
            self._restored_dir = None


def _check_links(path: str) -> None:
    """Refuse a reported checkpoint whose links cannot be followed (one that
    points nowhere, a cycle): a bug in the trainable, which a retry would
    repeat, named now rather than a checkpoint lost later."""
    try:
        for _ in tree_entries(path):
            pass
    except ValueError as error:
        raise ReportError(f"report()'s checkpoint {path!r} cannot be kept: {error}") from None


def worker_facts() -> dict[str, Any]:
    """Tune's auto-filled result keys of this process: when, and where it runs."""
    now = time.time()
    return {"timestamp": int(now), "date": time.strftime("%Y-%m-%d_%H-%M-%S", time.localtime(now)), **_host()}


@functools.lru_cache(maxsize=1)
def _host() -> dict[str, Any]:
    import socket

    import ray

    return {"pid": os.getpid(), "hostname": socket.gethostname(), "node_ip": ray.util.get_node_ip_address()}


def _link_or_copy(source: str, destination: str) -> None:
    """A hard link costs no copy and outlives the user deleting the source;
    across file systems, a copy."""
    try:
        os.link(source, destination)
    except OSError:
        shutil.copy2(source, destination)


def _differs(config: dict[str, Any], path: str, value: Any) -> bool:
    """Whether a plain value at ``path`` is not ``value`` any more (PBT
    explored it). Unchanged ones reach the trainable as the user gave them,
    numpy scalars included, as in Tune."""
    original = config
    for part in split_path(path):
        original = original[part]
    original = original.item() if isinstance(original, np.generic) else original
    return type(original) is not type(value) or original != value
