"""The transitions of one chunk of rows: one small protocol (:class:`Transitions`), two implementations.

- :class:`SymbolTransitions` (the symbol route): the transition of hop ``l`` from position ``i`` to ``j`` is
  ``E_l[value_i, key_j] / R_l[value_i]`` with ``E_l = exp(scores[l] - rowmax)`` and ``R_l`` the row's
  normaliser, so a message crosses a hop as ``(c, S) x (S, S)`` products and a scatter/gather over the
  positions: ``O(S^2 + N)`` per row and hop, no ``(N, N)`` tensor;
- :class:`PositionTransitions` (the position route): the ``(c, N, N)`` transition matrices of the chunk and
  batched products, ``O(N^2)`` per row and hop.

Every recursion of the engine (:mod:`.recursion`) and the EM statistics go through the protocol, so a new
gate plugs in as one more implementation, and a new query as one more method with a generic default (built
on :meth:`Transitions.matrix`) that an implementation may override with a faster one. Which route a chunk
takes, and preparing a chunk on it, is :mod:`.routes`.

Shapes: ``c`` rows, ``N`` positions, ``S`` symbols; ``hop`` indexes the ``L - 1`` transitions (0-based:
transition ``hop`` goes from ``z_{hop+1}`` to ``z_{hop+2}``).
"""

from __future__ import annotations

import warnings
from typing import List, Optional

import torch

from ..gate_ops import exp, flat_gather, small_flat_index
from .hop_factors import HopFactors
from .log_space import HopChain
from .moved_names import deprecated_aliases
from .recursion import underflow_floor

__all__ = [
    "Transitions",
    "SymbolTransitions",
    "PositionTransitions",
    "key_statistics_from_pairwise",
]

# Moved to .routes (route choice) and .budget (working memory per row), kept here for one release.
__getattr__ = deprecated_aliases(__name__, {
    **{name: ("pyro_multihop.engine.routes", name)
       for name in ("PreparedChunk", "prepare", "dense_retries", "DENSE_RETRY_ELEMENTS")},
    **{name: ("pyro_multihop.engine.budget", name) for name in ("bytes_per_row", "rows_per_chunk")},
})


def key_statistics_from_pairwise(pairwise: torch.Tensor, keys: torch.Tensor, values: torch.Tensor,
                                 num_symbols: int) -> torch.Tensor:
    """``(S, S)``: ``out[k, s] = sum_c sum_ij pairwise[c, i, j] [key_cj = k] [value_ci = s]``, from explicit
    (weighted) pairwise terms ``(c, N, N)``: one ``index_add`` of ``c N^2`` entries."""
    S = num_symbols
    flat = (keys.unsqueeze(-2) * S + values.unsqueeze(-1)).flatten()
    return pairwise.new_zeros(S * S).index_add_(0, flat, pairwise.flatten()).view(S, S)


class Transitions:
    """The hop transitions ``P_hop[c, i, j] = p(z_{hop+2} = j | z_{hop+1} = i)`` of one chunk.

    An implementation provides :attr:`ok`, :meth:`select`, :meth:`forward`, :meth:`backward` and
    :meth:`matrix`; the other methods have generic versions built on :meth:`matrix` (``O(N^2)`` per row and
    hop) that an implementation may replace.

    :ivar ok: ``(c,)`` bool, rows whose transitions are representable in probability space (the caller retries
        the others on their dense factors, :func:`~.routes.dense_retries`).
    :ivar keys, values: ``(c, N)`` symbols of the chunk, or None (a gate without symbol tables).
    :ivar num_symbols: ``S`` (for :meth:`key_statistics`).
    """

    ok: torch.Tensor
    keys: Optional[torch.Tensor]
    values: Optional[torch.Tensor]
    num_symbols: int

    def select(self, rows: torch.Tensor) -> "Transitions":
        """The transitions of ``rows`` (a LongTensor of rows of this chunk) alone."""
        raise NotImplementedError

    def forward(self, message: torch.Tensor, hop: int) -> torch.Tensor:
        """``(c, N)``: ``out[j] = sum_i message[i] P[i, j]``."""
        raise NotImplementedError

    def backward(self, message: torch.Tensor, hop: int) -> torch.Tensor:
        """``(c, N)``: ``out[i] = sum_j P[i, j] message[j]``."""
        raise NotImplementedError

    def matrix(self, hop: int) -> torch.Tensor:
        """``(c, N, N)``: ``P[i, j]``."""
        raise NotImplementedError

    def pairwise(self, hop: int, alpha: torch.Tensor, beta: torch.Tensor, total: torch.Tensor) -> torch.Tensor:
        """``(c, N, N)``: ``alpha[i] P[i, j] beta[j] / total``, the pairwise posterior of ``z_{hop+1}, z_{hop+2}``
        given the forward message of the first, the backward message of the second and their normaliser."""
        return alpha.unsqueeze(-1) * self.matrix(hop) * beta.unsqueeze(-2) / total.view(-1, 1, 1)

    def key_statistics(self, hop: int, alpha: torch.Tensor, beta: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        """``(S, S)``: ``out[k, s] = sum_c scale[c] sum_ij alpha[c, i] P[c, i, j] beta[c, j] [key_j = k]
        [value_i = s]``, the EM statistics of the keys of hop ``hop + 2`` (with ``scale = w / total``)."""
        weighted = alpha.unsqueeze(-1) * self.matrix(hop) * (beta * scale.unsqueeze(-1)).unsqueeze(-2)
        return key_statistics_from_pairwise(weighted, self.keys, self.values, self.num_symbols)

    def max_forward(self, message: torch.Tensor, hop: int) -> torch.Tensor:
        """Max-product: ``(c, N)``, ``out[j] = max_i message[i] P[i, j]`` (the argmax is found when decoding,
        for the decoded position alone, from :meth:`columns`)."""
        return (message.unsqueeze(-1) * self.matrix(hop)).amax(-2)

    def max_backward(self, message: torch.Tensor, hop: int) -> torch.Tensor:
        """Max-product backward: ``(c, N)``, ``out[i] = max_j P[i, j] message[j]``."""
        return (self.matrix(hop) * message.unsqueeze(-2)).amax(-1)

    def submatrix(self, hop: int, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """``(c, M, M')``: ``P[c, rows[c, a], cols[c, b]]`` for ``rows (c, M)`` and ``cols (c, M')`` positions."""
        matrix = self.matrix(hop)
        c, N = matrix.shape[0], matrix.shape[-1]
        picked = matrix.gather(1, rows.unsqueeze(-1).expand(c, rows.shape[1], N))
        return picked.gather(2, cols.unsqueeze(1).expand(c, rows.shape[1], cols.shape[1]))

    def kmax_forward(self, message: torch.Tensor, hop: int, k: int):
        """k-max product: ``message (c, r, N)`` holds per position the ``r`` best path scores ending there; returns
        the ``r' = min(k, r N)`` best of ``message[r, i] P[i, j]`` per ``j`` ``(c, r', N)``, best first, and their
        flat predecessors ``rank * N + i`` ``(c, r', N)``."""
        # (c, N_to, r, N_from), so that the top k run over the contiguous last dim
        scores = (message.unsqueeze(1) * self.matrix(hop).transpose(-1, -2).unsqueeze(2)).flatten(-2)
        best, pointer = scores.topk(min(k, scores.shape[-1]), dim=-1)
        return best.transpose(-1, -2), pointer.transpose(-1, -2)

    def columns(self, hop: int, positions: torch.Tensor, out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``(c, s, N)``: ``out[c, d, i] = P[c, i, positions[c, d]]``, one column per draw ``d`` (written into
        ``out`` when given)."""
        c, s = positions.shape
        matrix = self.matrix(hop)
        index = positions.unsqueeze(-1).expand(c, s, matrix.shape[-1])
        return torch.gather(matrix.transpose(-1, -2), -2, index, out=out)

    def reverse_weights(self, hop: int, alpha: torch.Tensor, positions: torch.Tensor,
                        out: Optional[torch.Tensor] = None) -> torch.Tensor:
        """``(c, s, N)``: ``alpha[i] P[i, positions[d]]``, the unnormalised reverse-chain weights of ``z_{hop+1}``
        given ``z_{hop+2} = positions[d]`` (for sampling and decoding; written into ``out`` when given)."""
        return self.columns(hop, positions, out=out).mul_(alpha.unsqueeze(-2))

    def conditional_entropy(self, hop: int, alpha: torch.Tensor, alpha_next: torch.Tensor,
                            posterior_next: torch.Tensor) -> torch.Tensor:
        """``(c,)``: ``sum_j posterior_next[j] H(z_{hop+1} | z_{hop+2} = j)`` under the reverse chain
        ``p(z_{hop+1} = i | z_{hop+2} = j) = alpha[i] P[i, j] / alpha_next[j]`` (``alpha`` the prior messages)."""
        joint = alpha.unsqueeze(-1) * self.matrix(hop)  # (c, M, M')
        conditional = joint / alpha_next.unsqueeze(-2).clamp_min(torch.finfo(joint.dtype).tiny)
        column_entropy = -torch.xlogy(conditional, conditional).sum(-2)  # (c, N_j)
        return (column_entropy.clamp_min(0) * posterior_next).sum(-1)


def _pair_weights(table: torch.Tensor, values: torch.Tensor, keys: torch.Tensor, indices: dict) -> torch.Tensor:
    """``(c, M, M')``: ``table[values[c, i], keys[c, j]]`` (``values (c, M)``, ``keys (c, M')``) for an ``(S, S)``
    table stored either way round. A table kept as a transposed view (key, value) is gathered in ``(c, j, i)``
    order, so that neighbouring entries read one row of it, and returned as a transposed view; ``indices`` keeps
    each layout's flat index for the next hop."""
    S = table.shape[-1]
    if table.stride(-1) != 1 and table.stride(-2) == 1:
        if "by_key" not in indices:
            indices["by_key"] = small_flat_index(keys.unsqueeze(-1), values.unsqueeze(-2), S, S * S)  # (c, M', M)
        return flat_gather(table.transpose(0, 1), indices["by_key"]).transpose(-1, -2)
    if "by_value" not in indices:
        indices["by_value"] = small_flat_index(values.unsqueeze(-1), keys.unsqueeze(-2), S, S * S)  # (c, M, M')
    return flat_gather(table.contiguous(), indices["by_value"])


def _inverse(normalisers: torch.Tensor, divide: torch.Tensor) -> torch.Tensor:
    """``1 / R`` where ``divide``, else 1, formed as ``exp(-log R)``: the backward of a division squares ``R``,
    which underflows for ``R < 1e-154`` in float64 (1e-19 in float32), and ``0 * inf`` would turn a zero
    gradient into NaN."""
    return torch.where(divide, normalisers, torch.ones_like(normalisers)).log().neg().exp()


class SymbolTransitions(Transitions):
    """Transitions factored through symbol space: ``P[i, j] = E[value_i, key_j] / R[value_i]``.

    :ivar weights: ``(L - 1, S, S)`` ``E`` (row maximum 1), shared by every row.
    :ivar real: ``(c, N)`` 1.0 at real positions, 0.0 at padding.
    :ivar inverse_normalisers: per transition ``(c, S)``, ``1 / R[c, v]`` (1 for values absent from the row).
    :ivar padded: whether any position is padding (else multiplying by ``real`` is skipped).
    """

    def __init__(self, weights: List[torch.Tensor], keys, values, real, inverse_normalisers: List[torch.Tensor], ok,
                 num_symbols: int, padded: bool = True):
        self.weights, self.keys, self.values, self.real = weights, keys, values, real
        self.inverse_normalisers, self.ok = inverse_normalisers, ok
        self.num_symbols, self.padded = num_symbols, padded
        self._flat_index = {}

    @classmethod
    def build(cls, factors: HopFactors, chunk, weights: Optional[List[torch.Tensor]] = None) -> "SymbolTransitions":
        """The transitions of ``chunk`` from ``factors.transition_weights`` (or the given ``weights``, the same
        tables detached, say)."""
        weights = factors.transition_weights if weights is None else weights
        S, dtype = factors.score_tables.num_symbols, factors.score_tables.dtype
        keys, values = chunk.keys, chunk.values
        real = chunk.full_mask().to(dtype)
        key_counts = _by_symbol(keys, real, S)  # real positions carrying each key
        present = _by_symbol(values, real, S) > 0  # value symbols at real positions
        floor = underflow_floor(dtype)
        ok = torch.ones(len(keys), dtype=torch.bool, device=keys.device)
        normalisers = []
        for table in weights:
            normaliser = key_counts @ table.transpose(0, 1)  # R[c, v] = sum_j E[v, key_j]
            ok &= ((normaliser >= floor) | ~present).all(-1)
            normalisers.append(normaliser)
        # Absent values are never divided by; failing rows get R = 1 so that every (discarded) value stays finite.
        divide = present & ok.unsqueeze(-1)
        return cls(weights, keys, values, real, [_inverse(r, divide) for r in normalisers], ok, S,
                   padded=chunk.mask is not None)

    def select(self, rows: torch.Tensor) -> "SymbolTransitions":
        return SymbolTransitions(self.weights, self.keys[rows], self.values[rows], self.real[rows],
                                 [r[rows] for r in self.inverse_normalisers], self.ok[rows], self.num_symbols,
                                 self.padded)

    def flat_index(self, field: str) -> torch.Tensor:
        """``(c N,)``: ``row * S + symbol`` of every position's ``field`` (``"keys"`` or ``"values"``), formed
        once per chunk."""
        if field not in self._flat_index:
            symbols = getattr(self, field)
            rows = torch.arange(len(symbols), device=symbols.device).unsqueeze(-1)
            self._flat_index[field] = (symbols + rows * self.num_symbols).flatten()
        return self._flat_index[field]

    def leaving(self, message: torch.Tensor, hop: int) -> torch.Tensor:
        """``(c, S)``: ``sum_{i: value_i = v} message[i] / R[v]``, the mass leaving through value ``v``."""
        return _by_symbol(self.values, message, self.num_symbols) * self.inverse_normalisers[hop]

    def arriving(self, message: torch.Tensor) -> torch.Tensor:
        """``(c, S)``: ``sum_{j: key_j = k} message[j]``."""
        return _by_symbol(self.keys, message, self.num_symbols)

    def forward(self, message, hop):
        return (self.leaving(message, hop) @ self.weights[hop]).gather(1, self.keys) * self.real

    def backward(self, message, hop):
        arriving = self.arriving(message) @ self.weights[hop].transpose(0, 1)
        return (arriving * self.inverse_normalisers[hop]).gather(1, self.values) * self.real

    def matrix(self, hop):
        matrix = self.weights[hop][self.values.unsqueeze(-1), self.keys.unsqueeze(-2)]
        matrix = matrix * self.inverse_normalisers[hop].gather(1, self.values).unsqueeze(-1)
        return matrix * self.real.unsqueeze(-2)

    def key_statistics(self, hop, alpha, beta, scale):
        # The pairwise term summed over the positions of value s and key k is leaving[s] E[s, k] arriving[k]:
        # one (S, c) x (c, S) product.
        leaving = self.leaving(alpha, hop)
        arriving = self.arriving(beta) * scale.unsqueeze(-1)
        return (arriving.transpose(0, 1) @ leaving) * self.weights[hop].transpose(0, 1)

    def max_forward(self, message, hop):
        # max_i message[i] E[v_i, k_j] / R[v_i] = max_v (max_{i: v_i = v} message[i]) / R[v] E[v, k_j]: a
        # scatter-max over the values, then an (S, S) max per row, over the contiguous last dim.
        # In place on the fresh intermediates: each (c, S) or (c, N) buffer of a step is a page-fault on some
        # machines (glibc hands freed blocks of this size back to the kernel).
        best_by_value = _max_by_symbol(self.flat_index("values"), message, self.num_symbols)
        scores = max_times(best_by_value.mul_(self.inverse_normalisers[hop]), self.weights[hop])  # (c, S_k)
        return self._at_real(scores.gather(1, self.keys))

    def max_backward(self, message, hop):
        # max_j E[v_i, k_j] message[j] / R[v_i] = max_k E[v_i, k] (max_{j: k_j = k} message[j]) / R[v_i].
        best_by_key = _max_by_symbol(self.flat_index("keys"), message * self.real if self.padded else message,
                                     self.num_symbols)
        best = max_times(best_by_key, self.weights[hop].transpose(0, 1))  # (c, S_v)
        return self._at_real(best.mul_(self.inverse_normalisers[hop]).gather(1, self.values))

    def _at_real(self, fresh: torch.Tensor) -> torch.Tensor:
        """``fresh (c, N)`` zeroed at padding, in place."""
        return fresh.mul_(self.real) if self.padded else fresh

    def submatrix(self, hop, rows, cols):
        values, keys = self.values.gather(1, rows), self.keys.gather(1, cols)
        weight = _pair_weights(self.weights[hop], values, keys, {})  # (c, M, M'): E[value of row a, key of col b]
        inverse = self.inverse_normalisers[hop].gather(1, values)  # (c, M)
        return weight * inverse.unsqueeze(-1) * self.real.gather(1, cols).unsqueeze(-2)

    def kmax_forward(self, message, hop, k):
        # P[i, j] depends on j only through key_j: the k best per key symbol, (c, S_k, r N_from), then gathered.
        c, r, N = message.shape
        leaving = message * self.inverse_normalisers[hop].gather(1, self.values).unsqueeze(1)  # message[r, i] / R[v_i]
        rows = self.weights[hop].transpose(0, 1)[:, self.values].transpose(0, 1)  # (c, S_k, N_from): E[v_i, k]
        scores = (leaving.unsqueeze(1) * rows.unsqueeze(2)).flatten(-2)  # (c, S_k, r N_from)
        best, pointer = scores.topk(min(k, scores.shape[-1]), dim=-1)  # (c, S_k, r')
        index = self.keys.unsqueeze(-1).expand(c, N, best.shape[-1])
        best = best.gather(1, index) * self.real.unsqueeze(-1)
        return best.transpose(-1, -2), pointer.gather(1, index).transpose(-1, -2)

    def columns(self, hop, positions, out=None):
        return self.reverse_weights(hop, self.real, positions, out=out)

    def reverse_weights(self, hop, alpha, positions, out=None):
        keys = self.keys.gather(1, positions)  # (c, s): the key of each drawn position
        c, s, N = len(keys), keys.shape[1], self.values.shape[1]
        by_key = self.weights[hop].transpose(0, 1)  # (S_k, S_v), contiguous when the table is kept by key
        if keys.numel() >= by_key.shape[0]:
            # Reading more rows than the table holds: one copy (none if contiguous) beats strided reads of the
            # transposed table; for few draws (MAP decoding) the copy would cost more than it saves. The path
            # queries on this route are timed in benchmarks/results/engine_paths.md.
            by_key = by_key.contiguous()
        columns = by_key.index_select(0, keys.flatten()).view(c, s, -1)  # (c, s, S): E[:, key] of each draw
        arriving = torch.gather(columns, -1, self.values.unsqueeze(1).expand(c, s, N), out=out)  # E[v_i, key]
        leaving = alpha * self.inverse_normalisers[hop].gather(1, self.values) * self.real  # alpha[i] / R[v_i]
        return arriving.mul_(leaving.unsqueeze(-2))

    def conditional_entropy(self, hop, alpha, alpha_next, posterior_next):
        # The reverse conditional p(z = i | z' = j) = a_i E[v_i, k_j] / A_{k_j}, a_i = alpha[i] / R[v_i], depends
        # on j only through its key k. With A_k = sum_i a_i E[v_i, k]:
        #   H_k = log A_k - (sum_v E[v, k] sum_{i: v_i = v} a_i log a_i + sum_v a_v E[v, k] log E[v, k]) / A_k,
        # (S,) x (S, S) products, and E_{z'} H = sum_k p(key of z' = k) H_k.
        S = self.num_symbols
        weights = self.weights[hop]
        a = alpha * self.inverse_normalisers[hop].gather(1, self.values)
        by_value = _by_symbol(self.values, a, S)  # a_v
        mass = by_value @ weights  # A_k
        spread = _by_symbol(self.values, torch.xlogy(a, a), S) @ weights + by_value @ torch.xlogy(weights, weights)
        tiny = torch.finfo(mass.dtype).tiny
        entropy = torch.where(mass > tiny, mass.clamp_min(tiny).log() - spread / mass.clamp_min(tiny),
                              torch.zeros_like(mass))
        return (entropy.clamp_min(0) * _by_symbol(self.keys, posterior_next, S)).sum(-1)


def max_times(rows: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """``(c, K)``: ``out[c, k] = max_v rows[c, v] table[v, k]``, the max-product of ``rows (c, V)`` and ``table
    (V, K)`` (both non-negative). For many rows, a running maximum over ``v`` (``V`` in-place products) rather than
    a ``(c, V, K)`` temporary: the same products without writing and re-reading the temporary, faster on one
    thread; for few rows one broadcast (the loop's per-step cost would dominate). The loop runs on the transpose,
    ``(K, c)``, so that each step scales contiguous rows by one entry of the table rather than a table row by a
    strided column of ``rows``; the result is its transposed view. The symbol route's max-product is timed in
    benchmarks/results/engine_paths.md (``map_paths``, ``k_best_paths``)."""
    c, V = rows.shape
    if c * table.shape[1] < MAX_TIMES_LOOP_ELEMENTS or V == 1:
        return (rows.unsqueeze(-1) * table).amax(-2)
    columns, table_rows = rows.t().contiguous().unbind(0), table.unsqueeze(-1).unbind(0)  # (c,) and (K, 1) each
    out = table_rows[0] * columns[0]  # (K, c)
    step = torch.empty_like(out)
    for column, table_row in zip(columns[1:], table_rows[1:]):
        torch.mul(table_row, column, out=step)
        torch.maximum(out, step, out=out)
    return out.t()


#: Below ``c K`` of this many elements, :func:`max_times` broadcasts instead of looping over ``v``.
MAX_TIMES_LOOP_ELEMENTS = 8192


def _max_by_symbol(flat_index: torch.Tensor, x: torch.Tensor, num_symbols: int) -> torch.Tensor:
    """``(c, S)``: ``out[c, s] = max(0, max_i x[c, i] [symbol_ci = s])`` for ``x (c, N) >= 0``, given the flat
    index ``c * S + symbol_ci`` (:meth:`SymbolTransitions.flat_index`): ``index_reduce_`` over the flat index, one
    pass over ``c N`` entries, was faster than a ``scatter_reduce`` over the rows when compared (``map_paths`` in
    benchmarks/results/engine_paths.md times the route). It is in beta, and says so once per process: that
    warning is not the user's concern."""
    out = x.new_zeros(x.shape[0] * num_symbols)
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="index_reduce", category=UserWarning)
        out.index_reduce_(0, flat_index, x.flatten(), "amax")
    return out.view(x.shape[0], num_symbols)


def _by_symbol(index: torch.Tensor, x: torch.Tensor, num_symbols: int) -> torch.Tensor:
    """``(c, S)``: ``out[c, s] = sum_i x[c, i] [index[c, i] = s]``."""
    return x.new_zeros(x.shape[0], num_symbols).scatter_add(1, index, x)


class PositionTransitions(Transitions):
    """Transitions as dense ``(c, N, N)`` matrices ``P = diag(1 / R) W``.

    Built from score tables (:meth:`from_scores`), ``W[i, j] = E_l[value_i, key_j]`` (the shared
    ``transition_weights``, gathered; padding columns zero) and ``R`` its row sums: one gather, one sum and
    one batched product a hop, no logarithm or exponential per entry; rows whose ``R`` underflows are
    flagged in ``ok``. Built from dense log factors (:meth:`from_chain`), ``W`` is their exponential and
    ``R = 1``.

    :ivar weights: per transition ``(c, N, N)`` ``W``. :ivar inverse_normalisers: per transition ``(c, N)``
        ``1 / R``, or None.
    """

    def __init__(self, weights: List[torch.Tensor], inverse_normalisers: Optional[List[torch.Tensor]], ok,
                 keys=None, values=None, num_symbols: int = 0):
        self.weights, self.inverse_normalisers, self.ok = weights, inverse_normalisers, ok
        self.keys, self.values, self.num_symbols = keys, values, num_symbols

    @classmethod
    def from_chain(cls, chain: HopChain, keys: Optional[torch.Tensor] = None, values: Optional[torch.Tensor] = None,
                   num_symbols: int = 0) -> "PositionTransitions":
        """From dense log factors; ``keys`` and ``values`` ``(c, N)`` (for :meth:`key_statistics`) where the
        observations have symbols."""
        ok = torch.ones(chain.init.shape[0], dtype=torch.bool, device=chain.init.device)
        return cls(list(exp(chain.trans).unbind(0)), None, ok, keys, values, num_symbols)

    @classmethod
    def from_scores(cls, factors: HopFactors, chunk) -> "PositionTransitions":
        S, dtype = factors.score_tables.num_symbols, factors.score_tables.dtype
        floor = underflow_floor(dtype)
        full = chunk.full_mask()
        real = None if chunk.mask is None else chunk.mask.to(dtype).unsqueeze(-2)
        ok = torch.ones(len(chunk), dtype=torch.bool, device=full.device)
        weights, normalisers = [], []
        indices = {}
        for table in factors.transition_weights:
            weight = _pair_weights(table, chunk.values, chunk.keys, indices)  # (c, N, N): W[i, j] = E[value_i, key_j]
            weight = weight if real is None else weight * real
            normaliser = weight.sum(-1)  # R[c, i]
            ok &= ((normaliser >= floor) | ~full).all(-1)
            weights.append(weight)
            normalisers.append(normaliser)
        divide = full & ok.unsqueeze(-1)  # failing rows and padding rows get R = 1
        return cls(weights, [_inverse(r, divide) for r in normalisers], ok, chunk.keys, chunk.values, S)

    def select(self, rows: torch.Tensor) -> "PositionTransitions":
        inverse = None if self.inverse_normalisers is None else [r[rows] for r in self.inverse_normalisers]
        keys = None if self.keys is None else self.keys[rows]
        values = None if self.values is None else self.values[rows]
        return PositionTransitions([w[rows] for w in self.weights], inverse, self.ok[rows], keys, values,
                                   self.num_symbols)

    def matrix(self, hop):
        if self.inverse_normalisers is None:
            return self.weights[hop]
        return self.weights[hop] * self.inverse_normalisers[hop].unsqueeze(-1)

    def forward(self, message, hop):
        if self.inverse_normalisers is not None:
            message = message * self.inverse_normalisers[hop]
        return torch.bmm(message.unsqueeze(-2), self.weights[hop]).squeeze(-2)

    def backward(self, message, hop):
        message = torch.bmm(self.weights[hop], message.unsqueeze(-1)).squeeze(-1)
        return message if self.inverse_normalisers is None else message * self.inverse_normalisers[hop]
