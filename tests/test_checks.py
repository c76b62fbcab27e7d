"""The shared argument checks name the argument and the value."""

import math

import pytest

from pyro_multihop.checks import check_number, check_positive_int, check_sigma2, renamed_keyword


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


def test_renamed_keyword_takes_the_new_or_the_old_keyword():
    """The new keyword's value, silently; the old one's, with a DeprecationWarning naming the new keyword and
    pointing at the caller of the function (stacklevel 3: helper, function, caller)."""

    def task(n_hops=None, *, hops=None):
        return renamed_keyword("task", "n_hops", n_hops, "hops", hops)

    assert task(3) == 3
    with pytest.warns(DeprecationWarning, match=r"task\(hops=...\) is deprecated; use task\(n_hops=...\)") as caught:
        assert task(hops=4) == 4
    assert caught[0].filename == __file__
    with pytest.raises(TypeError, match="task\\(\\) got both 'n_hops' and its old keyword 'hops'"), pytest.warns(DeprecationWarning):
        task(3, hops=4)
    with pytest.raises(TypeError, match="task\\(\\) missing required argument: 'n_hops'"):
        task()


def test_renamed_keyword_with_a_default():
    """With a default, the new keyword left at it counts as not given (the old one's value is taken)."""

    def task(n_hops=2, *, hops=None):
        return renamed_keyword("task", "n_hops", n_hops, "hops", hops, default=2)

    assert task() == 2 and task(5) == 5
    with pytest.warns(DeprecationWarning, match="use task"):
        assert task(hops=3) == 3
    with pytest.raises(TypeError, match="got both"), pytest.warns(DeprecationWarning):
        task(5, hops=3)
