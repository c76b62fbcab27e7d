"""The shared argument checks name the argument and the value."""

import math

import pytest

from pyro_multihop.checks import check_number, check_positive_int, check_sigma2


def test_check_number_bounds():
    assert check_number("x", 0) == 0.0
    assert check_number("x", -2.5, lower=-math.inf, strict=True) == -2.5
    with pytest.raises(ValueError, match=r"x must be a finite number > 0, got 0"):
        check_number("x", 0, strict=True)
    with pytest.raises(ValueError, match=r"x must be a finite number >= 1, got 0.5"):
        check_number("x", 0.5, lower=1.0)
    with pytest.raises(ValueError, match="x must be a finite number >= 0, got nan"):
        check_number("x", float("nan"))


@pytest.mark.parametrize("value", [True, "big", None])
def test_check_number_rejects_non_numbers(value):
    with pytest.raises(TypeError, match=f"y must be a finite number, got {value!r}"):
        check_number("y", value)


def test_positive_int_and_sigma2():
    assert check_positive_int("n", 3) == 3 and check_sigma2(0.5) == 0.5
    with pytest.raises(ValueError, match="n must be a positive integer, got True"):
        check_positive_int("n", True)
    with pytest.raises(ValueError, match="sigma2 must be a positive finite number, got -1"):
        check_sigma2(-1)
