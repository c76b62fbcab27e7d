"""The structured-facts head's emission (:class:`~pyro_multihop.models.facts.FactAttention`): the answer given the
fact the last hop attends, a mixture over the fact's real fields of a learnt table and a copy, and a comparison of
question tokens with the fact's fields (the formula is in :mod:`.facts`; the copy's weights are :mod:`.fact_copy`,
the comparison :mod:`.fact_comparison`, an embedded head's tables :mod:`.symbol_embedding`), with a head's
``register`` mixed in (:mod:`.fact_register`: a count or a set, the same at every fact), then a head's
``composition`` (:mod:`.fact_composition`: a yes / no from two facts composed, the same at every fact).

Three forms, each for what a query needs: every target of every fact (:meth:`FactEmission.emission_log_probs`,
``(c, N, S)``: sampling), each row's target alone (:meth:`FactEmission.target_log_probs`, ``(c, N)``: the
likelihood and the path queries) and the mixture over the facts (:meth:`FactEmission.emission_mixture`, ``(c, S)``:
predictions), the last two without a ``(c, N, S)`` table.
"""

from __future__ import annotations

import torch

from ..data import FactObservations
from ..engine.log_space import MASKED_LOGIT, floored_log
from ..gate_ops import table_gather
from . import fact_comparison as comparison
from . import fact_copy
from . import symbol_embedding as embedded
from .fact_features import padded

__all__ = ["FactEmission"]


class FactEmission:
    """The emission's methods of :class:`~pyro_multihop.models.facts.FactAttention`, which holds their parameters
    (``emission_mix``, the tables or the embedded head's ``emission_bilinear``, ``output_embedding`` and
    ``answer_bias``, the copy's and the comparison's)."""

    def emission_log_probs(self, obs: FactObservations) -> torch.Tensor:
        """``(c, N, S)`` normalised ``log p(target = t | z_L = i)``: each real field's table mixed with its copy.

        Mixed in probability space (``F`` row lookups and one scatter of the copies), then one logarithm;
        a probability below the dtype's smallest normal number is raised to it (so a target the mixture
        cannot emit gets ``log(tiny)``, about -708 in float64, and every gradient stays finite)."""
        tables, copies, compares, total, matches = self._mixture_weights(obs)
        probs = self._learnt_probs(obs, tables, compares, matches)
        if self.answer_symbols is not None:  # (c, N, A) -> (c, N, S)
            probs = probs.new_zeros(*probs.shape[:-1], self.num_symbols).index_add_(-1, self.answer_symbols, probs)
        probs = probs.scatter_add(-1, obs.facts, copies)
        log_probs = floored_log(probs / total)
        log_probs = self.with_register(log_probs, lambda: self.register_answer_log_probs(obs))
        return self.with_composition(log_probs, lambda: self.composition_answer_log_probs(obs))

    def _learnt_probs(self, obs: FactObservations, tables: torch.Tensor, compares: torch.Tensor,
                      matches) -> torch.Tensor:
        """``(c, N, A)``: the learnt components over the answers, each fact's tables weighted by ``tables``
        ``(c, N, F)`` and its comparison by ``compares`` ``(c, N, 1)`` (unnormalised: :meth:`_mixture_weights`'s, or
        those times a mixing weight)."""
        if self.embed_dim is not None:
            probs = embedded.table_probs(obs.facts, self.embedding_matrix(), self.emission_bilinear,
                                         self.output_embedding, self.answer_bias, tables)
        else:
            rows = self.emission_tables.softmax(-1)  # (F, S, A)
            probs = sum(tables[..., a, None] * torch.nn.functional.embedding(obs.facts[..., a], rows[a])
                        for a in range(self.num_fields))
        if self._comparison_weighs():
            probs = probs + compares * comparison.comparison_probs(matches, self._comparison_logits(),
                                                                   self.compare_bias)
        return probs

    def field_normalisers(self) -> "embedded.FieldNormalisers":
        """An embedded head's emission normalisers, computed once per (field, symbol) of the chunks they serve."""
        return embedded.FieldNormalisers(self.embedding_matrix(), self.emission_bilinear, self.output_embedding,
                                         self.answer_bias, self.embedded_symbols)

    def _comparison_logits(self) -> torch.Tensor:
        """``(2 F, A)``: ``compare_logits`` over ``compare_flip_logits``, the weights of
        :func:`~.fact_comparison.flipped_matches`."""
        return torch.cat([self.compare_logits, self.compare_flip_logits])

    def _comparison_weighs(self) -> bool:
        """Whether the comparison component has any weight (its mixture logit above ``MASKED_LOGIT``): where it has
        none, its terms are exactly 0 and their gradients too, so they are not computed."""
        return bool(self.emission_mix[-1] > MASKED_LOGIT)

    def target_log_probs(self, obs: FactObservations, normalisers=None) -> torch.Tensor:
        """``(c, N)``: :meth:`emission_log_probs` at each row's target only, the tables and copies in ``O(c N F)``,
        the comparison's normaliser in blocks of answers (the engine's ``position_target``: the likelihood and the
        path queries need no ``(c, N, S)`` table). ``normalisers``: an embedded head's
        :class:`~.symbol_embedding.FieldNormalisers`, shared by the chunks of one query (:meth:`hop_factors`)."""
        tables, copies, compares, total, matches = self._mixture_weights(obs)
        target = obs.target.view(-1, 1).expand(obs.facts.shape[:2])  # (c, N)
        answer = self.answer_index[obs.target]  # (c,): the target's answer number, -1 where the tables cannot give it
        emitted = (answer >= 0).to(tables.dtype).view(-1, 1, 1)
        answer = answer.clamp(min=0)
        if self.embed_dim is not None:  # the normaliser over the A answers in blocks, no (c, N, A) table
            normalisers = self.field_normalisers() if normalisers is None else normalisers
            table_probs = embedded.table_log_probs(obs.facts, answer, self.embedding_matrix(), self.emission_bilinear,
                                                   self.output_embedding, self.answer_bias, normalisers).exp()
        else:
            rows = self.emission_tables.log_softmax(-1)  # (F, S, A)
            at = answer.view(-1, 1).expand(obs.facts.shape[:2])
            table_probs = torch.stack([table_gather(rows[a], obs.facts[..., a], at)
                                       for a in range(self.num_fields)], -1).exp()
        probs = (tables * table_probs * emitted + copies * (obs.facts == target.unsqueeze(-1))).sum(-1, keepdim=True)
        if self._comparison_weighs():
            compared = comparison.comparison_log_probs(matches, answer, self._comparison_logits(),
                                                       self.compare_bias).exp()
            probs = probs + compares * (compared.unsqueeze(-1) * emitted)
        log_probs = floored_log(probs / total).squeeze(-1)
        log_probs = self.with_register(log_probs, lambda: self.register_target_log_probs(obs))
        return self.with_composition(log_probs, lambda: self.composition_target_log_probs(obs))

    def _mixture_weights(self, obs: FactObservations):
        """``(table weights (c, N, F), copy weights (c, N, F), comparison weight (c, N, 1), their total (c, N, 1),
        the comparison's features (c, N, 2 F), :func:`~.fact_comparison.flipped_matches`, or None where the
        comparison has no weight)``: over each fact's real fields ``mix[0, a]`` and
        ``mix[1, a] exp(copy_by_symbol[f_i^a])``, and ``mix[2 F] exp(sum_a compare_by_symbol[f_i^a])``, formed in
        log space and scaled by each fact's largest, so that none overflows."""
        chunk = self._chunk(obs)
        F = self.num_fields
        real = chunk.real_fields  # (c, N, F)
        mix = self.emission_mix.log_softmax(-1)
        copy_logits = fact_copy.copy_logits(chunk, self.copy_by_symbol, self.copy_question_equality,
                                            self.copy_by_question)  # (c, N, F)
        compare_logits = padded(self.compare_by_symbol, 1)[chunk.fields].sum(-1, keepdim=True)  # (c, N, 1)
        logits = torch.cat([mix[:F] + torch.zeros_like(copy_logits), mix[F:2 * F] + copy_logits], -1)
        logits = torch.cat([logits.masked_fill(~real.repeat(1, 1, 2), MASKED_LOGIT), mix[2 * F] + compare_logits], -1)
        weights = (logits - logits.detach().max(-1, keepdim=True).values).exp()  # (c, N, 2 F + 1)
        matches = None  # read only where the comparison weighs
        if self._comparison_weighs():
            weights_e = comparison.token_weights(padded(self.compare_choice, 1), self.compare_position,
                                                 chunk.question, chunk.real_tokens)
            matches = comparison.field_matches(weights_e, chunk.question, chunk.fields, real)
            matches = comparison.flipped_matches(matches, padded(self.compare_flip, 1), chunk.fields, real)
        return weights[..., :F], weights[..., F:2 * F], weights[..., 2 * F:], weights.sum(-1, keepdim=True), matches

    def emission_mixture(self, obs: FactObservations, weights: torch.Tensor) -> torch.Tensor:
        """``(c, S)``: ``sum_i weights[:, i] p(t | z_L = i)`` for ``weights`` ``(c, N)`` (the engine's
        ``position_mixture``: a prediction mixes the emission by ``p(z_L = i)``). Mixed over the facts in the
        answers' space, ``(c, N, A)``, before the copies and the answers are scattered into the ``S`` symbols, so
        that no ``(c, N, S)`` table is formed: :meth:`emission_log_probs` exponentiated and mixed, but for its
        floor (a position's probability raised to the dtype's smallest normal number)."""
        tables, copies, compares, total, matches = self._mixture_weights(obs)
        share = weights.unsqueeze(-1) / total  # (c, N, 1): each fact's weight over its mixture's total
        learnt = self._learnt_probs(obs, tables * share, compares * share, matches).sum(-2)  # (c, A)
        if self.answer_symbols is not None:  # (c, A) -> (c, S)
            learnt = learnt.new_zeros(len(obs), self.num_symbols).index_add_(-1, self.answer_symbols, learnt)
        mixture = learnt.scatter_add(-1, obs.facts.flatten(1), (copies * share).flatten(1))
        # the register's and the composition's shares, the same at every fact: weighted by the facts' total weight
        for used, logit, log_probs in ((self.uses_register, "register_mix", self.register_answer_log_probs),
                                       (self.uses_composition, "composition_mix", self.composition_answer_log_probs)):
            if used:
                share = torch.sigmoid(getattr(self, logit)[0])
                mixture = (1 - share) * mixture + share * weights.sum(-1, keepdim=True) * log_probs(obs).exp()
        return mixture

