"""Tensor primitives of the attention gate, shared by both heads, their Pyro models and the hop chain.

Every gate in this library is a gather from a small ``(S, S)`` score table followed by a normalisation
over the ``N`` context positions. Under enumeration the gathered tensor is ``(N, n, N)``, so these two
steps are most of the work of a loss; they live here so that the enumerated Pyro model and the fused
forward recursion (:mod:`pyro_multihop.engine.log_space`) use the same implementation.
``benchmarks/chained_loss.py`` times both (benchmarks/results/chained_loss.md).
"""

from __future__ import annotations

from typing import Optional

import torch

__all__ = ["table_gather", "flat_gather", "flat_index", "small_flat_index", "log_normalize", "SHORT_ROW", "exp",
           "logsumexp", "LOG2_E"]

# Rows shorter than this are normalised as ``x - logsumexp(x)``: torch's CPU ``log_softmax`` kernel
# vectorises across a row: on rows shorter than a vector (16 float32 lanes) it is slower, forward plus backward,
# than the two-kernel form, and from 16 entries on faster.
SHORT_ROW = 16


def log_normalize(logits: torch.Tensor) -> torch.Tensor:
    """``log_softmax`` over the last dim, by whichever of two exact forms is faster for the row length.

    :param logits: ``(..., N)`` finite logits (padding at :data:`~pyro_multihop.engine.log_space.MASKED_LOGIT`).
    :returns: ``(..., N)`` normalised log-probabilities.
    """
    if logits.shape[-1] < SHORT_ROW:
        return logits - logits.logsumexp(-1, keepdim=True)
    return logits.log_softmax(-1)


#: ``log2(e)``, to write ``exp(x)`` as ``exp2(x log2(e))``.
LOG2_E = 1.4426950408889634


def exp(x: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
    """``exp(x)`` as ``exp2(x log2(e))``, for log-probabilities and shifted logits (``x <= 0``), differentiable.

    torch's CPU ``exp`` takes a slow path where its result underflows (float32 inputs below about -87), many
    times slower than in range, and sharp gates (small ``sigma2``) and padding
    (:data:`~pyro_multihop.engine.log_space.MASKED_LOGIT`) make most entries of a factor such inputs; ``exp2``
    has no slow path (the sharp-gates section of docs/engine.md; benchmarks/results/engine_sharp.md times the
    queries of a sharp gate). The product adds one rounding: a relative error of at most ``|x| eps``, an
    absolute error below ``eps / e`` for ``x <= 0``.

    :param out: a tensor of ``x``'s shape to write into (not with autograd), or None for a fresh one.
    """
    if out is None:
        return torch.mul(x, LOG2_E).exp2_()
    return torch.mul(x, LOG2_E, out=out).exp2_()


def logsumexp(x: torch.Tensor, dim: int, keepdim: bool = False) -> torch.Tensor:
    """``torch.logsumexp(x, dim)`` through :func:`exp` (no slow path for far-below-maximum entries, which a sharp
    gate's reductions are full of: the sharp-gates section of docs/engine.md), differentiable; a slice of ``-inf``
    gives ``-inf``."""
    shift = x.detach().amax(dim, keepdim=True)
    shift = torch.where(torch.isfinite(shift), shift, torch.zeros_like(shift))
    total = torch.sub(x, shift).mul_(LOG2_E).exp2_().sum(dim, keepdim=True).log_().add_(shift)
    return total if keepdim else total.squeeze(dim)


def _flat_index(rows: torch.Tensor, cols: torch.Tensor, num_cols: int) -> torch.Tensor:
    return rows * num_cols + cols


def flat_index(rows: torch.Tensor, cols: torch.Tensor, num_cols: int) -> torch.Tensor:
    """``rows * num_cols + cols`` (broadcast): the index of ``table[rows, cols]`` in ``table.reshape(-1)``, for
    :func:`flat_gather` from several tables of the same shape."""
    return _flat_index(rows, cols, num_cols)


def small_flat_index(rows: torch.Tensor, cols: torch.Tensor, num_cols: int, num_entries: int) -> torch.Tensor:
    """:func:`flat_index` into a table of ``num_entries`` entries, as int32 when they number fewer than ``2^31``
    (half the memory traffic of int64 for the index of a million-pair chunk), else int64."""
    dtype = torch.int32 if num_entries < 2**31 else torch.int64
    return rows.to(dtype) * num_cols + cols.to(dtype)


class _TableGather(torch.autograd.Function):
    """``table[rows, cols]`` as a ``take`` of flat indices, with a ``scatter_add`` backward.

    For the ``(N, n, N)`` gathers of an enumerated gate, advanced indexing is slower than these forward, and its
    backward (an accumulating ``index_put``) slower still (``benchmarks/chained_loss.py`` times the enumerated
    loss that uses them, benchmarks/results/chained_loss.md). The flat indices are
    rebuilt in the backward rather than stored, so the forward keeps no index tensor alive.
    """

    @staticmethod
    def forward(ctx, table, rows, cols):
        ctx.save_for_backward(rows, cols)
        ctx.table_shape = table.shape
        return table.reshape(-1).take(_flat_index(rows, cols, table.shape[1]))

    @staticmethod
    def backward(ctx, grad):
        rows, cols = ctx.saved_tensors
        num_rows, num_cols = ctx.table_shape
        flat = _flat_index(rows, cols, num_cols).expand(grad.shape).reshape(-1)
        grad_table = grad.new_zeros(num_rows * num_cols).scatter_add_(0, flat, grad.reshape(-1))
        return grad_table.view(num_rows, num_cols), None, None


def table_gather(table: torch.Tensor, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
    """``table[rows, cols]`` (``rows`` and ``cols`` broadcast), differentiable in ``table``.

    :param table: ``(R, C)`` floating-point table. :param rows: LongTensor of row indices in ``[0, R)``.
    :param cols: LongTensor of column indices in ``[0, C)``, broadcastable with ``rows``.
    :returns: the broadcast shape of ``rows`` and ``cols``.
    """
    if not table.requires_grad or not torch.is_grad_enabled():
        return table.reshape(-1).take(_flat_index(rows, cols, table.shape[1]))
    return _TableGather.apply(table, rows, cols)


def _take(flat: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    # index_select rather than take: faster on one CPU thread for millions of entries from a table of a million;
    # it also takes an int32 index (half the index traffic).
    return flat.index_select(0, index.reshape(-1)).view(index.shape)


class _FlatGather(torch.autograd.Function):
    """``table.reshape(-1)[index]`` with a ``scatter_add`` (``index_add_`` for an int32 index) backward that
    reuses the given index."""

    @staticmethod
    def forward(ctx, table, index):
        ctx.save_for_backward(index)
        ctx.table_shape = table.shape
        return _take(table.reshape(-1), index)

    @staticmethod
    def backward(ctx, grad):
        (index,) = ctx.saved_tensors
        grad_table = grad.new_zeros(ctx.table_shape.numel())
        if index.dtype == torch.int32:
            grad_table.index_add_(0, index.reshape(-1), grad.reshape(-1))
        else:
            grad_table.scatter_add_(0, index.reshape(-1), grad.reshape(-1))
        return grad_table.view(ctx.table_shape), None


def flat_gather(table: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``table.reshape(-1)[index]`` for a precomputed :func:`flat_index`, differentiable in ``table``: when one
    index serves several tables (the hops of a dense chunk), it is built once, not once per gather and again
    in every backward."""
    if not table.requires_grad or not torch.is_grad_enabled():
        return _take(table.reshape(-1), index)
    return _FlatGather.apply(table, index)
