"""Argument checks shared by the models, guides and estimators: errors name the argument and its value."""

from __future__ import annotations

import math

__all__ = ["check_positive_int", "check_sigma2", "check_number"]


def check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_sigma2(sigma2) -> float:
    try:
        value = float(sigma2)
    except (TypeError, ValueError):
        raise TypeError(f"sigma2 must be a positive finite number, got {sigma2!r}") from None
    if not math.isfinite(value) or value <= 0:
        raise ValueError(f"sigma2 must be a positive finite number, got {sigma2!r}")
    return value


def check_number(name: str, value, lower: float = 0.0, strict: bool = False) -> float:
    """``value`` as a float: ``TypeError`` unless it is a number (bools are not), ``ValueError`` unless it is
    finite and ``>= lower`` (``> lower`` with ``strict``)."""
    if isinstance(value, bool):
        raise TypeError(f"{name} must be a finite number, got {value!r}")
    try:
        number = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{name} must be a finite number, got {value!r}") from None
    if not math.isfinite(number) or number < lower or (strict and number == lower):
        raise ValueError(f"{name} must be a finite number {'>' if strict else '>='} {lower:g}, got {value!r}")
    return number
