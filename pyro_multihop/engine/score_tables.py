"""The gate logits of a head whose gate depends on the (query symbol, key symbol) pair alone, formed only as far
as a query reads them.

``scores[l, q, k]`` ``(L, S, S)`` is the unnormalised logit of hop ``l + 1`` when its query symbol ``q`` meets key
symbol ``k``. The engine reads it three ways: gathered at a chunk's ``(query, key)`` pairs (the first hop, the
dense chain of a small chunk), exponentiated whole as the transition weights of the later hops (the symbol route,
the position route of a large chunk), and, rarely, whole (batched factors, a user's own code). With ``S`` in the
thousands and a batch of ``n N^2 << S^2`` pairs, forming the whole table is most of the work of a query, and of
its backward; a head whose logits have a closed form in its parameters implements :class:`ScoreTables` itself,
reading them straight from its parameters (the chained head's key tables:
:mod:`pyro_multihop.models.chained_key_tables`), and may hand the engine its own closed form of the symbol route's
likelihood (:attr:`ScoreTables.symbol_route_total`).

- :class:`ScoreTables`: the protocol the engine reads.
- :class:`DenseScoreTables`: a given ``(*batch, L, S, S)`` tensor (the tied head's table, batched factors).

Shapes: ``L`` hops, ``S`` symbols; ``hop`` is 0-based.
"""

from __future__ import annotations

from typing import List, Optional

import torch

from ..gate_ops import flat_gather, flat_index, table_gather
from .moved_names import deprecated_aliases

__all__ = ["ScoreTables", "DenseScoreTables", "as_score_tables"]

# The chained head's key tables moved to its own side, pyro_multihop.models.chained_key_tables; kept here for one release.
__getattr__ = deprecated_aliases(__name__, {}, moved_modules=["pyro_multihop.models.chained_key_tables"])


class ScoreTables:
    """The protocol: ``(L, S, S)`` gate logits, read lazily.

    :ivar n_hops: ``L``. :ivar num_symbols: ``S``. :ivar batch_shape: leading batch dims of a batched table
        (empty for one head's tables).
    :ivar dtype: the tables' dtype. :ivar device: their device.
    """

    n_hops: int
    num_symbols: int
    batch_shape: torch.Size = torch.Size()
    dtype: torch.dtype
    device: torch.device

    #: The hook a head may implement: None (the engine differentiates the symbol route's likelihood through the
    #: :meth:`transition_weights`, :func:`~.symbol_likelihood.symbol_route_total`), or a method
    #: ``symbol_route_total(factors, chunk, emission (c, N)) -> (total (c,), ok (c,))``: the shifted likelihood
    #: ``sum_i alpha_L[i] emission[i]`` of a chunk on the symbol route, differentiable in the head's parameters
    #: and in ``emission``, with ``ok`` flagging the rows whose transitions are representable; the gradient of a
    #: row that is not ok must be 0 (the engine recomputes it).
    symbol_route_total = None

    def dense(self) -> torch.Tensor:
        """``(*batch, L, S, S)``: the whole table, formed on the first call and kept."""
        raise NotImplementedError

    def gather(self, hop: int, query: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """``scores[hop, query, keys]`` (``query`` and ``keys`` LongTensors, broadcast), differentiable."""
        raise NotImplementedError

    def later_pair_logits(self, values: torch.Tensor, keys: torch.Tensor) -> torch.Tensor:
        """``(L - 1, c, N, N)``: ``scores[l + 1, values[c, i], keys[c, j]]``, the unnormalised logits of every hop
        after the first from position ``i`` to ``j``; a view with stride 0 on the first dim when every hop shares
        one table (then callers normalise it once)."""
        raise NotImplementedError

    def chain_logits(self, obs):
        """``(init (c, N), later (L - 1, c, N, N))``: the unnormalised logits of the first hop at each position,
        :meth:`gather` ``(0, query, keys)``, and :meth:`later_pair_logits` (empty when ``L = 1``)."""
        first = self.gather(0, obs.query.unsqueeze(-1), obs.keys)
        if self.n_hops == 1:
            return first, first.new_zeros((0,) + obs.keys.shape + obs.keys.shape[-1:])
        return first, self.later_pair_logits(obs.values, obs.keys)

    def transition_weights(self) -> List[torch.Tensor]:
        """``L - 1`` tables ``(S, S)``: ``E[l, q, k] = exp(scores[l + 1, q, k] - max_k' scores[l + 1, q, k'])`` (row maximum
        1), one a hop after the first, formed on the first call and kept; each possibly a transposed view (read its rows with ``contiguous()``
        where the layout matters). The row shift cancels in every normalised transition, so no gradient flows
        through it."""
        raise NotImplementedError


class DenseScoreTables(ScoreTables):
    """A given table ``scores (*batch, L, S, S)``."""

    def __init__(self, scores: torch.Tensor):
        self.scores = scores
        self.n_hops, self.num_symbols = scores.shape[-3], scores.shape[-1]
        self.batch_shape, self.dtype, self.device = scores.shape[:-3], scores.dtype, scores.device
        self._transition_weights = {}

    def dense(self):
        return self.scores

    def gather(self, hop, query, keys):
        return table_gather(self.scores[hop], query, keys)

    def later_pair_logits(self, values, keys):
        index = flat_index(values.unsqueeze(-1), keys.unsqueeze(-2), self.num_symbols)  # (c, N, N)
        later = self.scores[1:]
        if later.shape[0] > 1 and later.stride(0) == 0:  # one table for every hop (the tied head)
            return flat_gather(later[0], index).unsqueeze(0).expand((later.shape[0],) + index.shape)
        return torch.stack([flat_gather(table, index) for table in later])

    def transition_weights(self):
        differentiable = self.scores.requires_grad and torch.is_grad_enabled()
        if differentiable not in self._transition_weights:  # kept apart by grad mode: one formed under no_grad must not serve a differentiable read
            later = self.scores[1:]
            if later.shape[0] > 1 and later.stride(0) == 0:  # one table for every hop (the tied head): form it once
                weight = (later[0] - later[0].amax(-1, keepdim=True).detach()).exp()
                weights = [weight] * later.shape[0]
            else:
                weights = [(table - table.amax(-1, keepdim=True).detach()).exp() for table in later.unbind(0)]
            self._transition_weights[differentiable] = weights
        return self._transition_weights[differentiable]


def as_score_tables(scores) -> Optional[ScoreTables]:
    """``scores`` as :class:`ScoreTables`: None stays None, a tensor becomes :class:`DenseScoreTables`, and score
    tables stay as they are."""
    return DenseScoreTables(scores) if torch.is_tensor(scores) else scores
