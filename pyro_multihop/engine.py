"""The exact hop-chain engine: every plug-in query of every head, in chunks of rows under a memory budget.

A head describes its gate to the engine by a :class:`HopGates` (``head.hop_gates()``): the ``(S, T)`` log
emission table, a callable that builds the dense log factors (:class:`~pyro_multihop.hop_chain.HopChain`) of
a chunk of observations, and, when the gate of hop ``l`` depends on the (query symbol, key symbol) pair
alone, the ``(L, S, S)`` table ``scores[l, q, k]`` of its unnormalised logits. The engine runs one
forward-backward recursion over the hop chain of each chunk, with the transition passed in as one of two
operators (torch-struct's idea of one dynamic program, many instantiations):

- **symbols** (the factored route): the transition of hop ``l`` from position ``i`` to ``j`` is
  ``E_l[value_i, key_j] / R_l[value_i]`` with ``E_l = exp(scores[l] - rowmax)`` and ``R_l`` the row's
  normaliser, so a message crosses a hop as ``(c, S) x (S, S)`` products and a scatter/gather over the
  positions: ``O(S^2 + N)`` per row and hop, no ``(N, N)`` tensor;
- **positions** (the dense route): the ``(c, N, N)`` softmax matrices of the chunk and batched products,
  ``O(N^2)`` per row and hop; used when ``S^2`` is large beside ``N^2`` (see :data:`SYMBOL_ROUTE_RATIO`)
  or when the gate has position-dependent terms (``scores is None``).

Both run in probability space: forward messages are distributions (transitions are row-stochastic),
backward messages are rescaled to a row maximum of 1 at every hop, and the emission is shifted by its
row maximum. A row whose sums would fall below ``tiny / eps`` in that form (an underflowing normaliser
``R``, message or likelihood; tiny ``sigma2`` with far-apart keys) is recomputed by the log-space
forward-backward of :mod:`pyro_multihop.hop_chain` on its dense factors, so every row is exact to
rounding. Queries that need a max or a sample over paths (MAP, k-best, sampling, entropy) run in log
space on dense chunks.

Memory: each query allocates its output, then processes ``rows_per_chunk`` rows at a time, chosen so
the chunk's working tensors stay under the budget (:func:`get_memory_budget`, default
:data:`DEFAULT_MEMORY_BUDGET` = 256 MiB; change it with :func:`set_memory_budget`, the
:func:`memory_budget` context manager, or the ``budget=`` argument of every query). Without gradients,
peak memory is the budget plus the inputs and the outputs, whatever ``n``. Chunks are moved to the
device of the gates one at a time, so the data may stay on the CPU.

Shapes: ``n`` rows, ``c`` rows of a chunk, ``N`` positions, ``L`` hops, ``S`` symbols, ``T`` targets.
"""

from __future__ import annotations

import contextlib
import math
from typing import Callable, Iterator, NamedTuple, Optional

import torch

from .data import Observations
from . import hop_chain as _hop_chain
from .gates import flat_gather, flat_index, table_gather
from .hop_chain import HopChain, chain_log_likelihood, chain_map_paths, chain_posterior, masked_log_softmax

__all__ = [
    "HopGates",
    "DEFAULT_MEMORY_BUDGET",
    "SYMBOL_ROUTE_RATIO",
    "get_memory_budget",
    "set_memory_budget",
    "memory_budget",
    "chain_from_scores",
    "choose_route",
    "log_likelihood",
    "predict_proba",
    "hop_marginals",
    "value_marginals",
    "pairwise_marginals",
    "posterior_marginals",
    "map_paths",
    "sample_paths",
    "path_entropy",
    "k_best_paths",
    "forward_backward_chunks",
    "dense_chunks",
    "ChunkPosterior",
]

#: Default working-memory budget of one chunk, in bytes (256 MiB).
DEFAULT_MEMORY_BUDGET = 256 * 2**20
_budget = [DEFAULT_MEMORY_BUDGET]

#: A forward pass (log-likelihood, predictive, and their gradients) takes the symbol route while
#: ``S^2 <= SYMBOL_ROUTE_RATIO * N^2``; a forward-backward pass (marginals, the EM statistics), whose
#: dense route also forms pairwise terms, while ``S^2 <= 4 * SYMBOL_ROUTE_RATIO * N^2``. Measured with
#: ``L = 3`` (one thread): the forward crossover lies at ``S`` about ``4 N`` for ``N`` = 10, 30 and 100; the
#: E-step's at ``S`` about ``4 N`` for ``N = 10`` and beyond ``8 N`` for ``N`` = 30 and 100 (see docs/engine.md).
SYMBOL_ROUTE_RATIO = 16.0


# -- the memory budget ---------------------------------------------------------------------------------------
def _check_budget(budget) -> int:
    if isinstance(budget, bool) or not isinstance(budget, (int, float)):
        raise TypeError(f"budget must be a positive number of bytes, got {budget!r}")
    if not math.isfinite(budget) or budget <= 0:
        raise ValueError(f"budget must be a positive number of bytes, got {budget!r}")
    return int(budget)


def get_memory_budget() -> int:
    """The default working-memory budget of one chunk, in bytes."""
    return _budget[0]


def set_memory_budget(budget: int) -> None:
    """Set the default working-memory budget of one chunk, in bytes (positive)."""
    _budget[0] = _check_budget(budget)


@contextlib.contextmanager
def memory_budget(budget: int):
    """Context manager: the default budget is ``budget`` bytes inside the block."""
    previous = _budget[0]
    set_memory_budget(budget)
    try:
        yield
    finally:
        _budget[0] = previous


def _resolve_budget(budget) -> int:
    return _budget[0] if budget is None else _check_budget(budget)


# -- what a head hands the engine -----------------------------------------------------------------------------
class HopGates:
    """A head's gate and emission, as the engine needs them.

    :ivar log_emission: ``(S, T)`` normalised log emission table.
    :ivar dense_chain: ``Observations -> HopChain``, the dense log factors of a chunk (``init (c, N)``,
        ``trans (L - 1, c, N, N)``).
    :ivar n_hops: ``L``.
    :ivar scores: ``(L, S, S)`` or None; ``scores[l, q, k]`` is the unnormalised logit of hop ``l + 1``
        when its query symbol ``q`` meets key symbol ``k``. None when the gate depends on more than the
        two symbols (then only the dense log factors are available).
    :ivar position_emission: None (the target is emitted from the last attended value through
        ``log_emission``), or ``chunk -> (c, N, T)`` normalised log-probabilities of every target given
        that the last hop attends position ``i``: an emission that reads more of a position than its value
        (the structured-facts head's copy emission). With it, ``scores`` must be None.
    :ivar position_target: None, or ``chunk -> (c, N)``: ``position_emission``'s entry of each row's target
        alone, when the head computes it for less than the ``(c, N, T)`` table.
    :ivar extra_elements: None, or ``N -> elements``: working memory per row, in elements, that the head's
        ``dense_chain`` and ``position_emission`` need beyond the engine's count (chunks shrink to fit).
    """

    def __init__(self, log_emission: torch.Tensor, dense_chain: Callable[[Observations], HopChain], n_hops: int,
                 scores: Optional[torch.Tensor] = None,
                 position_emission: Optional[Callable[[Observations], torch.Tensor]] = None,
                 extra_elements: Optional[Callable[[int], float]] = None,
                 position_target: Optional[Callable[[Observations], torch.Tensor]] = None):
        if position_emission is not None and scores is not None:
            raise ValueError("a gate with a position_emission has no symbol score tables (scores must be None)")
        self.log_emission = log_emission
        self.dense_chain = dense_chain
        self.n_hops = n_hops
        self.scores = scores
        self.position_emission = position_emission
        self.extra_elements = extra_elements
        self.position_target = position_target
        self._transition_weights = None

    def replace(self, **changes) -> "HopGates":
        """A copy with some fields changed."""
        fields = {"log_emission": self.log_emission, "dense_chain": self.dense_chain, "n_hops": self.n_hops,
                  "scores": self.scores, "position_emission": self.position_emission,
                  "extra_elements": self.extra_elements, "position_target": self.position_target}
        fields.update(changes)
        return HopGates(**fields)

    def target_log_probs(self, chunk: Observations) -> torch.Tensor:
        """``(c, N)``: ``log p(target_c | z_L = i)`` at every position of a chunk."""
        if self.position_emission is None:
            return self.log_emission[chunk.values, chunk.target.unsqueeze(-1)]
        if self.position_target is not None:
            return self.position_target(chunk)
        return self.position_emission(chunk).gather(-1, chunk.target.view(-1, 1, 1).expand(-1, chunk.context_len, 1)).squeeze(-1)

    @property
    def transition_weights(self) -> torch.Tensor:
        """``(L - 1, S, S)``: ``exp(scores[l] - max_k scores[l, :, k])`` for the hops after the first (row
        maximum 1), computed once per :class:`HopGates` and shared by every chunk."""
        if self._transition_weights is None:
            later = self.scores[1:]
            # The row shift cancels in every normalised transition, so its gradient is exactly 0: detached.
            self._transition_weights = (later - later.amax(-1, keepdim=True).detach()).exp()
        return self._transition_weights


def chain_from_scores(scores: torch.Tensor, obs: Observations) -> HopChain:
    """The dense log factors of ``obs`` for a gate given by the score tables ``scores`` ``(L, S, S)``.

    In formulas (padding positions excluded from every softmax)::

        init[c, j]        = log softmax_j scores[0][query_c, key_cj]
        trans[l, c, i, j] = log softmax_j scores[l + 1][value_ci, key_cj]
    """
    mask = obs.mask
    init = _first_hop_log_probs(scores, obs)
    n, N = obs.keys.shape
    if scores.shape[0] == 1:
        return HopChain(init, init.new_zeros(0, n, N, N))
    # Position i's value meets position j's key: one flat index for every hop's table.
    index = flat_index(obs.values.unsqueeze(-1), obs.keys.unsqueeze(-2), scores.shape[-1])  # (c, N, N)
    pair_mask = None if mask is None else mask.unsqueeze(-2)
    later = scores[1:]
    if later.shape[0] > 1 and later.stride(0) == 0:  # one table for every hop (the tied head): compute it once
        trans = masked_log_softmax(flat_gather(later[0], index), pair_mask)
        return HopChain(init, trans.unsqueeze(0).expand(later.shape[0], n, N, N))
    trans = torch.stack([masked_log_softmax(flat_gather(table, index), pair_mask) for table in later])
    return HopChain(init, trans)


def choose_route(gates: HopGates, context_len: int, backward: bool = False) -> str:
    """``"symbols"`` or ``"positions"`` for rows of ``context_len`` positions, for a forward pass or (with
    ``backward``) a forward-backward pass (see :data:`SYMBOL_ROUTE_RATIO`)."""
    if gates.scores is None:
        return "positions"
    S = gates.scores.shape[-1]
    ratio = SYMBOL_ROUTE_RATIO * (4 if backward else 1)
    return "symbols" if S * S <= ratio * context_len * context_len else "positions"


# -- chunking ----------------------------------------------------------------------------------------------------
def _bytes_per_row(route: str, L: int, N: int, S: int, itemsize: int, extra: float = 0.0) -> float:
    """Working memory of one row of a chunk on ``route``, in bytes (a generous count of live tensors)."""
    if route == "symbols":  # measured peaks at n = 200 000, N = 100, S = 50 were 1.5x the earlier, smaller count
        elements = (5 * L + 9) * N + (6 * L + 3) * S
    else:  # dense factors, their exponentials and the temporaries of a batched product or logsumexp
        elements = (2 * max(L - 1, 1) + 3) * N * N + (3 * L + 4) * N
    return (elements + extra) * itemsize + 8 * 4 * N  # int64 index tensors


def _chunks(n: int, rows: int) -> Iterator[slice]:
    for start in range(0, n, rows):
        yield slice(start, min(n, start + rows))


def _rows_per_chunk(gates: HopGates, N: int, route: str, budget, extra: float = 0.0) -> int:
    S = gates.log_emission.shape[0]
    itemsize = gates.log_emission.element_size()
    extra = extra + (0.0 if gates.extra_elements is None else gates.extra_elements(N))
    return max(1, int(_resolve_budget(budget) // _bytes_per_row(route, gates.n_hops, N, S, itemsize, extra)))


def _floor(dtype) -> float:
    """Sums below this may hold imprecise subnormals; rows that reach it go to log space."""
    info = torch.finfo(dtype)
    return info.tiny / info.eps


def _device_chunk(obs: Observations, rows: slice, device) -> Observations:
    chunk = obs[rows]
    return chunk if chunk.device == device else chunk.to(device)


# -- the two transition operators -------------------------------------------------------------------------------
class _SymbolTransitions:
    """Hop transitions of a chunk factored through symbol space (module docstring).

    ``forward(l, alpha)``: ``alpha'[j] = sum_i alpha[i] P_l[i, j]``; ``backward(l, beta)``:
    ``beta'[i] = sum_j P_l[i, j] beta[j]``; ``ok``: rows whose normalisers are all representable.
    """

    def __init__(self, gates: HopGates, chunk: Observations):
        scores = gates.scores
        self.gates = gates.transition_weights  # (L - 1, S, S), row max 1
        self.keys, self.values = chunk.keys, chunk.values
        self.real = chunk.full_mask().to(scores.dtype)
        c, S = self.keys.shape[0], scores.shape[-1]
        self.c, self.S = c, S
        key_counts = self.by_symbol(self.keys, self.real)  # real positions carrying each key
        present = self.by_symbol(self.values, self.real) > 0  # value symbols at real positions
        floor = _floor(scores.dtype)
        self.ok = torch.ones(c, dtype=torch.bool, device=self.keys.device)
        normalisers = []
        for gate in self.gates:
            normaliser = key_counts @ gate.transpose(0, 1)  # R[c, v] = sum_j E[v, key_j]
            self.ok &= ((normaliser >= floor) | ~present).all(-1)
            normalisers.append(normaliser)
        # Absent values are never divided by; the rows that fail are recomputed in log space by the caller, and
        # get normaliser 1 here so that every value, and every (discarded) gradient through them, stays finite.
        # 1 / R is formed as exp(-log R): the backward of a division squares R, which underflows for R < 1e-154
        # in float64 (1e-19 in float32), and 0 * inf would turn a zero gradient into NaN.
        divide = present & self.ok.unsqueeze(-1)
        self.inverse_normalisers = [torch.where(divide, r, torch.ones_like(r)).log().neg().exp() for r in normalisers]

    def by_symbol(self, index: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """``out[c, s] = sum_i x[c, i] [index[c, i] = s]``."""
        return x.new_zeros(self.c, self.S).scatter_add(1, index, x)

    def leaving(self, hop: int, alpha: torch.Tensor) -> torch.Tensor:
        """``(c, S)``: ``sum_{i: value_i = v} alpha[i] / R[v]``, the mass leaving through value ``v``."""
        return self.by_symbol(self.values, alpha) * self.inverse_normalisers[hop]

    def arriving(self, beta: torch.Tensor) -> torch.Tensor:
        """``(c, S)``: ``sum_{j: key_j = k} beta[j]``."""
        return self.by_symbol(self.keys, beta)

    def forward(self, hop: int, alpha: torch.Tensor) -> torch.Tensor:
        return (self.leaving(hop, alpha) @ self.gates[hop]).gather(1, self.keys) * self.real

    def backward(self, hop: int, beta: torch.Tensor) -> torch.Tensor:
        arriving = self.arriving(beta) @ self.gates[hop].transpose(0, 1)
        return (arriving * self.inverse_normalisers[hop]).gather(1, self.values) * self.real


class _PositionTransitions:
    """Hop transitions of a chunk as dense ``(c, N, N)`` matrices ``P = diag(1 / R) W``.

    With score tables, ``W[i, j] = E_l[value_i, key_j]`` (the shared ``transition_weights``, gathered; padding
    columns zero) and ``R`` its row sums, so a hop costs one gather, one sum and one batched product, with no
    logarithm or exponential per entry; rows whose ``R`` underflows are flagged in ``ok`` for the log-space
    recompute. Without tables (position-dependent gates), ``W`` is the exponential of the head's dense log
    factors and ``R = 1``.
    """

    def __init__(self, gates: HopGates, chunk: Observations, chain: Optional[HopChain]):
        c, N = len(chunk), chunk.context_len
        self.ok = torch.ones(c, dtype=torch.bool, device=chunk.device)
        if chain is not None:
            self.weights = chain.trans.exp()  # (L - 1, c, N, N), rows on the simplex
            self.inverse_normalisers = None
            return
        floor = _floor(gates.scores.dtype)
        real = None if chunk.mask is None else chunk.mask.to(gates.scores.dtype).unsqueeze(-2)
        index = flat_index(chunk.values.unsqueeze(-1), chunk.keys.unsqueeze(-2), gates.scores.shape[-1])  # (c, N, N)
        weights, normalisers = [], []
        for table in gates.transition_weights:
            weight = flat_gather(table, index)  # (c, N, N): W[i, j] = E[value_i, key_j]
            weight = weight if real is None else weight * real
            normaliser = weight.sum(-1)  # R[c, i]
            self.ok &= ((normaliser >= floor) | ~chunk.full_mask()).all(-1)
            weights.append(weight)
            normalisers.append(normaliser)
        self.weights = weights
        # As in the symbol route: 1 / R as exp(-log R), failing rows and padding rows get R = 1.
        divide = chunk.full_mask() & self.ok.unsqueeze(-1)
        self.inverse_normalisers = [torch.where(divide, r, torch.ones_like(r)).log().neg().exp() for r in normalisers]

    def matrix(self, hop: int) -> torch.Tensor:
        """``(c, N, N)`` transition probabilities of hop ``hop + 2`` (0-based ``hop``)."""
        if self.inverse_normalisers is None:
            return self.weights[hop]
        return self.weights[hop] * self.inverse_normalisers[hop].unsqueeze(-1)

    def forward(self, hop: int, alpha: torch.Tensor) -> torch.Tensor:
        if self.inverse_normalisers is not None:
            alpha = alpha * self.inverse_normalisers[hop]
        return torch.bmm(alpha.unsqueeze(-2), self.weights[hop]).squeeze(-2)

    def backward(self, hop: int, beta: torch.Tensor) -> torch.Tensor:
        beta = torch.bmm(self.weights[hop], beta.unsqueeze(-1)).squeeze(-1)
        return beta if self.inverse_normalisers is None else beta * self.inverse_normalisers[hop]


class _Chunk(NamedTuple):
    """One chunk prepared for the recursion: its first-hop distribution, transitions and dense chain."""

    obs: Observations
    init: torch.Tensor  # (c, N) p(z_1 = i)
    transitions: object
    chain: Optional[HopChain]  # dense log factors (positions route), else built on demand for failing rows


def _first_hop_log_probs(scores: torch.Tensor, obs: Observations) -> torch.Tensor:
    """``(c, N)`` ``log p(z_1 = i)`` from the score table of hop 1 (padding excluded)."""
    return masked_log_softmax(table_gather(scores[0], obs.query.unsqueeze(-1), obs.keys), obs.mask)


def _first_hop(gates: HopGates, chunk: Observations) -> torch.Tensor:
    """``(c, N)`` ``p(z_1 = i)``."""
    return _first_hop_log_probs(gates.scores, chunk).exp()


def _prepare(gates: HopGates, chunk: Observations, route: str) -> _Chunk:
    if route == "symbols":
        return _Chunk(chunk, _first_hop(gates, chunk), _SymbolTransitions(gates, chunk), None)
    if gates.scores is not None:
        return _Chunk(chunk, _first_hop(gates, chunk), _PositionTransitions(gates, chunk, None), None)
    chain = gates.dense_chain(chunk)
    return _Chunk(chunk, chain.init.exp(), _PositionTransitions(gates, chunk, chain), chain)


def _forward(prepared: _Chunk, L: int) -> list:
    """Prior messages ``alpha[l] (c, N) = p(z_{l+1} = i)``; distributions, no rescaling needed."""
    alphas = [prepared.init]
    for hop in range(L - 1):
        alphas.append(prepared.transitions.forward(hop, alphas[-1]))
    return alphas


def _shifted_emission(gates: HopGates, chunk: Observations):
    """``(exp(log_emission[value_i, target] - shift) * real (c, N), shift (c,), ok (c,))``."""
    log_emission = gates.target_log_probs(chunk)
    real = chunk.full_mask()
    shift = log_emission.masked_fill(~real, -math.inf).amax(-1)
    finite = torch.isfinite(shift)
    shift = torch.where(finite, shift, torch.zeros_like(shift))
    emission = (log_emission - shift.unsqueeze(-1)).exp() * real
    return emission, shift, finite


def _rows_in_log_space(gates: HopGates, prepared: _Chunk, rows: torch.Tensor):
    """``(sub-chunk, its dense log factors, its (c', N) log emission)`` for the ``rows`` of a chunk that the
    probability-space route could not compute (the dense factors are reused when the route built them)."""
    sub = prepared.obs[rows]
    if prepared.chain is None:
        chain = gates.dense_chain(sub)
    else:
        chain = HopChain(prepared.chain.init[rows], prepared.chain.trans[:, rows])
    return sub, chain, gates.target_log_probs(sub)


def _log_likelihood_chunk(gates: HopGates, chunk: Observations, route: str) -> torch.Tensor:
    """``(c,)`` exact log-likelihoods of a chunk, differentiable; failing rows recomputed in log space."""
    prepared = _prepare(gates, chunk, route)
    alpha = _forward(prepared, gates.n_hops)[-1]
    emission, shift, ok = _shifted_emission(gates, chunk)
    total = (alpha * emission).sum(-1)
    floor = _floor(total.dtype)
    ok = ok & prepared.transitions.ok & (total >= floor)
    result = total.clamp_min(floor).log() + shift
    if ok.all():
        return result
    bad = (~ok).nonzero().squeeze(-1)
    sub, chain, log_emission = _rows_in_log_space(gates, prepared, bad)
    return result.index_put((bad,), chain_log_likelihood(chain, log_emission))


# -- forward-backward ----------------------------------------------------------------------------------------
class ChunkPosterior:
    """The posterior of one chunk, as :func:`forward_backward_chunks` yields it.

    :ivar rows: LongTensor, the chunk's rows in the data. :ivar obs: the chunk (on the gates' device).
    :ivar log_likelihood: ``(c,)``.
    :ivar route: ``"symbols"``, ``"positions"`` or ``"log"`` (the log-space recompute of failing rows).
    :ivar alphas, betas: per hop ``(c, N)`` prior and (rescaled) backward messages (not for ``"log"``).
    :ivar totals: per hop ``(c,)``, ``sum_i alpha[l][i] beta[l][i]`` (the normaliser of hop ``l``'s marginal).
    :ivar transitions: the route's operator (symbol route: ``leaving``/``arriving``/``gates``).
    :ivar pairwise: ``(L - 1, c, N, N)`` for the ``"log"`` route or when asked for, else None.
    """

    def __init__(self, rows, obs, log_likelihood, route, alphas=None, betas=None, totals=None, transitions=None,
                 pairwise=None, hop_marginals=None):
        self.rows, self.obs, self.log_likelihood, self.route = rows, obs, log_likelihood, route
        self.alphas, self.betas, self.totals, self.transitions = alphas, betas, totals, transitions
        self.pairwise = pairwise
        self._hop_marginals = hop_marginals

    @property
    def hop_marginals(self) -> torch.Tensor:
        """``(L, c, N)`` posterior ``p(z_l = i | observation)`` (computed on first use)."""
        if self._hop_marginals is None:
            self._hop_marginals = torch.stack(
                [a * b / t.unsqueeze(-1) for a, b, t in zip(self.alphas, self.betas, self.totals)]
            )
        return self._hop_marginals

    def pairwise_at(self, hop: int) -> torch.Tensor:
        """``(c, N, N)`` pairwise posterior of hops ``hop + 1`` and ``hop + 2`` (0-based ``hop``)."""
        if self.pairwise is not None:
            return self.pairwise[hop]
        return _pairwise(self.transitions, hop, self.alphas[hop], self.betas[hop + 1], self.totals[hop + 1])


def _posterior_chunk(gates: HopGates, chunk: Observations, route: str, pairwise: bool):
    """Forward-backward of one chunk: ``(ChunkPosterior of the rows computed in probability space,
    ChunkPosterior of the failing rows in log space or None)``; row indices relative to the chunk."""
    L = gates.n_hops
    prepared = _prepare(gates, chunk, route)
    alphas = _forward(prepared, L)
    emission, shift, ok = _shifted_emission(gates, chunk)
    floor = _floor(emission.dtype)
    ok = ok & prepared.transitions.ok
    betas = [emission]
    for hop in range(L - 2, -1, -1):
        beta = prepared.transitions.backward(hop, betas[0])
        scale = beta.amax(-1, keepdim=True)
        ok &= (scale.squeeze(-1) >= floor) & torch.isfinite(scale.squeeze(-1))
        betas.insert(0, beta / scale.clamp_min(floor))
    totals = [(alpha * beta).sum(-1) for alpha, beta in zip(alphas, betas)]
    for total in totals:
        ok &= (total >= floor) & torch.isfinite(total)
    good = ok.nonzero().squeeze(-1) if not ok.all() else None

    def keep(x):
        return x if good is None else x[good]

    totals = [keep(t) for t in totals]
    alphas, betas = [keep(a) for a in alphas], [keep(b) for b in betas]
    transitions = prepared.transitions
    if good is not None:
        transitions = _select_transitions(transitions, good)
    pair = None
    if pairwise and L > 1:
        pair = torch.stack([_pairwise(transitions, hop, alphas[hop], betas[hop + 1], totals[hop + 1]) for hop in range(L - 1)])
    main = ChunkPosterior(
        good if good is not None else slice(None),
        chunk if good is None else chunk[good],
        totals[-1].log() + keep(shift),
        route,
        alphas,
        betas,
        totals,
        transitions,
        pair,
    )
    if good is None:
        return main, None
    bad = (~ok).nonzero().squeeze(-1)
    sub, chain, log_emission = _rows_in_log_space(gates, prepared, bad)
    exact = chain_posterior(chain, log_emission)
    fallback = ChunkPosterior(bad, sub, exact.log_likelihood, "log", pairwise=exact.pairwise_marginals,
                              hop_marginals=exact.hop_marginals)
    return main, fallback


def _select_transitions(transitions, rows: torch.Tensor):
    """The operator restricted to ``rows`` (for the statistics of the rows kept in probability space)."""
    if isinstance(transitions, _PositionTransitions):
        selected = object.__new__(_PositionTransitions)
        selected.weights = [w[rows] for w in transitions.weights]
        selected.inverse_normalisers = (None if transitions.inverse_normalisers is None
                                        else [r[rows] for r in transitions.inverse_normalisers])
        selected.ok = transitions.ok[rows]
        return selected
    selected = object.__new__(_SymbolTransitions)
    selected.gates = transitions.gates
    selected.keys, selected.values, selected.real = transitions.keys[rows], transitions.values[rows], transitions.real[rows]
    selected.c, selected.S = len(rows), transitions.S
    selected.ok = transitions.ok[rows]
    selected.inverse_normalisers = [r[rows] for r in transitions.inverse_normalisers]
    return selected


def _pairwise(transitions, hop: int, alpha: torch.Tensor, beta: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
    """``(c, N, N)``: ``p(z_{hop+1} = i, z_{hop+2} = j | obs) = alpha[i] P[i, j] beta[j] / total``."""
    if isinstance(transitions, _PositionTransitions):
        matrix = transitions.matrix(hop)
    else:
        gate = transitions.gates[hop]
        matrix = gate[transitions.values.unsqueeze(-1), transitions.keys.unsqueeze(-2)]
        matrix = matrix * transitions.inverse_normalisers[hop].gather(1, transitions.values).unsqueeze(-1)
        matrix = matrix * transitions.real.unsqueeze(-2)
    return alpha.unsqueeze(-1) * matrix * beta.unsqueeze(-2) / total.view(-1, 1, 1)


def forward_backward_chunks(gates: HopGates, obs: Observations, budget=None, pairwise: bool = False, route=None,
                            rows: Optional[int] = None):
    """Yield :class:`ChunkPosterior` objects covering every row of ``obs`` once (the E-step's source).

    Rows of a chunk that the probability-space route computes are yielded in one object (``route`` =
    ``"symbols"``/``"positions"``, with messages), the rest in a second (``route = "log"``, with pairwise
    marginals). Their ``rows`` index ``obs``.

    :param route: force ``"symbols"`` or ``"positions"`` (default :func:`choose_route`).
    :param rows: rows per chunk (default: as many as the budget allows).
    """
    n, N = len(obs), obs.context_len
    route = choose_route(gates, N, backward=True) if route is None else route
    if route == "symbols" and gates.scores is None:
        raise ValueError("route 'symbols' needs gate score tables; this gate has position terms")
    device = gates.log_emission.device
    extra = (gates.n_hops - 1) * N * N if pairwise else 0.0
    rows_per_chunk = _rows_per_chunk(gates, N, route, budget, extra) if rows is None else rows
    with torch.no_grad():
        for rows in _chunks(n, rows_per_chunk):
            chunk = _device_chunk(obs, rows, device)
            main, fallback = _posterior_chunk(gates, chunk, route, pairwise)
            offset = torch.arange(rows.start, rows.stop, device=device)
            main.rows = offset[main.rows]
            yield main
            if fallback is not None:
                fallback.rows = offset[fallback.rows]
                yield fallback


# -- the queries -------------------------------------------------------------------------------------------------
def log_likelihood(gates: HopGates, obs: Observations, budget=None) -> torch.Tensor:
    """``(n,)`` exact ``log p(target | context, query)``; differentiable in the gates when grad is enabled
    (the autograd graph then holds every chunk's messages: ``O(n (L S + N))`` for the symbol route)."""
    n, N = len(obs), obs.context_len
    route = choose_route(gates, N)
    device = gates.log_emission.device
    rows_per_chunk = _rows_per_chunk(gates, N, route, budget)
    # Concatenated, not written into a preallocated output, so that the result keeps every chunk's graph
    # whenever any input of the gates requires grad.
    chunks = _chunks(n, rows_per_chunk) if n else [slice(0, 0)]  # an empty shard still gives a (0,) result
    return torch.cat([_log_likelihood_chunk(gates, _device_chunk(obs, rows, device), route) for rows in chunks])


def predict_proba(gates: HopGates, obs: Observations, budget=None) -> torch.Tensor:
    """``(n, T)`` predictive target distribution, the hop latents marginalised (targets of ``obs`` unused)."""
    n, N = len(obs), obs.context_len
    S, T = gates.log_emission.shape
    route = choose_route(gates, N)
    device = gates.log_emission.device
    emission = gates.log_emission.exp()
    # mix by value symbol: (c, S) x (S, T), a BLAS product, beats gathering (c, N, T) rows
    by_symbol = S <= 4 * N and gates.position_emission is None
    rows_per_chunk = _rows_per_chunk(gates, N, route, budget, extra=(S if by_symbol else 2 * N * T) + T)
    out = emission.new_empty(n, T)
    for rows in _chunks(n, rows_per_chunk):
        chunk = _device_chunk(obs, rows, device)
        alpha = _forward(_prepare(gates, chunk, route), gates.n_hops)[-1]  # (c, N) p(z_L = i)
        if gates.position_emission is not None:
            out[rows] = torch.bmm(alpha.unsqueeze(-2), gates.position_emission(chunk).exp()).squeeze(-2)
        elif by_symbol:
            weights = alpha.new_zeros(len(chunk), S).scatter_add_(1, chunk.values, alpha)
            out[rows] = weights @ emission
        else:
            out[rows] = torch.bmm(alpha.unsqueeze(-2), emission[chunk.values]).squeeze(-2)
    return out


def posterior_marginals(gates: HopGates, obs: Observations, budget=None, pairwise: bool = False):
    """``(log_likelihood (n,), hop_marginals (L, n, N), pairwise (L - 1, n, N, N) or None)`` in one
    forward-backward pass; the pairwise marginals (``O(L n N^2)`` memory) only with ``pairwise=True``."""
    L, n, N = gates.n_hops, len(obs), obs.context_len
    log_likelihood_out = gates.log_emission.new_empty(n)
    marginals = gates.log_emission.new_empty(L, n, N)
    pairs = gates.log_emission.new_zeros(L - 1, n, N, N) if pairwise else None
    for part in forward_backward_chunks(gates, obs, budget, pairwise=pairwise and L > 1):
        log_likelihood_out[part.rows] = part.log_likelihood
        marginals[:, part.rows] = part.hop_marginals
        if pairwise and L > 1:
            pairs[:, part.rows] = part.pairwise
    return log_likelihood_out, marginals, pairs


def hop_marginals(gates: HopGates, obs: Observations, budget=None) -> torch.Tensor:
    """``(L, n, N)`` posterior ``p(z_l = i | observation)``."""
    return posterior_marginals(gates, obs, budget)[1]


def pairwise_marginals(gates: HopGates, obs: Observations, budget=None) -> torch.Tensor:
    """``(L - 1, n, N, N)`` posterior ``p(z_l = i, z_{l+1} = j | observation)``: ``O(L n N^2)`` memory."""
    return posterior_marginals(gates, obs, budget, pairwise=True)[2]


def value_marginals(gates: HopGates, obs: Observations, budget=None) -> torch.Tensor:
    """``(L, n, S)``: the posterior probability that hop ``l`` attends a position whose value is ``s``."""
    L, n, S = gates.n_hops, len(obs), gates.log_emission.shape[0]
    out = gates.log_emission.new_zeros(L, n, S)

    for part in forward_backward_chunks(gates, obs, budget):
        values = part.obs.values.unsqueeze(0).expand(L, -1, -1)
        out[:, part.rows] = part.hop_marginals.new_zeros(L, len(part.obs), S).scatter_add_(2, values, part.hop_marginals)
    return out


def dense_chunks(gates: HopGates, obs: Observations, budget, extra: float = 0.0):
    """``(rows, chunk, chain, log_emission)`` over dense log-space chunks (for max and sampling queries)."""
    n, N = len(obs), obs.context_len
    device = gates.log_emission.device
    with torch.no_grad():
        for rows in _chunks(n, _rows_per_chunk(gates, N, "positions", budget, extra)):
            chunk = _device_chunk(obs, rows, device)
            yield rows, chunk, gates.dense_chain(chunk), gates.target_log_probs(chunk)


def map_paths(gates: HopGates, obs: Observations, budget=None, given_target: bool = True) -> torch.Tensor:
    """``(n, L)`` LongTensor, the most probable hop path given the target (Viterbi; ties to the lowest index);
    with ``given_target=False`` the most probable path of the prior chain (targets ignored)."""
    out = torch.empty(len(obs), gates.n_hops, dtype=torch.long, device=gates.log_emission.device)
    for rows, _, chain, log_emission in dense_chunks(gates, obs, budget):
        out[rows] = chain_map_paths(chain, log_emission if given_target else torch.zeros_like(log_emission))
    return out


def sample_paths(gates: HopGates, obs: Observations, num_samples: int, generator=None, budget=None) -> torch.Tensor:
    """``(num_samples, n, L)`` hop paths drawn from the posterior given the target (forward filtering,
    backward sampling)."""
    out = torch.empty(num_samples, len(obs), gates.n_hops, dtype=torch.long, device=gates.log_emission.device)
    extra = 2 * num_samples * obs.context_len
    for rows, _, chain, log_emission in dense_chunks(gates, obs, budget, extra):
        out[:, rows] = _hop_chain.chain_sample_posterior(chain, log_emission, num_samples, generator)
    return out


def path_entropy(gates: HopGates, obs: Observations, budget=None, given_target: bool = True) -> torch.Tensor:
    """``(n,)`` exact entropy (nats) of the posterior over hop paths given the target; with
    ``given_target=False``, of the prior chain (the uncertainty before the target is seen)."""
    out = gates.log_emission.new_empty(len(obs))
    N = obs.context_len
    for rows, _, chain, log_emission in dense_chunks(gates, obs, budget, extra=2 * N * N):
        log_emission = log_emission if given_target else torch.zeros_like(log_emission)
        out[rows] = _hop_chain.chain_entropy(chain, log_emission)
    return out


def k_best_paths(gates: HopGates, obs: Observations, k: int, budget=None):
    """``(paths (n, k, L), log_probs (n, k))``: the ``k`` most probable hop paths given the target, best
    first, with their posterior log-probabilities; ``-inf`` rows where fewer than ``k`` paths exist."""
    n, L, N = len(obs), gates.n_hops, obs.context_len
    device = gates.log_emission.device
    paths = torch.zeros(n, k, L, dtype=torch.long, device=device)
    log_probs = gates.log_emission.new_empty(n, k)
    for rows, _, chain, log_emission in dense_chunks(gates, obs, budget, extra=3 * N * N * k):
        paths[rows], log_probs[rows] = _hop_chain.chain_k_best(chain, log_emission, k)
    return paths, log_probs
