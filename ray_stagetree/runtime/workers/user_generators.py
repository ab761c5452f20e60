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
weakly, so one the trainable dropped is not carried. Not carried: NumPy's
generators (they take no weak reference, so one made per epoch, as
`ResumableLoader` makes them, would look alive forever and be given a
stale state), ``random.Random`` objects. For NumPy's the rule is enforced
instead: a ``numpy.random.default_rng`` the trainable makes while it sets
up and still draws from after its first report (its state moved between
the first two reports) gets a warning naming the fixes, once per worker.
"""

from __future__ import annotations

import pickle
import sys
import types
import warnings
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
        # NumPy generators made while it sets up, and their states at its first report (None: not yet)
        self._numpy: list[Any] = []
        self._numpy_states: list[bytes] | None = None
        self._setting_up = True
        self._saved: dict[int, bytes] = {}  # from the checkpoint the run restored: state by creation index
        self._restore_on_seed: set[int] = set()  # created after the restore: their setup seeding is overridden

    def setup_done(self) -> None:
        """The run reported: generators it makes from now on are not carried,
        and the restored states have all been given. At the next report, a
        NumPy generator made during setup whose state moved since is one the
        trainable draws from across iterations: warned of."""
        if self._setting_up:
            self._setting_up = False
            self._saved, self._restore_on_seed = {}, set()
            self._numpy_states = [_numpy_state(generator) for generator in self._numpy]
        elif self._numpy:
            if self._numpy_states != [_numpy_state(generator) for generator in self._numpy]:
                _warn_numpy_generator()
            self._numpy, self._numpy_states = [], None

    def numpy_created(self, generator: Any) -> None:
        if self._setting_up:
            self._numpy.append(generator)

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


NUMPY_GENERATOR_WARNING = (
    "the trainable draws from a numpy.random.Generator (default_rng) it made while setting up, across "
    "iterations: its state is not carried in stage checkpoints, so a trial forked off a shared stage, or "
    "restarted where a value changed, draws its numbers from the start again and does not equal the trial "
    "trained alone. Use a torch.Generator (carried), or save generator.bit_generator.state in your checkpoint "
    "and set it back after get_checkpoint(), or make one per epoch from (seed, epoch)"
)
_warned = False


def _warn_numpy_generator() -> None:
    global _warned
    if not _warned:
        _warned = True
        warnings.warn(NUMPY_GENERATOR_WARNING, stacklevel=2)


def _numpy_state(generator: Any) -> bytes:
    return pickle.dumps(generator.bit_generator.state)


def track_numpy(numpy: types.ModuleType, tracker_of: Callable[[], UserGenerators | None]) -> None:
    """Make ``numpy.random.default_rng`` tell ``tracker_of()`` of each generator
    the trainable's own code makes (not ray_stagetree's: `ResumableLoader`
    makes one per epoch, from its seed and the epoch)."""
    default_rng = numpy.random.default_rng

    def tracked_default_rng(*args: Any, **kwargs: Any) -> Any:
        generator = default_rng(*args, **kwargs)
        tracker = tracker_of()
        if tracker is not None and not sys._getframe(1).f_globals.get("__name__", "").startswith("ray_stagetree."):
            tracker.numpy_created(generator)
        return generator

    tracked_default_rng.__doc__ = default_rng.__doc__
    numpy.random.default_rng = tracked_default_rng
