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

:func:`symbol_route_total` applies it to any score tables' transition weights (their own backward then takes the
gradient on to the parameters); :func:`closed_form_total` is what the engine calls, and takes instead the score
tables' own closed form where they carry one (:attr:`~.score_tables.ScoreTables.symbol_route_total`, built from
:func:`kept_gradient` and :func:`backward_products`: the chained head's, on its key tables).

Shapes: ``c`` rows, ``N`` positions, ``S`` symbols, ``L`` hops.
"""

from __future__ import annotations

from typing import List

import torch

from .hop_factors import first_hop_log_probs
from .moved_names import deprecated_aliases
from .recursion import forward_messages
from .transitions import SymbolTransitions

__all__ = ["symbol_route_total", "closed_form_total", "kept_gradient", "backward_products"]

# The chained head's closed form moved to its key tables (pyro_multihop.models.chained_key_tables); kept for one release.
__getattr__ = deprecated_aliases(__name__, {"key_table_symbol_route_total": (
    "pyro_multihop.models.chained_key_tables", "key_table_symbol_route_total")})


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
        grad = kept_gradient(ctx.transitions, grad_total)
        grad_weights = [None] * len(weights)

        def write(hop, left, right):  # (S_k, S_v), viewed as (S_v, S_k): the layout the whole tables' backward reads
            grad_weights[hop] = (left @ right).transpose(0, 1)

        beta = backward_products(ctx.transitions, ctx.alphas, emission, [w.detach() for w in weights], grad, write)
        return (None, None, beta * grad, ctx.alphas[-1] * grad, *grad_weights)


def kept_gradient(transitions, grad_total: torch.Tensor) -> torch.Tensor:
    """``(c, 1)``: the upstream gradient ``grad_total (c,)``, 0 on rows that failed in probability space (the caller recomputes them
    in log space and discards this total)."""
    return torch.where(transitions.ok, grad_total, torch.zeros_like(grad_total)).unsqueeze(-1)


def backward_products(transitions, alphas, emission, tables, grad, write) -> torch.Tensor:
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


def symbol_route_total(factors, chunk, init: torch.Tensor, emission: torch.Tensor, weights: List[torch.Tensor]):
    """``(total (c,), ok (c,), transitions)``: the shifted likelihood ``sum_i alpha_L[i] emission[i]`` of a chunk
    on the symbol route, differentiable in ``init``, ``emission`` and ``weights`` through the closed form of
    :mod:`this module <.symbol_likelihood>`; ``ok`` flags the rows whose transitions are representable."""
    total, ok = _SymbolRouteTotal.apply(factors, chunk, init, emission, *weights)
    return total, ok


def closed_form_total(factors, chunk, emission: torch.Tensor):
    """``(total (c,), ok (c,))`` as :func:`symbol_route_total`, differentiable in the factors' parameters and in
    ``emission (c, N)``: through the score tables' own closed form when they carry one
    (:attr:`~.score_tables.ScoreTables.symbol_route_total`), else through their transition weights."""
    tables = factors.score_tables
    if tables.symbol_route_total is not None:
        return tables.symbol_route_total(factors, chunk, emission)
    weights = factors.transition_weights  # first: the first hop then reads the whole tables
    init = first_hop_log_probs(tables, chunk).exp()
    return symbol_route_total(factors, chunk, init, emission, weights)
