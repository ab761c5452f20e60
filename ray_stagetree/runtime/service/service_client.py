"""The driver's side of a plan service: attach a study, stop a service.

``Tuner(..., plan_service="team")`` (or a `PlanServiceConfig`, or the
environment variable ``RAY_STAGETREE_PLAN_SERVICE=team``) runs the study on
the plan service of that name in the driver's Ray namespace, started if
there is none. Studies attach only to a service of their own namespace whose
storage is the study's ``storage_path``: one that keeps its plan elsewhere is
refused, so checkpoints are never read from a path the user did not give.
"""

from __future__ import annotations

import dataclasses
import functools
import logging
import os
import re
import threading
import time
from typing import Any

import ray

from ray_stagetree.runtime.control.controller import fetch_summaries
from ray_stagetree.runtime.control.messages import StudyError
from ray_stagetree.runtime.control.spec import StudySpec
from ray_stagetree.runtime.service.actor import PlanService
from ray_stagetree.runtime.workers.remote import remote_once
from ray_stagetree.validation import Real, check

logger = logging.getLogger("ray_stagetree")

#: Environment variable naming the plan service studies attach to.
SERVICE_ENV = "RAY_STAGETREE_PLAN_SERVICE"

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")


@dataclasses.dataclass(frozen=True)
class PlanServiceConfig:
    """Where a study attaches (``Tuner(plan_service=...)``).

    Parameters
    ----------
    name:
        The service's name in the driver's Ray namespace (letters, digits,
        ``_ . -``); its plan lives in ``storage_path/name``.
    study_group:
        Studies share stages only within one group and with the same
        trainable (code and ``with_parameters`` objects; see
        `runtime.service.trainable_identity`).
    weight:
        The study's weight in the share of workers between attached studies.
    idle_timeout_s:
        A service this study starts ends after this long without a study.
    detach_after_s:
        A service this study starts detaches a study whose driver has not
        polled it for this long (the driver is taken for dead: killed, or
        its machine lost). Drivers poll twice a second.
    """

    name: str
    study_group: str = "default"
    weight: float = 1.0
    idle_timeout_s: float = 600.0
    detach_after_s: float = 30.0

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(
                f"PlanServiceConfig.name must be letters, digits, '_', '.' or '-' (not starting with one of the "
                f"last three), got {self.name!r}"
            )
        if not isinstance(self.study_group, str) or not _NAME.fullmatch(self.study_group):
            raise ValueError(f"PlanServiceConfig.study_group must be a name like name's, got {self.study_group!r}")
        for field in ("weight", "idle_timeout_s", "detach_after_s"):
            check(f"PlanServiceConfig.{field}", getattr(self, field), Real(low=0, closed="neither", finite=False))


def service_config(value: Any) -> PlanServiceConfig | None:
    """``Tuner(plan_service=...)``'s value as a config (None: no service),
    the environment variable's when not given."""
    if value is None:
        value = os.environ.get(SERVICE_ENV) or None
    if value is None or isinstance(value, PlanServiceConfig):
        return value
    if isinstance(value, str):
        return PlanServiceConfig(value)
    raise TypeError(f"plan_service must be a service name (str) or a PlanServiceConfig, got {type(value).__name__}")


def connect(config: PlanServiceConfig, storage_path: str, storage_filesystem: Any = None) -> Any:
    """The handle of service ``config.name`` in this Ray namespace, started
    (detached) if there is none. Raises ValueError when it keeps its plan in
    another storage location."""
    root = f"{storage_path.rstrip('/')}/{config.name}"
    service = (
        remote_once(PlanService)
        .options(name=config.name, lifetime="detached", get_if_exists=True, num_cpus=0, max_concurrency=1000)
        .remote(config.name, root, storage_filesystem, config.idle_timeout_s, config.detach_after_s)
    )
    where, _ = ray.get(service.location.remote())
    if where != root:
        raise ValueError(
            f"plan service {config.name!r} in Ray namespace {ray.get_runtime_context().namespace!r} keeps its plan "
            f"at {where!r}, not under this study's storage_path ({root!r}): attach with the same storage_path, or "
            "use another service name"
        )
    return service


def shutdown(name: str) -> bool:
    """Stop plan service ``name`` of this Ray namespace (its plan is saved
    first; attached studies are detached); False if there is none."""
    try:
        service = ray.get_actor(name)
    except ValueError:
        return False
    try:
        ray.get(service.shutdown.remote())
    except ray.exceptions.RayActorError:
        pass  # it ended itself, as asked
    return True


def status(name: str) -> dict[str, Any]:
    """What plan service ``name`` of this namespace holds (studies, plan size, work)."""
    return ray.get(ray.get_actor(name).status.remote())


def run_attached(
    config: PlanServiceConfig,
    spec: StudySpec,
    share_key: str,
    storage_path: str,
    callbacks: Any,
    reporter: Any,
    interrupted: threading.Event,
    poll_s: float,
) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """Run a study on the plan service, as `Tuner.fit` runs its controller:
    poll its progress into the callbacks and reporter until it ends (or the
    driver is interrupted: its trials stop), then return the last progress
    and the trials' summaries. The study is detached in any case."""
    service, study_id = _attach(config, spec, share_key, storage_path)
    # Where a trainable waits for the callbacks' answer, the poll returns as soon as it waits.
    answer, wait_s = None, poll_s if callbacks.answers_checkpoint_requests else 0.0
    try:
        while True:
            progress = ray.get(service.progress.remote(study_id, answer, wait_s))
            callbacks.update(progress)
            answer = callbacks.answer()
            if progress.done:
                break
            if interrupted.is_set():
                ray.get(service.halt.remote(study_id))
                logger.warning("The study was interrupted; its trials stopped and it detaches from the plan service")
                progress = ray.get(service.progress.remote(study_id))
                callbacks.update(progress)
                break
            reporter.update(progress, trials=list(callbacks.trials.values()))
            time.sleep(poll_s - wait_s)
        if progress.study_error is not None:
            raise StudyError(progress.study_error)
        reporter.update(progress, final=True, trials=list(callbacks.trials.values()), partial=interrupted.is_set())
        summaries = fetch_summaries(functools.partial(service.results.remote, study_id))
        callbacks.end(interrupted=interrupted.is_set())
    finally:
        try:
            ray.get(service.detach.remote(study_id))
        except ray.exceptions.RayActorError:
            pass  # the service was shut down meanwhile
    return progress, summaries


#: Tries to attach when the service found ends before it takes the study.
ATTACH_ATTEMPTS = 5


def _attach(config: PlanServiceConfig, spec: StudySpec, share_key: str, storage_path: str) -> tuple[Any, str]:
    """(the service, the study's id). A service that ends as the study
    attaches (its idle timeout) is replaced by a new one (its name is
    released once its process is gone)."""
    for attempt in range(1, ATTACH_ATTEMPTS + 1):
        try:
            service = connect(config, storage_path, spec.loop.storage_filesystem)
            return service, ray.get(service.attach.remote(spec, share_key, config.weight))
        except ray.exceptions.RayActorError:
            if attempt == ATTACH_ATTEMPTS:
                raise
            time.sleep(0.5 * attempt)
    raise AssertionError("unreachable")
