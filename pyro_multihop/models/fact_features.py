"""What the structured-facts head (:mod:`.facts`) reads from a chunk of rows: symbols with padding mapped to ``S``,
masks, ranks and ages, the nearest facts sharing a field (:func:`nearest_sharing`), and the flat indices of the
``S x S`` tables at the chunk's field pairs (:class:`FieldPairs`, the table head's pair term)."""

from __future__ import annotations

import torch

from ..data import FactObservations
from .chained import DISTANCE_UNIT
from .fact_comparison import field_matches

__all__ = ["FactFeatures", "FieldPairs", "nearest_sharing", "padded"]


def padded(table: torch.Tensor, dims: int) -> torch.Tensor:
    """``table`` with one zero appended along each of its last ``dims`` dims: the row/column of symbol ``S``,
    which stands for a padded field or token, so that padding enters no term."""
    return torch.nn.functional.pad(table, (0, 1) * dims)


def padded_rows(table: torch.Tensor) -> torch.Tensor:
    """``table`` ``(..., S, D)`` with a zero row appended before its last dim: the row of symbol ``S``, padding, so
    that indexing it with a chunk's symbols (padding mapped to ``S``) gives 0 there."""
    return torch.nn.functional.pad(table, (0, 0, 0, 1))


class FactFeatures:
    """What the terms read from a chunk of rows: symbols with padding mapped to ``S``, masks, ranks."""

    def __init__(self, obs: FactObservations, num_symbols: int, max_distance: int, dtype):
        S = num_symbols
        self.real = obs.full_mask()  # (c, N)
        self.real_fields = obs.real_fields()  # (c, N, F)
        self.fields = obs.facts.masked_fill(~self.real_fields, S)  # (c, N, F), padding -> S
        self.real_tokens = obs.real_tokens()  # (c, M)
        self.question = obs.question.masked_fill(~self.real_tokens, S)  # (c, M)
        # in floating point: integer (c, N, N) arithmetic is several times slower on CPUs
        rank = self.real.to(dtype).cumsum(-1) - 1  # real facts before each fact
        age = self.real.to(dtype).sum(-1, keepdim=True) - 1 - rank  # real facts after it
        self.age = age.clamp(0, max_distance) / DISTANCE_UNIT  # (c, N)
        self.rank = rank
        self.max_distance = max_distance
        self.num_symbols = num_symbols
        self.by_rows = 2 * (num_symbols + 1) <= self.fields.shape[1] * self.fields.shape[2]
        self._nearest = None
        self._order = None
        self._pair_index = None
        self._question_index = None
        self._question_matches = None
        self._in_question = None
        self._shared_fields = None
        self._mention_ages = None
        self.vectors = None  # the embedded head's (question, facts) embedding rows, gathered on first use

    def order_features(self):
        """``(min(|rank_j - rank_i|, D) / U, [rank_j > rank_i], [rank_j = rank_i - 1], [rank_j = rank_i + 1])``, each
        ``(c, N, N)`` in the parameters' dtype: the distance, the direction and the real facts just before and just
        after fact ``i``, from one rank offset (built on first use)."""
        if self._order is None:
            offset = self.rank.unsqueeze(-2) - self.rank.unsqueeze(-1)  # (c, N_i, N_j): rank_j - rank_i
            self._order = (offset.abs().clamp(max=self.max_distance) / DISTANCE_UNIT, (offset > 0).to(offset.dtype),
                           (offset == -1).to(offset.dtype), (offset == 1).to(offset.dtype))
        return self._order

    def nearest_facts(self):
        """``(index, found)``, both ``(c, N, 2 F)``: :func:`nearest_sharing` of the chunk with -1 mapped to 0, and
        whether there is such a fact (in the parameters' dtype); built on first use."""
        if self._nearest is None:
            nearest = nearest_sharing(self.fields, self.real_fields).flatten(-2)  # (c, N, 2F)
            self._nearest = (nearest.clamp_min(0), (nearest >= 0).to(self.rank.dtype))
        return self._nearest

    def _symbols(self, symbols: torch.Tensor) -> torch.Tensor:
        # int32 while the flat tables have fewer than 2^31 entries: index_select and index_add_ take it, half
        # the memory traffic of int64
        size = self.num_symbols + 1
        return symbols.to(torch.int32) if self.fields.shape[-1] ** 2 * size * size < 2**31 else symbols

    def pair_index(self) -> torch.Tensor:
        """``(F, F, c, N, N)``: ``[a, b, r, i, j] = f_i^a (S + 1) + f_j^b``, the flat index of field pair ``(a, b)``
        in an ``(S + 1, S + 1)`` table; built on first use and shared by every hop (forward and backward)."""
        if self._pair_index is None:
            fields = self._symbols(self.fields).permute(2, 0, 1).contiguous()  # (F, c, N)
            rows = (fields * (self.num_symbols + 1)).unsqueeze(-1)  # (F, c, N, 1)
            F, c, N = fields.shape
            self._pair_index = fields.new_empty(F, F, c, N, N)
            for a in range(F):  # pair by pair: one 5-dim broadcast add is several times slower
                for b in range(F):
                    torch.add(rows[a], fields[b].unsqueeze(-2), out=self._pair_index[a, b])
        return self._pair_index

    def question_index(self) -> torch.Tensor:
        """``(c, M, F, N)``: ``[r, m, b, j] = b (S + 1)^2 + q_m (S + 1) + f_j^b``, the flat index of (token
        ``m``, field ``b`` of fact ``j``) in ``F`` stacked ``(S + 1, S + 1)`` tables; built on first use."""
        if self._question_index is None:
            size = self.num_symbols + 1
            F = self.fields.shape[-1]
            fields = self._symbols(self.fields).transpose(1, 2).contiguous()  # (c, F, N)
            offsets = torch.arange(F, device=fields.device, dtype=fields.dtype).view(1, F, 1) * (size * size)
            question = self._symbols(self.question) * size  # (c, M)
            self._question_index = (fields + offsets).unsqueeze(1) + question.view(*question.shape, 1, 1)
        return self._question_index

    def question_matches(self, num_positions: int) -> torch.Tensor:
        """``(c, N, P F)``: ``[r, j, p F + b]`` = the number of real question tokens ``m`` at position ``min(m, P)``
        equal to the real field ``b`` of fact ``j`` (``P`` = ``num_positions``; tokens past the ``P``-th share its
        bin), in the parameters' dtype; one ``(c, N, F)`` comparison a token, built on first use."""
        if self._question_matches is None:
            c, N, F = self.fields.shape
            matches = self.rank.new_zeros(c, N, num_positions, F)
            for m in range(self.question.shape[1]):
                same = (self.fields == self.question[:, m, None, None]) & self.real_fields
                same = same & self.real_tokens[:, m, None, None]
                matches[:, :, min(m, num_positions - 1)] += same.to(matches.dtype)
            self._question_matches = matches.view(c, N, num_positions * F)
        return self._question_matches

    def in_question(self) -> torch.Tensor:
        """``(c, N, F)``: ``[r, j, b]`` = whether the real field ``b`` of fact ``j`` equals a real question token, in
        the parameters' dtype (the copy's question equality, an answer per hop's entry): the comparison's
        :func:`~.fact_comparison.field_matches` with every real token weighing 1, clipped at 1; built on first use."""
        if self._in_question is None:
            tokens = self.real_tokens.to(self.rank.dtype)
            self._in_question = field_matches(tokens, self.question, self.fields, self.real_fields).clamp(max=1)
        return self._in_question

    def mention_ages(self) -> torch.Tensor:
        """``(c, M, N)``: ``[r, m, j]`` = ``min(n, D)`` where the real fact ``j`` names the real token ``q_m`` in a real
        field and ``n`` real facts after it name it too; 0 where ``j`` does not name it (the recency of ``j`` among
        the facts that name a token: 0 at the latest of them), in the parameters' dtype; built on first use."""
        if self._mention_ages is None:
            names = torch.stack([((self.fields == self.question[:, m, None, None]) & self.real_fields).any(-1)
                                 for m in range(self.question.shape[1])], 1)  # (c, M, N)
            names = names & self.real_tokens.unsqueeze(-1)
            counts = names.to(self.rank.dtype)
            later = counts.flip(-1).cumsum(-1).flip(-1) - counts  # naming facts after j
            self._mention_ages = later.clamp(max=self.max_distance) * counts
        return self._mention_ages

    def shared_fields(self) -> torch.Tensor:
        """``(c, N, N, F)``: ``[r, i, j, b]`` = whether the real field ``b`` of fact ``j`` equals a real field of fact
        ``i``, in the parameters' dtype (an answer per hop's entry from the previous fact); one ``(c, N, N)``
        comparison a field pair, built on first use and shared by every hop."""
        if self._shared_fields is None:
            fields, real = self.fields, self.real_fields
            c, N, F = fields.shape
            shared = torch.zeros(c, N, N, F, dtype=torch.bool, device=fields.device)
            for b in range(F):
                for a in range(F):
                    shared[..., b] |= ((fields[:, :, None, a] == fields[:, None, :, b]) & real[:, :, None, a]
                                       & real[:, None, :, b])
            self._shared_fields = shared.to(self.rank.dtype)
        return self._shared_fields


class FieldPairs(torch.autograd.Function):
    """``sum_{a, b} tables[a, b][fields[..., i, a], fields[..., j, b]]`` ``(c, N, N)`` for ``tables (F, F, S', S')``,
    given the chunk's flat pair indices ``(F, F, c, N, N)`` (:meth:`FactFeatures.pair_index`, shared by every hop and
    by the backward): one ``index_select`` a field pair, the sum built in place; the backward adds the gradient
    into each table with ``index_add_`` at the same index."""

    @staticmethod
    def forward(ctx, tables, pair_index):
        ctx.save_for_backward(pair_index)
        ctx.tables_shape = tables.shape
        flat = tables.reshape(tables.shape[0], tables.shape[1], -1)
        F, _, c, N, _ = pair_index.shape
        term = tables.new_empty(c, N, N)  # not a view: the caller adds into it in place
        for a in range(F):
            for b in range(F):
                index = pair_index[a, b].view(-1)
                if a == b == 0:
                    torch.index_select(flat[a, b], 0, index, out=term.view(-1))
                else:
                    term.add_(flat[a, b].index_select(0, index).view(c, N, N))
        return term

    @staticmethod
    def backward(ctx, grad):
        (pair_index,) = ctx.saved_tensors
        F, _, size, _ = ctx.tables_shape
        grad = grad.contiguous().view(-1)
        grad_tables = grad.new_zeros(F, F, size * size)
        for a in range(F):
            for b in range(F):
                grad_tables[a, b].index_add_(0, pair_index[a, b].view(-1), grad)
        return grad_tables.view(ctx.tables_shape), None


def nearest_sharing(fields: torch.Tensor, real_fields: torch.Tensor) -> torch.Tensor:
    """``(c, N, 2, F)``: for each fact ``i``, the nearest real fact before it (``[..., 0, a]``) and after it
    (``[..., 1, a]``) whose field ``a`` equals ``f_i^a`` (both real), or -1 where there is none.

    Per field, the facts are sorted by (symbol, position): the nearest fact before ``i`` with its symbol is
    its predecessor in that order when the symbols agree, the nearest after its successor. ``O(c N log N)``,
    no ``(N, N)`` comparison.

    :param fields: ``(c, N, F)`` symbols. :param real_fields: ``(c, N, F)`` bool (False on padded facts too).
    """
    c, N, F = fields.shape
    position = torch.arange(N, device=fields.device).expand(c, N)
    none = torch.full((c, 1), -1, dtype=torch.long, device=fields.device)
    out = torch.empty(c, N, 2, F, dtype=torch.long, device=fields.device)
    for a in range(F):
        # A padded field gets a symbol of its own (negative, one per position): it matches nothing.
        symbol = torch.where(real_fields[..., a], fields[..., a], -1 - position)
        order = (symbol * N + position).argsort(-1)  # (c, N): by symbol, then position
        ordered = symbol.gather(1, order)
        same = ordered[:, 1:] == ordered[:, :-1]  # (c, N - 1): neighbours in that order share the symbol
        before = torch.cat([none, torch.where(same, order[:, :-1], -1)], 1)
        after = torch.cat([torch.where(same, order[:, 1:], -1), none], 1)
        out[..., 0, a] = before.new_empty(c, N).scatter_(1, order, before)
        out[..., 1, a] = after.new_empty(c, N).scatter_(1, order, after)
    return out
