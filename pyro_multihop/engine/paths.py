"""Queries over whole hop paths, on the probability-space routes: the MAP path and the k best paths by
max-product and k-max product with rescaling, posterior samples by forward filtering and backward sampling
over the forward messages, and the path entropy from the forward-backward messages; rows that underflow in
probability space are retried on their dense factors, then recomputed in log space (:mod:`.log_space`), as for
the marginals. :class:`~.hop_posterior.HopPosterior` reads them lazily."""

from __future__ import annotations

import functools
import math

import torch

from ..checks import check_positive_int
from .budget import device_chunk, row_slices, rows_per_chunk
from .hop_factors import HopFactors
from .log_space import (
    chain_entropy,
    chain_k_best,
    chain_map_paths,
    chain_sample_posterior,
    draw_by_inverse_cdf,
)
from .moved_names import deprecated_aliases
from .posterior import posterior_chunk, shifted_emission
from .recursion import forward_messages, recurse, underflow_floor
from .routes import choose_route, prepare, run_with_fallback
from .transitions import PositionTransitions

__all__ = ["map_paths", "sample_paths", "path_entropy", "k_best_paths"]

# Moved to .hop_posterior and .budget; kept here for one release.
__getattr__ = deprecated_aliases(__name__, {"HopPosterior": ("pyro_multihop.engine.hop_posterior", "HopPosterior"),
                                            "dense_chunks": ("pyro_multihop.engine.budget", "dense_chunks")})


def _chunks(factors: HopFactors, obs, route: str, budget, extra: float = 0.0):
    n, N = len(obs), obs.context_len
    device = factors.device
    for part in row_slices(n, rows_per_chunk(factors, N, route, budget, extra)):
        yield part, device_chunk(obs, part, device)


def _log_space_emission(log_emission: torch.Tensor, given_target: bool) -> torch.Tensor:
    return log_emission if given_target else torch.zeros_like(log_emission)


def _rescaled(step, floor: float):
    """A max-product step whose output (a fresh tensor) is divided, in place, by its maximum over everything but the
    rows; it keeps ``(what the step kept, scale (c,))``."""

    def rescaled(message, hop):
        out = step(message, hop)
        out, kept = out if isinstance(out, tuple) else (out, None)
        scale = out.flatten(1).amax(-1)
        return out.div_(scale.clamp_min(floor).view((-1,) + (1,) * (out.dim() - 1))), (kept, scale)

    return rescaled


# -- MAP --------------------------------------------------------------------------------------------------------
def _map_chunk(factors: HopFactors, chunk, route: str, given_target: bool, prepared=None, emission=None,
               budget=None) -> torch.Tensor:
    """The MAP paths ``(c, L)`` of a chunk, through :func:`~.routes.run_with_fallback`; ``prepared`` and
    ``emission`` (``shifted_emission``'s triple) when a forward-backward pass on the same route already formed
    them (for the chunk itself, not its retries)."""
    kept = {"prepared": prepared, "emission": emission}

    def attempt(chunk, route):
        given = kept.copy()
        kept.update(prepared=None, emission=None)
        return _map_attempt(factors, chunk, route, given_target, **given)

    def in_log_space(sub, chain, log_emission):
        return chain_map_paths(chain, _log_space_emission(log_emission, given_target))

    return run_with_fallback(factors, chunk, route, attempt, in_log_space, budget)


def _map_attempt(factors: HopFactors, chunk, route: str, given_target: bool, prepared=None, emission=None):
    """``(paths (c, L), ok (c,), prepared)`` by max-product with rescaling in probability space."""
    prepared = prepare(factors, chunk, route) if prepared is None else prepared
    transitions = prepared.transitions
    if emission is None or not given_target:
        emission = shifted_emission(factors, chunk, given_target, prepared.init.dtype)
    emission, _, ok = emission
    floor = underflow_floor(emission.dtype)
    messages, kept = recurse(prepared.init, range(factors.n_hops - 1), _rescaled(transitions.max_forward, floor))
    best, last = (messages[-1] * emission).max(-1)
    ok = ok & transitions.ok & (best >= floor)
    path = [last]
    for hop in reversed(range(factors.n_hops - 1)):
        ok &= kept[hop][1] >= floor
        # The best predecessor of the decoded position alone (ties to the lowest index).
        weights = transitions.reverse_weights(hop, messages[hop], path[0].unsqueeze(-1))  # (c, 1, N)
        path.insert(0, weights.squeeze(-2).argmax(-1))
    return torch.stack(path, dim=-1), ok, prepared


def map_paths(factors: HopFactors, obs, budget=None, given_target: bool = True, kept=()) -> torch.Tensor:
    """``(n, L)`` LongTensor, the most probable hop path given the target (Viterbi by max-product; ties to the
    lowest index); with ``given_target=False`` the most probable path of the prior chain (targets ignored).

    :param kept: ``(rows, prepared, emission)`` of the first chunks of ``obs`` in order (``rows`` consecutive
        slices from 0, ``prepared`` a :class:`~.routes.PreparedChunk` on the max-product's route, ``emission``
        its :func:`~.posterior.shifted_emission` triple), as a forward-backward pass kept them
        (:func:`~.queries.posterior_marginals`' ``keep``): decoded without preparing them again."""
    factors = factors.given(given_target)
    out = torch.empty(len(obs), factors.n_hops, dtype=torch.long, device=factors.device)
    route = choose_route(factors, obs.context_len, max_product=True)
    done = 0
    with torch.no_grad():
        for part, prepared, emission in kept:
            out[part] = _map_chunk(factors, prepared.obs, route, given_target, prepared, emission, budget)
            done = part.stop
        rest = obs[done:] if done else obs
        for part, chunk in _chunks(factors, rest, route, budget):
            out[done + part.start:done + part.stop] = _map_chunk(factors, chunk, route, given_target, budget=budget)
    return out


# -- k best ----------------------------------------------------------------------------------------------------
def _k_max_paths(transitions, init: torch.Tensor, emission: torch.Tensor, n_hops: int, k: int, floor: float):
    """The k-max product with rescaling over ``transitions``: ``(values (c, r), paths (c, r, L) in their
    positions, log of the scales divided out (c,), ok (c,))``, best first, ``r = min(k, N^L)``."""
    step = functools.partial(_kmax, transitions, k=k)
    messages, kept = recurse(init.unsqueeze(-2), range(n_hops - 1), _rescaled(step, floor))
    final = (messages[-1] * emission.unsqueeze(-2)).flatten(-2)  # (c, r N)
    values, flat = final.topk(min(k, final.shape[-1]), dim=-1)
    log_scale = torch.zeros_like(values[:, 0])
    ok = torch.ones_like(values[:, 0], dtype=torch.bool)
    path = [flat]
    for pointer, scale in reversed(kept):
        ok &= scale >= floor
        log_scale += scale.clamp_min(floor).log()
        path.insert(0, pointer.flatten(-2).gather(-1, path[0]))
    return values, torch.stack(path, dim=-1) % init.shape[-1], log_scale, ok


def _k_best_by_enumeration(weights, init: torch.Tensor, emission: torch.Tensor, n_hops: int, k: int, floor: float):
    """As :func:`_k_max_paths`, by scoring all ``s^L`` paths of ``s`` positions (the few candidates of a pruned
    row) and one top-k, given the transition weights ``(s, s, c)`` of each hop with the rows last: ``(values (c,
    r), paths (c, r, L), log of the scales divided out (c,), ok (c,))``."""
    c, s = init.shape
    # The paths so far (m, c), the last hop's position varying fastest, the rows last: the products and the
    # maxima over the paths run along contiguous rows, faster than with the rows first (``k_best_paths`` in
    # benchmarks/results/engine_paths.md).
    scores = init.t()
    log_scale = torch.zeros_like(init[:, 0])
    ok = torch.ones_like(init[:, 0], dtype=torch.bool)
    for hop in range(n_hops - 1):
        # (m / s, s, 1, c) x (s, s, c): each path times its last position's row of the transition
        scores = (scores.reshape(-1, s, 1, c) * weights[hop]).view(-1, c)
        scale = scores.amax(0)
        ok &= scale >= floor
        scores.div_(scale.clamp_min(floor))
        log_scale += scale.clamp_min(floor).log()
    final = (scores.view(-1, s, c) * emission.t()).view(-1, c)
    values, flat = _largest(final.t(), min(k, final.shape[0]), in_place=True)
    paths = torch.stack([(flat // s ** (n_hops - 1 - hop)) % s for hop in range(n_hops)], dim=-1)
    return values, paths, log_scale, ok


#: A pruned row's k best paths come from scoring every path of its candidates while there are at most this many.
ENUMERATED_PATHS = 4096

#: Pruned rows that need at most this many candidates a hop are searched apart from the others.
FEW_CANDIDATES = 8


def _largest(scores: torch.Tensor, k: int, rest: bool = False, in_place: bool = False):
    """``(values (c, k), positions (c, k))``: the ``k`` largest entries of each row of ``scores (c, N)``
    (``N >= k``), best first; with ``rest``, also ``(c,)`` the largest of the others (``N > k``). For small ``k``,
    by taking out row maxima one at a time (in ``scores`` itself with ``in_place``): ``k`` passes over ``(c, N)``,
    less work than a top-k's sort of each row (``k_best_paths`` in benchmarks/results/engine_paths.md)."""
    if k > 8:
        values, positions = scores.topk(k + rest, dim=-1)
        return (values[:, :k], positions[:, :k], values[:, k]) if rest else (values, positions)
    scores = scores if in_place else scores.clone()
    values, positions = [], []
    for _ in range(k):
        value, position = scores.max(-1, keepdim=True)
        values.append(value)
        positions.append(position)
        scores.scatter_(-1, position, -math.inf)
    values, positions = torch.cat(values, -1), torch.cat(positions, -1)
    return (values, positions, scores.amax(-1)) if rest else (values, positions)


def _top_positions(scores: torch.Tensor, k: int):
    """``(values (c, k), positions (c, k), rest (c,))`` for ``scores (c, N) >= 0`` (``N > k``): ``k`` distinct
    positions of each row among its largest entries, their values, and an upper bound on each of the other entries.

    Each entry's bits, read as an integer (monotone in a non-negative float), keep their high bits and carry the
    position's rank in the low ``ceil(log2 N)`` bits: one integer row maximum gives a position (ties and values
    within ``2^-(mantissa bits - log2 N)`` of each other, relatively, in index order), and ``k`` of them cost less
    than ``k`` float row maxima with their positions: the integer maximum is vectorised, the float one with its
    index is not (``k_best_paths`` in benchmarks/results/engine_paths.md). The k positions need not be
    the exact top k: any k distinct positions' smallest value bounds the k-th best path from below, and ``rest``
    bounds every other position from above."""
    c, N = scores.shape
    bits = max(1, (N - 1).bit_length())
    integer = {4: torch.int32, 8: torch.int64}.get(scores.element_size())
    if integer is None or bits > 12 or not scores.is_contiguous():
        return _largest(scores, k, rest=True)
    low = (1 << bits) - 1
    rank = low - torch.arange(N, device=scores.device, dtype=integer)  # the lowest index wins a tie
    keys = scores.view(integer).bitwise_and(~low).bitwise_or_(rank)
    taken = torch.iinfo(integer).min
    positions = []
    for _ in range(k):
        position = (low - keys.amax(-1, keepdim=True).bitwise_and_(low)).long()
        positions.append(position)
        keys.scatter_(-1, position, taken)
    positions = torch.cat(positions, -1)
    rest = keys.amax(-1).bitwise_or_(low).view(scores.dtype)  # the largest other key, its low bits all set
    return scores.gather(-1, positions), positions, rest


def _first_where(mask: torch.Tensor, size: int):
    """``(positions (c, size), filled (c, size))``: the first ``size`` positions where ``mask (c, N)`` holds, in
    index order; slots past a row's last such position hold position 0 and ``filled`` False."""
    c = mask.shape[0]
    rows, positions = mask.nonzero(as_tuple=True)  # row by row, in index order
    counts = mask.sum(-1)
    slots = torch.arange(len(rows), device=mask.device) - (counts.cumsum(0) - counts)[rows]
    kept = slots < size
    rows, slots = rows[kept], slots[kept]
    chosen = torch.zeros(c, size, dtype=torch.long, device=mask.device)
    filled = torch.zeros(c, size, dtype=torch.bool, device=mask.device)
    chosen[rows, slots] = positions[kept]
    filled[rows, slots] = True
    return chosen, filled


def _k_best_candidates(transitions, init, emission, n_hops: int, k: int, cap: int, floor: float):
    """Per hop ``(positions (c, size), filled (c, size))``: the positions through which every one of the ``k``
    best paths passes (slots past a row's own hold position 0 and ``filled`` False); ``(c,)`` how many of them
    each row needs (at least ``k``; ``size`` is the most any pruned row needs, at most ``cap``); ``(c,)`` whether
    the row is pruned (its positions hold all of its ``k`` best paths).

    The best path through position ``i`` at hop ``l`` (its max-marginal, forward times backward max-product
    messages, relative to the best path) bounds every path through it, and at any hop the ``k``-th largest
    max-marginal is a lower bound on the ``k``-th best path (``k`` distinct paths reach it). A position below the
    largest such bound is on none of the ``k`` best paths; a row with more than ``cap`` positions above it at
    some hop is not pruned. Most rows have at most ``k`` positions above the bound at every hop: their candidates
    are the ``k`` largest max-marginals of each hop, found with the bound; only the other rows are searched for
    every position above it."""
    forward, _ = recurse(init, range(n_hops - 1), _rescaled(transitions.max_forward, floor))
    backward, _ = recurse(emission, reversed(range(n_hops - 1)), _rescaled(transitions.max_backward, floor))
    backward = backward[::-1]
    max_marginals = [f * b for f, b in zip(forward, backward)]
    best = [m.amax(-1).clamp_min(floor) for m in max_marginals]  # the best path's score, in each hop's scale
    top = [_top_positions(m, k) for m in max_marginals]
    # The smallest of k distinct positions' max-marginals bounds the k-th best path from below; the slack covers
    # the rounding of the max-marginals (a few eps each).
    threshold = torch.stack([values.amin(-1) / b for (values, _, _), b in zip(top, best)]).amax(0) * (1 - 1e-4)
    bounds = [threshold * b for b in best]
    more = torch.stack([rest >= bound for (_, _, rest), bound in zip(top, bounds)]).any(0)  # > k above, some hop
    fits = threshold >= floor
    needed = torch.full_like(more, k, dtype=torch.long)
    over = (more & fits).nonzero().squeeze(-1)
    above = [m[over] >= bound[over].unsqueeze(-1) for m, bound in zip(max_marginals, bounds)]
    if len(over):
        needed[over] = torch.stack([a.sum(-1) for a in above]).amax(0)
        fits[over] = needed[over] <= cap
    size = int(needed[fits].max()) if fits.any() else k
    candidates = []
    for (values, positions, _), bound, a in zip(top, bounds, above):
        chosen, filled = positions, values >= bound.unsqueeze(-1)
        if size > k:
            chosen = torch.cat([chosen, chosen.new_zeros(len(chosen), size - k)], -1)
            filled = torch.cat([filled, filled.new_zeros(len(filled), size - k)], -1)
        if len(over):
            chosen[over], filled[over] = _first_where(a, size)
        candidates.append((chosen, filled))
    return candidates, needed, fits


def _k_best_chunk(factors: HopFactors, chunk, route: str, k: int, budget, given_target: bool = True):
    """``(paths (c, k, L), log_probs (c, k))`` of a chunk, through :func:`~.routes.run_with_fallback`."""

    def in_log_space(sub, chain, log_emission):
        return chain_k_best(chain, _log_space_emission(log_emission, given_target), k)

    attempt = functools.partial(_k_best_attempt, factors, k=k, budget=budget, given_target=given_target)
    return run_with_fallback(factors, chunk, route, attempt, in_log_space, budget)


def _k_best_attempt(factors: HopFactors, chunk, route: str, k: int, budget, given_target: bool = True):
    """``((paths (c, k, L), log_probs (c, k)), ok (c,), prepared)`` by the k-max product in probability space."""
    L, N = factors.n_hops, chunk.context_len
    prepared = prepare(factors, chunk, route)
    transitions = prepared.transitions
    emission, _, ok = shifted_emission(factors, chunk, given_target, prepared.init.dtype)
    floor = underflow_floor(emission.dtype)
    cap = max(4 * k, 16)  # candidate positions a hop when pruning, at most
    pruned = torch.zeros_like(ok)
    candidates = None
    if L > 1 and k <= N and cap < N:
        candidates, needed, pruned = _k_best_candidates(transitions, prepared.init, emission, L, k, cap, floor)
    r = min(k, N**L)
    values = emission.new_zeros(len(chunk), r)
    paths = torch.zeros(len(chunk), r, L, dtype=torch.long, device=emission.device)
    log_scale = torch.zeros_like(emission[:, 0])
    # The k best paths within the candidates, then their positions, in groups by need (the paths of a group are
    # scored at its largest need, and their number grows as need^L): exactly k candidates, up to
    # FEW_CANDIDATES, more.
    if candidates is not None:
        chosen = [positions for positions, _ in candidates]
        filled = [slot_filled.to(emission.dtype) for _, slot_filled in candidates]
        exact, few = pruned & (needed <= k), pruned & (needed <= FEW_CANDIDATES)
        for group in (exact, few & ~exact, pruned & ~few):
            rows = group.nonzero().squeeze(-1)
            if not len(rows):
                continue
            size = int(needed[rows].max())
            # The candidates' transition weights and first- and last-hop factors, those of the exact group (most
            # rows) formed for every row at its size, the others' for their rows alone; empty slots (past a row's
            # own candidates) are made unreachable: no start, no transition into them.
            every = size == k
            sub = transitions if every else transitions.select(rows)
            picked = [positions[:, :size] if every else positions[rows, :size] for positions in chosen]
            fill = [slot_filled[:, :size] if every else slot_filled[rows, :size] for slot_filled in filled]
            weights = [sub.submatrix(hop, picked[hop], picked[hop + 1]) * fill[hop + 1].unsqueeze(-2)
                       for hop in range(L - 1)]
            first = (prepared.init if every else prepared.init[rows]).gather(1, picked[0]) * fill[0]
            last = (emission if every else emission[rows]).gather(1, picked[-1])
            if every:
                weights, first, last = [w[rows] for w in weights], first[rows], last[rows]
                picked = [positions[rows] for positions in picked]
            if size**L <= ENUMERATED_PATHS:
                found = _k_best_by_enumeration([w.permute(1, 2, 0).contiguous() for w in weights], first, last, L,
                                               k, floor)  # the weights (s, s, rows): the rows last
            else:
                found = _k_max_paths(PositionTransitions(weights, None, transitions.ok[rows]), first, last, L, k,
                                     floor)
            values[rows], log_scale[rows] = found[0], found[2]
            paths[rows] = torch.stack([picked[hop].gather(1, found[1][..., hop]) for hop in range(L)], dim=-1)
            ok[rows] &= found[3]
    # The k-max product over every position holds (c, N, k, N) or (c, S, k N): the other rows in slices that fit.
    rows = (~pruned).nonzero().squeeze(-1)
    per = rows_per_chunk(factors, N, "positions", budget, extra=3 * N * max(N, factors.num_symbols) * k)
    for part in row_slices(len(rows), per):
        sub = rows[part]
        found = _k_max_paths(transitions.select(sub), prepared.init[sub], emission[sub], L, k, floor)
        values[sub], paths[sub], log_scale[sub] = found[:3]
        ok[sub] &= found[3]
    total = (forward_messages(transitions, prepared.init, L)[-1] * emission).sum(-1)  # the likelihood, shifted
    # Paths of probability zero (padding, a zero emission) are exactly 0 here; a rank below the number of
    # possible paths that is below the floor underflowed, and the row goes to log space.
    real_positions = N if chunk.mask is None else chunk.mask.sum(-1).to(emission.dtype)
    possible = real_positions ** (L - 1) * (emission > 0).sum(-1).to(emission.dtype)  # emission is 0 at padding
    ranks = torch.arange(values.shape[-1], device=values.device)
    ok &= transitions.ok & (total >= floor) & ((values >= floor) | (ranks >= possible.unsqueeze(-1))).all(-1)
    impossible = values <= 0
    log_probs = (values.clamp_min(floor).log() + (log_scale - total.clamp_min(floor).log()).unsqueeze(-1))
    log_probs = log_probs.masked_fill(impossible, -math.inf)
    paths = paths.masked_fill(impossible.unsqueeze(-1), 0)
    if values.shape[-1] < k:  # only when N^L < k
        c = len(chunk)
        log_probs = torch.cat([log_probs, log_probs.new_full((c, k - values.shape[-1]), -math.inf)], dim=-1)
        paths = torch.cat([paths, paths.new_zeros(c, k - values.shape[-1], L)], dim=-2)
    return (paths, log_probs), ok, prepared


def _kmax(transitions, message, hop, k):
    return transitions.kmax_forward(message, hop, k)


def k_best_paths(factors: HopFactors, obs, k: int, budget=None, given_target: bool = True):
    """``(paths (n, k, L), log_probs (n, k))``: the ``k`` most probable hop paths given the target, best
    first, with their posterior log-probabilities; ``-inf`` rows where fewer than ``k`` paths exist. With
    ``given_target=False``, those of the prior chain (targets ignored: the paths followed before the answer is
    seen), with their prior log-probabilities."""
    check_positive_int("k", k)
    factors = factors.given(given_target)
    n, L, N = len(obs), factors.n_hops, obs.context_len
    device = factors.device
    paths = torch.zeros(n, k, L, dtype=torch.long, device=device)
    log_probs = torch.empty(n, k, dtype=factors.dtype, device=device)
    route = choose_route(factors, N, max_product=True)
    # The max-marginals and the candidates' paths; rows that are not pruned run in smaller slices.
    extra = 4 * ENUMERATED_PATHS + 4 * (L + 1) * N
    with torch.no_grad():
        for part, chunk in _chunks(factors, obs, route, budget, extra=extra):
            paths[part], log_probs[part] = _k_best_chunk(factors, chunk, route, k, budget, given_target)
    return paths, log_probs


# -- sampling ----------------------------------------------------------------------------------------------------
def _sample_chunk(factors: HopFactors, chunk, route: str, num_samples: int, generator, budget=None,
                  given_target: bool = True):
    """``(c, num_samples, L)`` posterior paths of a chunk, through :func:`~.routes.run_with_fallback`."""

    def attempt(chunk, route):
        return _sample_attempt(factors, chunk, route, num_samples, generator, given_target)

    def in_log_space(sub, chain, log_emission):
        return chain_sample_posterior(chain, _log_space_emission(log_emission, given_target), num_samples,
                                      generator).transpose(0, 1)

    return run_with_fallback(factors, chunk, route, attempt, in_log_space, budget,
                             extra=3 * num_samples * chunk.context_len)


def _sample_attempt(factors: HopFactors, chunk, route: str, num_samples: int, generator, given_target: bool):
    """``(paths (c, num_samples, L), ok (c,), prepared)`` by forward filtering, backward sampling in probability
    space::

        z_L ~ alpha_L(z_L) p(target | z_L),    z_l | z_{l+1} = j  ~  alpha_l(z_l) P_l[z_l, j]

    (without the ``p(target | z_L)`` factor when not ``given_target``: paths of the prior chain)."""
    L = factors.n_hops
    prepared = prepare(factors, chunk, route)
    transitions = prepared.transitions
    alphas = forward_messages(transitions, prepared.init, L)
    emission, _, ok = shifted_emission(factors, chunk, given_target, prepared.init.dtype)
    floor = underflow_floor(emission.dtype)
    last = alphas[-1] * emission
    ok = ok & transitions.ok & (last.sum(-1) >= floor)
    position = draw_by_inverse_cdf(last, num_samples, generator)  # (c, s)
    path = [position]
    weights = None  # one (c, s, N) buffer for every hop: fresh buffers of that size cost page faults
    for hop in reversed(range(L - 1)):
        weights = transitions.reverse_weights(hop, alphas[hop], position, out=weights)  # (c, s, N)
        position = draw_by_inverse_cdf(weights, 1, generator, in_place=True).squeeze(-1)
        ok &= (weights[..., -1] >= floor).all(-1)  # the row totals, the CDF's last entries
        path.insert(0, position)
    return torch.stack(path, dim=-1), ok, prepared  # (c, s, L)


def sample_paths(factors: HopFactors, obs, num_samples: int, generator=None, budget=None,
                 given_target: bool = True) -> torch.Tensor:
    """``(num_samples, n, L)`` hop paths drawn from the posterior given the target (forward filtering,
    backward sampling); with ``given_target=False``, from the prior chain (the paths before the target is seen)."""
    check_positive_int("num_samples", num_samples)
    factors = factors.given(given_target)
    out = torch.empty(num_samples, len(obs), factors.n_hops, dtype=torch.long, device=factors.device)
    route = choose_route(factors, obs.context_len)
    with torch.no_grad():
        for part, chunk in _chunks(factors, obs, route, budget, extra=3 * num_samples * obs.context_len):
            paths = _sample_chunk(factors, chunk, route, num_samples, generator, budget, given_target)
            out[:, part] = paths.transpose(0, 1)
    return out


# -- entropy -------------------------------------------------------------------------------------------------------
def path_entropy(factors: HopFactors, obs, budget=None, given_target: bool = True) -> torch.Tensor:
    """``(n,)`` exact entropy (nats) of the posterior over hop paths given the target; with
    ``given_target=False``, of the prior chain (the uncertainty before the target is seen).

    By the chain rule on the reverse chain, from the forward-backward messages::

        H(z_1..z_L | target) = H(z_L | target) + sum_{l<L} E_{z_{l+1} | target} H(z_l | z_{l+1})
    """
    factors = factors.given(given_target)
    out = torch.empty(len(obs), dtype=factors.dtype, device=factors.device)
    N = obs.context_len
    route = choose_route(factors, N, backward=True)
    with torch.no_grad():
        for part, chunk in _chunks(factors, obs, route, budget, extra=2 * N * N if route == "positions" else 0.0):
            rows = torch.arange(part.start, part.stop, device=out.device)
            for piece in posterior_chunk(factors, chunk, route, given_target=given_target, budget=budget):
                if piece.route == "log":
                    log_emission = _log_space_emission(factors.target_log_probs(piece.obs), given_target)
                    out[rows[piece.rows]] = chain_entropy(factors.dense_chain(piece.obs), log_emission)
                    continue
                gamma = piece.hop_marginals
                entropy = -torch.xlogy(gamma[-1], gamma[-1]).sum(-1)
                for hop in range(factors.n_hops - 1):
                    entropy += piece.transitions.conditional_entropy(hop, piece.alphas[hop], piece.alphas[hop + 1],
                                                                     gamma[hop + 1])
                out[rows[piece.rows]] = entropy
    return out
