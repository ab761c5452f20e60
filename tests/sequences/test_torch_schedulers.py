"""Tests for `from_torch`: torch schedulers by their names and arguments, value
for value against torch itself, the arguments refused, Tune domains."""

from __future__ import annotations

import warnings
from typing import Any

import pytest

from ray_stagetree.sequences import (
    Concat,
    Constant,
    Cosine,
    CyclicLR,
    Exponential,
    Linear,
    MultiStep,
    OneCycle,
    Sequence,
    Step,
    from_json,
    from_torch,
)

# (scheduler name, torch arguments, base lr, iterations compared). Each set runs
# past the milestones, restarts and warm-ups it has; CosineAnnealingLR and
# OneCycleLR stop where the sequence stops agreeing with torch by design
# (T_max, total_steps; see the tests after the table).
CASES: dict[str, tuple[str, dict[str, Any], float, int]] = {
    "StepLR": ("StepLR", {"step_size": 7, "gamma": 0.8}, 0.1, 60),
    "StepLR-defaults": ("StepLR", {"step_size": 3}, 0.05, 60),
    "MultiStepLR": ("MultiStepLR", {"milestones": [8, 12], "gamma": 0.1}, 0.1, 60),
    "MultiStepLR-unsorted-default-gamma": ("MultiStepLR", {"milestones": [30, 10, 45]}, 0.2, 60),
    "MultiStepLR-repeated-milestone": ("MultiStepLR", {"milestones": [20, 40, 20], "gamma": 0.5}, 0.1, 60),
    "ExponentialLR": ("ExponentialLR", {"gamma": 0.95}, 0.1, 60),
    "ExponentialLR-growing": ("ExponentialLR", {"gamma": 1.02}, 0.01, 60),
    "CosineAnnealingLR": ("CosineAnnealingLR", {"T_max": 59}, 0.1, 60),
    "CosineAnnealingLR-eta_min": ("CosineAnnealingLR", {"T_max": 20, "eta_min": 1e-3}, 0.1, 21),
    "CosineAnnealingLR-T_max-1": ("CosineAnnealingLR", {"T_max": 1, "eta_min": 0.01}, 0.1, 2),
    "CosineAnnealingWarmRestarts": ("CosineAnnealingWarmRestarts", {"T_0": 10}, 0.1, 60),
    "CosineAnnealingWarmRestarts-T_mult": (
        "CosineAnnealingWarmRestarts",
        {"T_0": 5, "T_mult": 2, "eta_min": 1e-4},
        0.1,
        60,
    ),
    "OneCycleLR": ("OneCycleLR", {"max_lr": 0.5, "total_steps": 60}, 0.1, 60),
    "OneCycleLR-epochs-linear-three-phase": (
        "OneCycleLR",
        {
            "max_lr": 1.0,
            "epochs": 6,
            "steps_per_epoch": 10,
            "pct_start": 0.25,
            "anneal_strategy": "linear",
            "three_phase": True,
            "div_factor": 10.0,
            "final_div_factor": 100.0,
        },
        0.1,
        60,
    ),
    "OneCycleLR-no-momentum": (
        "OneCycleLR",
        {"max_lr": 0.3, "total_steps": 57, "pct_start": 0.4, "cycle_momentum": False, "three_phase": True},
        0.1,
        57,
    ),
    "LinearLR-defaults": ("LinearLR", {}, 0.1, 60),
    "LinearLR-warmup": ("LinearLR", {"start_factor": 0.1, "total_iters": 20}, 0.1, 60),
    "LinearLR-decay": ("LinearLR", {"start_factor": 1.0, "end_factor": 0.05, "total_iters": 40}, 0.1, 60),
    "LinearLR-to-zero": ("LinearLR", {"start_factor": 0.5, "end_factor": 0.0, "total_iters": 30}, 0.1, 60),
    "PolynomialLR-defaults": ("PolynomialLR", {}, 0.1, 60),
    "PolynomialLR-square": ("PolynomialLR", {"total_iters": 40, "power": 2.0}, 0.1, 60),
    "PolynomialLR-root": ("PolynomialLR", {"total_iters": 50, "power": 0.5}, 0.1, 60),
    "ConstantLR-defaults": ("ConstantLR", {}, 0.1, 60),
    "ConstantLR": ("ConstantLR", {"factor": 0.5, "total_iters": 20}, 0.3, 60),
    "ConstantLR-factor-1": ("ConstantLR", {"factor": 1.0, "total_iters": 20}, 0.1, 60),
    "CyclicLR": ("CyclicLR", {"base_lr": 0.01, "max_lr": 0.1, "step_size_up": 7}, 0.1, 60),
    "CyclicLR-asymmetric": (
        "CyclicLR",
        {
            "base_lr": 0.001,
            "max_lr": 0.05,
            "step_size_up": 4,
            "step_size_down": 11,
            "mode": "triangular",
            "gamma": 0.9,  # unused in the triangular mode, by torch too
            "cycle_momentum": False,
        },
        0.1,
        60,
    ),
    "SequentialLR-warmup-cosine": (
        "SequentialLR",
        {
            "schedulers": [("LinearLR", {"start_factor": 0.1, "total_iters": 5}), ("CosineAnnealingLR", {"T_max": 55})],
            "milestones": [5],
        },
        0.1,
        61,
    ),
    "SequentialLR-cosine-cut-short": (
        "SequentialLR",
        {"schedulers": [("CosineAnnealingLR", {"T_max": 40}), ("StepLR", {"step_size": 9})], "milestones": [20]},
        0.1,
        60,
    ),
    "SequentialLR-three": (
        "SequentialLR",
        {
            "schedulers": [
                ("ConstantLR", {"factor": 0.5, "total_iters": 10}),
                ("MultiStepLR", {"milestones": [10, 20]}),
                ("CosineAnnealingWarmRestarts", {"T_0": 7, "eta_min": 0.001}),
            ],
            "milestones": [15, 40],
        },
        0.1,
        60,
    ),
    "SequentialLR-decays": (
        "SequentialLR",
        {
            "schedulers": [
                ("ExponentialLR", {"gamma": 0.9}),
                ("LinearLR", {"start_factor": 0.5, "end_factor": 0.1, "total_iters": 10}),
                ("PolynomialLR", {"total_iters": 20, "power": 2.0}),
            ],
            "milestones": [10, 30],
        },
        0.2,
        60,
    ),
    "SequentialLR-one": ("SequentialLR", {"schedulers": [("StepLR", {"step_size": 5})], "milestones": []}, 0.1, 60),
}


# The families that compute with torch's own operations, in torch's order
# (the others differ from torch's recursive products by an ulp or two).
EXACT = {"CosineAnnealingWarmRestarts", "CyclicLR", "OneCycleLR"}


def build_torch(lr_scheduler: Any, optimizer: Any, name: str, arguments: dict[str, Any]) -> Any:
    """The torch scheduler ``name(optimizer, **arguments)``, SequentialLR's schedulers built in list order."""
    if name == "SequentialLR":
        schedulers = [build_torch(lr_scheduler, optimizer, child, args) for child, args in arguments["schedulers"]]
        return lr_scheduler.SequentialLR(optimizer, schedulers, milestones=arguments["milestones"])
    return getattr(lr_scheduler, name)(optimizer, **arguments)


def torch_lrs(name: str, arguments: dict[str, Any], lr: float, n: int) -> list[float]:
    """The lr a training loop reads before each of ``n`` ``scheduler.step()`` calls."""
    torch = pytest.importorskip("torch")
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=lr)
    scheduler = build_torch(torch.optim.lr_scheduler, optimizer, name, arguments)
    lrs = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # SequentialLR restarts a scheduler with an explicit epoch (deprecated)
        for _ in range(n):
            lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
    return lrs


def with_classes(name: str, arguments: dict[str, Any]) -> tuple[Any, dict[str, Any]]:
    """The same call with torch's classes for the names, as a ported script writes it."""
    torch = pytest.importorskip("torch")
    classes = torch.optim.lr_scheduler
    if name == "SequentialLR":
        schedulers = [(getattr(classes, child), args) for child, args in arguments["schedulers"]]
        arguments = {**arguments, "schedulers": schedulers}
    return getattr(classes, name), arguments


@pytest.mark.parametrize("case", sorted(CASES))
def test_agrees_with_torch(case: str) -> None:
    name, arguments, lr, n = CASES[case]
    expected = torch_lrs(name, arguments, lr, n)
    scheduler, class_arguments = with_classes(name, arguments)
    seq = from_torch(scheduler, lr=lr, **class_arguments)
    assert seq.is_resolved
    assert [seq.value(i) for i in range(n)] == pytest.approx(expected, rel=1e-9)
    assert list(seq.values(0, n)) == pytest.approx(expected, rel=1e-9)
    if name in EXACT:
        assert [seq.value(i) for i in range(n)] == expected
    # The class and its name give the same sequence, which survives its JSON form.
    assert from_torch(name, lr, **arguments) == seq
    assert from_json(seq.to_json()) == seq


def test_the_families_they_give() -> None:
    assert from_torch("StepLR", 0.1, step_size=3) == Step(0.1, 3, 0.1)
    assert from_torch("MultiStepLR", 0.1, milestones=[12, 8], gamma=0.5) == MultiStep(0.1, [8, 12], 0.5)
    assert from_torch("ExponentialLR", 1, gamma=0.9) == Exponential(1.0, 0.9)  # an int lr is a float lr
    assert from_torch("CosineAnnealingWarmRestarts", 0.1, T_0=5, T_mult=2) == Cosine(0.1, 0.0, 5, 2)
    assert from_torch("CosineAnnealingLR", 0.1, T_max=20, eta_min=0) == Cosine(0.1, 0.0, 20).then(0.0, at=20)
    assert from_torch("CyclicLR", 0.1, base_lr=0.01, max_lr=0.1, step_size_up=5) == CyclicLR(0.01, 0.1, 5)
    assert from_torch("OneCycleLR", 0.1, max_lr=1.0, epochs=3, steps_per_epoch=20) == OneCycle(1.0, 60)
    assert from_torch("LinearLR", 0.5, start_factor=0.5, end_factor=1.0, total_iters=4) == Linear(0.25, 0.5, 4)
    assert from_torch("ConstantLR", 0.5, factor=0.5, total_iters=4) == MultiStep(values=[0.25, 0.5], milestones=[4])
    warmup_then_cosine = from_torch(
        "SequentialLR",
        0.1,
        schedulers=[("ConstantLR", {"factor": 0.5, "total_iters": 5}), ("CosineAnnealingLR", {"T_max": 20})],
        milestones=[5],
    )
    # Flattened, as Sequence.then builds it: the cosine's hold starts 5 + 20 iterations in.
    assert warmup_then_cosine == Concat(
        [MultiStep(values=[0.05, 0.1], milestones=[5]), Cosine(0.1, 0.0, 20), Constant(0.0)], [5, 25]
    )


def test_cosine_annealing_lr_holds_eta_min_after_t_max_where_torch_rises_again() -> None:
    seq = from_torch("CosineAnnealingLR", 0.1, T_max=20, eta_min=1e-3)
    expected = torch_lrs("CosineAnnealingLR", {"T_max": 20, "eta_min": 1e-3}, 0.1, 41)
    assert seq.value(20) == expected[20] == 1e-3  # exact at T_max
    assert all(seq.value(i) == 1e-3 for i in range(20, 200))
    assert expected[40] == pytest.approx(0.1)  # torch's cosine wave is back at lr at 2 * T_max


def test_one_cycle_lr_holds_its_last_value_where_torch_raises() -> None:
    seq = from_torch("OneCycleLR", 0.1, max_lr=0.5, total_steps=30)
    assert seq.values(29, 100).tolist() == [seq.value(29)] * 71
    torch_lrs("OneCycleLR", {"max_lr": 0.5, "total_steps": 30}, 0.1, 30)  # 30 steps are torch's limit
    with pytest.raises(ValueError, match="Tried to step 31 times"):
        torch_lrs("OneCycleLR", {"max_lr": 0.5, "total_steps": 30}, 0.1, 31)


# --------------------------------------------------------------------------
# What is refused, and what the messages say
# --------------------------------------------------------------------------

WARMUP = ("LinearLR", {"total_iters": 5})


@pytest.mark.parametrize(
    "scheduler, arguments, match",
    [
        ("StepLr", {"step_size": 3}, r"from_torch: scheduler 'StepLr' is not a scheduler.*did you mean 'StepLR'\?"),
        ("Cosine", {}, r"supported: ConstantLR, CosineAnnealingLR, CosineAnnealingWarmRestarts, CyclicLR, "),
        ("LambdaLR", {"lr_lambda": abs}, r"scheduler LambdaLR is not supported: its lr_lambda is a Python function"),
        ("ReduceLROnPlateau", {}, r"ReduceLROnPlateau is not supported: it follows the metric"),
        ("ChainedScheduler", {}, r"ChainedScheduler is not supported.*SequentialLR"),
        (3, {}, r"from_torch: scheduler must be a torch.optim.lr_scheduler class or its name, got 3 \(int\)"),
        (
            "StepLR",
            {"step_size": 3, "gama": 0.5},
            r"from_torch\(StepLR\): StepLR has no argument 'gama' \(did you mean 'gamma'\?\); "
            r"StepLR takes step_size, gamma=0.1, last_epoch=-1$",
        ),
        ("StepLR", {"step_size": 3, "verbose": True}, r"StepLR has no argument 'verbose'"),
        (
            "StepLR",
            {"step_size": 3, "optimizer": None},
            r"no argument 'optimizer'; from_torch takes the optimizer's lr",
        ),
        ("StepLR", {"gamma": 0.5}, r"from_torch\(StepLR\): missing argument step_size; StepLR takes step_size, "),
        ("StepLR", {"step_size": 3, "last_epoch": 5}, r"from_torch\(StepLR\): last_epoch must be -1 \(a sequence "),
        ("StepLR", {"step_size": 0}, r"from_torch\(StepLR\): step_size must be an int > 0, got 0$"),
        ("StepLR", {"step_size": 2.5}, r"step_size must be an int > 0, got 2.5 \(float\)"),
        ("ExponentialLR", {"gamma": 0.0}, r"from_torch\(ExponentialLR\): gamma must be a finite number > 0, got 0.0"),
        ("MultiStepLR", {"milestones": [0, 5]}, r"milestones must be a list of positive ints, in any order.*\[0, 5\]"),
        ("MultiStepLR", {"milestones": 5}, r"milestones must be a list of positive ints.*got 5 \(int\)"),
        ("CosineAnnealingLR", {"T_max": 0}, r"from_torch\(CosineAnnealingLR\): T_max must be an int > 0, got 0"),
        ("CosineAnnealingWarmRestarts", {"T_0": 5, "T_mult": 0}, r"T_mult must be an int >= 1, got 0"),
        ("LinearLR", {"start_factor": 0}, r"from_torch\(LinearLR\): start_factor must be a finite number > 0 and "),
        ("LinearLR", {"end_factor": 1.5}, r"end_factor must be a finite number >= 0 and <= 1, got 1.5"),
        ("LinearLR", {"total_iters": 0}, r"total_iters must be an int > 0, got 0"),
        ("ConstantLR", {"factor": 0.0}, r"factor must be a finite number > 0 and <= 1 \(torch divides by factor"),
        ("PolynomialLR", {"power": -1.0}, r"power must be a finite number >= 0, got -1.0"),
        (
            "CyclicLR",
            {"base_lr": 0.01, "max_lr": 0.1, "mode": "exp_range"},
            r"from_torch\(CyclicLR\): mode must be 'triangular' \(.*exp_range scale each cycle down\), got 'exp_range'",
        ),
        ("CyclicLR", {"base_lr": 0.01, "max_lr": 0.1, "mode": "triangular2"}, r"got 'triangular2'"),
        ("CyclicLR", {"base_lr": 0.01, "max_lr": 0.1, "scale_fn": abs}, r"scale_fn must be None \(a custom scale_fn"),
        ("CyclicLR", {"base_lr": [0.01], "max_lr": 0.1}, r"base_lr must be a number, got \[0.01\]: torch's per-group"),
        ("CyclicLR", {"base_lr": 0.01, "max_lr": 0.1, "step_size_up": 2.5}, r"step_size_up must be an int > 0"),
        ("CyclicLR", {"base_lr": 0.01, "max_lr": 0.1, "cycle_momentum": 1}, r"cycle_momentum must be True or False"),
        ("OneCycleLR", {"max_lr": 0.1}, r"from_torch\(OneCycleLR\): give total_steps, or both epochs and steps_per"),
        ("OneCycleLR", {"max_lr": 0.1, "epochs": 3}, r"got total_steps=None, epochs=3, steps_per_epoch=None"),
        ("OneCycleLR", {"max_lr": 0.1, "total_steps": 100, "pct_start": 1.0}, r"pct_start must be a finite number > 0"),
        ("OneCycleLR", {"max_lr": 0.1, "total_steps": 100, "anneal_strategy": "exp"}, r"'cos' or 'linear', got 'exp'"),
        ("OneCycleLR", {"max_lr": 0.1, "total_steps": 10, "pct_start": 0.1}, r"OneCycle: .*phase of zero length"),
        ("SequentialLR", {"schedulers": [], "milestones": []}, r"schedulers must be a non-empty list of \(scheduler,"),
        ("SequentialLR", {"schedulers": [WARMUP, "StepLR"], "milestones": [5]}, r"schedulers\[1\] must be one of"),
        (
            "SequentialLR",
            {"schedulers": [WARMUP, ("ExponentialLR", {"gamma": 0.9})], "milestones": [5, 10]},
            r"milestones must have one entry fewer than schedulers \(1\), got \[5, 10\] for 2 schedulers",
        ),
        (
            "SequentialLR",
            {"schedulers": [WARMUP, WARMUP, WARMUP], "milestones": [10, 5]},
            r"from_torch\(SequentialLR\): milestones must be a list of strictly increasing positive ints",
        ),
        (
            "SequentialLR",
            {"schedulers": [WARMUP, ("CosineAnnealingLR", {"T_mx": 10})], "milestones": [5]},
            r"from_torch\(SequentialLR\): schedulers\[1\] \(CosineAnnealingLR\): CosineAnnealingLR has no argument "
            r"'T_mx' \(did you mean 'T_max'\?\)",
        ),
        (
            "SequentialLR",
            {"schedulers": [WARMUP, ("ExponentialLR", {"gamma": 0.9, "lr": 0.5})], "milestones": [5]},
            r"schedulers\[1\]: ExponentialLR has no argument 'lr': the optimizer's lr is given once",
        ),
        (
            "SequentialLR",
            {"schedulers": [WARMUP, ("OneCycleLR", {"max_lr": 1.0, "total_steps": 10})], "milestones": [5]},
            r"schedulers\[1\]: OneCycleLR is not supported inside SequentialLR: OneCycleLR overwrites",
        ),
        (
            "SequentialLR",
            {"schedulers": [("CyclicLR", {"base_lr": 0.01, "max_lr": 0.1}), WARMUP], "milestones": [5]},
            r"schedulers\[0\]: CyclicLR is not supported inside SequentialLR",
        ),
        (
            "SequentialLR",
            {"schedulers": [WARMUP, ("SequentialLR", {"schedulers": [WARMUP], "milestones": []})], "milestones": [5]},
            r"SequentialLR is not supported inside SequentialLR: torch cannot nest",
        ),
        (
            "SequentialLR",
            {"schedulers": [WARMUP, ("LambdaLR", {})], "milestones": [5]},
            r"from_torch\(SequentialLR\): schedulers\[1\] LambdaLR is not supported",
        ),
    ],
)
def test_refused_arguments_name_the_scheduler_argument_value_and_what_is_allowed(scheduler, arguments, match) -> None:
    with pytest.raises(ValueError, match=match):
        from_torch(scheduler, 0.1, **arguments)


def test_a_negative_or_listed_lr_is_refused() -> None:
    with pytest.raises(ValueError, match=r"from_torch\(StepLR\): lr must be a finite number >= 0, got -0.1"):
        from_torch("StepLR", -0.1, step_size=3)
    with pytest.raises(ValueError, match=r"from_torch\(StepLR\): lr must be a number, got \[0.1, 0.2\]"):
        from_torch("StepLR", [0.1, 0.2], step_size=3)


def test_a_built_scheduler_is_refused_with_a_hint() -> None:
    torch = pytest.importorskip("torch")
    optimizer = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    built = torch.optim.lr_scheduler.StepLR(optimizer, step_size=3)
    with pytest.raises(ValueError, match=r"pass the class \(StepLR\) and its arguments, not a scheduler built on"):
        from_torch(built, 0.1, step_size=3)


def test_a_class_is_recognised_by_its_name_without_torch() -> None:
    class StepLR:  # what from_torch sees of torch's class: its __name__
        pass

    assert from_torch(StepLR, 0.1, step_size=3) == Step(0.1, 3, 0.1)


# --------------------------------------------------------------------------
# Tune search-space domains
# --------------------------------------------------------------------------

GRID = {"grid_search": [0.01, 0.1]}
TWO = [("StepLR", {"step_size": 2}), ("ExponentialLR", {"gamma": 0.9})]


@pytest.mark.parametrize(
    "scheduler, lr, arguments, match",
    [
        (
            "LinearLR",
            GRID,
            {},
            r"from_torch\(LinearLR\): lr cannot be a Tune search-space domain here, got "
            r"\{'grid_search': \[0.01, 0.1\]\}: LinearLR's values are lr times start_factor",
        ),
        ("LinearLR", 0.1, {"start_factor": GRID}, r"start_factor cannot be a Tune search-space domain"),
        ("ConstantLR", 0.1, {"factor": GRID}, r"factor cannot be .*ConstantLR's values are lr times factor"),
        ("CosineAnnealingLR", 0.1, {"T_max": {"grid_search": [10, 20]}}, r"T_max cannot be .* uses it twice"),
        ("CosineAnnealingLR", 0.1, {"T_max": 10, "eta_min": GRID}, r"eta_min cannot be .*CosineAnnealingWarmRestarts"),
        ("OneCycleLR", GRID, {"max_lr": 1.0, "total_steps": 10}, r"lr cannot be .*OneCycleLR ignores the optimizer's"),
        ("OneCycleLR", 0.1, {"max_lr": 1.0, "epochs": GRID, "steps_per_epoch": 5}, r"epochs cannot be .*computed"),
        (
            "OneCycleLR",
            0.1,
            {"max_lr": 1.0, "total_steps": 10, "cycle_momentum": {"grid_search": [True, False]}},
            r"cycle_momentum cannot be .*it schedules the momentum, not the learning rate, so a domain would search",
        ),
        ("CyclicLR", GRID, {"base_lr": 0.01, "max_lr": 0.1}, r"lr cannot be .*CyclicLR ignores the optimizer's lr"),
        (
            "CyclicLR",
            0.1,
            {"base_lr": 0.01, "max_lr": 0.1, "mode": {"grid_search": ["triangular", "exp_range"]}},
            r"mode cannot be a Tune search-space domain",
        ),
        ("MultiStepLR", GRID, {"milestones": [5, 5]}, r"lr cannot be .*milestones repeat \[5\]"),
        (
            "SequentialLR",
            GRID,
            {"schedulers": TWO, "milestones": [5]},
            r"from_torch\(SequentialLR\): lr cannot be .*each of the 2 schedulers",
        ),
    ],
)
def test_a_domain_where_it_would_be_computed_with_or_drawn_twice_is_refused(scheduler, lr, arguments, match) -> None:
    with pytest.raises(ValueError, match=match):
        from_torch(scheduler, lr, **arguments)
    with pytest.raises(ValueError, match=r"give a plain value, or search whole schedules: tune.choice\(\[from_torch"):
        from_torch(scheduler, lr, **arguments)


def test_a_ray_domain_is_shown_by_its_type_and_range() -> None:
    tune = pytest.importorskip("ray.tune")
    with pytest.raises(ValueError, match=r"lr cannot be .*, got a Tune domain Float \(0.001, 0.1\): LinearLR's"):
        from_torch("LinearLR", tune.loguniform(1e-3, 1e-1))


def test_domains_give_unresolved_sequences_that_tune_resolves() -> None:
    """A domain passed where its value is used as is leaves the sequence
    unresolved; Tune's variant generator draws it and from_json rebuilds
    the sequence, whose values are torch's for the drawn arguments."""
    tune = pytest.importorskip("ray.tune")
    from ray.tune.search.variant_generator import generate_variants

    lr = tune.loguniform(1e-3, 1e-1)
    multi_step = from_torch("MultiStepLR", lr=lr, milestones=[8, 12], gamma=0.1)
    assert not multi_step.is_resolved
    with pytest.raises(ValueError, match=r"MultiStep: cannot compute values: parameter\(s\) init are unresolved"):
        multi_step.value(0)
    assert multi_step.to_spec()["init"] is lr

    param_space = {
        "multi_step": multi_step.to_spec(),
        "step": from_torch("StepLR", 0.1, step_size=tune.grid_search([5, 10]), gamma=tune.uniform(0.1, 0.9)).to_spec(),
        "one_cycle": from_torch("OneCycleLR", 0.1, max_lr=tune.choice([0.5, 1.0]), total_steps=60).to_spec(),
        "cosine": from_torch("CosineAnnealingLR", tune.uniform(0.05, 0.2), T_max=30, eta_min=1e-3).to_spec(),
        "sequential": from_torch(
            "SequentialLR",
            0.1,
            schedulers=[("ConstantLR", {"factor": 0.5}), ("ExponentialLR", {"gamma": tune.uniform(0.8, 0.99)})],
            milestones=[tune.randint(5, 20)],
        ).to_spec(),
    }
    configs = [config for _, config in generate_variants(param_space)]
    assert len(configs) == 2  # the grid over step_size
    for config in configs:
        drawn = {key: from_json(spec) for key, spec in config.items()}
        assert all(seq.is_resolved for seq in drawn.values())
        step, multi, one_cycle, cosine, sequential = (
            drawn[key] for key in ("step", "multi_step", "one_cycle", "cosine", "sequential")
        )
        assert 1e-3 <= multi.init <= 1e-1
        exp_part, at = sequential.parts[1], sequential.milestones[0]
        cosine_lr = cosine.parts[0].init
        expected: list[tuple[Sequence, str, dict[str, Any], float, int]] = [
            (step, "StepLR", {"step_size": step.step_size, "gamma": step.gamma}, 0.1, 60),
            (multi, "MultiStepLR", {"milestones": [8, 12], "gamma": 0.1}, multi.init, 60),
            (one_cycle, "OneCycleLR", {"max_lr": one_cycle.max_value, "total_steps": 60}, 0.1, 60),
            (cosine, "CosineAnnealingLR", {"T_max": 30, "eta_min": 1e-3}, cosine_lr, 31),
            (
                sequential,
                "SequentialLR",
                {
                    "schedulers": [("ConstantLR", {"factor": 0.5}), ("ExponentialLR", {"gamma": exp_part.gamma})],
                    "milestones": [at],
                },
                0.1,
                60,
            ),
        ]
        for seq, name, arguments, base, n in expected:
            assert [seq.value(i) for i in range(n)] == pytest.approx(torch_lrs(name, arguments, base, n), rel=1e-9)
    assert {from_json(config["step"]).step_size for config in configs} == {5, 10}
