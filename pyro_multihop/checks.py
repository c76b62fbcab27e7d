"""Argument checks shared by the models, guides, estimators and simulators: errors name the argument and its
value; an argument renamed in this release is still taken under its old keyword, with a warning."""

from __future__ import annotations

import math
import warnings

import torch

__all__ = ["check_positive_int", "check_sigma2", "check_number", "check_symbol_mask", "renamed_keyword"]


def check_positive_int(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def check_symbol_mask(name: str, value, num_symbols: int):
    """``value`` as a ``(S,)`` bool tensor (a copy), ``TypeError``/``ValueError`` naming ``name`` otherwise."""
    mask = torch.as_tensor(value)
    if mask.dtype != torch.bool:
        raise TypeError(f"{name} must hold booleans, got dtype {mask.dtype}")
    if tuple(mask.shape) != (num_symbols,):
        raise ValueError(f"{name} must have shape (S,) = ({num_symbols},), got {tuple(mask.shape)}")
    return mask.clone()


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


def renamed_keyword(function: str, new: str, value, old: str, old_value, default=None):
    """The argument ``new`` of ``function``: ``value``, or ``old_value`` when the caller used the argument's old
    keyword ``old`` instead (kept for one release: it warns, a :class:`DeprecationWarning` naming ``new``).

    None stands for "not given": ``old_value`` None, the old keyword was not used; ``value`` None or equal to
    ``default``, ``new`` was left at its default (``default`` None: ``new`` is required). ``TypeError``, as for
    any bad call, when both are given or a required one is missing.
    """
    if old_value is None:
        if value is None:
            raise TypeError(f"{function}() missing required argument: {new!r}")
        return value
    warnings.warn(f"{function}({old}=...) is deprecated; use {function}({new}=...)", DeprecationWarning,
                  stacklevel=3)
    if value is not None and (default is None or value != default):
        raise TypeError(f"{function}() got both {new!r} and its old keyword {old!r}")
    return old_value
