"""An answer per hop for the structured-facts head (:class:`~pyro_multihop.models.facts.FactAttention` with
``answer_parts``): an answer of ``L`` parts, part ``l`` said by the fact hop ``l`` attends, read from the side the
path enters it (bAbI's path finding: "s,e", one way out of each room the path crosses).

``parts[t] = (d_1, ..., d_L)`` names, for an answer symbol ``t``, one of ``D`` parts per hop. The emission at the end
of the chain is replaced by one factor per hop, each a function of the question, the fact ``j`` the hop attends and
the fact ``i`` the hop before it attended (``f_j^a`` is field ``a`` of fact ``j``, ``[.]`` an indicator)::

    x_b(j)    = [f_j^b occurs in the question]                          # real fields b of fact j
    y_b(i, j) = [f_j^b equals a real field of fact i]                   # hops 2..L; 0 at hop 1
    p(d_l = d | z_{l-1} = i, z_l = j) = softmax_d(sum_a (part_tables[l, 0, a][f_j^a, d]
                                           + sum_b x_b(j) part_tables[l, 1 + b, a][f_j^a, d]
                                           + sum_b y_b(i, j) part_tables[l, 1 + F + b, a][f_j^a, d]))
    p(target = t | z_1..z_L) = prod_l p(d_l = parts[t, l] | z_{l-1}, z_l)

A table says which part a fact's symbol names (a relation word, a direction), and in which sense: the tables of
the fields where the path enters the fact (the field that matches the question at hop 1, the previous fact after
it) turn a row around where the same fact, read from its other side, names the opposite part. Nothing names a
word: relabelling the symbols relabels the tables alone. The tables start at 0 and enter linearly, so each learns
from the first step. (A table of the symbols times a weight of the entry fields, ``O(F S D)`` in place of these
``O(F^2 S D)``, starts at a saddle: with the weights alike a row learns both of its opposite parts alike, and the
weights learn nothing until a row tells them apart; on bAbI task 19, 1k, that form answered 52.0 %, 67.7 % from a
random start of the weights, 86.7 % from a start that told the fields apart, and 52.5 % on the route task of
``tests/experiments/test_qa_hop_answers.py``, where these tables answer 86.5 % and 100 %; task 19 answers 100 %
over a chain normalised over whole paths, ``path_normalised=True``, which ``qa`` turns on with them.)

Each factor depends on the previous hop only through its fact, so the hop latents stay a Markov chain: the factors
of the row's target are folded into the chain's (``HopFactors.target_chain``: ``init (c, N)`` at hop 1,
``trans (L - 1, c, N, N)`` after), every query given the target is exact, and every query before it (the
question-only path) reads the prior chain alone. A prediction sums over the paths once per answer that has
parts (:meth:`HopAnswers.predict_proba`). Cost per chunk: ``O(c N^2 F D)``, a ``(c, N, N, D)`` tensor of logits a
hop; parameters ``L (1 + 2 F) F S D``.
"""

from __future__ import annotations

import math
from typing import Optional

import pyro
import pyro.distributions as dist
import torch
from pyro.ops.indexing import Vindex

from ..engine.log_space import HopChain
from .fact_features import FactFeatures, padded_rows

__all__ = ["HopAnswers", "PART_SHAPES", "parts_table"]

#: Shape of the parameters of an answer per hop (``D`` parts), only in a head given ``answer_parts``.
PART_SHAPES = {"part_tables": "(L, 1 + 2 F, F, S, D)"}


def parts_table(answer_parts, num_symbols: int, n_hops: int) -> Optional[torch.Tensor]:
    """``(S + 1, L)`` long: row ``t`` the parts of answer symbol ``t``, -1 where ``t`` has none (the last row is
    padding's); None for ``answer_parts = None``.

    :param answer_parts: ``{answer symbol: L part numbers}`` (a mapping, or its ``(symbol, parts)`` pairs), the
        parts numbered ``0 .. D - 1`` with every number used, no two answers with the same parts.
    """
    if answer_parts is None:
        return None
    pairs = list(answer_parts.items() if hasattr(answer_parts, "items") else answer_parts)
    if not pairs:
        raise ValueError("answer_parts must name at least one answer, got none")
    table = torch.full((num_symbols + 1, n_hops), -1, dtype=torch.long)
    seen = {}
    for pair in pairs:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"answer_parts must pair each answer symbol with its parts, got {pair!r}")
        symbol, parts = pair
        if isinstance(symbol, bool) or not isinstance(symbol, int) or not 0 <= symbol < num_symbols:
            raise ValueError(f"answer_parts names symbol {symbol!r}, outside 0 .. {num_symbols - 1}")
        parts = list(parts)
        if len(parts) != n_hops:
            raise ValueError(f"answer_parts[{symbol}] must have one part per hop (n_hops = {n_hops}), got {parts!r}")
        if any(isinstance(d, bool) or not isinstance(d, int) or d < 0 for d in parts):
            raise ValueError(f"answer_parts[{symbol}] must be non-negative integers, got {parts!r}")
        if bool((table[symbol] >= 0).any()):
            raise ValueError(f"answer_parts names symbol {symbol} twice")
        if tuple(parts) in seen:
            raise ValueError(f"answer_parts gives symbols {seen[tuple(parts)]} and {symbol} the same parts {parts}")
        seen[tuple(parts)] = symbol
        table[symbol] = torch.tensor(parts)
    used = torch.unique(table[table >= 0])
    if len(used) != int(used.max()) + 1:
        missing = sorted(set(range(int(used.max()) + 1)) - set(used.tolist()))
        raise ValueError(f"answer_parts must use every part number 0 .. {int(used.max())}; unused: {missing}")
    return table


class HopAnswers:
    """The answer-per-hop methods of :class:`~pyro_multihop.models.facts.FactAttention` (module docstring): its
    parameters ``part_tables`` and the buffer ``part_of`` exist only where ``answer_parts`` is given."""

    def _answer_parts_option(self, answer_parts, dtype) -> None:
        table = parts_table(answer_parts, self.num_symbols, self.n_hops)
        self.register_buffer("part_of", table, persistent=False)
        if table is None:
            return
        if self.embedding_posterior != "point":
            raise ValueError("answer_parts needs embedding_posterior='point' (a mean-field embedding's predictions "
                             f"mix the emission at the last hop), got {self.embedding_posterior!r}")
        L, F, S = self.n_hops, self.num_fields, self.num_symbols
        self.num_parts = int(table.max()) + 1
        self.part_tables = torch.nn.Parameter(torch.zeros(L, 1 + 2 * F, F, S, self.num_parts, dtype=dtype))

    @property
    def per_hop_answers(self) -> bool:
        """Whether the answer is said per hop (``answer_parts`` given)."""
        return self.part_of is not None

    def answer_parts_config(self) -> list:
        """``[[symbol, [parts]], ...]``: ``answer_parts`` as the config stores it (JSON)."""
        rows = (self.part_of[:-1, 0] >= 0).nonzero().flatten().tolist()
        return [[symbol, self.part_of[symbol].tolist()] for symbol in rows]

    def part_logits(self, hop: int, chunk: FactFeatures) -> torch.Tensor:
        """Unnormalised logits of hop ``hop``'s part (0-based): ``(c, N, D)`` at hop 0 (by the fact ``j``), ``(c, N, N,
        D)`` after it (by the previous fact ``i`` and ``j``), in the module docstring's formula: each table's rows at
        the fact's symbols summed over the fields first, ``(1 + 2 F, c, N, D)``, then weighted by the matches."""
        F = self.num_fields
        tables = padded_rows(self.part_tables[hop])  # (1 + 2 F, F, S + 1, D), padding 0
        said = sum(tables[:, a][:, chunk.fields[..., a]] for a in range(F))  # (1 + 2 F, c, N, D), summed over a
        logits = said[0] + torch.einsum("cjb,bcjd->cjd", chunk.in_question(), said[1:1 + F])  # (c, N, D)
        if hop == 0:
            return logits
        return logits.unsqueeze(1) + torch.einsum("cijb,bcjd->cijd", chunk.shared_fields(), said[1 + F:])

    def target_chain(self, obs) -> HopChain:
        """The log factors of each row's target, ``init (c, N)`` and ``trans (L - 1, c, N, N)``: ``log p(d_l =
        parts[target, l] | z_{l-1}, z_l)``; a target without parts gets ``log(tiny)`` at hop 1 (the emission's floor)."""
        chunk = self._chunk(obs)
        parts = self.part_of[obs.target]  # (c, L)
        known = parts[:, 0] >= 0
        factors = []
        for hop in range(self.n_hops):
            log_probs = self.part_logits(hop, chunk).log_softmax(-1)
            part = parts[:, hop].clamp(min=0).view(-1, *([1] * (log_probs.dim() - 1)))
            at = log_probs.gather(-1, part.expand(*log_probs.shape[:-1], 1)).squeeze(-1)
            floor = math.log(torch.finfo(at.dtype).tiny) if hop == 0 else 0.0
            factors.append(at.masked_fill(~known.view(-1, *([1] * (at.dim() - 1))), floor))
        c, N = factors[0].shape
        trans = torch.stack(factors[1:]) if self.n_hops > 1 else factors[0].new_zeros(0, c, N, N)
        return HopChain(factors[0], trans)

    def observe_answer_part(self, hop: int, chunk: FactFeatures, target: torch.Tensor, rows: torch.Tensor,
                            previous: Optional[torch.Tensor], position: torch.Tensor) -> None:
        """The observed site ``answer_part_{hop + 1}`` of the enumerated model, inside hop ``hop``'s ``pyro.markov``
        iteration (it depends on ``z_hop`` and ``z_{hop+1}``)."""
        parts = self.part_of[target, hop]
        if bool((parts < 0).any()):
            bad = target[parts < 0][:5].tolist()
            raise ValueError(f"target symbols {bad} have no answer_parts: every training answer needs its parts")
        logits = self.part_logits(hop, chunk)
        logits = Vindex(logits)[rows, position] if hop == 0 else Vindex(logits)[rows, previous, position]
        pyro.sample(f"answer_part_{hop + 1}", dist.Categorical(logits=logits), obs=parts)

    def part_elements(self, N: int) -> float:
        """Working memory per row of the parts' factors, in elements (0 without ``answer_parts``)."""
        if not self.per_hop_answers:
            return 0.0
        F, D = self.num_fields, self.num_parts
        return (F + 3 * D + 2) * N * N + 4 * (1 + 2 * F) * D * N

    @torch.no_grad()
    def predict_proba(self, obs, *, budget: Optional[int] = None) -> torch.Tensor:
        """``(n, S)``: with ``answer_parts``, ``p(target = t)`` for every answer ``t`` that has parts, the paths
        summed out once per answer (0 elsewhere; the mass of part combinations that no answer names is left out, so
        a row sums to at most 1); without, the engine's mixture of the last hop's emission."""
        if not self.per_hop_answers:
            return super().predict_proba(obs, budget=budget)
        self.check_observations(obs)
        out = torch.zeros(len(obs), self.num_symbols, dtype=self.part_tables.dtype, device=obs.device)
        for symbol in (self.part_of[:-1, 0] >= 0).nonzero().flatten().tolist():
            target = torch.full_like(obs.target, symbol)
            out[:, symbol] = self.log_likelihood(obs.with_target(target), budget=budget).exp()
        return out
