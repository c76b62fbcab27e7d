"""The likelihood and the marginals: every row in chunks under the memory budget, on the chosen route."""

from __future__ import annotations

import functools
from typing import Optional

import torch

from .budget import device_chunk, resolve_budget, row_slices, rows_per_chunk
from .hop_factors import HopFactors
from .log_space import chain_log_likelihood, last_hop_prior
from .posterior import forward_backward_chunks, shifted_emission
from .recursion import forward_messages, underflow_floor
from .routes import PreparedChunk, choose_route, prepare, run_with_fallback
from .symbol_likelihood import closed_form_total

__all__ = ["log_likelihood", "predict_proba", "posterior_marginals", "hop_marginals", "pairwise_marginals",
           "value_marginals"]


#: From this many symbols on, the symbol route's gradient comes from the forward-backward messages
#: (:mod:`.symbol_likelihood`): from here on it takes clearly less time than autograd through the recursion (loss
#: plus backward of a chained head on one thread; the closed form's paragraph of docs/engine.md, and the collapsed
#: loss at ``S = 1000`` in benchmarks/results/engine_speed.md); below it the two are within noise, and autograd's
#: path is the simpler.
CLOSED_FORM_MIN_SYMBOLS = 256


def _log_likelihood_chunk(factors: HopFactors, chunk, route: str, budget=None) -> torch.Tensor:
    """``(c,)`` exact log-likelihoods of a chunk, differentiable, through :func:`~.routes.run_with_fallback`."""
    return run_with_fallback(factors, chunk, route, functools.partial(_log_likelihood_attempt, factors),
                             _log_likelihood_in_log_space, budget)


def _log_likelihood_attempt(factors: HopFactors, chunk, route: str):
    """``(log-likelihoods (c,), ok (c,), prepared)`` in probability space. On the symbol route with gradients, the
    total's gradient comes from the forward-backward messages (:mod:`.symbol_likelihood`) rather than from autograd
    through the recursion: from the score tables' own closed form where they carry one, else from their transition
    weights."""
    closed_form = (route == "symbols" and torch.is_grad_enabled() and factors.n_hops > 1
                   and factors.num_symbols >= CLOSED_FORM_MIN_SYMBOLS)
    if closed_form:
        emission, shift, ok = shifted_emission(factors, chunk)
        total, transitions_ok = closed_form_total(factors, chunk, emission)
        prepared = PreparedChunk(chunk, None, None, None)
    else:
        prepared = prepare(factors, chunk, route)
        alpha = forward_messages(prepared.transitions, prepared.init, factors.n_hops)[-1]
        emission, shift, ok = shifted_emission(factors, chunk)
        total, transitions_ok = (alpha * emission).sum(-1), prepared.transitions.ok
    floor = underflow_floor(total.dtype)
    ok = ok & transitions_ok & (total >= floor)
    return total.clamp_min(floor).log() + shift, ok, prepared


def _log_likelihood_in_log_space(sub, chain, log_emission) -> torch.Tensor:
    return chain_log_likelihood(chain, log_emission)


def log_likelihood(factors: HopFactors, obs, budget=None) -> torch.Tensor:
    """``(n,)`` exact ``log p(target | context, query)``; differentiable in the factors when grad is enabled
    (the autograd graph then holds every chunk's messages: ``O(n (L S + N))`` for the symbol route)."""
    n, N = len(obs), obs.context_len
    route = choose_route(factors, N)
    device = factors.device
    rows = rows_per_chunk(factors, N, route, budget)
    # Concatenated, not written into a preallocated output, so that the result keeps every chunk's graph
    # whenever any input of the factors requires grad.
    parts = row_slices(n, rows) if n else [slice(0, 0)]  # an empty shard still gives a (0,) result
    return torch.cat([_log_likelihood_chunk(factors, device_chunk(obs, part, device), route, budget) for part in parts])


def predict_proba(factors: HopFactors, obs, budget=None) -> torch.Tensor:
    """``(n, T)`` predictive target distribution, the hop latents marginalised (targets of ``obs`` unused)."""
    if factors.target_chain is not None:
        raise ValueError("these factors emit the target along the hops (target_chain): a prediction sums over the paths "
                         "once per answer, the head's predict_proba")
    n, N = len(obs), obs.context_len
    S, T = factors.num_symbols, factors.num_targets
    route = choose_route(factors, N)
    device = factors.device
    # a position emission needs no (S, T) table (a head may hand an expanded stand-in: never exponentiate it whole)
    emission = None if factors.position_emission is not None else factors.log_emission.exp()
    # mix by value symbol: (c, S) x (S, T), a BLAS product, beats gathering (c, N, T) rows
    by_symbol = S <= 4 * N and factors.position_emission is None
    # a position emission of every target: the head's (c, N, T) table, its logarithm and the mixture's product;
    # a head's own mixture: its (c, T) result (its working memory is its extra_elements)
    per_position = 4 * N * T if factors.position_emission is not None else 2 * N * T
    if factors.position_mixture is not None:
        per_position = T
    rows = rows_per_chunk(factors, N, route, budget, extra=(S if by_symbol else per_position) + T)
    out = torch.empty(n, T, dtype=factors.dtype, device=device)
    for part in row_slices(n, rows):
        out[part] = _predict_chunk(factors, device_chunk(obs, part, device), route, emission, by_symbol, budget)
    return out


def _predict_chunk(factors: HopFactors, chunk, route: str, emission: torch.Tensor, by_symbol: bool, budget=None):
    """``(c, T)``: :func:`predict_proba` of one chunk, through :func:`~.routes.run_with_fallback`."""

    def attempt(chunk, route):
        prepared = prepare(factors, chunk, route)
        alpha = forward_messages(prepared.transitions, prepared.init, factors.n_hops)[-1]  # (c, N) p(z_L = i)
        return _mixture(factors, chunk, alpha, emission, by_symbol), prepared.transitions.ok, prepared

    def in_log_space(sub, chain, log_emission):
        return _mixture(factors, sub, last_hop_prior(chain), emission, by_symbol)

    return run_with_fallback(factors, chunk, route, attempt, in_log_space, budget)


def _mixture(factors: HopFactors, chunk, alpha: torch.Tensor, emission: torch.Tensor, by_symbol: bool):
    """``(c, T)``: the emission of each position mixed by ``alpha (c, N)``, ``p(z_L = i)``."""
    if factors.position_mixture is not None:
        return factors.position_mixture(chunk, alpha)
    if factors.position_emission is not None:
        return torch.bmm(alpha.unsqueeze(-2), factors.position_emission(chunk).exp()).squeeze(-2)
    if by_symbol:
        return alpha.new_zeros(len(chunk), emission.shape[0]).scatter_add_(1, chunk.values, alpha) @ emission
    return torch.bmm(alpha.unsqueeze(-2), emission[chunk.values]).squeeze(-2)


def posterior_marginals(factors: HopFactors, obs, budget=None, pairwise: bool = False, keep: Optional[list] = None,
                        kept_bytes_per_row: float = 0.0, given_target: bool = True):
    """``(log_likelihood (n,), hop_marginals (L, n, N), pairwise (L - 1, n, N, N) or None)`` in one
    forward-backward pass; the pairwise marginals (``O(L n N^2)`` memory) only with ``pairwise=True``. With a
    list ``keep``, each probability-space chunk's ``(part, prepared, emission)`` is appended to it (for path
    queries that reuse them), the first chunks only, while their rows at ``kept_bytes_per_row`` fit in the
    memory budget. ``given_target=False``: the prior chain's (the hop marginals before the target is seen; the
    log-likelihood is then 0)."""
    factors = factors.given(given_target)
    kept_rows, limit = 0, resolve_budget(budget)
    L, n, N = factors.n_hops, len(obs), obs.context_len
    like = {"dtype": factors.dtype, "device": factors.device}
    log_likelihood_out = torch.empty(n, **like)
    marginals = torch.empty(L, n, N, **like)
    pairs = torch.zeros(L - 1, n, N, N, **like) if pairwise else None
    for part in forward_backward_chunks(factors, obs, budget, pairwise=pairwise and L > 1, given_target=given_target):
        log_likelihood_out[part.rows] = part.log_likelihood
        marginals[:, part.rows] = part.hop_marginals
        if keep is not None and part.prepared is not None and kept_rows == (part.part.start or 0):
            rows = part.part.stop - part.part.start
            if (kept_rows + rows) * kept_bytes_per_row <= limit:
                keep.append((part.part, part.prepared, part.emission))
                kept_rows += rows
        if pairwise and L > 1:
            pairs[:, part.rows] = part.pairwise
    return log_likelihood_out, marginals, pairs


def hop_marginals(factors: HopFactors, obs, budget=None, given_target: bool = True) -> torch.Tensor:
    """``(L, n, N)`` posterior ``p(z_l = i | observation)``; with ``given_target=False``, ``p(z_l = i | context,
    query)``, the prior chain's (what the hops attend before the target is seen)."""
    return posterior_marginals(factors, obs, budget, given_target=given_target)[1]


def pairwise_marginals(factors: HopFactors, obs, budget=None) -> torch.Tensor:
    """``(L - 1, n, N, N)`` posterior ``p(z_l = i, z_{l+1} = j | observation)``: ``O(L n N^2)`` memory."""
    return posterior_marginals(factors, obs, budget, pairwise=True)[2]


def value_marginals(factors: HopFactors, obs, budget=None) -> torch.Tensor:
    """``(L, n, S)``: the posterior probability that hop ``l`` attends a position whose value is ``s`` (factors that
    read symbols only: observations with ``values``)."""
    if not factors.reads_symbols:
        raise ValueError("value_marginals needs factors that read value symbols; these emit from a position "
                         "(position_emission), and their observations need not have values")
    L, n, S = factors.n_hops, len(obs), factors.num_symbols
    out = torch.zeros(L, n, S, dtype=factors.dtype, device=factors.device)
    for part in forward_backward_chunks(factors, obs, budget):
        values = part.obs.values.unsqueeze(0).expand(L, -1, -1)
        out[:, part.rows] = part.hop_marginals.new_zeros(L, len(part.obs), S).scatter_add_(2, values, part.hop_marginals)
    return out
