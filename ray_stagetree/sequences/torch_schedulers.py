"""PyTorch learning-rate schedulers as sequences, by their names: `from_torch`.

A training script ported to Ray Tune keeps its scheduler and its arguments;
they move into ``param_space``::

    from torch.optim.lr_scheduler import MultiStepLR

    param_space = {"lr": from_torch(MultiStepLR, lr=tune.loguniform(1e-3, 1e-1), milestones=[8, 12], gamma=0.1)}

and the trainable sets the optimizer's lr to this iteration's value
(``get_hparams()["lr"]``) where the script called ``scheduler.step()``.  This
module never imports torch: a scheduler is the class (recognised by its
``__name__``) or that name as a string.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from ray_stagetree.sequences._params import _is_domain, _milestones, _plain, _type_name
from ray_stagetree.sequences.base import Concat, Sequence
from ray_stagetree.sequences.cyclic import Cosine, CyclicLR, OneCycle
from ray_stagetree.sequences.decay import Exponential, Linear, Polynomial
from ray_stagetree.sequences.piecewise import MultiStep, Step
from ray_stagetree.validation import (
    BOOL,
    Constraint,
    Int,
    InvalidArgumentError,
    Options,
    Real,
    check,
    did_you_mean,
)

_REQUIRED = object()
"""The default of an argument torch requires."""

# What the arguments may be: torch's own rules, narrowed where torch accepts a
# value it then divides by (step_size=0, factor=0, total_iters=0) or the family
# refuses (gamma <= 0). A learning rate is a finite number >= 0, as torch's
# optimizers require.
_RATE = Real(low=0)
_FINITE = Real()
_POSITIVE = Real(low=0, closed="neither")
_POSITIVE_INT = Int(low=0, closed="neither")
_FACTOR = Real(low=0, high=1, closed="right")  # (0, 1]
_LAST_EPOCH = Options((-1,))

_SCHEDULERS: dict[str, tuple[dict[str, Any], Callable[[_Call], Sequence]]] = {}
"""Supported scheduler name -> (its arguments and torch's defaults, in torch's order; the converter)."""

_REFUSED = {
    "LambdaLR": "its lr_lambda is a Python function, which a sequence cannot store declaratively; "
    "write the schedule as a family (MultiStep(values=...), Values([...]), Concat, ...)",
    "MultiplicativeLR": "its lr_lambda is a Python function, which a sequence cannot store declaratively; "
    "write the schedule as a family (Exponential, MultiStep(values=...), Values([...]), ...)",
    "ReduceLROnPlateau": "it follows the metric a trial reports, while a sequence is a function of the iteration "
    "alone; use one of Tune's trial schedulers to react to the metric",
    "ChainedScheduler": "it multiplies the effects of all its schedulers at every step; "
    "chain schedules one after the other with SequentialLR instead",
    "LRScheduler": "it is the base class of torch's schedulers, not a schedule",
    "_LRScheduler": "it is the base class of torch's schedulers, not a schedule",
}

# SequentialLR hands its schedulers the optimizer's lr; these set it themselves.
_NOT_IN_SEQUENTIAL = {
    "SequentialLR": "torch cannot nest SequentialLR (it restarts a scheduler with step(0), which SequentialLR "
    "lacks); list the inner schedulers in the outer one, milestones counted from iteration 0",
    "OneCycleLR": "OneCycleLR overwrites the optimizer's initial_lr, so in torch the other schedulers' base "
    "learning rate depends on the order they were built in",
    "CyclicLR": "CyclicLR sets the optimizer's lr to base_lr when it is built, so in torch the other "
    "schedulers' base learning rate depends on the order they were built in",
}


def _scheduler(name: str, **signature: Any) -> Callable[[Callable[[_Call], Sequence]], Callable[[_Call], Sequence]]:
    """Register the converter of scheduler ``name``, whose torch arguments
    (after ``optimizer``) and their defaults are ``signature``."""

    def register(convert: Callable[[_Call], Sequence]) -> Callable[[_Call], Sequence]:
        _SCHEDULERS[name] = (signature, convert)
        return convert

    return register


def from_torch(scheduler: Any, lr: Any, **arguments: Any) -> Sequence:
    """The sequence of the learning rates a torch scheduler sets.

    With ``optimizer = SGD(params, lr=lr)`` and ``s = scheduler(optimizer,
    **arguments)``, ``optimizer.param_groups[0]["lr"]`` read before the
    ``i``-th ``s.step()`` equals ``from_torch(scheduler, lr, **arguments).value(i)``
    (checked against torch 2.13 for every class below).  A script ported to
    Tune moves the scheduler's arguments into ``param_space`` unchanged:
    torch's argument names, torch's defaults.

    ===============================  ==================================================================
    ``torch.optim.lr_scheduler``     sequence (``b`` is ``lr``)
    ===============================  ==================================================================
    ``StepLR``                       ``Step(b, step_size, gamma)``
    ``MultiStepLR``                  ``MultiStep(b, milestones, gamma)`` [1]
    ``ExponentialLR``                ``Exponential(b, gamma)``
    ``CosineAnnealingLR``            ``Cosine(b, eta_min, T_max).then(eta_min, at=T_max)`` [2]
    ``CosineAnnealingWarmRestarts``  ``Cosine(b, eta_min, T_0, T_mult)``
    ``CyclicLR``                     ``CyclicLR(base_lr, max_lr, step_size_up, step_size_down)`` [3]
    ``OneCycleLR``                   ``OneCycle(max_lr, total_steps, pct_start, ...)`` [4]
    ``LinearLR``                     ``Linear(b * start_factor, b * end_factor, total_iters)``
    ``PolynomialLR``                 ``Polynomial(b, total_iters, power)``
    ``ConstantLR``                   ``MultiStep(values=[b * factor, b], milestones=[total_iters])``
    ``SequentialLR``                 ``Concat`` of its schedulers (``a.then(b, at=m)``) [5]
    ===============================  ==================================================================

    [1] Milestones in any order; one given twice decays twice there, as in
    torch.  [2] Torch's values form a cosine wave of period ``2 * T_max``: they
    agree on ``[0, T_max]``, then torch rises back towards ``b`` while the
    sequence holds ``eta_min`` (for restarts, use CosineAnnealingWarmRestarts).
    [3] ``mode="triangular"`` only; torch's ``lr`` is replaced by ``base_lr``,
    so ``lr`` is ignored, as are ``gamma`` and ``scale_mode`` (unused in that
    mode).  [4] ``total_steps``, or ``epochs * steps_per_epoch`` when it is
    None; ``lr`` is ignored (torch starts at ``max_lr / div_factor``); torch
    raises after ``total_steps`` steps, the sequence holds its last value.
    [5] ``schedulers`` is a list of ``(scheduler, arguments)`` pairs, each
    scheduler a class or name of this table but SequentialLR, OneCycleLR and
    CyclicLR (those set the optimizer's lr themselves, so torch's result
    depends on the order the schedulers were built in), all sharing ``lr``.

    ``cycle_momentum``, ``base_momentum`` and ``max_momentum`` (OneCycleLR,
    CyclicLR) schedule the momentum, not the learning rate: they are accepted
    and ignored.

    Parameters may be Ray Tune search-space domains where their value goes
    unchanged into one place of the sequence (``lr`` of StepLR, ``gamma``,
    ``milestones``, ``T_0``, ``max_lr``, ``total_iters``, ...): the sequence is
    then unresolved and Tune draws it like any other.  A domain is refused
    where from_torch must compute with the value (``lr`` of LinearLR and
    ConstantLR, ``start_factor``, ``factor``, ``epochs * steps_per_epoch``) or
    put it in two places (``T_max`` and ``eta_min`` of CosineAnnealingLR,
    ``lr`` shared by a SequentialLR's schedulers): Tune would draw each place
    on its own.  Search such schedules whole instead:
    ``tune.choice([from_torch(LinearLR, lr=v, ...) for v in (0.01, 0.1)])``.

    Args:
        scheduler: a ``torch.optim.lr_scheduler`` class, or its name.
        lr: the optimizer's base learning rate (the param group's ``lr``
            when the scheduler is built), a number >= 0 or a Tune domain.
        **arguments: the scheduler's arguments but ``optimizer``, by torch's
            names.

    Raises:
        ValueError: an unknown or unsupported scheduler, a misspelt or
            missing argument, a value torch or the family refuses, or one the
            sequences cannot express (``last_epoch != -1``, CyclicLR's
            ``mode="exp_range"``, a ``scale_fn``, per-group lists of learning
            rates, a domain where it would be drawn twice): the message names
            the scheduler, the argument, the value and what is allowed.

    Examples:
        >>> from_torch("MultiStepLR", lr=0.1, milestones=[8, 12], gamma=0.1)
        MultiStep(init=0.1, milestones=[8, 12], gamma=0.1)
        >>> lr = from_torch(
        ...     "SequentialLR",
        ...     lr=0.1,
        ...     schedulers=[
        ...         ("LinearLR", {"start_factor": 0.1, "total_iters": 5}),
        ...         ("CosineAnnealingLR", {"T_max": 20}),
        ...     ],
        ...     milestones=[5],
        ... )
        >>> [round(lr.value(i), 4) for i in (0, 5, 15, 25, 40)]
        [0.01, 0.1, 0.05, 0.0, 0.0]
    """
    name = _scheduler_name("from_torch", "scheduler", scheduler)
    return _convert(name, f"from_torch({name})", lr, arguments)


def _scheduler_name(where: str, what: str, scheduler: Any) -> str:
    """The name of a supported scheduler given as a class or a string."""
    if isinstance(scheduler, type):
        name = scheduler.__name__
    elif isinstance(scheduler, str):
        name = scheduler
    else:
        hint = ""
        if hasattr(scheduler, "optimizer") and hasattr(scheduler, "step"):
            built = type(scheduler).__name__
            hint = f"; pass the class ({built}) and its arguments, not a scheduler built on an optimizer"
        raise InvalidArgumentError(
            f"{where}: {what} must be a torch.optim.lr_scheduler class or its name, "
            f"got {scheduler!r} ({_type_name(scheduler)}){hint}"
        )
    supported = ", ".join(sorted(_SCHEDULERS))
    if name in _REFUSED:
        raise ValueError(f"{where}: {what} {name} is not supported: {_REFUSED[name]}; supported: {supported}")
    if name not in _SCHEDULERS:
        raise ValueError(
            f"{where}: {what} {name!r} is not a scheduler from_torch knows{did_you_mean(name, _SCHEDULERS)}; "
            f"supported: {supported}"
        )
    return name


def _convert(name: str, where: str, lr: Any, arguments: Mapping[str, Any]) -> Sequence:
    signature, convert = _SCHEDULERS[name]
    return convert(_Call(name, where, signature, lr, arguments))


def _shown(value: Any) -> str:
    """A value for a message; a Ray domain object's repr names only its address."""
    if _is_domain(value) and not isinstance(value, dict):
        return f"a Tune domain {type(value).__name__} {getattr(value, 'domain_str', '')}".rstrip()
    return repr(value)


class _Call:
    """One scheduler's arguments, checked (each named as the user wrote it) as the converter reads them."""

    def __init__(self, name: str, where: str, signature: dict[str, Any], lr: Any, arguments: Mapping[str, Any]):
        self.name, self.where = name, where
        takes = ", ".join(key if default is _REQUIRED else f"{key}={default!r}" for key, default in signature.items())
        for key in arguments:
            if key not in signature:
                if key == "optimizer":
                    reason = "; from_torch takes the optimizer's lr as lr, and no optimizer"
                else:
                    reason = did_you_mean(key, signature)
                raise ValueError(f"{where}: {name} has no argument {key!r}{reason}; {name} takes {takes}")
        missing = [key for key, default in signature.items() if default is _REQUIRED and key not in arguments]
        if missing:
            raise ValueError(f"{where}: missing argument {', '.join(missing)}; {name} takes {takes}")
        self.arguments = {key: _plain(arguments.get(key, default)) for key, default in signature.items()}
        self._lr = _plain(lr)
        self.get("last_epoch", _LAST_EPOCH, plain="it must be -1", meaning=_LAST_EPOCH_MEANING)

    # -- reading arguments -------------------------------------------------

    def lr(self, plain: str | None = None) -> Any:
        """The optimizer's lr (a Tune domain unless ``plain`` says why not)."""
        return self._read("lr", self._lr, (_RATE,), plain, rate=True)

    def get(self, key: str, *constraints: Constraint | None, plain: str | None = None, meaning: str = "") -> Any:
        """Argument ``key``, one of ``constraints`` (None allows None), or a
        Tune domain unless ``plain`` says why it may not be one."""
        return self._read(key, self.arguments[key], constraints, plain, meaning=meaning)

    def rate(self, key: str, plain: str | None = None) -> Any:
        """A learning rate, as a float (``eta_min=0`` and ``0.0`` give one sequence)."""
        return self._read(key, self.arguments[key], (_RATE,), plain, rate=True)

    def ignored(self, key: str, *constraints: Constraint | None, why: str) -> None:
        """An argument torch takes that does not change the learning rate: checked, then dropped."""
        self._read(key, self.arguments[key], constraints, f"{why}, so a domain would search nothing")

    def refuse_domain(self, key: str, value: Any, why: str) -> None:
        """Raise if ``value`` (argument ``key``) is a Tune domain, saying ``why`` it may not be one."""
        if _is_domain(value):
            raise ValueError(
                f"{self.where}: {key} cannot be a Tune search-space domain here, got {_shown(value)}: {why}; give a "
                f"plain value, or search whole schedules: tune.choice([from_torch({self.name}, ...) for ... in ...])"
            )

    def _read(
        self,
        key: str,
        value: Any,
        constraints: tuple[Constraint | None, ...],
        plain: str | None,
        rate: bool = False,
        meaning: str = "",
    ) -> Any:
        where = f"{self.where}: {key}"
        if _is_domain(value):
            if plain is not None:
                self.refuse_domain(key, value, plain)
            return value
        if rate and isinstance(value, (list, tuple)):
            raise InvalidArgumentError(
                f"{where} must be a number, got {value!r}: torch's per-group lists describe several param groups, "
                "while a sequence is one group's learning rate (build one sequence per group)"
            )
        value = check(where, value, *constraints, meaning=meaning)
        return float(value) if rate else value


_LAST_EPOCH_MEANING = (
    " (a sequence starts at iteration 0; a trial resumed from a checkpoint continues at its own iteration, "
    "so build the scheduler as the script did at its start)"
)
_MOMENTUM = "it schedules the momentum, not the learning rate"


# --------------------------------------------------------------------------
# The schedulers, in torch's argument order


@_scheduler("StepLR", step_size=_REQUIRED, gamma=0.1, last_epoch=-1)
def _step_lr(c: _Call) -> Sequence:
    return Step(c.lr(), c.get("step_size", _POSITIVE_INT), c.get("gamma", _POSITIVE))


@_scheduler("MultiStepLR", milestones=_REQUIRED, gamma=0.1, last_epoch=-1)
def _multi_step_lr(c: _Call) -> Sequence:
    lr, gamma = c.lr(), c.get("gamma", _POSITIVE)
    milestones = c.arguments["milestones"]
    if _is_domain(milestones):
        return MultiStep(lr, milestones, gamma)
    where, allowed = f"{c.where}: milestones", "a list of positive ints, in any order (one given twice decays twice)"
    if isinstance(milestones, np.ndarray):
        milestones = milestones.tolist()
    if not isinstance(milestones, (list, tuple, range)):
        raise InvalidArgumentError(f"{where} must be {allowed}, got {milestones!r} ({_type_name(milestones)})")
    milestones = [_plain(m) for m in milestones]
    for m in milestones:
        if not _is_domain(m) and not _POSITIVE_INT.holds(m):
            raise InvalidArgumentError(f"{where} must be {allowed}, got {milestones!r}")
    if any(_is_domain(m) for m in milestones):
        return MultiStep(lr, milestones, gamma)  # MultiStep checks the order once Tune has drawn them
    counts = Counter(milestones)
    distinct = sorted(counts)
    if len(distinct) == len(milestones):
        return MultiStep(lr, distinct, gamma)
    # A milestone given `count` times decays by gamma ** count there: explicit values.
    repeated = [m for m in distinct if counts[m] > 1]
    c.refuse_domain("lr", lr, f"milestones repeat {repeated}, which makes the values lr * gamma ** k computed")
    c.refuse_domain("gamma", gamma, f"milestones repeat {repeated}, which makes the values lr * gamma ** k computed")
    decays, values = 0, [lr]
    for m in distinct:
        decays += counts[m]
        values.append(lr * gamma**decays)
    return MultiStep(values=values, milestones=distinct)


@_scheduler("ExponentialLR", gamma=_REQUIRED, last_epoch=-1)
def _exponential_lr(c: _Call) -> Sequence:
    return Exponential(c.lr(), c.get("gamma", _POSITIVE))


@_scheduler("CosineAnnealingLR", T_max=_REQUIRED, eta_min=0.0, last_epoch=-1)
def _cosine_annealing_lr(c: _Call) -> Sequence:
    twice = (
        "the sequence uses it twice, in the cosine and in the value held from T_max on, and Tune would draw the "
        "two places independently (CosineAnnealingWarmRestarts(T_0=...), whose values are the same on [0, T_0), "
        "takes domains)"
    )
    t_max = c.get("T_max", _POSITIVE_INT, plain=twice)
    eta_min = c.rate("eta_min", plain=twice)
    return Cosine(c.lr(), eta_min, t_max).then(eta_min, at=t_max)


@_scheduler("CosineAnnealingWarmRestarts", T_0=_REQUIRED, T_mult=1, eta_min=0.0, last_epoch=-1)
def _cosine_annealing_warm_restarts(c: _Call) -> Sequence:
    return Cosine(c.lr(), c.rate("eta_min"), c.get("T_0", _POSITIVE_INT), c.get("T_mult", Int(low=1)))


@_scheduler(
    "CyclicLR",
    base_lr=_REQUIRED,
    max_lr=_REQUIRED,
    step_size_up=2000,
    step_size_down=None,
    mode="triangular",
    gamma=1.0,
    scale_fn=None,
    scale_mode="cycle",
    cycle_momentum=True,
    base_momentum=0.8,
    max_momentum=0.9,
    last_epoch=-1,
)
def _cyclic_lr(c: _Call) -> Sequence:
    c.lr(plain="CyclicLR ignores the optimizer's lr (it sets the lr to base_lr); search base_lr and max_lr")
    only = "the triangular mode is the CyclicLR family's; triangular2 and exp_range scale each cycle down"
    c.get("mode", Options(("triangular",)), plain=only, meaning=f" ({only})")
    c.get(
        "scale_fn",
        None,
        plain="it must be None",
        meaning=" (a custom scale_fn is a Python function, which a sequence cannot store declaratively)",
    )
    c.ignored("gamma", _FINITE, why="the triangular mode does not use gamma")
    c.ignored("scale_mode", Options(("cycle", "iterations")), why="torch sets it from mode when scale_fn is None")
    c.ignored("cycle_momentum", BOOL, why=_MOMENTUM)
    c.ignored("base_momentum", _FINITE, why=_MOMENTUM)
    c.ignored("max_momentum", _FINITE, why=_MOMENTUM)
    return CyclicLR(
        c.rate("base_lr"),
        c.rate("max_lr"),
        c.get("step_size_up", _POSITIVE_INT),
        c.get("step_size_down", None, _POSITIVE_INT, meaning=" (None means step_size_up)"),
    )


@_scheduler(
    "OneCycleLR",
    max_lr=_REQUIRED,
    total_steps=None,
    epochs=None,
    steps_per_epoch=None,
    pct_start=0.3,
    anneal_strategy="cos",
    cycle_momentum=True,
    base_momentum=0.85,
    max_momentum=0.95,
    div_factor=25.0,
    final_div_factor=1e4,
    three_phase=False,
    last_epoch=-1,
)
def _one_cycle_lr(c: _Call) -> Sequence:
    c.lr(plain="OneCycleLR ignores the optimizer's lr (it starts at max_lr / div_factor); search max_lr")
    c.ignored("cycle_momentum", BOOL, why=_MOMENTUM)
    c.ignored("base_momentum", _FINITE, why=_MOMENTUM)
    c.ignored("max_momentum", _FINITE, why=_MOMENTUM)
    if c.arguments["total_steps"] is not None:
        total_steps = c.get("total_steps", _POSITIVE_INT)
        given = "torch uses total_steps when it is given"
        c.ignored("epochs", None, _POSITIVE_INT, why=given)
        c.ignored("steps_per_epoch", None, _POSITIVE_INT, why=given)
    else:
        product = "total_steps is then epochs * steps_per_epoch, computed; give total_steps instead"
        epochs = c.get("epochs", None, _POSITIVE_INT, plain=product)
        per_epoch = c.get("steps_per_epoch", None, _POSITIVE_INT, plain=product)
        if epochs is None or per_epoch is None:
            raise ValueError(
                f"{c.where}: give total_steps, or both epochs and steps_per_epoch; got total_steps=None, "
                f"epochs={epochs!r}, steps_per_epoch={per_epoch!r}"
            )
        total_steps = epochs * per_epoch
    return OneCycle(
        c.rate("max_lr"),
        total_steps,
        pct_start=c.get("pct_start", Real(low=0, high=1, closed="neither")),
        anneal_strategy=c.get("anneal_strategy", Options(("cos", "linear"))),
        div_factor=c.get("div_factor", _POSITIVE),
        final_div_factor=c.get("final_div_factor", _POSITIVE),
        three_phase=c.get("three_phase", BOOL),
    )


@_scheduler("LinearLR", start_factor=1.0 / 3, end_factor=1.0, total_iters=5, last_epoch=-1)
def _linear_lr(c: _Call) -> Sequence:
    product = "LinearLR's values are lr times start_factor and end_factor, computed before Tune draws"
    lr = c.lr(plain=product)
    start = c.get("start_factor", _FACTOR, plain=product)
    end = c.get("end_factor", Real(low=0, high=1), plain=product)
    return Linear(lr * start, lr * end, c.get("total_iters", _POSITIVE_INT))


@_scheduler("PolynomialLR", total_iters=5, power=1.0, last_epoch=-1)
def _polynomial_lr(c: _Call) -> Sequence:
    return Polynomial(c.lr(), c.get("total_iters", _POSITIVE_INT), c.get("power", Real(low=0)))


@_scheduler("ConstantLR", factor=1.0 / 3, total_iters=5, last_epoch=-1)
def _constant_lr(c: _Call) -> Sequence:
    product = "ConstantLR's values are lr times factor, then lr, computed before Tune draws"
    lr = c.lr(plain=product)
    factor = c.get("factor", _FACTOR, plain=product, meaning=" (torch divides by factor at total_iters)")
    return MultiStep(values=[lr * factor, lr], milestones=[c.get("total_iters", _POSITIVE_INT)])


@_scheduler("SequentialLR", schedulers=_REQUIRED, milestones=_REQUIRED, last_epoch=-1)
def _sequential_lr(c: _Call) -> Sequence:
    pair = '(scheduler, arguments) pairs, e.g. [(LinearLR, {"total_iters": 5}), (ExponentialLR, {"gamma": 0.9})]'
    items = c.arguments["schedulers"]
    c.refuse_domain("schedulers", items, "a domain cannot choose between schedulers given by name")
    if not isinstance(items, (list, tuple)) or not items:
        raise InvalidArgumentError(f"{c.where}: schedulers must be a non-empty list of {pair}, got {items!r}")
    if len(items) > 1:
        c.lr(
            plain=f"it is the base lr of each of the {len(items)} schedulers, and Tune would draw it once per scheduler"
        )
    parts = []
    for k, item in enumerate(items):
        where = f"{c.where}: schedulers[{k}]"
        if not (isinstance(item, (list, tuple)) and len(item) == 2 and isinstance(item[1], Mapping)):
            raise InvalidArgumentError(f"{where} must be one of {pair}, got {item!r}")
        name = _scheduler_name(c.where, f"schedulers[{k}]", item[0])
        if name in _NOT_IN_SEQUENTIAL:
            raise ValueError(f"{where}: {name} is not supported inside SequentialLR: {_NOT_IN_SEQUENTIAL[name]}")
        if "lr" in item[1]:
            raise ValueError(
                f"{where}: {name} has no argument 'lr': the optimizer's lr is given once, to from_torch, "
                "and SequentialLR's schedulers share it"
            )
        parts.append(_convert(name, f"{where} ({name})", c._lr, item[1]))
    milestones = c.arguments["milestones"]
    if _is_domain(milestones):
        return Concat(parts, milestones)
    milestones = _milestones(c.where, "milestones", milestones)
    if len(milestones) != len(parts) - 1:
        raise ValueError(
            f"{c.where}: milestones must have one entry fewer than schedulers ({len(parts) - 1}), "
            f"got {list(milestones)!r} for {len(parts)} schedulers"
        )
    sequence = parts[0]
    for part, at in zip(parts[1:], milestones):
        sequence = sequence.then(part, at=at)
    return sequence
