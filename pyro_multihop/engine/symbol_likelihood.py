"""The symbol route's likelihood with a gradient read off the forward-backward messages.

Through the symbol route, autograd differentiates every ``(c, S) x (S, S)`` product of the forward recursion and
of the normalisers ``R``: per transition, three products whose ``(S, S)`` results are written and then added.
The gradient of the total has a closed form in the forward messages ``alpha`` and the backward messages
``beta`` (the E-step's statistics): with ``P[i, j] = E[v_i, k_j] real_j / R[v_i]`` and
``R[v] = sum_j real_j E[v, k_j]``, for ``total = sum_ij alpha[i] P[i, j] beta[j]`` (any one transition)::

    d total / d E[v, k] = out[v] arriving[k] - out[v] back[v] key_counts[k]

    out[v]      = sum_{i: v_i = v} alpha[i] / R[v]          (the mass leaving through value v)
    arriving[k] = sum_{j: k_j = k} real_j beta[j]           (the backward mass arriving at key k)
    back[v]     = sum_j E[v, k_j] real_j beta[j] / R[v]     (the backward message at value v)
    key_counts[k] = sum_{j: k_j = k} real_j

so that over a chunk it is one ``(S, 2c) x (2c, S)`` product a transition, written once, and the first hop and
the emission get ``beta[0]`` and ``alpha[L - 1]``.

Two autograd functions apply it: :func:`symbol_route_total` to any score tables' transition weights (their own
backward then takes the gradient on to the parameters), and :func:`key_table_symbol_route_total` to a chained
head's key tables, forming the first hop and the weights inside, so that every hop's gradient is written once into
the key tables' gradient (16 MB of fresh ``(S, S)`` buffers less a loss at ``S = 1000``, ``L = 3``).

Shapes: ``c`` rows, ``N`` positions, ``S`` symbols, ``L`` hops.
"""

from __future__ import annotations

from typing import List

import torch

from .log_space import masked_log_softmax
from .recursion import forward_messages
from .score_tables import KeyTableScores, key_gradient_, transition_weights_by_key
from .transitions import SymbolTransitions

__all__ = ["symbol_route_total", "key_table_symbol_route_total", "takes_key_tables"]


class _SymbolRouteTotal(torch.autograd.Function):
    """``total (c,) = sum_i alpha_L[i] emission[i]`` and ``ok (c,)`` (not differentiable) from ``init (c, N)``,
    ``emission (c, N)`` and the transition weights ``E_l (S, S)``; see the module docstring for the backward."""

    @staticmethod
    def forward(ctx, factors, chunk, init, emission, *weights):
        with torch.no_grad():
            transitions = SymbolTransitions.build(factors, chunk, [w.detach() for w in weights])
            alphas = forward_messages(transitions, init.detach(), factors.n_hops)
            total = (alphas[-1] * emission.detach()).sum(-1)
        ctx.transitions, ctx.alphas = transitions, alphas
        ctx.save_for_backward(emission, *weights)
        ctx.mark_non_differentiable(transitions.ok)
        return total, transitions.ok

    @staticmethod
    def backward(ctx, grad_total, _grad_ok):
        emission, *weights = ctx.saved_tensors
        grad = _kept_rows(ctx.transitions, grad_total)
        grad_weights = [None] * len(weights)

        def write(hop, left, right):  # (S_k, S_v), viewed as (S_v, S_k): the layout the whole tables' backward reads
            grad_weights[hop] = (left @ right).transpose(0, 1)

        beta = _backward_products(ctx.transitions, ctx.alphas, emission, [w.detach() for w in weights], grad, write)
        return (None, None, beta * grad, ctx.alphas[-1] * grad, *grad_weights)


def _kept_rows(transitions, grad_total: torch.Tensor) -> torch.Tensor:
    """``(c, 1)``: the upstream gradient, 0 on rows that failed in probability space (the caller recomputes them
    in log space and discards this total)."""
    return torch.where(transitions.ok, grad_total, torch.zeros_like(grad_total)).unsqueeze(-1)


def _backward_products(transitions, alphas, emission, tables, grad, write) -> torch.Tensor:
    """The backward recursion of the module docstring: for each transition, from the last, ``write(hop, left
    (S_k, 2c), right (2c, S_v))``, whose product is ``d total / d E[v, k]`` in (key, value) layout; returns the
    first hop's backward message ``beta[0] (c, N)``."""
    values, real = transitions.values, transitions.real
    key_counts = transitions.arriving(real)  # real positions carrying each key
    beta = emission.detach() * real  # unscaled: every beta is at most 1 (a shifted emission, stochastic P)
    for hop in reversed(range(len(tables))):
        table, inverse = tables[hop], transitions.inverse_normalisers[hop]
        arriving = transitions.arriving(beta * real)  # (c, S)
        back = (arriving @ table.transpose(0, 1)) * inverse  # (c, S): at value v
        out = transitions.leaving(alphas[hop], hop) * grad  # (c, S)
        # The gradient is unchanged when beta moves by a constant a row (arriving by m key_counts, back by m,
        # P being stochastic); centred on its mean over the real positions, the two terms of each row's
        # difference are smaller, and so is the rounding of their cancelling sum (in float32 the gradient's error
        # against float64 is then below autograd's: tests/engine/test_symbol_likelihood.py checks it).
        centre = (beta * real).sum(-1, keepdim=True) / real.sum(-1, keepdim=True).clamp_min(1.0)
        # (S_k, S_v) = [arriving; -key_counts]^T [out; out * back]
        left = torch.cat([arriving - centre * key_counts, -key_counts]).transpose(0, 1)
        write(hop, left, torch.cat([out, out * (back - centre)]))
        beta = back.gather(1, values) * real
    return beta


class _KeyTableSymbolRouteTotal(torch.autograd.Function):
    """As :class:`_SymbolRouteTotal`, from the chained head's key tables ``K (L, S, S)`` themselves (a
    :class:`~.score_tables.KeyTableScores`): the first hop's logits ``(K[0, key_j, query] - ||K[0, key_j]||^2 / 2)
    / sigma2`` are gathered and the later hops' weights formed inside, so that the backward writes every hop's
    gradient into one ``(L, S, S)`` tensor. Separately, the whole first-hop table (formed only to gather ``c N``
    of its entries) and its dense gradient, and each later hop's ``(S, S)`` product and its copy into the key
    tables' gradient, are fresh ``(S, S)`` buffers of a loss: 16 MB of 44 MB at ``S = 1000``, ``L = 3``.

    Backward, in the key tables' (key, query) layout, with ``D_l = d total / d E_l * E_l`` for the later hops and
    ``g = d total / d logits`` of the first hop (a softmax over the positions)::

        dK[l, k, q] = (D_l[k, q] - K[l, k, q] sum_q' D_l[k, q']) / sigma2                         (l >= 1)
        dK[0, k, q] = (sum_{j: key_j = k, query = q} g_j - K[0, k, q] sum_{j: key_j = k} g_j) / sigma2
    """

    @staticmethod
    def forward(ctx, factors, chunk, key_tables, emission):
        sigma2 = factors.score_tables.sigma2
        with torch.no_grad():
            tables = key_tables.detach()
            weights = [transition_weights_by_key(table, sigma2) for table in tables[1:].unbind(0)]  # (S_k, S_q)
            half_norms = torch.linalg.vector_norm(tables[0], dim=-1).square_().mul_(0.5)  # (S,)
            S = tables.shape[-1]
            first_index = chunk.keys * S + chunk.query.unsqueeze(-1)  # (c, N) into K[0] viewed flat
            logits = (tables[0].reshape(-1)[first_index] - half_norms[chunk.keys]) / sigma2
            init = masked_log_softmax(logits, chunk.mask).exp()
            transitions = SymbolTransitions.build(factors, chunk, [w.transpose(0, 1) for w in weights])
            alphas = forward_messages(transitions, init, factors.n_hops)
            total = (alphas[-1] * emission.detach()).sum(-1)
        ctx.transitions, ctx.alphas, ctx.sigma2 = transitions, alphas, sigma2
        ctx.first_index, ctx.keys, ctx.init, ctx.weights = first_index, chunk.keys, init, weights
        ctx.save_for_backward(key_tables, emission)
        ctx.mark_non_differentiable(transitions.ok)
        return total, transitions.ok

    @staticmethod
    def backward(ctx, grad_total, _grad_ok):
        key_tables, emission = ctx.saved_tensors
        tables, sigma2, init, weights = key_tables.detach(), ctx.sigma2, ctx.init, ctx.weights
        grad = _kept_rows(ctx.transitions, grad_total)
        grad_tables = torch.empty_like(tables) if ctx.needs_input_grad[2] else None

        def write(hop, left, right):
            if grad_tables is None:
                return
            out = torch.mm(left, right, out=grad_tables[hop + 1]).mul_(weights[hop])  # D, in (key, query) layout
            key_gradient_(out, tables[hop + 1], sigma2)

        beta = _backward_products(ctx.transitions, ctx.alphas, emission, [w.transpose(0, 1) for w in weights],
                                  grad, write)
        if grad_tables is not None:
            upstream = beta * grad  # d total / d init
            first = init * (upstream - (init * upstream).sum(-1, keepdim=True))  # through the softmax (0 at padding)
            S = tables.shape[-1]
            first = first / sigma2
            by_key = first.new_zeros(S).index_add_(0, ctx.keys.flatten(), first.flatten())  # sum_{key_j = k} g_j
            torch.mul(tables[0], by_key.neg_().unsqueeze(-1), out=grad_tables[0])
            grad_tables[0].view(-1).index_add_(0, ctx.first_index.flatten(), first.flatten())
        return None, None, grad_tables, ctx.alphas[-1] * grad


def symbol_route_total(factors, chunk, init: torch.Tensor, emission: torch.Tensor, weights: List[torch.Tensor]):
    """``(total (c,), ok (c,), transitions)``: the shifted likelihood ``sum_i alpha_L[i] emission[i]`` of a chunk
    on the symbol route, differentiable in ``init``, ``emission`` and ``weights`` through the closed form of
    :mod:`this module <.symbol_likelihood>`; ``ok`` flags the rows whose transitions are representable."""
    total, ok = _SymbolRouteTotal.apply(factors, chunk, init, emission, *weights)
    return total, ok


def takes_key_tables(factors) -> bool:
    """Whether :func:`key_table_symbol_route_total` applies: the factors' score tables are a chained head's key
    tables."""
    return isinstance(factors.score_tables, KeyTableScores) and factors.n_hops > 1


def key_table_symbol_route_total(factors, chunk, emission: torch.Tensor):
    """As :func:`symbol_route_total` for factors whose score tables are a chained head's key tables
    (:func:`takes_key_tables`), differentiable in the key tables (the first hop and the transition weights formed
    inside, :class:`_KeyTableSymbolRouteTotal`) and in ``emission``: ``(total (c,), ok (c,))``."""
    return _KeyTableSymbolRouteTotal.apply(factors, chunk, factors.score_tables.key_tables, emission)
