"""The study controller's hooks: the methods of `StudyController` that a
class extending it may override, and nothing else of it.

A plan service extends the controller twice (`runtime.service`):
`SharedPlan` runs the controller's loop over one plan for many studies and
hands what concerns a trial to the study that owns it; `AttachedStudy` is
a study's trials on that plan, without a loop of its own. Each override
point they use is declared here, with the signature the controller calls
it with; an override is marked `hook`. `override_problems` finds an
override of anything else, a hook renamed in the controller but not in its
overrides, and an override that does not take the hook's arguments
(``tests/runtime/test_hooks.py`` runs it on every class that extends the
controller).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:
    from ray_stagetree.execution.batches import BatchOutcome
    from ray_stagetree.planning.plan import PlanNode
    from ray_stagetree.runtime.control.trials import TrialState


class StudyHooks(Protocol):
    """What a class extending `StudyController` may override."""

    # -- the loop's: SharedPlan runs the loop over every attached study ---------------------

    def admit(self) -> bool | None:
        """Admit the trial source's next trials (each turn of the loop); True
        when more may come at once (the loop does not wait for a report)."""

    def unfinished(self) -> bool:
        """Whether the loop goes on once nothing runs (trials live or to come)."""

    def stuck(self) -> None:
        """Nothing runs and no batch can be dispatched, yet the study is
        unfinished: raise why (a bug), unless that is a normal wait."""

    def wake_in(self) -> float | None:
        """Seconds until the loop must wake without a report (the time
        budget), None when nothing is due."""

    def ingest(self, outcome: BatchOutcome) -> None:
        """Fold a worker's records and checkpoints into the plan and the trials."""

    async def complete(self, ref: Any) -> None:
        """The batch behind ``ref`` ended, failed, or its worker died."""

    async def finalize(self) -> None:
        """The study's end: trials' checkpoints into their folders, the
        plan and the last snapshot saved."""

    # -- a trial's: SharedPlan hands each to the study that owns the trial ------------------

    def add_result(self, state: TrialState, iteration: int, metrics: dict[str, Any]) -> None:
        """The trial's result at ``iteration``: checked, made a Tune row,
        decided on by its scheduler and told to its searcher."""

    def fail(
        self,
        trial_ids: set[str],
        error: str,
        retry: bool = True,
        in_restore: bool = False,
        error_pickle: bytes | None = None,
    ) -> None:
        """The trials failed (``in_restore``: loading their starting
        checkpoint raised): retried as `failures.Failures` says, else they
        end in error. ``retry`` False: a retry would fail the same way.
        ``error_pickle``: the trainable's exception as ``Result.error`` gives it."""

    def end_trial(self, trial_id: str) -> None:
        """End a trial now, leaving paused trials paused (what a scheduler
        calls while it decides; ``stop_trial`` also resumes the others)."""

    def resume_paused(self) -> None:
        """Run again the paused trials their scheduler chooses."""

    def abort(self, error: str) -> None:
        """No worker can run the trainable: every live trial ends in error
        and the study stops (the Tuner raises ``error``)."""

    def assign_node(self, state: TrialState, node: PlanNode) -> None:
        """The trial's request is on ``node`` now; a node is configured by
        the first trial requesting it."""

    def trial_context(self, node_id: int) -> dict[str, str]:
        """What a class trainable on ``node_id`` reads of its trial
        (``trial_id``, ``trial_name``, ``experiment_name``, ``trial_dir``)."""

    def configured_saves(self, batch_id: int, outcome: BatchOutcome | None = None) -> list[int]:
        """The iterations ``CheckpointConfig`` saves on a batch."""

    # -- a study's: AttachedStudy on a shared plan ---------------------------------------

    def trial_share_key(self, trial_id: str) -> str:
        """The trial's share key in the plan: trials share stages only under one key."""

    def progress(self) -> dict[str, Any]:
        """What happened since the driver's last poll (the actor's API)."""


#: The names of the hooks.
HOOKS = frozenset(name for name in vars(StudyHooks) if not name.startswith("_"))

Method = TypeVar("Method", bound=Callable[..., Any])


def hook(method: Method) -> Method:
    """Mark ``method`` as an override of the controller's hook of its name
    (`override_problems` checks that there is one)."""
    method.__stagetree_hook__ = True  # type: ignore[attr-defined]
    return method


def override_problems(cls: type, base: type) -> list[str]:
    """What is wrong with how ``cls`` extends ``base`` (the controller): a
    method or attribute of ``base`` overridden that is not a hook, a hook
    overridden without `hook`, a `hook` that overrides no hook of
    ``base`` (renamed there), and an override that is not called as the
    hook is (another signature, or async where the hook is not); [] when
    nothing is. Only what ``cls`` itself defines is checked."""
    problems = []
    for name, value in vars(cls).items():
        if name.startswith("__") and name.endswith("__"):
            continue
        marked = getattr(value, "__stagetree_hook__", False)
        overrides = any(name in vars(ancestor) for ancestor in base.__mro__)
        if not overrides:
            if marked:
                problems.append(f"{cls.__name__}.{name} is marked @hook but {base.__name__} has no {name}")
            continue
        if name not in HOOKS:
            problems.append(f"{cls.__name__}.{name} overrides {base.__name__}.{name}, which is not a hook (StudyHooks)")
        elif not marked:
            problems.append(f"{cls.__name__}.{name} overrides the hook {name} without @hook")
        else:
            problems += [
                f"{cls.__name__}.{name}: {problem}" for problem in _call_problems(value, getattr(StudyHooks, name))
            ]
    return problems


def declaration_problems(base: type) -> list[str]:
    """Each hook of `StudyHooks` that ``base`` does not define exactly as
    declared (the same parameters, defaults, and async or not): a change of
    the controller's hook is a change of its declaration, which its
    overrides are then checked against."""
    problems = []
    for name in sorted(HOOKS):
        method, declared = getattr(base, name, None), getattr(StudyHooks, name)
        if method is None:
            problems.append(f"{base.__name__} has no {name}, a hook of StudyHooks")
        elif _parameters(method) != _parameters(declared) or inspect.iscoroutinefunction(
            method
        ) != inspect.iscoroutinefunction(declared):
            problems.append(
                f"{base.__name__}.{name}{inspect.signature(method)} is not as StudyHooks declares it: "
                f"{name}{inspect.signature(declared)}"
            )
    return problems


def _parameters(method: Any) -> list[tuple[str, Any, Any]]:
    # Ray's tracing adds `_ray_trace_ctx` to an actor class's methods where it ran as an actor.
    parameters = inspect.signature(method).parameters.values()
    return [(p.name, p.kind, p.default) for p in parameters if p.name != "_ray_trace_ctx"]


def _call_problems(method: Any, declared: Any) -> list[str]:
    """Why ``method`` cannot be called as the ``declared`` hook is: with
    each of its parameters by position, and its optional ones by keyword."""
    if not callable(method):
        return [f"not a method ({type(method).__name__})"]
    problems = []
    if inspect.iscoroutinefunction(method) != inspect.iscoroutinefunction(declared):
        problems.append("async where the hook is not, or not where it is")
    signature = inspect.signature(method)
    parameters = list(inspect.signature(declared).parameters.values())
    positional = [p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD]
    required = [p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD and p.default is p.empty]
    for args, kwargs in (
        (positional, {}),
        (required, {p.name: p.name for p in parameters if p.name not in required and p.name != "self"}),
    ):
        try:
            signature.bind(*args, **kwargs)
        except TypeError as error:
            problems.append(f"not called as the hook {declared.__name__}{inspect.signature(declared)} ({error})")
    return problems
