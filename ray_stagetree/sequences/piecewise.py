"""Piecewise-constant families: `Step`, `MultiStep` (numbers, batch sizes or categories) and `Values`."""

from __future__ import annotations

from typing import Any

import numpy as np

from ray_stagetree.sequences._params import (
    _DTYPES,
    _combine_kinds,
    _integer,
    _length_check,
    _milestones,
    _number,
    _scalar_kind,
    _scalars,
)
from ray_stagetree.sequences.base import Sequence
from ray_stagetree.validation import Real


class Step(Sequence):
    """``init * gamma**(i // step_size)`` (torch ``StepLR``).

    Args:
        init: value at iteration 0.
        step_size: iterations between two decays, a positive int.
        gamma: factor applied every ``step_size`` iterations, > 0.

    Examples:
        >>> [Step(1.0, 2, 0.5).value(i) for i in range(5)]
        [1.0, 1.0, 0.5, 0.5, 0.25]
    """

    def __init__(self, init: float, step_size: int, gamma: float) -> None:
        self._setup(
            init=_number("Step", "init", init),
            step_size=_integer("Step", "step_size", step_size),
            gamma=_number("Step", "gamma", gamma, Real(low=0, closed="neither")),
        )

    def _range(self, start: int, stop: int) -> np.ndarray:
        decays = np.arange(start, stop, dtype=np.int64) // self.step_size
        return self.init * np.power(float(self.gamma), decays.astype(np.float64))


class MultiStep(Sequence):
    """Piecewise constant, changing at ``milestones``.

    Either ``init * gamma**k`` where ``k`` is the number of milestones ``<= i``
    (torch ``MultiStepLR``), or explicit ``values``: ``values[k]`` on
    ``[milestones[k-1], milestones[k])``.  Values may be ints (batch sizes stay
    ints; ``init`` and ``gamma`` both ints also give ints) or categorical.

    Args:
        init: value before the first milestone (with ``gamma``).
        milestones: strictly increasing positive ints.
        gamma: factor applied at each milestone, > 0 (with ``init``).
        values: keyword-only alternative to ``init``/``gamma``:
            ``len(milestones) + 1`` scalars.

    Examples:
        >>> MultiStep(0.1, [100, 150], 0.1).value(120)
        0.010000000000000002
        >>> MultiStep(values=[128, 256], milestones=[70]).value(70)
        256
        >>> MultiStep(values=["adam", "sgd"], milestones=[40]).value(39)
        'adam'
    """

    def __init__(
        self,
        init: float | None = None,
        milestones: list[int] | tuple[int, ...] = (),
        gamma: float | None = None,
        *,
        values: list[Any] | tuple[Any, ...] | None = None,
    ) -> None:
        if values is None:
            if init is None or gamma is None:
                raise ValueError(
                    f"MultiStep: give either init and gamma, or values; got init={init!r}, gamma={gamma!r}, values=None"
                )
            init = _number("MultiStep", "init", init)
            gamma = _number("MultiStep", "gamma", gamma, Real(low=0, closed="neither"))
        elif init is not None or gamma is not None:
            raise ValueError(
                "MultiStep: give either init and gamma, or values, not both; "
                f"got init={init!r}, gamma={gamma!r}, values={values!r}"
            )
        else:
            values = _scalars("MultiStep", "values", values)
        milestones = _milestones("MultiStep", "milestones", milestones)
        if values is not None:
            _length_check("MultiStep", "values", values, milestones)
        self._setup(init=init, milestones=milestones, gamma=gamma, values=values)

    def _prepare(self) -> str:
        if self._params["values"] is not None:
            table = list(self._params["values"])
        else:
            # Python arithmetic keeps int * int**k exact (batch-size doubling).
            table = [self.init * self.gamma**k for k in range(len(self.milestones) + 1)]
        kind = _combine_kinds([_scalar_kind(v) for v in table])
        object.__setattr__(self, "_table", np.array(table, dtype=_DTYPES[kind]))
        object.__setattr__(self, "_milestone_array", np.array(self.milestones, dtype=np.int64))
        return kind

    def _range(self, start: int, stop: int) -> np.ndarray:
        iterations = np.arange(start, stop, dtype=np.int64)
        return self._table[np.searchsorted(self._milestone_array, iterations, side="right")]


class Values(Sequence):
    """An explicit list: ``values[i]``, and the last value after the list ends.

    Args:
        values: a non-empty list of scalars.

    Examples:
        >>> [Values([1, 2, 3]).value(i) for i in range(5)]
        [1, 2, 3, 3, 3]
    """

    def __init__(self, values: list[Any] | tuple[Any, ...]) -> None:
        self._setup(values=_scalars("Values", "values", values))

    def _prepare(self) -> str:
        table = self._params["values"]
        kind = _combine_kinds([_scalar_kind(v) for v in table])
        object.__setattr__(self, "_table", np.array(table, dtype=_DTYPES[kind]))
        return kind

    def _range(self, start: int, stop: int) -> np.ndarray:
        last = len(self._table) - 1
        return self._table[np.minimum(np.arange(start, stop, dtype=np.int64), last)]
