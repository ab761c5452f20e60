"""The declared argument checks every public constructor uses (Ray-free)."""

import math

import numpy as np
import pytest

from ray_stagetree.validation import (
    BOOL,
    CALLABLE,
    InstanceOf,
    Int,
    InvalidArgumentError,
    Options,
    Real,
    check,
    duration,
)


@pytest.mark.parametrize("value", [1, 7, np.int64(3), 2**70])
def test_an_int_in_range_passes_through(value):
    assert check("workers", value, Int(low=1)) is value


@pytest.mark.parametrize(
    ("value", "error", "message"),
    [
        (0, ValueError, "workers must be an int >= 1, got 0$"),
        (True, TypeError, r"workers must be an int >= 1, got True \(bool\)"),
        (np.bool_(True), TypeError, r"got np.True_ \(bool\)"),
        (2.0, TypeError, r"workers must be an int >= 1, got 2.0 \(float\)"),
        ("3", TypeError, r"got '3' \(str\)"),
    ],
)
def test_an_int_argument_names_itself_what_is_allowed_and_the_value(value, error, message):
    with pytest.raises(error, match=message):
        check("workers", value, Int(low=1))


def test_the_error_is_both_value_and_type_error_so_either_convention_catches_it():
    with pytest.raises(InvalidArgumentError) as raised:
        check("repeats", -1, Int(low=1))
    assert isinstance(raised.value, ValueError) and isinstance(raised.value, TypeError)


@pytest.mark.parametrize("value", [math.nan, math.inf, -0.5])
def test_nan_and_infinity_are_never_in_a_finite_range(value):
    with pytest.raises(ValueError, match="must be a finite number >= 0"):
        check("amount", value, Real(low=0))


def test_open_bounds_and_infinity_where_allowed():
    fraction = Real(low=0, high=1, closed="neither")
    assert fraction.holds(0.5) and not fraction.holds(0) and not fraction.holds(1)
    assert check("budget", math.inf, Real(low=0, closed="neither", finite=False)) == math.inf
    with pytest.raises(ValueError, match="budget must be a number > 0, got 0"):
        check("budget", 0, Real(low=0, closed="neither", finite=False))
    with pytest.raises(ValueError, match="budget must be a number > 0, got nan"):
        check("budget", math.nan, Real(low=0, closed="neither", finite=False))


def test_none_and_alternatives_are_listed_with_what_values_mean():
    assert check("num_to_keep", None, None, Int(low=1)) is None
    with pytest.raises(ValueError, match=r"num_to_keep must be None or an int >= 1 \(None keeps all\), got 0"):
        check("num_to_keep", 0, None, Int(low=1), meaning=" (None keeps all)")


def test_options_compare_by_type_as_well_as_value():
    modes = Options(("min", "max"))
    assert check("mode", "min", modes) == "min"
    with pytest.raises(ValueError, match="mode must be 'min' or 'max', got 'minimum'$"):
        check("mode", "minimum", modes)
    with pytest.raises(TypeError, match=r"fail_fast must be True, False or 'raise', got 1 \(int\)"):
        check("fail_fast", 1, BOOL, Options(("raise",)))


def test_instances_and_callables():
    assert check("hook", len, None, CALLABLE) is len
    with pytest.raises(TypeError, match=r"hook must be None or a callable, got 3 \(int\)"):
        check("hook", 3, None, CALLABLE)
    with pytest.raises(TypeError, match=r"space must be a dict, got \[\] \(list\)"):
        check("space", [], InstanceOf(dict, "a dict"))


@pytest.mark.parametrize(
    ("seconds", "shown"),
    [
        (0.4, "0.4 s"),
        (42, "42 s"),
        (59.6, "1.0 min"),
        (130, "2.2 min"),
        (3599, "1.0 h"),
        (7384, "2.1 h"),
        (86400, "24.0 h"),
        (200000, "2.3 days"),
        (math.inf, "-"),
    ],
)
def test_a_duration_is_shown_in_the_unit_its_size_calls_for(seconds, shown):
    """Plan estimates and progress lines: never 0.0361 worker-hours for two minutes."""
    assert duration(seconds) == shown
