"""Hyper-parameter sequences: a hyper-parameter as a function of the iteration.

A *sequence* maps a 0-based iteration index to the hyper-parameter value a
trainable observes in that iteration (a learning-rate schedule, batch-size
steps, an optimizer switch, ...).  Sequences are immutable, compare
structurally, hash, and serialise to a declarative JSON form, so that search
plans can store them without pickle.  The planner compares thousands of them,
so every family computes ``values(start, stop)`` with vectorised numpy and
``first_difference`` stops at the first chunk that differs.

The families reproduce the PyTorch schedulers users already know.  With an
optimizer whose base learning rate is ``b``, the ``lr`` read before each
``scheduler.step()`` at iteration ``i`` equals ``value(i)`` for:

=======================================  ==========================================================
family                                   PyTorch equivalent (``torch.optim.lr_scheduler``)
=======================================  ==========================================================
``Constant(b)``                          no scheduler
``Exponential(b, gamma)``                ``ExponentialLR(gamma)``
``Step(b, step_size, gamma)``            ``StepLR(step_size, gamma)``
``MultiStep(b, milestones, gamma)``      ``MultiStepLR(milestones, gamma)``
``MultiStep(values=v, milestones=m)``    ``LambdaLR`` with a piecewise-constant lambda;
                                         ``ConstantLR(f, n)`` for ``v = [b * f, b]``, ``m = [n]``
``CyclicLR(b, max_y, up, down)``         ``CyclicLR(b, max_y, up, down, cycle_momentum=False)`` [1]
``Cosine(b, min_y, period, gamma)``      ``CosineAnnealingWarmRestarts(period, gamma, min_y)`` [2]
``Linear(b * f0, b * f1, n)``            ``LinearLR(start_factor=f0, end_factor=f1, total_iters=n)``
``OneCycle(max_value, steps, ...)``      ``OneCycleLR(max_value, steps, ..., cycle_momentum=False)`` [3]
``Polynomial(b, steps, power)``          ``PolynomialLR(total_iters=steps, power)`` (``end`` = 0)
``Warmup(w, period, func)``              ``SequentialLR([LinearLR(w / f, 1.0, period), F], [period])`` [4]
``Concat(parts, milestones)``            ``SequentialLR(schedulers, milestones)``
``Values([...])``                        ``LambdaLR`` with a list lookup
``InverseSqrt(peak, W)``                 none; ``Warmup(0, W, InverseSqrt(peak, W))`` is fairseq's
                                         ``inverse_sqrt`` schedule
=======================================  ==========================================================

[1] ``mode="triangular"``; torch names ``base_lr, max_lr, step_size_up,
step_size_down``.  [2] ``T_0=period, T_mult=gamma, eta_min=min_y``;
``CosineAnnealingLR(T_max=period, eta_min=min_y)`` agrees on ``[0, period)``
only (it then rises again where ``Cosine`` restarts);
``Cosine(b, min_y, period).then(min_y, at=period)`` agrees on ``[0, period]``,
then holds ``min_y``.  [3] Torch raises after ``total_steps``; ``OneCycle``
holds its final value.  [4] ``f = func.value(0)`` and ``F`` is the scheduler
equivalent to ``func``.

:func:`from_torch` builds these from the scheduler itself: a
``torch.optim.lr_scheduler`` class (or its name), ``lr = b`` and torch's own
arguments, ``from_torch(MultiStepLR, lr=0.1, milestones=[100, 150], gamma=0.1)``,
so that a script moves to Tune by moving its scheduler's arguments into
``param_space`` (supported classes and what is refused:
``ray_stagetree.sequences.torch_schedulers``).

Parameters may be Ray Tune search-space domains (``tune.loguniform(...)``,
``tune.grid_search([...])``): the sequence is then *unresolved*; it can be
written with :meth:`Sequence.to_spec`, resolved by Tune like any nested config,
and rebuilt (and validated) with :func:`from_json`.  This package never imports
Ray: domains are recognised by duck typing.

Examples:
    >>> lr = Warmup(0.0, 5, MultiStep(0.1, [100, 150], 0.1))
    >>> lr.value(5), lr.value(105)
    (0.1, 0.010000000000000002)
    >>> from_json(lr.to_json()) == lr
    True
    >>> MultiStep(0.1, [100], 0.1).first_difference(MultiStep(0.1, [150], 0.1), stop=200)
    100
"""

# Defining a family registers it (`FAMILIES`); the package exports every
# family by its name, so a new family is its class and nothing else.
from ray_stagetree.sequences import cyclic, decay, piecewise  # noqa: F401  (they define the families)
from ray_stagetree.sequences.base import (
    FAMILIES,
    Sequence,
    as_sequence,
    first_difference_unchecked,
    from_json,
    is_sequence_spec,
)
from ray_stagetree.sequences.torch_schedulers import from_torch

globals().update(FAMILIES)

__all__ = [
    "FAMILIES",
    "Sequence",
    "as_sequence",
    "first_difference_unchecked",
    "from_json",
    "from_torch",
    "is_sequence_spec",
    *sorted(FAMILIES),
]
