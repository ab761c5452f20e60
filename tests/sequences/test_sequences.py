"""Tests for ray_stagetree.sequences: torch equivalence, composition, JSON, validation, Tune domains."""

from __future__ import annotations

import copy
import doctest
import importlib
import json
import math
import pickle
import tracemalloc
import warnings

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from ray_stagetree import sequences
from ray_stagetree.sequences import (
    FAMILIES,
    Concat,
    Constant,
    Cosine,
    CyclicLR,
    Exponential,
    InverseSqrt,
    Linear,
    MultiStep,
    OneCycle,
    Polynomial,
    Sequence,
    Step,
    Values,
    Warmup,
    as_sequence,
    from_json,
    is_sequence_spec,
)
from ray_stagetree.sequences.base import first_difference_unchecked, next_change

RTOL, ATOL = 1e-9, 1e-12


def assert_matches(seq: Sequence, expected: np.ndarray) -> None:
    """Both the vectorised and the scalar path reproduce ``expected``."""
    n = len(expected)
    np.testing.assert_allclose(seq.values(0, n), expected, rtol=RTOL, atol=ATOL)
    np.testing.assert_allclose([seq.value(i) for i in range(n)], expected, rtol=RTOL, atol=ATOL)


# --------------------------------------------------------------------------
# PyTorch equivalence
# --------------------------------------------------------------------------


def torch_lrs(make_scheduler, n: int, base_lr: float = 0.1) -> np.ndarray:
    """The lr a training loop sees in each of ``n`` iterations (read before each step)."""
    torch = pytest.importorskip("torch")
    param = torch.nn.Parameter(torch.zeros(1))
    optimizer = torch.optim.SGD([param], lr=base_lr)
    scheduler = make_scheduler(torch.optim.lr_scheduler, optimizer)
    lrs = []
    with warnings.catch_warnings():
        # SequentialLR steps its children with an explicit epoch (deprecated API).
        warnings.simplefilter("ignore")
        for _ in range(n):
            lrs.append(optimizer.param_groups[0]["lr"])
            optimizer.step()
            scheduler.step()
    return np.array(lrs)


TORCH_CASES = {
    "StepLR": (lambda S, o: S.StepLR(o, step_size=7, gamma=0.8), Step(0.1, 7, 0.8), 320),
    "MultiStepLR": (
        lambda S, o: S.MultiStepLR(o, milestones=[30, 80, 250], gamma=0.1),
        MultiStep(0.1, [30, 80, 250], 0.1),
        320,
    ),
    "ExponentialLR": (lambda S, o: S.ExponentialLR(o, gamma=0.98), Exponential(0.1, 0.98), 320),
    "CosineAnnealingWarmRestarts-Tmult1": (
        lambda S, o: S.CosineAnnealingWarmRestarts(o, T_0=20, T_mult=1, eta_min=1e-4),
        Cosine(0.1, 1e-4, 20),
        320,
    ),
    "CosineAnnealingWarmRestarts-Tmult2": (
        lambda S, o: S.CosineAnnealingWarmRestarts(o, T_0=10, T_mult=2, eta_min=1e-4),
        Cosine(0.1, 1e-4, 10, gamma=2),
        640,
    ),
    "CosineAnnealingLR-first-period": (
        lambda S, o: S.CosineAnnealingLR(o, T_max=310, eta_min=1e-3),
        Cosine(0.1, 1e-3, 310),
        310,
    ),
    "CyclicLR-symmetric": (
        lambda S, o: S.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=13, cycle_momentum=False),
        CyclicLR(0.01, 0.1, 13),
        320,
    ),
    "CyclicLR-asymmetric": (
        lambda S, o: S.CyclicLR(o, base_lr=0.01, max_lr=0.1, step_size_up=7, step_size_down=29, cycle_momentum=False),
        CyclicLR(0.01, 0.1, 7, 29),
        320,
    ),
    "LinearLR-up": (
        lambda S, o: S.LinearLR(o, start_factor=0.25, end_factor=1.0, total_iters=40),
        Linear(0.025, 0.1, 40),
        320,
    ),
    "LinearLR-down": (
        lambda S, o: S.LinearLR(o, start_factor=1.0, end_factor=0.1, total_iters=250),
        Linear(0.1, 0.01, 250),
        320,
    ),
    "PolynomialLR-linear": (
        lambda S, o: S.PolynomialLR(o, total_iters=200, power=1.0),
        Polynomial(0.1, 200),
        320,
    ),
    "PolynomialLR-square": (
        lambda S, o: S.PolynomialLR(o, total_iters=300, power=2.0),
        Polynomial(0.1, 300, power=2.0),
        320,
    ),
    "SequentialLR-warmup": (
        lambda S, o: S.SequentialLR(
            o,
            [S.LinearLR(o, start_factor=0.1, total_iters=10), S.ExponentialLR(o, gamma=0.97)],
            milestones=[10],
        ),
        Warmup(0.01, 10, Exponential(0.1, 0.97)),
        320,
    ),
    "SequentialLR-then": (
        lambda S, o: S.SequentialLR(
            o, [S.StepLR(o, step_size=20, gamma=0.5), S.ExponentialLR(o, gamma=0.99)], milestones=[90]
        ),
        Step(0.1, 20, 0.5).then(Exponential(0.1, 0.99), at=90),
        320,
    ),
}

for _strategy in ("cos", "linear"):
    for _three_phase in (False, True):
        TORCH_CASES[f"OneCycleLR-{_strategy}-{'3' if _three_phase else '2'}phase"] = (
            lambda S, o, a=_strategy, t=_three_phase: S.OneCycleLR(
                o, max_lr=0.5, total_steps=330, anneal_strategy=a, three_phase=t, cycle_momentum=False
            ),
            OneCycle(0.5, 330, anneal_strategy=_strategy, three_phase=_three_phase),
            330,
        )
TORCH_CASES["OneCycleLR-custom"] = (
    lambda S, o: S.OneCycleLR(
        o,
        max_lr=2.0,
        total_steps=301,
        pct_start=0.45,
        div_factor=7.0,
        final_div_factor=50.0,
        cycle_momentum=False,
    ),
    OneCycle(2.0, 301, pct_start=0.45, div_factor=7.0, final_div_factor=50.0),
    301,
)


@pytest.mark.parametrize("case", sorted(TORCH_CASES))
def test_matches_torch_scheduler(case: str) -> None:
    make_scheduler, seq, n = TORCH_CASES[case]
    assert_matches(seq, torch_lrs(make_scheduler, n))


def test_one_cycle_holds_final_value_after_total_steps() -> None:
    seq = OneCycle(0.5, 100)
    final = seq.value(99)
    assert final == pytest.approx(0.5 / 25.0 / 1e4)
    assert np.all(seq.values(99, 500) == final)


# --------------------------------------------------------------------------
# Values of the families and their compositions, by hand
# --------------------------------------------------------------------------


def test_warmup_then_multistep() -> None:
    seq = Warmup(0.0, 4, MultiStep(0.1, [10], 0.1))
    expected = [0.0, 0.025, 0.05, 0.075] + [0.1] * 10 + [0.01] * 3
    assert_matches(seq, np.array(expected))
    assert seq.value(4) == seq.func.value(0)


def test_warmup_then_exponential_and_cosine() -> None:
    exp = Warmup(0.02, 2, Exponential(0.1, 0.5))
    assert_matches(exp, np.array([0.02, 0.06, 0.1, 0.05, 0.025]))
    cos = Warmup(0.0, 2, Cosine(1.0, 0.0, 4))
    half = (1 + math.cos(math.pi / 4)) / 2
    assert_matches(cos, np.array([0.0, 0.5, 1.0, half, 0.5, 1 - half, 1.0]))


def test_warmup_with_plain_value_and_inverse_sqrt() -> None:
    assert Warmup(0.0, 2, 0.1) == Warmup(0.0, 2, Constant(0.1))
    assert_matches(Warmup(0.0, 2, 0.1), np.array([0.0, 0.05, 0.1, 0.1]))
    # fairseq inverse_sqrt: linear warm-up to peak over W updates, then peak * sqrt(W / i).
    peak, w = 5e-4, 4000
    seq = Warmup(0.0, w, InverseSqrt(peak, w))
    assert seq.value(w // 2) == pytest.approx(peak / 2)
    for i in (w, 2 * w, 10_000, 123_456):
        assert seq.value(i) == pytest.approx(peak * math.sqrt(w / i), rel=1e-12)


def test_warmup_values_before_the_warmup_ends() -> None:
    seq = Warmup(0.0, 10, Exponential(1.0, 0.5))
    np.testing.assert_allclose(seq.values(2, 5), [0.2, 0.3, 0.4])
    assert len(seq.values(3, 3)) == 0


def test_concat_and_then() -> None:
    seq = Constant(0.1).then(Exponential(0.01, 0.5), at=3).then(0.5, at=5)
    assert seq == Concat([0.1, Exponential(0.01, 0.5), 0.5], [3, 5])
    assert seq.parts == (Constant(0.1), Exponential(0.01, 0.5), Constant(0.5))
    assert_matches(seq, np.array([0.1, 0.1, 0.1, 0.01, 0.005, 0.5, 0.5]))
    np.testing.assert_allclose(seq.values(2, 6), [0.1, 0.01, 0.005, 0.5])


def test_then_flattens_and_truncates() -> None:
    a = Concat([1.0, 2.0, 3.0], [10, 20])
    # `then` cuts self at `at`: the third part never starts.
    assert a.then(9.0, at=15) == Concat([1.0, 2.0, 9.0], [10, 15])
    # A Concat on the right is flattened too, its milestones shifted by `at`.
    assert Constant(0.0).then(a, at=5) == Concat([0.0, 1.0, 2.0, 3.0], [5, 15, 25])


def test_values_holds_last_value() -> None:
    seq = Values([0.3, 0.2, 0.1])
    assert_matches(seq, np.array([0.3, 0.2, 0.1, 0.1, 0.1]))
    assert seq.values(100, 103).tolist() == [0.1, 0.1, 0.1]


def test_categorical_multistep() -> None:
    seq = MultiStep(values=("adam", "sgd"), milestones=[40])
    assert seq.value(39) == "adam" and seq.value(40) == "sgd"
    values = seq.values(38, 42)
    assert values.dtype == object and values.tolist() == ["adam", "adam", "sgd", "sgd"]


def test_batch_size_stays_int() -> None:
    seq = MultiStep(values=(128, 256), milestones=[70])
    assert type(seq.value(0)) is int and seq.value(69) == 128 and seq.value(70) == 256
    assert seq.values(0, 100).dtype == np.int64
    doubling = MultiStep(128, [10, 20], 2)
    assert [doubling.value(i) for i in (0, 10, 25)] == [128, 256, 512]
    assert type(doubling.value(25)) is int
    assert type(Constant(64).value(3)) is int and type(Values([32, 64]).value(9)) is int
    assert Concat([32, 64], [5]).values(0, 10).dtype == np.int64


def test_value_types_and_dtypes() -> None:
    assert type(Exponential(1, 0.5).value(0)) is float
    assert Constant(True).values(0, 3).dtype == np.bool_ and Constant(True).value(0) is True
    mixed = Concat([1, 0.5], [2])  # int and float mix as numbers do
    assert mixed.values(0, 4).dtype == np.float64 and type(mixed.value(0)) is float
    categorical = Values([1, "a", None])
    assert [categorical.value(i) for i in range(4)] == [1, "a", None, None]


def test_cosine_restart_boundaries_with_multiplier() -> None:
    seq = Cosine(1.0, 0.0, 3, gamma=2)
    restarts = [i for i in range(1, 100) if seq.value(i) == 1.0]
    assert restarts == [3, 9, 21, 45, 93]


# --------------------------------------------------------------------------
# first_difference
# --------------------------------------------------------------------------


def test_first_difference_equal_sequences() -> None:
    assert MultiStep(0.1, [100], 0.1).first_difference(MultiStep(0.1, [100], 0.1), stop=10**9) is None


def test_first_difference_milestones() -> None:
    a, b = MultiStep(0.1, [100], 0.1), MultiStep(0.1, [150], 0.1)
    assert a.first_difference(b, stop=200) == 100
    assert b.first_difference(a, stop=200) == 100
    assert a.first_difference(b, stop=100) is None
    assert a.first_difference(b, stop=200, start=150) is None
    assert a.first_difference(b, stop=200, start=120) == 120
    assert a.first_difference(b, stop=50, start=60) is None


def test_first_difference_different_families_equal_on_a_range() -> None:
    # Equal values on [0, 100), then the Step family decays.
    step = Step(0.1, 100, 0.5)
    assert step.first_difference(Constant(0.1), stop=100) is None
    assert step.first_difference(Constant(0.1), stop=5000) == 100
    assert Exponential(0.1, 1.0).first_difference(0.1, stop=10_000) is None
    assert Warmup(0.0, 10, 0.1).first_difference(Linear(0.0, 0.1, 10), stop=1000) is None


def test_first_difference_far_away_and_types() -> None:
    late = Constant(1.0).then(2.0, at=123_456)
    assert Constant(1.0).first_difference(late, stop=10**6) == 123_456
    assert Constant(0.1).first_difference("adam", stop=10) == 0
    assert (
        MultiStep(values=["adam", "sgd"], milestones=[5]).first_difference(Values(["adam"] * 5 + ["sgd"]), stop=50)
        is None
    )
    # A trainable can observe the type: 128 and 128.0 (or 1 and True) are not shared.
    assert Constant(128).first_difference(Constant(128.0), stop=10) == 0
    assert Constant(1).first_difference(Constant(True), stop=10) == 0
    assert Values([1, "a"]).first_difference(Values([1.0, "a"]), stop=10) == 0


@settings(max_examples=100, deadline=None)
@given(
    st.lists(st.integers(1, 300), max_size=4, unique=True),
    st.lists(st.integers(1, 300), max_size=4, unique=True),
    st.integers(0, 400),
    st.integers(0, 400),
)
def test_first_difference_matches_brute_force(ma, mb, start, stop) -> None:
    a = MultiStep(values=list(range(len(ma) + 1)), milestones=sorted(ma))
    b = MultiStep(values=list(range(len(mb) + 1)), milestones=sorted(mb))
    expected = next((i for i in range(start, stop) if a.value(i) != b.value(i)), None)
    assert a.first_difference(b, stop=stop, start=start) == expected


# --------------------------------------------------------------------------
# next_change: where a value handed over as plain changes, on any horizon
# --------------------------------------------------------------------------


def test_next_change_answers_a_huge_horizon_from_the_structure(monkeypatch) -> None:
    """A stage worker asks where a plain value changes over its whole batch,
    which may span stop={"training_iteration": 10**9}: a Constant, or a
    Concat of them (PBT's explored values), is answered without computing
    values (expanding the horizon held a study at 0 results, issue 30)."""
    explored = Constant(0.1).then(0.2, at=5).then(0.2, at=20).then(0.3, at=10**8)
    computed = []
    constant_range = Constant._range

    def counted(self, start, stop):
        computed.append(stop - start)
        return constant_range(self, start, stop)

    monkeypatch.setattr(Constant, "_range", counted)
    assert next_change(Constant(0.1), 0, 10**9) is None
    assert [next_change(explored, after, 10**9) for after in (0, 4, 5, 6, 10**8 - 1, 10**8)] == [
        5,
        5,
        10**8,
        10**8,
        10**8,
        None,
    ], "20 starts a part with the value before it: no change"
    assert next_change(explored, 0, 5) is None, "(after, stop) is open at both ends"
    assert sum(computed) < 10_000, "values computed (a value's cache is filled a few hundred at a time)"


def test_next_change_inside_parts_and_by_type() -> None:
    assert next_change(Step(1.0, 100_000, 0.5), 3, 10**6) == 100_000
    assert next_change(Constant(1.0).then(Step(1.0, 3, 0.5), at=10**7), 0, 10**9) == 10**7 + 3
    assert next_change(Exponential(1.0, 0.9), 5, 100) == 6
    assert next_change(Constant(1).then(True, at=7), 0, 10) == 7, "1 == True, but a trainable can observe the type"
    assert next_change(Values([1, 2, 3]), 5, 10**6) is None


@settings(max_examples=100, deadline=None)
@given(st.lists(st.integers(1, 300), max_size=4, unique=True), st.integers(0, 400), st.integers(0, 400))
def test_next_change_matches_brute_force(milestones, after, stop) -> None:
    seq = MultiStep(values=[k // 2 for k in range(len(milestones) + 1)], milestones=sorted(milestones))
    expected = next((i for i in range(after + 1, stop) if seq.value(i) != seq.value(i - 1)), None)
    assert next_change(seq, after, stop) == expected
    pieces = Concat([Constant(k // 2) for k in range(len(milestones) + 1)], sorted(milestones))
    assert next_change(pieces, after, stop) == expected


# --------------------------------------------------------------------------
# Vectorised and scalar paths agree
# --------------------------------------------------------------------------

finite = st.floats(-10, 10, allow_nan=False, allow_infinity=False)
positive = st.floats(1e-3, 2.0, allow_nan=False)
periods = st.integers(1, 50)
milestone_lists = st.lists(st.integers(1, 200), max_size=4, unique=True).map(sorted)

leaf_sequences = st.one_of(
    st.builds(Constant, finite),
    st.builds(Exponential, finite, positive),
    st.builds(Step, finite, periods, positive),
    milestone_lists.flatmap(
        lambda ms: (
            st.builds(MultiStep, finite, st.just(ms), positive)
            | st.builds(
                lambda values: MultiStep(values=values, milestones=ms),
                st.lists(st.integers(1, 512), min_size=len(ms) + 1, max_size=len(ms) + 1),
            )
        )
    ),
    st.builds(CyclicLR, finite, finite, periods, st.none() | periods),
    st.builds(Cosine, finite, finite, periods, st.integers(1, 3)),
    st.builds(Linear, finite, finite, periods),
    st.builds(Polynomial, finite, periods, st.floats(0, 3), finite),
    st.builds(InverseSqrt, finite, positive),
    st.builds(Values, st.lists(finite, min_size=1, max_size=5)),
    st.builds(OneCycle, positive, st.integers(10, 100), st.sampled_from([0.25, 0.3, 0.5])),
)
numeric_sequences = st.recursive(
    leaf_sequences,
    lambda inner: (
        st.builds(Warmup, finite, periods, inner)
        | st.tuples(inner, inner, st.integers(1, 100)).map(lambda t: t[0].then(t[1], at=t[2]))
    ),
    max_leaves=4,
)


@settings(max_examples=200, deadline=None)
@given(numeric_sequences, st.integers(0, 300), st.integers(0, 300))
def test_values_slices_and_value_agree(seq: Sequence, a: int, b: int) -> None:
    start, stop = min(a, b), max(a, b)
    full = seq.values(0, 301)
    np.testing.assert_array_equal(seq.values(start, stop), full[start:stop])
    assert seq.value(stop) == full[stop]


@settings(max_examples=200, deadline=None)
@given(numeric_sequences)
def test_json_round_trip_generated(seq: Sequence) -> None:
    text = json.dumps(seq.to_json())
    again = from_json(text)
    assert again == seq and hash(again) == hash(seq)
    np.testing.assert_array_equal(again.values(0, 100), seq.values(0, 100))


# --------------------------------------------------------------------------
# JSON, equality, repr
# --------------------------------------------------------------------------

ONE_OF_EACH = [
    Constant(0.1),
    Constant("adam"),
    Exponential(0.1, 0.9),
    Step(0.1, 30, 0.1),
    MultiStep(0.1, [100, 150], 0.1),
    MultiStep(values=[128, 256], milestones=[70]),
    CyclicLR(0.01, 0.1, 10),
    CyclicLR(0.01, 0.1, 10, 20),
    Cosine(0.1, 0.0, 10, 2),
    Warmup(0.0, 5, MultiStep(0.1, [100], 0.1)),
    Warmup(0.0, 5, 0.1),
    Linear(0.01, 0.1, 10),
    OneCycle(0.5, 100, three_phase=True, anneal_strategy="linear"),
    Polynomial(0.1, 100, 2.0, 0.001),
    InverseSqrt(0.1, 4000),
    Values([1, 2, 3]),
    Concat([0.1, Exponential(0.1, 0.9), Values(["a", "b"])], [10, 20]),
]


def test_every_family_has_a_round_trip_case() -> None:
    assert {seq.family for seq in ONE_OF_EACH} == set(FAMILIES)


@pytest.mark.parametrize("seq", ONE_OF_EACH, ids=repr)
def test_json_round_trip(seq: Sequence) -> None:
    data = seq.to_json()
    assert data["family"] == seq.family
    assert set(data) == {"family", *type(seq)._param_names}
    assert from_json(data) == seq
    assert from_json(json.loads(json.dumps(data))) == seq
    assert from_json(json.dumps(data)) == seq
    assert seq.to_spec() == data
    assert is_sequence_spec(data)
    assert pickle.loads(pickle.dumps(seq)) == seq and copy.deepcopy(seq) == seq
    np.testing.assert_array_equal(from_json(data).values(0, 50), seq.values(0, 50))


def test_nested_plain_values_serialise_as_constant() -> None:
    assert Warmup(0.0, 5, 0.1).to_json()["func"] == {"family": "Constant", "init": 0.1}
    assert Concat([0.1, 0.01], [5]).to_json()["parts"][1] == {"family": "Constant", "init": 0.01}


def test_equality_and_hash() -> None:
    assert Exponential(0.1, 0.9) == Exponential(0.1, 0.9)
    assert Exponential(0.1, 0.9) != Exponential(0.1, 0.8)
    assert Constant(1) != Constant(1.0) != Constant(True)
    assert len({Exponential(0.1, 0.9), Exponential(0.1, 0.9), Step(0.1, 1, 0.9)}) == 2
    assert Exponential(np.float64(0.1), 0.9) == Exponential(0.1, 0.9)
    assert Exponential(0.1, 0.9) != 0.1


def test_repr_is_readable() -> None:
    assert repr(Exponential(0.1, 0.9)) == "Exponential(init=0.1, gamma=0.9)"
    assert repr(Cosine(0.1, 0.0, 10)) == "Cosine(init=0.1, min_y=0.0, period=10)"
    assert repr(MultiStep(values=[128, 256], milestones=[70])) == "MultiStep(milestones=[70], values=[128, 256])"
    assert repr(Warmup(0.0, 5, 0.1)) == "Warmup(init=0.0, period=5, func=Constant(init=0.1))"
    for seq in ONE_OF_EACH:  # the repr is valid Python that rebuilds the sequence
        assert eval(repr(seq), vars(sequences)) == seq


def test_immutable() -> None:
    seq = Exponential(0.1, 0.9)
    with pytest.raises(AttributeError, match="immutable"):
        seq.gamma = 0.5
    with pytest.raises(TypeError):
        seq.params["gamma"] = 0.5
    assert seq.gamma == 0.9 and seq.params["init"] == 0.1


def test_as_sequence_and_is_sequence_spec() -> None:
    seq = Exponential(0.1, 0.9)
    assert as_sequence(seq) is seq
    assert as_sequence(0.1) == Constant(0.1) and as_sequence("adam") == Constant("adam")
    assert as_sequence(True) == Constant(True)
    assert as_sequence(seq.to_json()) == seq
    assert not is_sequence_spec({"family": "Nope"}) and not is_sequence_spec({"lr": 0.1})
    assert not is_sequence_spec(seq) and not is_sequence_spec({"family": ["unhashable"]})


def test_from_json_defaults_may_be_omitted() -> None:
    assert from_json({"family": "Cosine", "init": 0.1, "min_y": 0.0, "period": 10}) == Cosine(0.1, 0.0, 10)
    assert from_json({"family": "MultiStep", "values": [1, 2], "milestones": [3]}) == MultiStep(
        values=[1, 2], milestones=[3]
    )


# --------------------------------------------------------------------------
# Validation
# --------------------------------------------------------------------------


@pytest.mark.parametrize(
    "build, error, match",
    [
        (lambda: Cosine(0.1, 0.0, -5), ValueError, r"Cosine: period must be an int > 0, got -5"),
        (lambda: Step(0.1, 0, 0.1), ValueError, "step_size"),
        (lambda: Step(0.1, 2.5, 0.1), TypeError, "step_size"),
        (lambda: MultiStep(0.1, [150, 100], 0.1), ValueError, r"milestones.*strictly increasing.*\[150, 100\]"),
        (lambda: MultiStep(0.1, [100, 100], 0.1), ValueError, "milestones"),
        (lambda: MultiStep(0.1, [0, 100], 0.1), ValueError, "milestones"),
        (lambda: MultiStep(0.1, [1.5], 0.1), TypeError, "milestones"),
        (lambda: MultiStep(0.1, 100, 0.1), TypeError, "milestones"),
        (
            lambda: Exponential(0.1, float("nan")),
            ValueError,
            r"Exponential: gamma must be a finite number > 0, got nan",
        ),
        (lambda: Exponential(float("inf"), 0.9), ValueError, "init"),
        (lambda: Exponential(0.1, 0.0), ValueError, "gamma"),
        (lambda: Exponential(0.1, "0.9"), TypeError, r"gamma.*'0.9'.*str"),
        (lambda: Exponential(True, 0.9), TypeError, "init.*bool"),
        (lambda: Cosine(0.1, 0.0, True), TypeError, "period"),
        (lambda: Cosine(0.1, 0.0, 10, 1.5), TypeError, "gamma"),
        (lambda: Cosine(0.1, 0.0, 10, 0), ValueError, "gamma"),
        (lambda: Constant([0.1]), TypeError, "init"),
        (lambda: Constant(float("nan")), ValueError, "init"),
        (lambda: MultiStep(values=[1, 2, 3], milestones=[10]), ValueError, "values"),
        (lambda: MultiStep(0.1, [10]), ValueError, "gamma"),
        (lambda: MultiStep(0.1, [10], 0.1, values=[1, 2]), ValueError, "values"),
        (lambda: Values([]), ValueError, "values"),
        (lambda: Values([0.1, float("nan")]), ValueError, r"values\[1\]"),
        (lambda: Concat([0.1, 0.2], [10, 20]), ValueError, "parts"),
        (lambda: Concat([0.1, [0.2]], [10]), TypeError, r"parts\[1\]"),
        (lambda: CyclicLR(0.1, 1.0, 10, 0), ValueError, "period2"),
        (lambda: Warmup(0.0, 0, 0.1), ValueError, "period"),
        (lambda: Warmup(0.0, 5, "adam"), ValueError, "func"),
        (lambda: Linear(0.0, 1.0, 0), ValueError, "period"),
        (lambda: OneCycle(0.1, 100, pct_start=1.0), ValueError, "pct_start"),
        (lambda: OneCycle(0.1, 100, anneal_strategy="exp"), ValueError, "anneal_strategy"),
        (lambda: OneCycle(0.1, 100, div_factor=-1.0), ValueError, "div_factor"),
        (lambda: OneCycle(0.1, 100, three_phase="yes"), TypeError, "three_phase"),
        (lambda: OneCycle(0.1, 10, pct_start=0.1), ValueError, "pct_start"),  # zero-length phase
        (lambda: Polynomial(0.1, 100, power=-1.0), ValueError, "power"),
        (lambda: InverseSqrt(0.1, 0), ValueError, "timescale"),
        (lambda: Constant(0.1).then(0.2, at=0), ValueError, "at"),
    ],
)
def test_bad_parameters(build, error, match) -> None:
    with pytest.raises(error, match=match):
        build()


@pytest.mark.parametrize(
    "data, error, match",
    [
        ({"family": "Triangle", "init": 0.1}, ValueError, r"unknown family 'Triangle'.*Exponential"),
        ({"init": 0.1}, ValueError, "family"),
        ({"family": "Exponential", "init": 0.1}, ValueError, "missing.*gamma"),
        ({"family": "Exponential", "init": 0.1, "gamma": 0.9, "decay": 1}, ValueError, "decay"),
        ({"family": "Exponential", "init": 0.1, "gamma": "x"}, TypeError, "gamma"),
        (
            {"family": "Warmup", "init": 0.0, "period": 5, "func": {"family": "Step", "init": 0.1}},
            ValueError,
            "step_size",
        ),
        ("{not json", ValueError, "JSON"),
        ("[1, 2]", TypeError, "dict"),
    ],
)
def test_bad_json(data, error, match) -> None:
    with pytest.raises(error, match=match):
        from_json(data)


def test_bad_iterations() -> None:
    seq = Exponential(0.1, 0.9)
    with pytest.raises(ValueError, match="iteration"):
        seq.value(-1)
    with pytest.raises(TypeError, match="iteration"):
        seq.value(1.5)
    with pytest.raises(ValueError, match="stop"):
        seq.values(10, 5)
    with pytest.raises(ValueError, match="start"):
        seq.first_difference(seq, stop=10, start=-1)


# --------------------------------------------------------------------------
# Ray Tune search-space domains
# --------------------------------------------------------------------------


def test_unresolved_tune_domain() -> None:
    tune = pytest.importorskip("ray.tune")
    domain = tune.loguniform(1e-3, 1e-1)
    seq = Exponential(init=domain, gamma=0.9)
    assert not seq.is_resolved
    with pytest.raises(ValueError, match=r"Exponential.*init.*unresolved.*trial must be drawn first"):
        seq.value(0)
    with pytest.raises(ValueError, match="init"):
        seq.values(0, 10)
    with pytest.raises(ValueError, match="init"):
        seq.to_json()
    spec = seq.to_spec()
    assert spec["init"] is domain and spec["gamma"] == 0.9
    resolved = from_json({**spec, "init": 0.01})
    assert resolved.is_resolved and resolved == Exponential(0.01, 0.9)
    assert resolved.value(1) == pytest.approx(0.009)
    # Validation is only deferred: a bad resolved value is still rejected.
    with pytest.raises(ValueError, match="gamma"):
        from_json({**spec, "init": 0.01, "gamma": -1.0})
    hash(seq)


def test_unresolved_nested_and_compared() -> None:
    tune = pytest.importorskip("ray.tune")
    inner = Exponential(init=tune.uniform(0.01, 0.1), gamma=0.9)
    seq = Warmup(0.0, 5, inner)
    assert not seq.is_resolved
    with pytest.raises(ValueError, match=r"func\.init"):
        seq.value(0)
    # Even the very same unresolved sequence may be drawn differently per trial.
    with pytest.raises(ValueError, match="unresolved"):
        seq.first_difference(seq, stop=10)
    concat = Constant(0.1).then(inner, at=10)
    with pytest.raises(ValueError, match=r"parts\[1\]\.init"):
        concat.to_json()


def test_grid_search_dict_and_list_elements() -> None:
    seq = MultiStep(0.1, {"grid_search": [[100], [150]]}, 0.1)
    assert not seq.is_resolved
    assert seq.to_spec()["milestones"] == {"grid_search": [[100], [150]]}
    assert from_json({**seq.to_spec(), "milestones": [150]}) == MultiStep(0.1, [150], 0.1)
    tune = pytest.importorskip("ray.tune")
    bs = MultiStep(values=[128, tune.choice([256, 512])], milestones=[70])
    with pytest.raises(ValueError, match=r"values\[1\]"):
        bs.value(0)


def test_tune_resolves_specs() -> None:
    """Tune's own variant generator resolves a spec; from_json rebuilds it."""
    tune = pytest.importorskip("ray.tune")
    from ray.tune.search.variant_generator import generate_variants

    param_space = {
        "lr": Warmup(0.0, 5, Exponential(tune.loguniform(1e-3, 1e-1), 0.9)).to_spec(),
        "bs": MultiStep(values=[128, 256], milestones=tune.grid_search([[70], [100]])).to_spec(),
        "func": Warmup(0.0, 5, tune.choice([Cosine(0.1, 0.0, 10), Step(0.1, 10, 0.5)])).to_spec(),
    }
    configs = [config for _, config in generate_variants(param_space)]
    assert len(configs) == 2
    for config in configs:
        lr, bs, func = (from_json(config[key]) for key in ("lr", "bs", "func"))
        assert lr.is_resolved and 1e-3 <= lr.func.init <= 1e-1
        assert bs.milestones in ((70,), (100,))
        assert func.func in (Cosine(0.1, 0.0, 10), Step(0.1, 10, 0.5))


# --------------------------------------------------------------------------
# Module hygiene
# --------------------------------------------------------------------------


@pytest.mark.parametrize("module", ["__init__", "base", "piecewise", "decay", "cyclic", "torch_schedulers"])
def test_docstring_examples(module: str) -> None:
    target = sequences if module == "__init__" else importlib.import_module(f"ray_stagetree.sequences.{module}")
    # Examples use the whole family set, as users import it from the package.
    assert doctest.testmod(target, extraglobs=vars(sequences)).failed == 0


def test_a_duplicate_family_name_is_refused_with_both_classes_named() -> None:
    with pytest.raises(
        TypeError,
        match=r"family 'MultiStep' is already defined by ray_stagetree\.sequences\.piecewise\.MultiStep; .*MultiStep needs another class name",
    ):

        class MultiStep(Sequence):  # noqa: F811 - the clash is the point
            def __init__(self, init: float) -> None:
                self._setup(init=init)

            def _range(self, start: int, stop: int) -> np.ndarray:
                return np.full(stop - start, self.init)

    assert FAMILIES["MultiStep"].__module__ == "ray_stagetree.sequences.piecewise", "the registered family stays"


def test_abstract_bases_are_not_families_and_their_concrete_subclasses_are() -> None:
    class ScaledBase(Sequence):
        """A helper base that leaves `_range` to its subclasses."""

    assert "ScaledBase" not in FAMILIES

    class TwiceTheIterationForTest(ScaledBase):
        def __init__(self, scale: float = 2.0) -> None:
            self._setup(scale=scale)

        def _range(self, start: int, stop: int) -> np.ndarray:
            return self.scale * np.arange(start, stop, dtype=float)

    try:
        assert FAMILIES["TwiceTheIterationForTest"] is TwiceTheIterationForTest
        assert from_json({"family": "TwiceTheIterationForTest"}).value(3) == 6.0
    finally:
        del FAMILIES["TwiceTheIterationForTest"]  # other tests expect the library's families only


def test_every_family_is_exported_by_its_name_from_both_packages() -> None:
    import ray_stagetree
    import ray_stagetree.sequences as sequences

    for name, family in FAMILIES.items():
        assert getattr(sequences, name) is family and getattr(ray_stagetree, name) is family
        assert name in sequences.__all__ and name in ray_stagetree.__all__


def test_a_constant_holds_one_value_however_far_it_is_read():
    """Each trial of a random search holds Constants of its own: asked for
    values, planned against other sequences, a Constant keeps one value, not
    an array of it (2 KB each, 200 MB in a 100,000-trial study)."""
    constants = [Constant(i / 4) for i in range(2000)]
    other = MultiStep(0.5, [6], 0.1)
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        for constant in constants:
            assert constant.value(300) == constant.init and constant.values(2, 5).tolist() == [constant.init] * 3
            assert constant.observed(7) == Constant(constant.init).observed(9000)
            assert first_difference_unchecked(constant, other, 100) == (6 if constant.init == 0.5 else 0)
        per_constant = (tracemalloc.get_traced_memory()[0] - before) / len(constants)
    finally:
        tracemalloc.stop()
    assert per_constant < 1000, f"{per_constant:.0f} bytes held per Constant read"
