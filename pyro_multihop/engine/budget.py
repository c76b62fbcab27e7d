"""The memory budget of one chunk, the working memory of a row on each route, and the chunking of a query's
rows under the budget.

The budget is a :class:`contextvars.ContextVar`: :func:`set_memory_budget` changes it for the current
context (thread or task), :func:`memory_budget` for a block, and every query also takes ``budget=``.
:func:`rows_per_chunk` turns it into rows per chunk for a head's factors (:class:`~.hop_factors.HopFactors`) and a
route, :func:`row_slices` and :func:`device_chunk` cut the rows, and :func:`dense_chunks` yields the dense log
factors of a head's rows chunk by chunk.
"""

from __future__ import annotations

import contextlib
import contextvars
import math
from typing import Iterator, Optional

import torch

from .hop_factors import HopFactors

__all__ = [
    "DEFAULT_MEMORY_BUDGET",
    "get_memory_budget",
    "set_memory_budget",
    "memory_budget",
    "resolve_budget",
    "rows_within_budget",
    "bytes_per_row",
    "rows_per_chunk",
    "row_slices",
    "device_chunk",
    "dense_chunks",
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


def bytes_per_row(route: str, L: int, N: int, S: int, itemsize: int, extra: float = 0.0) -> float:
    """Working memory of one row of a chunk on ``route``, in bytes (a generous count of live tensors)."""
    if route == "symbols":  # set from the peaks in benchmarks/results/engine_memory.md, above an earlier count
        elements = (5 * L + 9) * N + (6 * L + 3) * S
    else:  # dense factors, their exponentials and the temporaries of a batched product or logsumexp
        elements = (2 * max(L - 1, 1) + 3) * N * N + (3 * L + 4) * N
    return (elements + extra) * itemsize + 8 * 4 * N  # int64 index tensors


def rows_per_chunk(factors: HopFactors, N: int, route: str, budget=None, extra: float = 0.0) -> int:
    """Rows of ``N`` positions per chunk of ``factors`` on ``route`` under the budget, with ``extra`` elements a row
    more."""
    itemsize = factors.itemsize
    extra = extra + (0.0 if factors.extra_elements is None else factors.extra_elements(N))
    return rows_within_budget(bytes_per_row(route, factors.n_hops, N, factors.num_symbols, itemsize, extra), budget)


def row_slices(n: int, rows: int) -> Iterator[slice]:
    """Consecutive slices of at most ``rows`` rows covering ``range(n)``."""
    for start in range(0, n, rows):
        yield slice(start, min(n, start + rows))


def device_chunk(obs, rows, device: torch.device):
    """``obs[rows]`` on ``device`` (moved only when it is elsewhere)."""
    chunk = obs[rows]
    return chunk if chunk.device == device else chunk.to(device)


def dense_chunks(factors: HopFactors, obs, budget, extra: float = 0.0):
    """``(rows, chunk, chain, log_emission)`` for the chunks of ``obs`` on the position route under the budget,
    without gradients: ``rows`` a slice of ``obs``, ``chunk`` its rows on the factors' device, ``chain`` their dense
    log factors (:class:`~.log_space.HopChain`) and ``log_emission`` ``(c, N)`` the target's log-probability at
    each position."""
    n, N = len(obs), obs.context_len
    device = factors.device
    with torch.no_grad():
        for part in row_slices(n, rows_per_chunk(factors, N, "positions", budget, extra)):
            chunk = device_chunk(obs, part, device)
            yield part, chunk, factors.dense_chain(chunk), factors.target_log_probs(chunk)
