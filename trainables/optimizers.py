"""Optimizer hyper-parameters on a stage's optimizers: `apply_hparams`
pushes changed values (learning rate, momentum, betas, ...) into an
optimizer's param groups, `follow_optimizer_hparams` keeps a trainable's own
optimizers (and its torch schedulers) on the values a stage is given.
Imported by users from ``ray_stagetree.trainables.torch``."""

from __future__ import annotations

import math
import numbers
from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch

from ray_stagetree.trainables.live import follow_hparams

#: Hyper-parameter names `apply_hparams` sets on optimizer param groups.
#: ``beta1`` / ``beta2`` set one element of a group's ``betas``.
OPTIMIZER_HPARAMS = frozenset(
    {"lr", "momentum", "weight_decay", "betas", "beta1", "beta2", "eps", "dampening", "nesterov"}
)

_NON_NEGATIVE = ("lr", "momentum", "weight_decay", "eps", "dampening")


def apply_hparams(optimizer: torch.optim.Optimizer, hparams: Mapping[str, Any]) -> set[str]:
    """Set optimizer hyper-parameters on every param group that has them.

    Parameters
    ----------
    optimizer:
        Any ``torch.optim.Optimizer``.
    hparams:
        Changed hyper-parameter values, e.g. what the runtime passes to
        ``update_hparams``. A key may carry a config path: only the part after
        the last ``/`` counts (``"optim/lr"`` sets ``lr``). Names in
        `OPTIMIZER_HPARAMS` are applied (``lr``, ``momentum``,
        ``weight_decay``, ``betas``, ``beta1``, ``beta2``, ``eps``,
        ``dampening``, ``nesterov``); any other key (``batch_size``,
        ``dropout``, ...) is ignored.

    Returns
    -------
    set[str]
        The keys of ``hparams`` that were applied, spelled as given (so
        ``{k: v for k, v in hparams.items() if k not in applied}`` is what is
        left for the caller to handle).

    Raises
    ------
    ValueError
        If an optimizer hyper-parameter is not in any of the optimizer's param
        groups (``momentum`` on Adam), has an invalid value, or is given twice
        with different values (``"lr"`` and ``"optim/lr"``; ``betas`` with
        ``beta1``).

    Notes
    -----
    A ``torch.optim.lr_scheduler`` attached to the optimizer overwrites
    ``lr`` on its next ``step()``; do not combine one with an ``lr`` sequence.
    ``optimizer.state_dict()`` stores the param groups, so the applied values
    travel with the optimizer's checkpoint.

    Examples
    --------
    >>> model = torch.nn.Linear(2, 1)
    >>> opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    >>> sorted(apply_hparams(opt, {"optim/lr": 0.01, "beta1": 0.8, "batch_size": 64}))
    ['beta1', 'optim/lr']
    >>> opt.param_groups[0]["lr"], opt.param_groups[0]["betas"]
    (0.01, (0.8, 0.999))
    """
    values: dict[str, Any] = {}
    source: dict[str, str] = {}  # name -> first key that set it (for messages)
    applied: set[str] = set()
    for key, value in hparams.items():
        name = str(key).rsplit("/", 1)[-1]
        if name not in OPTIMIZER_HPARAMS:
            continue
        value = _validate_hparam(str(key), name, value)
        if name in values and values[name] != value:
            raise ValueError(
                f"hparams[{source[name]!r}] = {values[name]!r} and hparams[{key!r}] = {value!r} "
                f"both set {name!r}; give it once"
            )
        values[name] = value
        source.setdefault(name, str(key))
        applied.add(key)
    if "betas" in values and ("beta1" in values or "beta2" in values):
        other = source.get("beta1", source.get("beta2"))
        raise ValueError(
            f"hparams[{source['betas']!r}] and hparams[{other!r}] both set betas; "
            "give either 'betas' or 'beta1'/'beta2'"
        )

    groups = optimizer.param_groups
    group_keys = sorted({k for group in groups for k in group if k != "params"})
    for name in values:
        needed = _group_field(name)
        if not any(needed in group for group in groups):
            raise ValueError(
                f"hparams[{source[name]!r}]: {type(optimizer).__name__} has no {needed!r} "
                f"hyper-parameter; its param groups have {group_keys}"
            )

    for group in groups:
        for name, value in values.items():
            if name in ("beta1", "beta2"):
                if "betas" in group:
                    betas = list(group["betas"])
                    betas[0 if name == "beta1" else 1] = value
                    group["betas"] = _keep_type(group["betas"], tuple(betas))
            elif name in group:
                group[name] = _keep_type(group[name], value)
    return applied


#: Config keys a framework names its optimizer's learning rate by (Hugging Face's ``learning_rate``).
LEARNING_RATE_ALIASES = frozenset({"lr", "learning_rate"})


def follow_optimizer_hparams(
    optimizers: torch.optim.Optimizer | Iterable[torch.optim.Optimizer],
    schedulers: Iterable[Any] = (),
) -> dict[str, Any]:
    """At the start of an iteration, apply the optimizer hyper-parameters
    whose config values change at it, so the trainable continues live
    across their changes (no restart). Call it before each iteration's
    training, on ``ray_stagetree.Tuner`` and ``ray.tune.Tuner`` alike; the
    Lightning and Hugging Face integrations call it for you.

    Config keys count by their last ``/`` part: the names of
    `OPTIMIZER_HPARAMS` that some optimizer has, and ``learning_rate`` for
    ``lr``. A sequence in ``param_space`` sets the base learning rate: a
    ``torch.optim.lr_scheduler`` among ``schedulers`` keeps scaling it (its
    ``base_lrs`` become the new value, the current lr keeps its factor), so
    a framework's warm-up or decay still applies on top. Keys that stay
    constant are never touched, so a scheduler built from a constant
    ``config["lr"]`` inside the trainable runs as written.

    Returns the changes applied, by config key (empty at iteration 0).
    """
    optimizers = [optimizers] if isinstance(optimizers, torch.optim.Optimizer) else list(optimizers)
    fields = {key for optimizer in optimizers for group in optimizer.param_groups for key in group}

    def field(key: str) -> str | None:
        name = key.rsplit("/", 1)[-1]
        if name in LEARNING_RATE_ALIASES:
            return "lr"
        return name if name in OPTIMIZER_HPARAMS and _group_field(name) in fields else None

    changes = follow_hparams(lambda key: field(key) is not None)
    values = {field(key): value for key, value in changes.items()}
    if "lr" in values:
        _rebase_learning_rate(optimizers, list(schedulers), _validate_hparam("lr", "lr", values.pop("lr")))
    for optimizer in optimizers:
        present = {key for group in optimizer.param_groups for key in group}
        apply_hparams(optimizer, {name: value for name, value in values.items() if _group_field(name) in present})
    return changes


def _group_field(name: str) -> str:
    """The param-group entry an optimizer hyper-parameter sets."""
    return "betas" if name in ("beta1", "beta2") else name


def _rebase_learning_rate(optimizers: list[torch.optim.Optimizer], schedulers: list[Any], lr: float) -> None:
    """Make ``lr`` every param group's base learning rate; where a scheduler
    scales it, the current rate keeps the scheduler's factor."""
    scaled = set()
    for scheduler in schedulers:
        scheduler = getattr(scheduler, "scheduler", scheduler)  # accelerate's AcceleratedScheduler wraps one
        base_lrs = getattr(scheduler, "base_lrs", None)
        if base_lrs is None:  # ReduceLROnPlateau scales the current rate only
            continue
        for index, group in enumerate(scheduler.optimizer.param_groups):
            factor = group["lr"] / base_lrs[index] if base_lrs[index] else 1.0
            group["lr"] = lr * factor
            base_lrs[index] = lr
            if "initial_lr" in group:
                group["initial_lr"] = lr
            scaled.add(id(group))
    for optimizer in optimizers:
        for group in optimizer.param_groups:
            if id(group) not in scaled:
                group["lr"] = lr


def _validate_hparam(key: str, name: str, value: Any) -> Any:
    if name == "nesterov":
        if not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"hparams[{key!r}] = {value!r}: nesterov must be True or False")
        return bool(value)
    if name == "betas":
        if isinstance(value, (str, bytes)) or not hasattr(value, "__len__") or len(value) != 2:
            raise ValueError(f"hparams[{key!r}] = {value!r}: betas must be a pair (beta1, beta2)")
        return tuple(_validate_hparam(key, "beta1", v) for v in value)
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not math.isfinite(value):
        raise ValueError(f"hparams[{key!r}] = {value!r}: {name} must be a finite real number")
    value = float(value)
    if name in ("beta1", "beta2") and not 0.0 <= value < 1.0:
        raise ValueError(f"hparams[{key!r}] = {value!r}: {name} must be in [0, 1)")
    if name in _NON_NEGATIVE and value < 0.0:
        raise ValueError(f"hparams[{key!r}] = {value!r}: {name} must be >= 0")
    return value


def _keep_type(old: Any, new: Any) -> Any:
    """Write into tensor-valued hyper-parameters in place (e.g. ``lr`` given as
    a tensor for ``capturable`` / compiled optimizers) so they stay tensors."""
    if isinstance(old, torch.Tensor):
        old.fill_(new)
        return old
    if isinstance(old, tuple) and any(isinstance(o, torch.Tensor) for o in old):
        for o, n in zip(old, new):
            if isinstance(o, torch.Tensor):
                o.fill_(n)
        return tuple(o if isinstance(o, torch.Tensor) else n for o, n in zip(old, new))
    return new
