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

Shapes: ``c`` rows, ``N`` positions, ``S`` symbols, ``L`` hops.
"""

from __future__ import annotations

from typing import List

import torch

from .recursion import forward_messages
from .transitions import SymbolTransitions

__all__ = ["symbol_route_total"]


class _SymbolRouteTotal(torch.autograd.Function):
    """``total (c,) = sum_i alpha_L[i] emission[i]`` and ``ok (c,)`` (not differentiable) from ``init (c, N)``,
    ``emission (c, N)`` and the transition weights ``E_l (S, S)``; see the module docstring for the backward."""

    @staticmethod
    def forward(ctx, gates, chunk, init, emission, *weights):
        with torch.no_grad():
            transitions = SymbolTransitions.build(gates, chunk, [w.detach() for w in weights])
            alphas = forward_messages(transitions, init.detach(), gates.n_hops)
            total = (alphas[-1] * emission.detach()).sum(-1)
        ctx.transitions, ctx.alphas = transitions, alphas
        ctx.save_for_backward(emission, *weights)
        ctx.mark_non_differentiable(transitions.ok)
        return total, transitions.ok

    @staticmethod
    def backward(ctx, grad_total, _grad_ok):
        emission, *weights = ctx.saved_tensors
        transitions, alphas = ctx.transitions, ctx.alphas
        # Rows that failed in probability space are recomputed in log space by the caller, which then discards
        # this total: their gradient here is 0.
        grad = torch.where(transitions.ok, grad_total, torch.zeros_like(grad_total)).unsqueeze(-1)  # (c, 1)
        values, real = transitions.values, transitions.real
        key_counts = transitions.arriving(real)  # real positions carrying each key
        beta = emission.detach() * real  # unscaled: every beta is at most 1 (a shifted emission, stochastic P)
        grad_weights: List[torch.Tensor] = [None] * len(weights)
        for hop in reversed(range(len(weights))):
            table, inverse = weights[hop].detach(), transitions.inverse_normalisers[hop]
            arriving = transitions.arriving(beta * real)  # (c, S)
            back = (arriving @ table.transpose(0, 1)) * inverse  # (c, S): at value v
            out = transitions.leaving(alphas[hop], hop) * grad  # (c, S)
            # The gradient is unchanged when beta moves by a constant a row (arriving by m key_counts, back by m,
            # P being stochastic); centred on its mean over the real positions, the two terms of each row's
            # difference are smaller, and so is the rounding of their cancelling sum (in float32, about 3x).
            centre = (beta * real).sum(-1, keepdim=True) / real.sum(-1, keepdim=True).clamp_min(1.0)
            # (S_k, S_v) = [arriving; -key_counts]^T [out; out * back], then viewed as (S_v, S_k): the layout the
            # whole tables' backward reads without a transposing copy.
            left = torch.cat([arriving - centre * key_counts, -key_counts]).transpose(0, 1)
            grad_weights[hop] = (left @ torch.cat([out, out * (back - centre)])).transpose(0, 1)
            beta = back.gather(1, values) * real
        grad_init = beta * grad
        grad_emission = alphas[-1] * grad
        return (None, None, grad_init, grad_emission, *grad_weights)


def symbol_route_total(gates, chunk, init: torch.Tensor, emission: torch.Tensor, weights: List[torch.Tensor]):
    """``(total (c,), ok (c,), transitions)``: the shifted likelihood ``sum_i alpha_L[i] emission[i]`` of a chunk
    on the symbol route, differentiable in ``init``, ``emission`` and ``weights`` through the closed form of
    :mod:`this module <.symbol_likelihood>`; ``ok`` flags the rows whose transitions are representable."""
    total, ok = _SymbolRouteTotal.apply(gates, chunk, init, emission, *weights)
    return total, ok
