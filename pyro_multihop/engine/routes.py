"""The engine's routes: which one a query's chunks take (:func:`choose_route`), a chunk prepared on one for the
recursion (:func:`prepare`), and the one fallback of every query's chunks (:func:`run_with_fallback`): probability
space on the route, the rows that underflow there retried on the ``"dense"`` route (:func:`dense_retries`), and
those that underflow there too recomputed in log space (:func:`rows_in_log_space`).

- ``"symbols"``: transitions factored through symbol space (:class:`~.transitions.SymbolTransitions`),
  ``O(S^2 + N)`` per row and hop;
- ``"positions"``: dense ``(c, N, N)`` transition matrices (:class:`~.transitions.PositionTransitions`),
  ``O(N^2)`` per row and hop; the only route of a gate without score tables;
- ``"dense"``: the position route on each row's own logits, every transition normalised over the row's
  positions: the retry of the rows that underflow on the other two.
"""

from __future__ import annotations

from typing import Callable, List, NamedTuple, Optional, Tuple

import torch

from ..gate_ops import SHORT_ROW, exp
from .budget import row_slices, rows_per_chunk
from .hop_factors import HopFactors, chain_from_scores, first_hop_log_probs
from .log_space import MASKED_LOGIT, HopChain, masked_log_softmax
from .transitions import PositionTransitions, SymbolTransitions, Transitions

__all__ = [
    "ROUTES",
    "SYMBOL_ROUTE_RATIO",
    "choose_route",
    "PreparedChunk",
    "prepare",
    "dense_retries",
    "DENSE_RETRY_ELEMENTS",
    "rows_in_log_space",
    "run_with_fallback",
    "put_rows",
]

#: The two routes of the engine: transitions factored through symbol space, or dense over positions.
ROUTES = ("symbols", "positions")

#: A forward pass (log-likelihood, predictive, and their gradients) takes the symbol route while
#: ``S^2 <= SYMBOL_ROUTE_RATIO * N^2``; a forward-backward pass (marginals, the EM statistics), whose
#: position route also forms pairwise terms, while ``S^2 <= 4 * SYMBOL_ROUTE_RATIO * N^2``. The ratio is where
#: the two routes' times cross with ``L = 3`` on one thread: the forward pass's crossover lies near ``S = 4 N``,
#: the forward-backward pass's at or beyond it (the last column of benchmarks/results/engine_speed.md times the
#: forward-backward pass on both routes; docs/engine.md discusses the crossover).
SYMBOL_ROUTE_RATIO = 16.0


def choose_route(factors: HopFactors, context_len: int, backward: bool = False, max_product: bool = False) -> str:
    """``"symbols"`` or ``"positions"`` for rows of ``context_len`` positions, for a forward pass, a
    forward-backward pass (``backward``), or a max-product pass (``max_product``: the MAP and k best paths, whose
    symbol route takes an ``(S, S)`` max a hop against the position route's ``(N, N)``, so it pays while
    ``S <= N``); see :data:`SYMBOL_ROUTE_RATIO`."""
    if factors.score_tables is None:
        return "positions"
    S = factors.score_tables.num_symbols
    ratio = SYMBOL_ROUTE_RATIO * (4 if backward else 1) / (16 if max_product else 1)
    return "symbols" if S * S <= ratio * context_len * context_len else "positions"


class PreparedChunk(NamedTuple):
    """One chunk prepared for the recursion: its first-hop distribution, transitions and dense chain."""

    obs: object
    init: torch.Tensor  # (c, N) p(z_1 = i)
    transitions: Transitions
    chain: Optional[HopChain]  # the dense log factors when the route built them, else None
    normalised: bool = False  # transitions normalised over each row's own positions (the dense route): no retry


def prepare(factors: HopFactors, chunk, route: str) -> PreparedChunk:
    """The first-hop distribution and the transitions of ``chunk`` on ``route``: ``"symbols"``, ``"positions"``,
    or ``"dense"``, the position route on each row's own logits, every transition normalised over the row's
    positions by a softmax (the retry of rows that underflow on the other two, see :func:`dense_retries`; a
    gate without score tables exponentiates its dense log factors).

    On the position route with score tables, a chunk whose ``c N^2`` pairs are fewer than the ``S^2`` entries
    of a table gathers its logits before exponentiating them (:func:`~.hop_factors.chain_from_scores`), rather
    than exponentiating, and differentiating through, the whole ``(L - 1, S, S)`` table.
    """
    if route == "symbols":
        transitions = SymbolTransitions.build(factors, chunk)  # first: the first hop then reads the whole tables
        return PreparedChunk(chunk, first_hop_log_probs(factors.score_tables, chunk).exp(), transitions, None)
    if route == "dense" and factors.score_tables is not None:
        # softmax, not log_softmax then exp: one pass, and torch's softmax has no slow path where entries underflow
        first, later = factors.score_tables.chain_logits(chunk)
        pair_mask = None if chunk.mask is None else chunk.mask.unsqueeze(-2)
        weights = list(_masked_softmax(later, pair_mask).unbind(0))
        ok = torch.ones(len(chunk), dtype=torch.bool, device=first.device)
        transitions = PositionTransitions(weights, None, ok, chunk.keys, chunk.values, factors.num_symbols)
        return PreparedChunk(chunk, _masked_softmax(first, chunk.mask), transitions, None, normalised=True)
    if route == "dense":
        chain = factors.dense_chain(chunk)
    elif factors.score_tables is not None:
        S, N = factors.score_tables.num_symbols, chunk.context_len
        if factors.n_hops == 1 or len(chunk) * N * N >= S * S:
            transitions = PositionTransitions.from_scores(factors, chunk)
            return PreparedChunk(chunk, first_hop_log_probs(factors.score_tables, chunk).exp(), transitions, None)
        chain = chain_from_scores(factors.score_tables, chunk)
    else:
        chain = factors.dense_chain(chunk)
    keys, values = (chunk.keys, chunk.values) if factors.reads_symbols else (None, None)
    transitions = PositionTransitions.from_chain(chain, keys, values, factors.num_symbols)
    return PreparedChunk(chunk, chain.init.exp(), transitions, chain)


def _masked_softmax(logits: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """``softmax`` over the last dim, positions where ``mask`` is False given probability 0. Rows shorter than
    :data:`~pyro_multihop.gate_ops.SHORT_ROW` go through ``exp(masked_log_softmax(.))``: torch's softmax kernel
    vectorises along a row and is slower on such rows (as its ``log_softmax`` is)."""
    if logits.shape[-1] < SHORT_ROW:
        return exp(masked_log_softmax(logits, mask))
    return (logits if mask is None else logits.masked_fill(~mask, MASKED_LOGIT)).softmax(-1)


def dense_retries(factors: HopFactors, prepared: PreparedChunk, rows: torch.Tensor, budget=None,
                  extra: float = 0.0) -> list:
    """Slices (LongTensors of chunk rows) of a chunk's failing ``rows`` for a retry on the ``"dense"`` route, in
    sub-chunks whose dense factors (and ``extra`` elements a row) fit in the memory budget and, on the CPU, hold at
    most :data:`DENSE_RETRY_ELEMENTS` entries a factor; none when the chunk's transitions already came from its dense
    factors (its failing rows then go to log space).

    Probability space fails where a sum falls below :func:`~.recursion.underflow_floor`. On the symbol route and
    on the position route from score tables that is mostly a row's normaliser ``R[v] = sum_j E[v, key_j]``: the
    weights ``E`` are shifted by each query's maximum over all ``S`` keys, and with sharp gates (small
    ``sigma2``) a context holding none of the keys near that maximum has every ``E[v, key_j]`` underflow. The
    dense factors are normalised over the row's own positions (a softmax), so those rows go through in
    probability space, faster than the log-space recursions (benchmarks/results/engine_sharp.md: the sharp gate's
    queries against "all in log space"); only a row whose messages or likelihood underflow there too is recomputed
    in log space.
    """
    if prepared.chain is not None or prepared.normalised or len(rows) == 0:
        return []
    N = prepared.obs.context_len
    per = rows_per_chunk(factors, N, "positions", budget, extra)
    if rows.device.type == "cpu":  # the cap is for glibc's page faults; CUDA's caching allocator has none
        per = min(per, max(1, DENSE_RETRY_ELEMENTS // (N * N)))
    return [rows[part] for part in row_slices(len(rows), per)]


#: Entries of one ``(c, N, N)`` factor of a dense retry's sub-chunk, at most: 4 MB in float32. On glibc, a freed
#: buffer above the mmap threshold (32 MB at most) goes back to the kernel and is page-faulted in again on its
#: next use, so sub-chunks whose factors stay below it run faster (the sharp-gates section of docs/engine.md;
#: the timings at this cap are benchmarks/results/engine_sharp.md).
DENSE_RETRY_ELEMENTS = 2**20


def rows_in_log_space(factors: HopFactors, prepared: PreparedChunk, rows: torch.Tensor):
    """``(sub-chunk, its dense log factors, its (c', N) log emission)`` for the ``rows`` of a chunk that the
    probability-space route could not compute (the dense factors are reused when the route built them)."""
    sub = prepared.obs[rows]
    if prepared.chain is None:
        chain = factors.dense_chain(sub)
    else:
        chain = HopChain(prepared.chain.init[rows], prepared.chain.trans[:, rows])
    return sub, chain, factors.target_log_probs(sub)


def run_with_fallback(factors: HopFactors, chunk, route: str, attempt: Callable, in_log_space: Callable, budget=None,
                      extra: float = 0.0, combine: Optional[Callable] = None):
    """A query's value on one chunk, exact on every row: the one fallback every query's chunks go through.

    ``attempt(chunk, route) -> (value, ok (c,), prepared)`` computes the chunk in probability space on ``route``
    (``prepared``: its :class:`PreparedChunk`); the rows not ``ok`` are retried by ``attempt`` on the ``"dense"``
    route in sub-chunks under the budget (:func:`dense_retries`, ``extra`` elements a row beside the factors), and
    where there is no such retry (the transitions came from the dense factors already), recomputed by
    ``in_log_space(sub-chunk, its HopChain, its (c', N) log emission) -> value of those rows`` (:mod:`.log_space`).
    ``combine(value, ok, parts)``, ``parts`` a list of ``(rows LongTensor, their value)``, gives the chunk's value;
    by default :func:`put_rows`. A new query is its ``attempt`` and its ``in_log_space``."""
    value, ok, prepared = attempt(chunk, route)
    parts: List[Tuple[torch.Tensor, object]] = []
    if not bool(ok.all()):
        bad = (~ok).nonzero().squeeze(-1)
        retries = dense_retries(factors, prepared, bad, budget, extra)
        for rows in retries:
            parts.append((rows, run_with_fallback(factors, chunk[rows], "dense", attempt, in_log_space, budget, extra,
                                                  combine)))
        if not retries:
            parts.append((bad, in_log_space(*rows_in_log_space(factors, prepared, bad))))
    return (put_rows if combine is None else combine)(value, ok, parts)


def put_rows(value, ok: torch.Tensor, parts: list):
    """``value`` (a tensor, or a tuple of tensors, rows first) with each part's rows put in, out of place (so that
    a differentiable value keeps its graph)."""
    for rows, part in parts:
        if isinstance(value, tuple):
            value = tuple(whole.index_put((rows,), piece) for whole, piece in zip(value, part))
        else:
            value = value.index_put((rows,), part)
    return value
