"""The memory budget of one chunk, and the chunking of a query's rows under it.

The budget is a :class:`contextvars.ContextVar`: :func:`set_memory_budget` changes it for the current
context (thread or task), :func:`memory_budget` for a block, and every query also takes ``budget=``.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Iterator, Optional

import torch

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "get_memory_budget",
    "set_memory_budget",
    "memory_budget",
    "resolve_budget",
    "rows_within_budget",
    "row_slices",
    "device_chunk",
]

#: Default working-memory budget of one chunk, in bytes (256 MiB).
DEFAULT_MEMORY_BUDGET = 256 * 2**20
_BUDGET = contextvars.ContextVar("pyro_multihop_memory_budget", default=DEFAULT_MEMORY_BUDGET)


def _check_budget(budget) -> int:
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise TypeError(f"budget must be a positive number of bytes, got {budget!r}")
    if not math.isfinite(budget) or budget <= 0:
        raise ValueError(f"budget must be a positive number of bytes, got {budget!r}")
    return int(budget)


def get_memory_budget() -> int:
    """The default working-memory budget of one chunk in the current context, in bytes."""
    return _BUDGET.get()


def set_memory_budget(budget: int) -> None:
    """Set the default working-memory budget of one chunk in the current context, in bytes (positive)."""
    _BUDGET.set(_check_budget(budget))


@contextlib.contextmanager
def memory_budget(budget: int):
    """Context manager: the default budget is ``budget`` bytes inside the block."""
    token = _BUDGET.set(_check_budget(budget))
    try:
        yield
    finally:
        _BUDGET.reset(token)


def resolve_budget(budget: Optional[float]) -> int:
    """``budget`` checked, or the context's default when None."""
    return _BUDGET.get() if budget is None else _check_budget(budget)


def rows_within_budget(bytes_per_row: float, budget: Optional[float] = None) -> int:
    """How many rows of ``bytes_per_row`` working bytes fit in the budget (at least 1)."""
    return max(1, int(resolve_budget(budget) // bytes_per_row))


def row_slices(n: int, rows: int) -> Iterator[slice]:
    """Consecutive slices of at most ``rows`` rows covering ``range(n)``."""
    for start in range(0, n, rows):
        yield slice(start, min(n, start + rows))


def device_chunk(obs, rows, device: torch.device):
    """``obs[rows]`` on ``device`` (moved only when it is elsewhere)."""
    chunk = obs[rows]
    return chunk if chunk.device == device else chunk.to(device)
