"""The chained head's gate logits read straight from its key tables, and its closed form of the symbol route's
likelihood: the engine's score-table protocol (:class:`~pyro_multihop.engine.ScoreTables`) implemented by the head
that owns the formula.

``scores[l, q, k] = (K[l, k, q] - ||K[l, k]||^2 / 2) / sigma2`` from the key tables ``K (L, S, S)`` of
:class:`~pyro_multihop.models.ChainedAttention` (:class:`KeyTableScores`): a gather is ``O(1)`` an entry after one
``(L, S)`` pass for the norms, the transition weights are formed in the key tables' own (key, query) layout by one
autograd function with a fused backward, and the whole table only on request. Its ``symbol_route_total`` hook
differentiates the symbol route's likelihood into the key tables in one autograd function
(:class:`_KeyTableSymbolRouteTotal`, on the engine's :func:`~pyro_multihop.engine.symbol_likelihood.backward_products`):
every hop's gradient written once into the key tables' gradient (16 MB of fresh ``(S, S)`` buffers less a loss at
``S = 1000``, ``L = 3``).

Shapes: ``L`` hops, ``S`` symbols; ``hop`` is 0-based; ``c`` rows and ``N`` positions of a chunk.
"""

from __future__ import annotations

from typing import List, Optional

import torch

from ..engine.log_space import masked_log_softmax
from ..engine.recursion import forward_messages
from ..engine.score_tables import ScoreTables
from ..engine.symbol_likelihood import backward_products, kept_gradient
from ..engine.transitions import SymbolTransitions
from ..gate_ops import LOG2_E, flat_gather, small_flat_index

__all__ = ["KeyTableScores", "key_table_symbol_route_total", "transition_weights_by_key", "key_gradient_"]


class _QueryKeyTables(torch.autograd.Function):
    """``scores[l, q, k] = (K[l, k, q] - ||K[l, k]||^2 / 2) / sigma2`` ``(L, S, S)``, in (query, key) order and
    contiguous (:meth:`KeyTableScores.dense`, ``ChainedAttention.gate_score_tables``). Elementwise work runs on the tables' own (key, query)
    layout and each direction crosses layouts once, by a transposing copy (blocked, unlike an elementwise op
    that reads a transposed operand); the backward is ``(G[l, m, k] - K[l, k, m] sum_q G[l, q, k]) / sigma2``.
    With ``S`` in the thousands the tables are most of a small batch's work, and autograd's elementwise chain
    (square, sum, scale, subtract, divide, copy, each with its backward) passes over them several times more."""

    @staticmethod
    def forward(ctx, key_tables, sigma2):
        ctx.save_for_backward(key_tables)
        ctx.sigma2 = sigma2
        # the norms as onehot_gate_logits forms them, so that both gates agree bit for bit
        half_norms = key_tables.pow(2).sum(-1, keepdim=True).mul_(0.5)  # (L, S, 1)
        by_key = torch.sub(key_tables, half_norms).div_(sigma2)  # (L, key, query)
        return by_key.transpose(-1, -2).contiguous()

    @staticmethod
    def backward(ctx, grad):
        (key_tables,) = ctx.saved_tensors
        by_key = grad.transpose(-1, -2).contiguous()  # (L, key, query): G[l, q, k] at [l, k, q]
        return key_gradient_(by_key, key_tables, ctx.sigma2), None


class _KeyTableGather(torch.autograd.Function):
    """``(K[rows, cols] - half_norms[rows]) / sigma2`` for the key tables viewed as ``(L S, S)`` (row ``l S + k``,
    column ``q``, ``rows`` and ``cols`` broadcast; ``half_norms (L, S)``, ``||K[l, k]||^2 / 2``, given without
    gradient). The norms are read at the rows' own shape and broadcast, not gathered per entry. Backward:
    ``dK[l, k, q] = (G[l, k, q] - K[l, k, q] sum_q' G[l, k, q']) / sigma2`` with ``G`` the scattered gradient: one
    zero fill, a scatter of the entries, and one pass over the hops the rows reach (the norms' term formed in
    place rather than as a second full-size gradient that autograd would then add)."""

    @staticmethod
    def forward(ctx, key_tables, rows, cols, half_norms, sigma2):
        shape = torch.broadcast_shapes(rows.shape, cols.shape)
        index = (rows * key_tables.shape[-1] + cols).reshape(-1)
        ctx.save_for_backward(key_tables, index, rows)
        ctx.sigma2 = sigma2
        picked = key_tables.reshape(-1).index_select(0, index).view(shape)
        norms = half_norms.reshape(-1).index_select(0, rows.reshape(-1)).view(rows.shape)
        return picked.sub_(norms).div_(sigma2)

    @staticmethod
    def backward(ctx, grad):
        key_tables, index, rows = ctx.saved_tensors
        L, S = key_tables.shape[0], key_tables.shape[-1]
        scaled = grad / ctx.sigma2
        grad_tables = scaled.new_zeros(key_tables.shape).view(-1).index_add_(0, index, scaled.reshape(-1))
        grad_tables = grad_tables.view(key_tables.shape)
        by_row = scaled.sum_to_size(rows.shape).reshape(-1)  # summed over the dims the rows broadcast along
        row_sums = scaled.new_zeros(L, S).view(-1).index_add_(0, rows.reshape(-1), by_row).view(L, S)
        for hop in row_sums.ne(0).any(-1).nonzero().flatten().tolist():
            grad_tables[hop].addcmul_(key_tables[hop], row_sums[hop].unsqueeze(-1), value=-1.0)
        return grad_tables, None, None, None, None


def key_gradient_(logit_grad: torch.Tensor, key_table: torch.Tensor, sigma2: float) -> torch.Tensor:
    """In place, the gradient in a key table ``K (S_k, S_q)`` from ``logit_grad`` ``G`` in the same layout, the
    gradient in its logits ``(K[k, q] - ||K[k]||^2 / 2) / sigma2``: ``(G[k, q] - K[k, q] sum_q' G[k, q']) /
    sigma2``."""
    return logit_grad.addcmul_(key_table, logit_grad.sum(-1, keepdim=True), value=-1.0).div_(sigma2)


def _logits_by_key(table: torch.Tensor, sigma2: float, base: float = 1.0) -> torch.Tensor:
    """``(S_k, S_q)``: one hop's logits ``(K[k, q] - ||K[k]||^2 / 2) / sigma2`` in the key table's own layout, times
    ``base`` (``log2(e)``: the logits in bits)."""
    inverse = base / sigma2
    shift = torch.linalg.vector_norm(table, dim=-1, keepdim=True).square_().mul_(-0.5 * inverse)  # (S_k, 1)
    return torch.addcmul(shift, table, table.new_tensor(inverse))


def transition_weights_by_key(table: torch.Tensor, sigma2: float) -> torch.Tensor:
    """``(S_k, S_q)``: one later hop's transition weights ``E^T``, its logits exponentiated after subtracting each
    query's maximum (so that each query's largest weight is 1), in the key table's layout. The logits are formed in
    bits and raised by ``exp2``: the same rounding (the scale folds into the one product that forms them), and
    torch's CPU ``exp2`` is faster than its ``exp``, in range and far more below it
    (:func:`~pyro_multihop.gate_ops.exp`)."""
    by_key = _logits_by_key(table, sigma2, base=LOG2_E)
    return by_key.sub_(by_key.amax(-2, keepdim=True)).exp2_()


def _whole_tables(key_tables: torch.Tensor, sigma2: float) -> List[torch.Tensor]:
    """In the key tables' (key, query) layout: the logits of hop 1, ``(S_k, S_q)``, and the transition weights
    ``E^T`` of every later hop (exponentiated, shifted so that each query's maximum is 1)."""
    tables = key_tables.unbind(0)
    return [_logits_by_key(tables[0], sigma2)] + [transition_weights_by_key(table, sigma2) for table in tables[1:]]


class _KeyTableWholeTables(torch.autograd.Function):
    """The whole tables of :class:`KeyTableScores`, one output a hop: the first hop's logits in the key tables'
    ``(S_k, S_q)`` layout, then each later hop's transition weights ``E (S_q, S_k)`` as a transposed view of the
    ``(S_k, S_q)`` tensor it is formed in (no transposing copy either way; a product ``m @ E`` sends its gradient
    back in that layout). Backward: with ``D = grad`` (the first hop) or ``grad * E`` (later hops) in that layout,
    ``dK[l, k, q] = (D[k, q] - K[l, k, q] sum_q' D[k, q']) / sigma2``: four passes a table, against about a
    dozen for autograd's chain of elementwise steps and the stacking of per-hop gradients."""

    @staticmethod
    def forward(ctx, key_tables, sigma2):
        tables = _whole_tables(key_tables, sigma2)
        ctx.save_for_backward(key_tables, *tables[1:])
        ctx.sigma2 = sigma2
        return (tables[0],) + tuple(table.transpose(0, 1) for table in tables[1:])

    @staticmethod
    def backward(ctx, *grads):
        key_tables, *weights = ctx.saved_tensors
        grad_tables = torch.empty_like(key_tables)
        for hop, grad in enumerate(grads):
            out = grad_tables[hop]
            if grad is None:
                out.zero_()
                continue
            if hop == 0:
                out.copy_(grad)
            else:
                torch.mul(grad.transpose(0, 1), weights[hop - 1], out=out)
            key_gradient_(out, key_tables[hop], ctx.sigma2)
        return grad_tables, None


class KeyTableScores(ScoreTables):
    """``scores[l, q, k] = (K[l, k, q] - ||K[l, k]||^2 / 2) / sigma2`` from key tables ``K (L, S, S)`` (row ``K[l, k]``
    is the key vector of symbol ``k`` at hop ``l + 1``), the logits of
    :func:`~pyro_multihop.models.chained.onehot_gate_logits` up to a constant a row.

    Until :meth:`transition_weights` is read, a gather reads the key tables and an ``(L, S)`` vector of norms;
    after it, the first hop's gathers read the first hop's whole logit table, formed with the weights."""

    def __init__(self, key_tables: torch.Tensor, sigma2: float):
        self.key_tables, self.sigma2 = key_tables, float(sigma2)
        self.n_hops, self.num_symbols = key_tables.shape[0], key_tables.shape[-1]
        self.dtype, self.device = key_tables.dtype, key_tables.device
        self._half_norms: Optional[torch.Tensor] = None
        # Tables formed with and without autograd are kept apart: one formed under no_grad must not serve a
        # later differentiable read (its gradient would be silently lost).
        self._kept = {}

    def _differentiable(self) -> bool:
        return self.key_tables.requires_grad and torch.is_grad_enabled()

    @property
    def _whole(self) -> Optional[tuple]:
        return self._kept.get(("whole", self._differentiable()))

    def half_norms(self) -> torch.Tensor:
        """``(L, S)``: ``||K[l, k]||^2 / 2``, formed once, without gradient (the gathers differentiate it)."""
        if self._half_norms is None:
            self._half_norms = torch.linalg.vector_norm(self.key_tables.detach(), dim=-1).square_().mul_(0.5)
        return self._half_norms

    def _gather_rows(self, rows: torch.Tensor, cols: torch.Tensor) -> torch.Tensor:
        """The logits at ``(rows, cols)`` of the key tables viewed as ``(L S, S)`` (row ``l S + k``, column ``q``,
        broadcast): from the key tables and the norms while the entries are fewer than the tables', else from
        the whole logit table (formed once, kept), which costs less per entry."""
        if max(rows.numel(), cols.numel()) >= self.key_tables.numel():
            if self._differentiable():  # a flat index: its backward is one index_add
                return flat_gather(self._by_key(), rows * self.num_symbols + cols)
            # broadcast (int64: int32 indices would be converted at full size), no index materialised
            return self._by_key().view(-1, self.num_symbols)[rows.long(), cols.long()]
        if self._differentiable():
            return _KeyTableGather.apply(self.key_tables, rows, cols, self.half_norms(), self.sigma2)
        return _KeyTableGather.forward(_Untracked(), self.key_tables.detach(), rows, cols, self.half_norms(),
                                       self.sigma2)

    def _rows(self, hop, keys: torch.Tensor) -> torch.Tensor:
        """Rows ``hop S + key`` of the ``(L S, S)`` view (``hop`` an int or a tensor broadcasting with ``keys``),
        int32 while they fit."""
        return keys.to(self._index_dtype()) + hop * self.num_symbols

    def _index_dtype(self) -> torch.dtype:
        return torch.int32 if self.key_tables.numel() < 2**31 else torch.int64

    def chain_logits(self, obs):
        if self._whole is not None:
            return super().chain_logits(obs)
        first_rows, first_cols = self._rows(0, obs.keys), obs.query.unsqueeze(-1)
        later_rows, later_cols = self._later_pairs(obs.values, obs.keys)
        later_shape = torch.broadcast_shapes(later_rows.shape, later_cols.shape)
        if not self._differentiable() or obs.keys.numel() + later_shape.numel() >= self.key_tables.numel():
            # without gradient, two gathers on the broadcast rows beat one on concatenated, expanded copies
            return self._gather_rows(first_rows, first_cols), self._gather_rows(later_rows, later_cols)
        # One gather for the first hop and the later ones: one zero fill of the tables' size in the backward.
        rows = torch.cat([first_rows.reshape(-1), later_rows.expand(later_shape).reshape(-1)])
        cols = torch.cat([first_cols.expand_as(obs.keys).reshape(-1).to(rows.dtype),
                          later_cols.to(rows.dtype).expand(later_shape).reshape(-1)])
        logits = self._gather_rows(rows, cols)
        count = obs.keys.numel()
        return logits[:count].view(obs.keys.shape), logits[count:].view(later_shape)

    def gather(self, hop, query, keys):
        if hop == 0 and self._whole is not None:
            return flat_gather(self._whole[0], small_flat_index(keys, query, self.num_symbols, self.num_symbols ** 2))
        return self._gather_rows(self._rows(hop, keys), query)

    def _later_pairs(self, values, keys):
        """``(rows (L - 1, c, 1, N_j), cols (c, N_i, 1))``, broadcasting to ``(L - 1, c, N_i, N_j)``:
        ``K[l + 1, key_j, value_i]`` for every hop after the first."""
        hops = torch.arange(1, self.n_hops, device=keys.device, dtype=self._index_dtype())
        hops = hops.view(-1, *([1] * (keys.dim() + 1)))
        return self._rows(hops, keys.unsqueeze(-2)), values.unsqueeze(-1)

    def later_pair_logits(self, values, keys):
        return self._gather_rows(*self._later_pairs(values, keys))

    def transition_weights(self):
        if self._whole is None:
            if self._differentiable():
                whole = _KeyTableWholeTables.apply(self.key_tables, self.sigma2)
            else:
                tables = _whole_tables(self.key_tables.detach(), self.sigma2)
                whole = (tables[0],) + tuple(table.transpose(0, 1) for table in tables[1:])
            self._kept[("whole", self._differentiable())] = whole
        return list(self._whole[1:])

    def _by_key(self) -> torch.Tensor:
        """``(L, S_k, S_q)``: the whole logit table in the key tables' layout, formed once."""
        key = ("by_key", self._differentiable())
        if key not in self._kept:
            half_norms = self.key_tables.pow(2).sum(-1, keepdim=True) / 2  # with its gradient (half_norms() has none)
            self._kept[key] = (self.key_tables - half_norms) / self.sigma2
        return self._kept[key]

    def dense(self):
        key = ("dense", self._differentiable())
        if key not in self._kept:
            self._kept[key] = _QueryKeyTables.apply(self.key_tables, self.sigma2)
        return self._kept[key]

    def symbol_route_total(self, factors, chunk, emission: torch.Tensor):
        """The engine's hook (:attr:`~pyro_multihop.engine.score_tables.ScoreTables.symbol_route_total`): ``(total
        (c,), ok (c,))`` of a chunk on the symbol route, differentiable in the key tables (the first hop and the
        transition weights formed inside, :class:`_KeyTableSymbolRouteTotal`) and in ``emission (c, N)``."""
        return _KeyTableSymbolRouteTotal.apply(factors, chunk, self.key_tables, emission, self.sigma2)


class _Untracked:
    """Stands in for autograd's context when a Function's forward runs without autograd."""

    def save_for_backward(self, *tensors):
        pass


class _KeyTableSymbolRouteTotal(torch.autograd.Function):
    """As the engine's :func:`~pyro_multihop.engine.symbol_likelihood.symbol_route_total`, from the key tables
    ``K (L, S, S)`` themselves (:class:`KeyTableScores`): the first hop's logits ``(K[0, key_j, query] - ||K[0, key_j]||^2 / 2)
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
    def forward(ctx, factors, chunk, key_tables, emission, sigma2):
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
        grad = kept_gradient(ctx.transitions, grad_total)
        grad_tables = torch.empty_like(tables) if ctx.needs_input_grad[2] else None

        def write(hop, left, right):
            if grad_tables is None:
                return
            out = torch.mm(left, right, out=grad_tables[hop + 1]).mul_(weights[hop])  # D, in (key, query) layout
            key_gradient_(out, tables[hop + 1], sigma2)

        beta = backward_products(ctx.transitions, ctx.alphas, emission, [w.transpose(0, 1) for w in weights],
                                  grad, write)
        if grad_tables is not None:
            upstream = beta * grad  # d total / d init
            first = init * (upstream - (init * upstream).sum(-1, keepdim=True))  # through the softmax (0 at padding)
            S = tables.shape[-1]
            first = first / sigma2
            by_key = first.new_zeros(S).index_add_(0, ctx.keys.flatten(), first.flatten())  # sum_{key_j = k} g_j
            torch.mul(tables[0], by_key.neg_().unsqueeze(-1), out=grad_tables[0])
            grad_tables[0].view(-1).index_add_(0, ctx.first_index.flatten(), first.flatten())
        return None, None, grad_tables, ctx.alphas[-1] * grad, None


def key_table_symbol_route_total(factors, chunk, emission: torch.Tensor):
    """``(total (c,), ok (c,))``: :meth:`KeyTableScores.symbol_route_total` of ``factors``' score tables (the
    function's old name, before the closed form moved behind the engine's hook)."""
    return factors.score_tables.symbol_route_total(factors, chunk, emission)
