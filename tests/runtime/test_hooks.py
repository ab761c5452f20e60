"""The study controller's declared hooks (runtime.control.hooks): a class
extending StudyController (the plan service's SharedPlan and AttachedStudy)
overrides hooks only, each marked, each called as the controller calls it.
A private method of the controller renamed or changed under a service's
override fails here, not silently at run time. No Ray is started."""

from __future__ import annotations

from typing import Any

from ray_stagetree.runtime.control.controller import StudyController
from ray_stagetree.runtime.control.hooks import HOOKS, StudyHooks, declaration_problems, hook, override_problems
from ray_stagetree.runtime.service.attached_study import AttachedStudy
from ray_stagetree.runtime.service.shared_plan import SharedPlan


def extensions(cls: type) -> list[type]:
    """The package's classes extending ``cls`` (not this module's examples)."""
    found = []
    for sub in cls.__subclasses__():
        if "__ray_actor_class__" in vars(sub) or sub.__name__.startswith("ActorClass("):
            continue  # Ray's own wrapper of an actor class (made where the class ran as an actor)
        found += [sub] if sub.__module__.startswith("ray_stagetree.") else []
        found += extensions(sub)
    return found


def test_every_class_extending_the_controller_overrides_declared_hooks_only():
    classes = extensions(StudyController)
    assert {SharedPlan, AttachedStudy} <= set(classes)
    assert {cls.__name__: override_problems(cls, StudyController) for cls in classes} == {
        cls.__name__: [] for cls in classes
    }


def test_the_services_use_the_hooks_they_declare():
    overridden = {name for cls in (SharedPlan, AttachedStudy) for name in vars(cls) if name in HOOKS}
    assert overridden == HOOKS  # a hook no class extends is not one: drop it from StudyHooks


def test_the_controller_defines_every_hook_as_declared():
    assert declaration_problems(StudyController) == []
    assert "fail" in HOOKS and "_dispatch" not in HOOKS and "run" not in HOOKS


class Fine(StudyController):
    @hook
    def fail(self, trial_ids, error, retry=True, in_restore=False, error_pickle=None):
        pass

    @hook
    async def complete(self, ref: Any) -> None:
        pass

    def own_method(self) -> None:  # not the controller's: anything goes
        pass


def test_a_marked_override_of_a_hook_called_as_declared_is_fine():
    assert override_problems(Fine, StudyController) == []


def test_overriding_a_method_that_is_not_a_hook_is_found():
    class Private(StudyController):
        async def _dispatch(self) -> bool:
            return False

    assert override_problems(Private, StudyController) == [
        "Private._dispatch overrides StudyController._dispatch, which is not a hook (StudyHooks)"
    ]


def test_a_hook_renamed_in_the_controller_leaves_its_override_marked_for_nothing():
    class Renamed(StudyController):
        @hook
        def _fail(self, trial_ids, error, retry=True, in_restore=False, error_pickle=None):
            pass

    assert override_problems(Renamed, StudyController) == [
        "Renamed._fail is marked @hook but StudyController has no _fail"
    ]


def test_an_unmarked_override_of_a_hook_is_found():
    class Unmarked(StudyController):
        def resume_paused(self) -> None:
            pass

    assert override_problems(Unmarked, StudyController) == [
        "Unmarked.resume_paused overrides the hook resume_paused without @hook"
    ]


def test_an_override_that_misses_a_parameter_of_the_hook_is_found():
    # What happened once: the controller's fail took a new argument that an override did not.
    class Behind(StudyController):
        @hook
        def fail(self, trial_ids, error, retry=True, in_restore=False):
            pass

    class Sync(StudyController):
        @hook
        def finalize(self) -> None:
            pass

    problems = override_problems(Behind, StudyController)
    assert len(problems) == 2 and all(p.startswith("Behind.fail: not called as the hook fail(") for p in problems)
    assert override_problems(Sync, StudyController) == [
        "Sync.finalize: async where the hook is not, or not where it is"
    ]


def test_a_declared_hook_the_controller_lacks_is_found():
    class Bare:
        def progress(self) -> dict:
            return {}

    problems = declaration_problems(Bare)
    assert "Bare has no fail, a hook of StudyHooks" in problems
    assert not any(p.startswith("Bare.progress") for p in problems)
    assert len(problems) == len(HOOKS) - 1
    assert StudyHooks.__doc__


def test_a_hook_the_controller_changed_without_its_declaration_is_found():
    class Widened:  # a new optional argument the overrides would not get
        def progress(self, verbose: bool = False) -> dict:
            return {}

        def finalize(self) -> None:  # no longer async
            pass

    problems = [p for p in declaration_problems(Widened) if "has no" not in p]
    assert [p.split("(")[0] for p in problems] == ["Widened.finalize", "Widened.progress"]
    assert all("is not as StudyHooks declares it" in p for p in problems)
    assert "verbose" in problems[1]
