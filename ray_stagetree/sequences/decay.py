"""Decaying and warm-up families: `Exponential`, `Linear`, `Polynomial`, `InverseSqrt` and `Warmup`."""

from __future__ import annotations

from typing import Any

import numpy as np

from ray_stagetree.sequences._params import _integer, _number
from ray_stagetree.sequences.base import Sequence, _part
from ray_stagetree.validation import Real


class Exponential(Sequence):
    """``init * gamma**i`` (torch ``ExponentialLR``).

    Args:
        init: value at iteration 0.
        gamma: multiplicative factor per iteration, > 0.

    Examples:
        >>> Exponential(0.1, 0.5).value(2)
        0.025
    """

    def __init__(self, init: float, gamma: float) -> None:
        self._setup(
            init=_number("Exponential", "init", init),
            gamma=_number("Exponential", "gamma", gamma, Real(low=0, closed="neither")),
        )

    def _range(self, start: int, stop: int) -> np.ndarray:
        exponents = np.arange(start, stop, dtype=np.float64)
        return self.init * np.power(float(self.gamma), exponents)


class Linear(Sequence):
    """Linear from ``init`` to ``end`` over ``period`` iterations, then ``end`` (torch ``LinearLR``).

    Args:
        init: value at iteration 0 (torch: ``base_lr * start_factor``).
        end: value from iteration ``period`` on (torch: ``base_lr * end_factor``).
        period: a positive int (torch ``total_iters``).

    Examples:
        >>> [Linear(0.0, 1.0, 4).value(i) for i in (0, 1, 4, 9)]
        [0.0, 0.25, 1.0, 1.0]
    """

    def __init__(self, init: float, end: float, period: int) -> None:
        self._setup(
            init=_number("Linear", "init", init),
            end=_number("Linear", "end", end),
            period=_integer("Linear", "period", period),
        )

    def _range(self, start: int, stop: int) -> np.ndarray:
        i = np.arange(start, stop, dtype=np.float64)
        ramp = self.init + (self.end - self.init) * i / self.period
        # Exactly `end` afterwards: init + (end - init) can be off by one ulp.
        return np.where(i >= self.period, float(self.end), ramp)


class Polynomial(Sequence):
    """``(init - end) * (1 - min(i, T) / T)**power + end`` (torch ``PolynomialLR`` when ``end == 0``).

    Args:
        init: value at iteration 0.
        total_steps: ``T``, iterations to reach ``end``, a positive int.
        power: exponent, a finite number >= 0.
        end: value from iteration ``T`` on.

    Examples:
        >>> [Polynomial(1.0, 4, power=2.0).value(i) for i in (0, 2, 4, 8)]
        [1.0, 0.25, 0.0, 0.0]
    """

    def __init__(self, init: float, total_steps: int, power: float = 1.0, end: float = 0.0) -> None:
        self._setup(
            init=_number("Polynomial", "init", init),
            total_steps=_integer("Polynomial", "total_steps", total_steps),
            power=_number("Polynomial", "power", power, Real(low=0)),
            end=_number("Polynomial", "end", end),
        )

    def _range(self, start: int, stop: int) -> np.ndarray:
        i = np.minimum(np.arange(start, stop, dtype=np.float64), self.total_steps)
        return (self.init - self.end) * (1.0 - i / self.total_steps) ** self.power + self.end


class InverseSqrt(Sequence):
    """``init * sqrt(timescale / (i + timescale))``.

    ``Warmup(0, W, InverseSqrt(peak, W))`` is fairseq's ``inverse_sqrt``
    schedule: linear warm-up to ``peak``, then ``peak * sqrt(W / i)``.

    Args:
        init: value at iteration 0.
        timescale: a finite number > 0; the value halves at ``i = 3 * timescale``.

    Examples:
        >>> InverseSqrt(1.0, 10).value(30)
        0.5
    """

    def __init__(self, init: float, timescale: float) -> None:
        self._setup(
            init=_number("InverseSqrt", "init", init),
            timescale=_number("InverseSqrt", "timescale", timescale, Real(low=0, closed="neither")),
        )

    def _range(self, start: int, stop: int) -> np.ndarray:
        i = np.arange(start, stop, dtype=np.float64)
        return self.init * np.sqrt(self.timescale / (i + self.timescale))


class Warmup(Sequence):
    """Linear warm-up from ``init`` to ``func.value(0)``, then ``func`` shifted by ``period``.

    ``value(i) = init + (func.value(0) - init) * i / period`` for ``i < period``,
    and ``func.value(i - period)`` after, so ``value(period) == func.value(0)``.

    Args:
        init: value at iteration 0.
        period: warm-up length, a positive int.
        func: the numeric sequence that follows; a plain number means ``Constant``.

    Examples:
        >>> w = Warmup(0.0, 4, Exponential(0.1, 0.5))
        >>> [round(w.value(i), 4) for i in range(6)]
        [0.0, 0.025, 0.05, 0.075, 0.1, 0.05]
    """

    def __init__(self, init: float, period: int, func: Sequence | Any) -> None:
        self._setup(
            init=_number("Warmup", "init", init),
            period=_integer("Warmup", "period", period),
            func=_part("Warmup", "func", func),
        )

    def _prepare(self) -> str:
        if self.func._kind not in ("int", "float"):
            raise ValueError(f"Warmup: func must have numeric values to warm up to, got {self.func!r}")
        object.__setattr__(self, "_target", float(self.func._range(0, 1)[0]))
        return "float"

    def _range(self, start: int, stop: int) -> np.ndarray:
        out = np.empty(stop - start, dtype=np.float64)
        split = min(max(start, self.period), stop)
        ramp = np.arange(start, split, dtype=np.float64)
        out[: split - start] = self.init + (self._target - self.init) * ramp / self.period
        if split < stop:
            out[split - start :] = self.func._range(split - self.period, stop - self.period)
        return out
