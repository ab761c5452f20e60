"""What a trainable may see of its config: nothing that could differ between
the trials that share the stage it is training.

Trials share iterations [0, k) exactly when their static config entries and
their hyper-parameters' names are equal and every hyper-parameter has the
same value (and type) at every iteration before k. A sequence object holds
more than that: its values after k and its parameters (milestones, gamma),
which differ between the trials through a shared stage. So the config a
trainable gets holds each sequence as a `SequenceSoFar`: its values up to
the iteration being trained, and nothing after. What the trainable computes
at iteration i can then depend only on what every trial through that
iteration shares, whichever trial's config the batch was started with, and
an error it raises there is every such trial's error.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np


class FutureValueError(LookupError):
    """A trainable asked a sequence for an iteration it has not reached."""


class HParams(dict):
    """What `get_hparams()` returns: this iteration's values by key (see
    `planning.config.hparam_keys`). A key two config entries join to is
    not in it; reading it names their JSON Pointers rather than raising a
    bare KeyError."""

    def __init__(self, values: dict[str, Any], ambiguous: dict[str, tuple[str, ...]]) -> None:
        super().__init__(values)
        self.ambiguous = ambiguous

    def __missing__(self, key: Any) -> Any:
        pointers = self.ambiguous.get(key) if isinstance(key, str) else None
        if pointers is None:
            raise KeyError(key)
        reads = " and ".join(f"{_config_path(pointer)} as get_hparams()[{pointer!r}]" for pointer in pointers)
        raise KeyError(
            f"{key!r} names {len(pointers)} config entries (a key holding '/', and nested keys): read {reads}"
        )


def _config_path(pointer: str) -> str:
    """``"/a~1b"`` -> ``"config['a/b']"``: where a JSON Pointer leads in the config."""
    from ray_stagetree.planning.config import split_path

    return "config" + "".join(f"[{part!r}]" for part in split_path(pointer[1:]))


class SequenceSoFar:
    """A hyper-parameter sequence as the trainable sees it in ``config``:
    `value` answers for iterations up to the one being trained.

    Read this iteration's values with ``get_hparams()``; ``value(i)`` for an
    earlier ``i`` also works. Later values, and the sequence's parameters,
    are hidden: trials that share the stage being trained may differ there.
    """

    __slots__ = ("name", "_sequence", "_now")

    def __init__(self, name: str, sequence: Any, now: Callable[[], int]) -> None:
        self.name = name
        self._sequence = sequence
        self._now = now

    def _check(self, last: int) -> None:
        now = self._now()
        if last > now:
            raise FutureValueError(
                f"config[{self.name!r}] at iteration {last} is not visible at iteration {now}: trials that share "
                f"this stage may differ after it. Read this iteration's value with get_hparams()[{self.name!r}] "
                "(or config[...].value(i) for i up to the current iteration)"
            )

    @property
    def iteration(self) -> int:
        """The iteration being trained: the last one `value` answers for."""
        return self._now()

    def value(self, iteration: int) -> Any:
        """The value at ``iteration`` (at most the one being trained)."""
        self._check(iteration)
        return self._sequence.value(iteration)

    def values(self, start: int, stop: int) -> np.ndarray:
        """Values at ``start .. stop - 1`` (``stop - 1`` at most the one being trained)."""
        self._check(stop - 1)
        return self._sequence.values(start, stop)

    def __deepcopy__(self, memo: dict) -> SequenceSoFar:
        return self  # immutable, and its clock is the running batch's

    def __copy__(self) -> SequenceSoFar:
        return self

    def __reduce__(self):
        # Pickled (Tune's loggers pickle configs), it keeps what it showed so far, and no more.
        now = self._now()
        return (SequenceSoFar, (self.name, _Recorded(self._sequence.values(0, now + 1)), _Clock(now)))

    def __repr__(self) -> str:
        now = self._now()
        return f"SequenceSoFar({self.name!r}, iteration={now}, value={self._sequence.value(now)!r})"


class _Recorded:
    """Values at iterations 0 .. n-1, as a pickled `SequenceSoFar` keeps them."""

    def __init__(self, values: Any) -> None:
        self._values = list(values)

    def value(self, iteration: int) -> Any:
        return self._values[iteration]

    def values(self, start: int, stop: int) -> np.ndarray:
        return np.asarray(self._values[start:stop])


class _Clock:
    """A stopped clock: the iteration a pickled `SequenceSoFar` had reached."""

    def __init__(self, iteration: int) -> None:
        self.iteration = iteration

    def __call__(self) -> int:
        return self.iteration


def sequences_so_far(
    config: dict[str, Any], flat: Any, plain: frozenset[str], now: Callable[[], int]
) -> dict[str, Any]:
    """``config`` with every sequence the user gave as a sequence (``flat``'s
    declared names not in ``plain``) replaced by its `SequenceSoFar`,
    copying only the dicts on those paths."""
    from ray_stagetree.planning.config import hparam_keys, split_path

    keys, _ = hparam_keys(flat.names)
    out = dict(config)
    for name, sequence in zip(flat.names, flat.sequences):
        if name not in flat.declared or name in plain:
            continue
        *parents, leaf = split_path(name)
        level = out
        for part in parents:
            level[part] = dict(level[part])
            level = level[part]
        level[leaf] = SequenceSoFar(keys[name], sequence, now)  # named as get_hparams() keys it
    return out


def retarget(visible: dict[str, Any], flat: Any) -> None:
    """Point the `SequenceSoFar` values of ``visible`` (what `sequences_so_far`
    made) at ``flat``'s sequences: a parked trainable, continued by a batch
    whose path goes on into a node forked from its own, sees that node's
    values from the fork on. They agree with the old ones up to the iteration
    reached, which is all a `SequenceSoFar` shows."""
    from ray_stagetree.planning.config import hparam_keys

    keys, _ = hparam_keys(flat.names)
    sequences = {keys[name]: sequence for name, sequence in zip(flat.names, flat.sequences)}  # by SequenceSoFar.name
    pending = [visible]
    while pending:
        for value in pending.pop().values():
            if isinstance(value, SequenceSoFar):
                value._sequence = sequences[value.name]
            elif isinstance(value, dict):
                pending.append(value)
