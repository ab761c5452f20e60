"""The plan service: a long-lived, named Ray actor that studies attach to.

One service per Ray namespace, name and storage location. It hosts the
`SharedPlan` of the trainable identity its studies share (search plan,
checkpoint store, a pool of warm stage workers) and one `StudyTrials` per
attached study. Several drivers attach at once; each polls its own study's
progress and results, as `Tuner.fit` polls its controller.

Lifetime:

* A study detaches when its driver's `fit()` ends, or when its driver has
  not polled for ``detach_after_s`` (a killed driver): its live trials stop,
  and batches no other study needs stop at their next report.
* A study whose trainable identity differs from the attached studies' is
  refused while they run; once none is attached, the service switches to
  the new identity's plan (the old one stays stored).
* The service ends when `service_client.shutdown` asks, or after
  ``idle_timeout_s`` with no study attached. Its plan is saved as it runs,
  and a service started later on the same storage continues it.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import logging
import time
import uuid
from typing import Any

import ray

from ray_stagetree.execution.batches import BatchOutcome, FlushReply
from ray_stagetree.execution.storage import CheckpointStorage
from ray_stagetree.runtime.control.batch_loop import TICK_S
from ray_stagetree.runtime.control.messages import CallbackAnswer, Progress, TrialSummary
from ray_stagetree.runtime.control.spec import StudySpec
from ray_stagetree.runtime.service.shared_plan import SharedPlan
from ray_stagetree.runtime.service.trainable_identity import parameter_registries

logger = logging.getLogger(__name__)

#: The file naming a plan directory's trainable identity, its share key
#: (stored under "sharing_key", as plan directories were written before the vocabulary rename).
IDENTITY_FILE = "stagetree_sharing_key.json"


class PlanService:
    """Ray actor body (async, detached, named; made by `service_client.connect`).

    Parameters
    ----------
    name:
        Its name in the Ray namespace.
    root:
        Its directory (``storage_path/name``, any fsspec URL): one plan
        directory per trainable identity under it.
    storage_filesystem:
        As ``RunConfig.storage_filesystem``.
    idle_timeout_s:
        Seconds without an attached study before the service ends itself.
    detach_after_s:
        Seconds without a poll from a study's driver before it is detached.
    """

    def __init__(
        self, name: str, root: str, storage_filesystem: Any, idle_timeout_s: float, detach_after_s: float
    ) -> None:
        self.name = name
        self.root = root
        self.storage_filesystem = storage_filesystem
        self.idle_timeout_s = idle_timeout_s
        self.detach_after_s = detach_after_s
        self.shared: SharedPlan | None = None
        self._loop: Any = None  # the shared plan's run(), a task of this actor's event loop
        self._seen: dict[str, float] = {}  # study id -> time.monotonic() of its driver's last poll
        self._idle_since = time.monotonic()
        self._watchdog: Any = None
        self._started = time.time()

    def location(self) -> tuple[str, Any]:
        return self.root, self.storage_filesystem

    # -- studies ------------------------------------------------------------------------

    async def attach(self, spec: StudySpec, share_key: str, weight: float) -> str:
        """Attach a study (the Tuner built ``spec``; its experiment path is a
        folder of its plan directory); returns its id."""
        if self._watchdog is None:
            self._watchdog = asyncio.ensure_future(self._watch())
        plan_dir = spec.loop.experiment_path.rstrip("/").rsplit("/", 1)[0]
        if self.shared is not None and self.shared.share_key != share_key:
            if self.shared.studies:
                raise ValueError(
                    f"plan service {self.name!r} runs {len(self.shared.studies)} studies of another trainable "
                    f"identity ({self.shared.share_key!r}; this study's is {share_key!r}: a different "
                    "study_group, or a trainable whose code or with_parameters objects differ). Studies share a "
                    "plan only with the same trainable: wait for them to end, or use another plan service name"
                )
            await self._close_shared()
        if self.shared is None:
            _claim(CheckpointStorage(plan_dir, self.storage_filesystem), share_key)
            worker = dataclasses.replace(spec.loop.worker, trainable=_adopt_parameters(spec.loop.worker.trainable))
            own = dataclasses.replace(spec.loop, experiment_path=plan_dir, worker=worker)
            self.shared = SharedPlan(own, share_key)
            here = ray.get_runtime_context().current_actor
            workers = [self.shared.spec.worker.start(here) for _ in range(spec.loop.num_workers)]
            self._loop = asyncio.ensure_future(self.shared.run(workers))
        study_id = f"{spec.loop.experiment_path.rstrip('/').rsplit('/', 1)[-1]}_{uuid.uuid4().hex[:6]}"
        self.shared.attach(spec, study_id, weight)
        self._seen[study_id] = time.monotonic()
        return study_id

    def _study(self, study_id: str) -> Any:
        self._fail_if_loop_died()
        study = self.shared.studies.get(study_id) if self.shared is not None else None
        if study is None:
            raise KeyError(
                f"no study {study_id!r} is attached to plan service {self.name!r} (it was detached: its driver did "
                f"not poll for {self.detach_after_s:g}s, or the service was shut down)"
            )
        self._seen[study_id] = time.monotonic()
        return study

    async def progress(self, study_id: str, answer: CallbackAnswer | None = None, wait_s: float = 0.0) -> Progress:
        """`StudyController.progress`, for the study ``study_id``."""
        return await self._study(study_id).answered_progress(answer, wait_s)

    def results(self, study_id: str, first: int = 0, count: int | None = None) -> list[TrialSummary]:
        return self._study(study_id).results(first, count)

    def halt(self, study_id: str) -> None:
        """Stop the study's trials where they are (its driver was interrupted)."""
        study = self._study(study_id)
        study.halt()
        self.shared.wake()

    def detach(self, study_id: str) -> None:
        self._seen.pop(study_id, None)
        if self.shared is not None:
            self.shared.detach(study_id)
            if not self.shared.studies:
                self._idle_since = time.monotonic()

    def worker_report(self, outcome: BatchOutcome) -> tuple[list[int], int, int]:
        """A stage worker's records (workers report to the actor that started them)."""
        return self.shared.worker_report(outcome)

    async def report_and_ask(self, outcome: BatchOutcome, node_id: int, iteration: int) -> tuple[FlushReply, bool]:
        """A stage worker's records, and its question (`BatchLoop.report_and_ask`)."""
        return await self.shared.report_and_ask(outcome, node_id, iteration)

    def status(self) -> dict[str, Any]:
        """What the service holds: its location, the share key and studies of
        its plan, iterations and worker-seconds so far."""
        self._fail_if_loop_died()
        return {
            "name": self.name,
            "root": self.root,
            "uptime_s": time.time() - self._started,
            "sharing_key": self.shared.share_key if self.shared else None,
            **(self.shared.workload() if self.shared else {"studies": []}),
        }

    # -- lifetime -----------------------------------------------------------------------

    async def _watch(self) -> None:
        """Detach studies whose driver is gone; once idle, ask the service to
        end and stop (`end_if_idle` starts it again if a study attached)."""
        while not self._idle():
            await asyncio.sleep(TICK_S)
            now = time.monotonic()
            for study_id, seen in list(self._seen.items()):
                if now - seen > self.detach_after_s:
                    logger.warning("study %s: its driver has not polled for %.0fs; detaching it", study_id, now - seen)
                    self.detach(study_id)
        # As an actor call: only an actor's own task can end it (exit_actor). Once: an actor that
        # exits waits for its tasks to end, and a watchdog asking every tick never let it (found by
        # test_an_idle_service_ends_itself_but_not_while_a_study_is_attached).
        ray.get_runtime_context().current_actor.end_if_idle.remote()

    def _idle(self) -> bool:
        attached = self.shared is not None and self.shared.studies
        return not attached and time.monotonic() - self._idle_since > self.idle_timeout_s

    async def end_if_idle(self) -> None:
        """`shutdown`, unless a study attached since the watchdog found the
        service idle (the watchdog then goes on)."""
        if not self._idle():
            self._watchdog = asyncio.ensure_future(self._watch())
            return
        logger.info("plan service %s: no study for %.0fs; ending", self.name, self.idle_timeout_s)
        await self.shutdown()

    def _fail_if_loop_died(self) -> None:
        if self._loop is not None and self._loop.done() and not self._loop.cancelled():
            error = self._loop.exception()
            if error is not None:
                raise RuntimeError(f"plan service {self.name!r} failed: {type(error).__name__}: {error}") from error

    async def _close_shared(self) -> None:
        shared, self.shared = self.shared, None
        await shared.close()
        try:
            await self._loop
        finally:
            shared.shutdown_workers()

    async def shutdown(self) -> None:
        """Save the plan, stop the workers and end this actor."""
        for study_id in list(self._seen):
            self.detach(study_id)
        if self.shared is not None:
            await self._close_shared()
        ray.actor.exit_actor()


def _claim(storage: CheckpointStorage, share_key: str) -> None:
    """Mark a plan directory as the plan of ``share_key``, or refuse one
    that holds another identity's plan (never load its checkpoints)."""
    path = storage.path(IDENTITY_FILE)
    if storage.filesystem.isfile(path):
        stored = json.loads(storage.read_key(IDENTITY_FILE))["sharing_key"]
        if stored != share_key:
            raise ValueError(
                f"the plan directory {storage!r} holds the plan of trainable identity {stored!r}, not {share_key!r}"
            )
        return
    storage.write_text(IDENTITY_FILE, json.dumps({"sharing_key": share_key}))


def _adopt_parameters(trainable: bytes) -> bytes:
    """The trainable with its ``tune.with_parameters`` objects put again by
    this actor: the first study's driver put them, and they would be lost
    with it (Ray frees an object with its owner), while this plan's workers
    serve later studies."""
    try:
        loaded = ray.cloudpickle.loads(trainable)
    except Exception:  # not loadable here: the workers report why, as without a service
        return trainable
    registries = list(parameter_registries(loaded))
    if not registries:
        return trainable
    for registry in registries:
        registry.references = {name: ray.put(ray.get(ref)) for name, ref in registry.references.items()}
    return ray.cloudpickle.dumps(loaded)
