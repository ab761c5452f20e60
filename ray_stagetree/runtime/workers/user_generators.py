"""Random generators a trainable owns, carried in stage checkpoints.

The global generators (Python's, NumPy's, torch's) travel in every stage
checkpoint (`ray_stagetree.execution.rng`). A trainable may also own
generators: a ``torch.Generator`` its ``DataLoader`` shuffles with. A trial
trained alone advances them
from iteration to iteration; restarted from a checkpoint (a fork off a
shared stage, a restart where a value it read changes) the trainable builds
and seeds them again at setup, and they would start over: merged would not
equal alone.

So a stage worker tracks the generators each run of a trainable creates
while it sets up (before its first report), by creation order; a checkpoint
carries the state of each one still alive; and in a run restored from that
checkpoint the generator created at the same place in the order gets the
state back: when `get_checkpoint` is called (to those created by then), or,
for one created later, at its creation and again after its first seeding.
Generators created later (a ``DataLoader`` makes one per epoch from the
global generator) are deterministic already and are left alone.

Tracked: ``torch.Generator`` (the name is this module's subclass in a stage
worker; ``isinstance`` checks still take torch's own generators), held
weakly, so one the trainable dropped is not carried. Not tracked: NumPy's
generators (they take no weak reference, so one made per epoch, as
`ResumableLoader` makes them, would look alive forever and be given a
stale state), ``random.Random`` objects.
"""

from __future__ import annotations

import types
import weakref
from collections.abc import Callable
from typing import Any


class UserGenerators:
    """The generators one run of a trainable created while it set up."""

    def __init__(self) -> None:
        self.new_run()

    def new_run(self) -> None:
        """The trainable (re)starts: its generators are made anew."""
        self._created: list[weakref.ref[Any]] = []
        self._setting_up = True
        self._saved: dict[int, bytes] = {}  # from the checkpoint the run restored: state by creation index
        self._restore_on_seed: set[int] = set()  # created after the restore: their setup seeding is overridden

    def setup_done(self) -> None:
        """The run reported: generators it makes from now on are not carried,
        and the restored states have all been given."""
        if self._setting_up:
            self._setting_up = False
            self._saved, self._restore_on_seed = {}, set()

    def created(self, generator: Any) -> None:
        if not self._setting_up:
            return
        index = len(self._created)
        self._created.append(weakref.ref(generator))
        if index in self._saved:
            _set_state(generator, self._saved[index])
            self._restore_on_seed.add(index)

    def seeded(self, generator: Any) -> None:
        for index in list(self._restore_on_seed):
            if self._created[index]() is generator:
                self._restore_on_seed.discard(index)
                _set_state(generator, self._saved[index])

    def capture(self) -> dict[int, bytes]:
        """The state of each tracked generator still alive, by creation index."""
        states = {}
        for index, entry in enumerate(self._created):
            generator = entry()
            if generator is not None:
                states[index] = generator.get_state().numpy().tobytes()
        return states

    def restore(self, states: dict[int, bytes]) -> None:
        """Give the run's generators the states a checkpoint carried."""
        if not self._setting_up or not states:
            return
        self._saved = dict(states)
        for index, entry in enumerate(self._created):
            generator = entry()
            if generator is not None and index in self._saved:
                _set_state(generator, self._saved[index])


def _set_state(generator: Any, state: bytes) -> None:
    import torch

    generator.set_state(torch.frombuffer(bytearray(state), dtype=torch.uint8))


def track_torch(torch: types.ModuleType, tracker_of: Callable[[], UserGenerators | None]) -> None:
    """Make ``torch.Generator`` a subclass whose objects ``tracker_of()``, the
    running trainable's (None outside one), tracks."""
    base = torch._C.Generator

    class GeneratorMeta(type(base)):  # type: ignore[misc]
        # torch's own generators (torch.default_generator) are still torch.Generator instances
        def __instancecheck__(cls, instance: Any) -> bool:
            return isinstance(instance, base)

        def __subclasscheck__(cls, subclass: type) -> bool:
            return issubclass(subclass, base)

    class Generator(base, metaclass=GeneratorMeta):  # type: ignore[misc,valid-type]
        __doc__ = base.__doc__

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__()
            tracker = tracker_of()
            if tracker is not None:
                tracker.created(self)

        def manual_seed(self, seed: Any) -> Any:
            out = super().manual_seed(seed)
            tracker = tracker_of()
            if tracker is not None:
                tracker.seeded(self)
            return out

        def seed(self) -> int:
            out = super().seed()
            tracker = tracker_of()
            if tracker is not None:
                tracker.seeded(self)
            return out

    Generator.__module__, Generator.__qualname__ = "torch", "Generator"
    torch.Generator = Generator
