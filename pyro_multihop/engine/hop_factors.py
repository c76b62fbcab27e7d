"""What a head hands the engine (:class:`HopFactors`: every hop's gate and the emission, the factors of the hop
chain), and the first-hop distribution and dense log factors of a gate given by score tables. Which route a chunk
takes is :mod:`.routes`."""

from __future__ import annotations

import functools
from typing import Callable, Optional

import torch

from .log_space import HopChain, masked_log_softmax
from .score_tables import ScoreTables, as_score_tables

__all__ = ["HopFactors", "chain_from_scores", "first_hop_log_probs"]


class HopFactors:
    """A head's factors of the hop chain, as the engine needs them: every hop's gate and the emission.

    :ivar log_emission: ``(S, T)`` normalised log emission table over value symbols, or None when the head
        emits from a position (``position_emission``).
    :ivar num_symbols: ``S``. :ivar num_targets: ``T``. :ivar dtype: the factors' floating-point dtype.
    :ivar device: where the engine moves each chunk. All four are read from ``log_emission`` when it is given
        (then a stated value must agree), and must be stated without it.
    :ivar dense_chain: ``observations -> HopChain``, the dense log factors of a chunk (``init (c, N)``,
        ``trans (L - 1, c, N, N)``).
    :ivar n_hops: ``L``.
    :ivar score_tables: :class:`~.score_tables.ScoreTables` or None: ``scores[l, q, k]`` ``(L, S, S)``, the
        unnormalised logit of hop ``l + 1`` when its query symbol ``q`` meets key symbol ``k``, read lazily
        (gathered at a chunk's pairs, or exponentiated whole). None when the gate depends on more than the two
        symbols (then only the dense log factors are available). The constructor's ``scores`` takes a tensor
        (wrapped in :class:`~.score_tables.DenseScoreTables`) or a :class:`~.score_tables.ScoreTables` (a head's
        own, with its own reads and, optionally, its own closed form of the symbol route's likelihood:
        :attr:`~.score_tables.ScoreTables.symbol_route_total`).
    :ivar scores: the whole ``(L, S, S)`` table (formed on first read), or None.
    :ivar position_emission: None (the target is emitted from the last attended value through
        ``log_emission``), or ``chunk -> (c, N, T)`` normalised log-probabilities of every target given
        that the last hop attends position ``i``: an emission that reads more of a position than its value
        (a structured-facts emission). With it, ``scores`` must be None.
    :ivar position_target: None, or ``chunk -> (c, N)``: ``position_emission``'s entry of each row's target
        alone, when the head computes it for less than the ``(c, N, T)`` table.
    :ivar position_mixture: None, or ``(chunk, weights (c, N)) -> (c, T)``: ``sum_i weights[:, i]
        exp(position_emission(chunk)[:, i])``, when the head mixes its emission over the positions for less than
        the ``(c, N, T)`` table (predictions: the weights are ``p(z_L = i)``); its working memory is the head's
        ``extra_elements``.
    :ivar extra_elements: None, or ``N -> elements``: working memory per row, in elements, that the head's
        ``dense_chain`` and ``position_emission`` need beyond the engine's count (chunks shrink to fit).
    :ivar target_chain: None, or ``chunk -> HopChain``: log factors of each row's target that depend on the hops
        (an answer per hop: ``log p(part l of the target | z_{l-1}, z_l)``, ``init (c, N)``, ``trans (L - 1, c, N,
        N)``). With it, :attr:`dense_chain` is the constructor's chain plus these (the chain given the target, the
        target's last factor included, so ``position_target`` gives 0 at real positions) and :attr:`prior_chain`
        the constructor's alone; a query before the target is seen reads :meth:`given` ``(False)``'s factors, and
        predictions are the head's (:func:`~.queries.predict_proba` refuses them).

    The observations the engine is given need only ``len()``, ``context_len``, ``obs[slice or LongTensor]``,
    ``to(device)``, ``device``, ``mask``, ``full_mask()`` and ``target``; ``keys``, ``values`` and ``query``
    are read only where the factors read symbols (:attr:`reads_symbols`: ``log_emission`` and ``scores``).
    """

    def __init__(self, log_emission: Optional[torch.Tensor], dense_chain: Callable[[object], HopChain], n_hops: int,
                 scores=None,
                 position_emission: Optional[Callable[[object], torch.Tensor]] = None,
                 extra_elements: Optional[Callable[[int], float]] = None,
                 position_target: Optional[Callable[[object], torch.Tensor]] = None,
                 position_mixture: Optional[Callable[[object, torch.Tensor], torch.Tensor]] = None,
                 target_chain: Optional[Callable[[object], HopChain]] = None, *,
                 num_symbols: Optional[int] = None, num_targets: Optional[int] = None,
                 dtype: Optional[torch.dtype] = None, device=None):
        if position_mixture is not None and position_emission is None:
            raise ValueError("a position_mixture mixes a position_emission: position_emission must be given too")
        if position_emission is not None and scores is not None:
            raise ValueError("a gate with a position_emission has no symbol score tables (scores must be None)")
        if target_chain is not None and (position_target is None or position_mixture is not None):
            raise ValueError("a target_chain holds the target's factors: it needs a position_target (0 at real "
                             "positions) and no position_mixture")
        if log_emission is None and position_emission is None:
            raise ValueError("log_emission is None but there is no position_emission: the factors need an emission")
        stated = {"num_symbols": num_symbols, "num_targets": num_targets, "dtype": dtype,
                  "device": None if device is None else torch.device(device)}
        if log_emission is not None:
            if log_emission.dim() < 2:
                raise ValueError(f"log_emission must be (S, T), got shape {tuple(log_emission.shape)}")
            table = {"num_symbols": log_emission.shape[-2], "num_targets": log_emission.shape[-1],
                     "dtype": log_emission.dtype, "device": log_emission.device}
            for name, value in stated.items():
                if value is not None and value != table[name]:
                    raise ValueError(f"{name} = {value} disagrees with log_emission's {table[name]}")
            stated = table
        missing = [name for name, value in stated.items() if value is None]
        if missing:
            raise ValueError(f"without log_emission the factors must state {', '.join(missing)}")
        self.num_symbols, self.num_targets = int(stated["num_symbols"]), int(stated["num_targets"])
        self.dtype, self.device = stated["dtype"], stated["device"]
        self.log_emission = log_emission
        self.prior_chain = dense_chain
        self.target_chain = target_chain
        self.dense_chain = dense_chain if target_chain is None else functools.partial(_given, dense_chain, target_chain)
        self.n_hops = n_hops
        self.score_tables: Optional[ScoreTables] = as_score_tables(scores)
        self.position_emission = position_emission
        self.extra_elements = extra_elements
        self.position_target = position_target
        self.position_mixture = position_mixture

    def replace(self, **changes) -> "HopFactors":
        """A copy with some fields changed (the stated sizes, dtype and device are read again from a new
        ``log_emission``)."""
        fields = {"log_emission": self.log_emission, "dense_chain": self.prior_chain, "n_hops": self.n_hops,
                  "scores": self.score_tables, "position_emission": self.position_emission,
                  "extra_elements": self.extra_elements, "position_target": self.position_target,
                  "position_mixture": self.position_mixture, "target_chain": self.target_chain}
        if changes.get("log_emission", self.log_emission) is None:
            fields.update(num_symbols=self.num_symbols, num_targets=self.num_targets, dtype=self.dtype,
                          device=self.device)
        fields.update(changes)
        return HopFactors(**fields)

    def given(self, given_target: bool) -> "HopFactors":
        """The factors of a query: these, or with ``given_target=False`` and a :attr:`target_chain`, the prior chain's
        alone (its target emission is never read there)."""
        if given_target or self.target_chain is None:
            return self
        return self.replace(target_chain=None)

    @property
    def reads_symbols(self) -> bool:
        """Whether the engine reads the observations' ``keys`` and ``values`` (an emission table over value
        symbols; False for a ``position_emission``)."""
        return self.position_emission is None

    @property
    def itemsize(self) -> int:
        """Bytes of one element of :attr:`dtype`."""
        return torch.finfo(self.dtype).bits // 8

    def target_log_probs(self, chunk) -> torch.Tensor:
        """``(c, N)``: ``log p(target_c | z_L = i)`` at every position of a chunk."""
        if self.position_emission is None:
            return self.log_emission[chunk.values, chunk.target.unsqueeze(-1)]
        if self.position_target is not None:
            return self.position_target(chunk)
        index = chunk.target.view(-1, 1, 1).expand(-1, chunk.context_len, 1)
        return self.position_emission(chunk).gather(-1, index).squeeze(-1)

    @property
    def scores(self) -> Optional[torch.Tensor]:
        return None if self.score_tables is None else self.score_tables.dense()

    @property
    def transition_weights(self) -> list:
        """``L - 1`` tables ``(S, S)``: ``exp(scores[l] - max_k scores[l, :, k])`` for the hops after the first (row
        maximum 1), computed once per :class:`HopFactors` and shared by every chunk (each possibly a transposed
        view)."""
        return self.score_tables.transition_weights()


def _given(dense_chain, target_chain, chunk) -> HopChain:
    """``dense_chain(chunk)`` plus ``target_chain(chunk)``, factor by factor."""
    prior, target = dense_chain(chunk), target_chain(chunk)
    return HopChain(prior.init + target.init, prior.trans + target.trans)


def first_hop_log_probs(scores, obs) -> torch.Tensor:
    """``(c, N)`` ``log p(z_1 = i)`` from the score tables (a tensor or :class:`~.score_tables.ScoreTables`) of
    hop 1 (padding excluded)."""
    logits = as_score_tables(scores).gather(0, obs.query.unsqueeze(-1), obs.keys)
    return masked_log_softmax(logits, obs.mask)


def chain_from_scores(scores, obs) -> HopChain:
    """The dense log factors of ``obs`` for a gate given by the score tables ``scores`` (an ``(L, S, S)`` tensor or
    :class:`~.score_tables.ScoreTables`).

    In formulas (padding positions excluded from every softmax)::

        init[c, j]        = log softmax_j scores[0][query_c, key_cj]
        trans[l, c, i, j] = log softmax_j scores[l + 1][value_ci, key_cj]
    """
    tables = as_score_tables(scores)
    first, later = tables.chain_logits(obs)
    init = masked_log_softmax(first, obs.mask)
    if tables.n_hops == 1:
        return HopChain(init, later)
    pair_mask = None if obs.mask is None else obs.mask.unsqueeze(-2)
    if later.shape[0] > 1 and later.stride(0) == 0:  # one table for every hop (the tied head): normalise once
        return HopChain(init, masked_log_softmax(later[0], pair_mask).unsqueeze(0).expand_as(later))
    return HopChain(init, masked_log_softmax(later, pair_mask))
