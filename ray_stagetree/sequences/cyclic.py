"""Cyclic and one-cycle families: `CyclicLR`, `Cosine` (SGDR) and `OneCycle`."""

from __future__ import annotations

import numpy as np

from ray_stagetree.sequences._params import (
    _integer,
    _is_domain,
    _number,
    _plain,
    _type_name,
)
from ray_stagetree.sequences.base import Sequence
from ray_stagetree.validation import Int, Real


class CyclicLR(Sequence):
    """Triangular cycle (torch ``CyclicLR(mode="triangular", cycle_momentum=False)``).

    Rises linearly from ``init`` to ``max_y`` over ``period1`` iterations, falls
    back over ``period2``, and repeats.

    Args:
        init: lowest value (torch ``base_lr``).
        max_y: highest value (torch ``max_lr``).
        period1: iterations of the rise, a positive int (``step_size_up``).
        period2: iterations of the fall, a positive int; None means ``period1``.

    Examples:
        >>> [CyclicLR(0.0, 1.0, 2).value(i) for i in range(5)]
        [0.0, 0.5, 1.0, 0.5, 0.0]
    """

    def __init__(self, init: float, max_y: float, period1: int, period2: int | None = None) -> None:
        self._setup(
            init=_number("CyclicLR", "init", init),
            max_y=_number("CyclicLR", "max_y", max_y),
            period1=_integer("CyclicLR", "period1", period1),
            period2=None if period2 is None else _integer("CyclicLR", "period2", period2),
        )

    def _range(self, start: int, stop: int) -> np.ndarray:
        # Same operations, in the same order, as torch's CyclicLR.get_lr.
        period2 = self.period1 if self.period2 is None else self.period2
        total = float(self.period1 + period2)
        step_ratio = self.period1 / total
        i = np.arange(start, stop, dtype=np.float64)
        cycle = np.floor(1 + i / total)
        x = 1.0 + i / total - cycle
        scale = np.where(x <= step_ratio, x / step_ratio, (x - 1) / (step_ratio - 1))
        return self.init + (self.max_y - self.init) * scale


class Cosine(Sequence):
    """Cosine annealing with warm restarts, SGDR (torch ``CosineAnnealingWarmRestarts``).

    Each cycle starts at ``init`` and anneals towards ``min_y``; cycle ``k``
    lasts ``period * gamma**k`` iterations.

    Args:
        init: value at the start of each cycle.
        min_y: value approached at the end of each cycle (``eta_min``).
        period: length of the first cycle, a positive int (``T_0``).
        gamma: cycle length multiplier, an int >= 1 (``T_mult``).

    Examples:
        >>> [round(Cosine(1.0, 0.0, 2).value(i), 6) for i in range(4)]
        [1.0, 0.5, 1.0, 0.5]
    """

    def __init__(self, init: float, min_y: float, period: int, gamma: int = 1) -> None:
        self._setup(
            init=_number("Cosine", "init", init),
            min_y=_number("Cosine", "min_y", min_y),
            period=_integer("Cosine", "period", period),
            gamma=_integer("Cosine", "gamma", gamma, Int(low=1)),
        )

    def _range(self, start: int, stop: int) -> np.ndarray:
        iterations = np.arange(start, stop, dtype=np.int64)
        if self.gamma == 1:
            t_cur = iterations % self.period
            t_len: np.ndarray = np.full(len(iterations), self.period, dtype=np.int64)
        else:
            # Cycle starts grow geometrically: only O(log stop) of them, built
            # with exact integer arithmetic (a float log misplaces boundaries).
            starts, lengths = [0], [self.period]
            while starts[-1] + lengths[-1] < stop:
                starts.append(starts[-1] + lengths[-1])
                lengths.append(lengths[-1] * self.gamma)
            cycle = np.searchsorted(np.array(starts, dtype=np.int64), iterations, side="right") - 1
            t_cur = iterations - np.array(starts, dtype=np.int64)[cycle]
            t_len = np.array(lengths, dtype=np.float64)[cycle]
        return self.min_y + (self.init - self.min_y) * (1 + np.cos(np.pi * t_cur / t_len)) / 2


class OneCycle(Sequence):
    """The 1cycle policy (torch ``OneCycleLR`` learning rate, ``cycle_momentum=False``).

    Starts at ``max_value / div_factor``, rises to ``max_value`` over the first
    ``pct_start`` of ``total_steps``, then anneals to
    ``max_value / div_factor / final_div_factor`` (with ``three_phase``, first
    back to the start value, symmetrically).  Holds its final value after
    ``total_steps``.

    Args:
        max_value: peak value (torch ``max_lr``).
        total_steps: length of the cycle, a positive int.
        pct_start: fraction of the cycle spent rising, in (0, 1).
        anneal_strategy: "cos" or "linear".
        div_factor: ``max_value / initial value``, > 0.
        final_div_factor: ``initial value / final value``, > 0.
        three_phase: use the three-phase variant.

    Examples:
        >>> s = OneCycle(1.0, 10, pct_start=0.5, anneal_strategy="linear", div_factor=2.0,
        ...              final_div_factor=1.0)
        >>> [round(s.value(i), 3) for i in (0, 4, 9, 20)]
        [0.5, 1.0, 0.5, 0.5]
    """

    def __init__(
        self,
        max_value: float,
        total_steps: int,
        pct_start: float = 0.3,
        anneal_strategy: str = "cos",
        div_factor: float = 25.0,
        final_div_factor: float = 1e4,
        three_phase: bool = False,
    ) -> None:
        if not (_is_domain(anneal_strategy) or anneal_strategy in ("cos", "linear")):
            raise ValueError(f'OneCycle: anneal_strategy must be "cos" or "linear", got {anneal_strategy!r}')
        if not (_is_domain(three_phase) or isinstance(three_phase, (bool, np.bool_))):
            raise TypeError(f"OneCycle: three_phase must be a bool, got {three_phase!r} ({_type_name(three_phase)})")
        self._setup(
            max_value=_number("OneCycle", "max_value", max_value),
            total_steps=_integer("OneCycle", "total_steps", total_steps),
            pct_start=_number("OneCycle", "pct_start", pct_start, Real(low=0, high=1, closed="neither")),
            anneal_strategy=anneal_strategy,
            div_factor=_number("OneCycle", "div_factor", div_factor, Real(low=0, closed="neither")),
            final_div_factor=_number("OneCycle", "final_div_factor", final_div_factor, Real(low=0, closed="neither")),
            three_phase=_plain(three_phase),
        )

    def _prepare(self) -> str:
        # Phase boundaries exactly as torch computes them: (end_step, from value, to value).
        initial = self.max_value / self.div_factor
        final = initial / self.final_div_factor
        rise_end = float(self.pct_start * self.total_steps) - 1
        if self.three_phase:
            phases = [
                (rise_end, initial, self.max_value),
                (float(2 * self.pct_start * self.total_steps) - 2, self.max_value, initial),
                (self.total_steps - 1, initial, final),
            ]
        else:
            phases = [(rise_end, initial, self.max_value), (self.total_steps - 1, self.max_value, final)]
        starts = [0.0] + [end for end, _, _ in phases[:-1]]
        if any(end == begin for (end, _, _), begin in zip(phases, starts)):
            # torch divides by this phase length and fails with ZeroDivisionError.
            raise ValueError(
                f"OneCycle: pct_start={self.pct_start!r} with total_steps={self.total_steps!r} "
                "gives a phase of zero length; change pct_start or total_steps"
            )
        object.__setattr__(self, "_phases", tuple(zip(starts, phases)))
        return "float"

    def _range(self, start: int, stop: int) -> np.ndarray:
        step = np.minimum(np.arange(start, stop, dtype=np.float64), self.total_steps - 1)
        out = np.empty(stop - start, dtype=np.float64)
        pending = np.ones(stop - start, dtype=bool)
        for k, (begin, (end_step, first, last)) in enumerate(self._phases):
            # torch takes the first phase whose end_step >= step, else the last one.
            mine = pending if k == len(self._phases) - 1 else pending & (step <= end_step)
            pct = (step[mine] - begin) / (end_step - begin)
            if self.anneal_strategy == "cos":
                out[mine] = last + (first - last) / 2.0 * (np.cos(np.pi * pct) + 1)
            else:
                out[mine] = (last - first) * pct + first
            pending &= ~mine
        return out
