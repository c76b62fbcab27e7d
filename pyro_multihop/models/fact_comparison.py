"""The comparison component of the structured-facts head's emission (:class:`~pyro_multihop.models.facts.FactAttention`):
an answer drawn from the outcome of comparing question tokens with the fields of the attended fact.

With the emission's own soft choice of question tokens (like a hop's, masked over padding)::

    w_E = softmax_m(compare_choice[q_m] + compare_position[min(m, P)])              # (M,)
    match_b(i) = sum_m w_E[m] [q_m == f_i^b]      (0 where field b of fact i is padded) # in [0, 1]
    g(i) = sum_a compare_flip[f_i^a]              (over the real fields a of fact i)
    p_compare(t | i) = softmax_t(compare_bias[t] + sum_b match_b(i) (compare_logits[b, t] + g(i) compare_flip_logits[b, t]))

so an answer (one a yes, another a no, a third a maybe) can rise where some field of the fact equals the chosen
question token and another elsewhere, for any symbols: nothing here names a word, and relabelling every symbol
relabels the component's parameters alone. ``g(i)`` lets a fact's symbols turn what a match says (a negation's
word makes a match say *no*): the matches alone read where in the fact the chosen token stands, not the fact's
other words, and a negation puts the place where a plain move does. ``compare_flip`` starts at
:data:`FLIP_START` (at 0 both it and ``compare_flip_logits`` would have zero gradients) and is decayed as
``compare_by_symbol`` is, ``compare_flip_logits`` starts at 0, where the component is the one without the flip. The head mixes it with its tables and copies, its weight
``mix[2 F] exp(sum_a compare_by_symbol[f_i^a])`` depending on the fact's symbols as a copy's weight does on the
symbol it copies (a fact that states a negation can leave the answer to the tables).

Cost per chunk of ``c`` rows: the matches ``O(c N F M)`` (one ``(c, N, F)`` comparison a question token); the
normaliser over the ``S`` answers ``O(c N F S)`` multiply-adds in blocks of answers under the engine's memory
budget (:class:`~pyro_multihop.models.symbol_embedding.LogNormaliser`, the matches standing for the hidden
vectors and ``compare_logits`` for the output embedding), so the likelihood holds no ``(c, N, S)`` tensor; only
predictions form the ``(c, N, S)`` distribution. No ``S x S`` table: the same for the embedded head.
"""

from __future__ import annotations

import torch

from ..engine.log_space import MASKED_LOGIT
from ..gate_ops import log_normalize
from .symbol_embedding import LogNormaliser

__all__ = ["COMPARISON_SHAPES", "FLIP_START", "token_weights", "field_matches", "flipped_matches",
           "comparison_log_probs", "comparison_probs"]

#: Shapes of the comparison's parameters (``F`` fields, ``S`` symbols, ``P`` question positions); all 0 at the start.
COMPARISON_SHAPES = {
    "compare_choice": "(S,)",
    "compare_position": "(P,)",
    "compare_logits": "(F, A)",
    "compare_bias": "(A,)",
    "compare_by_symbol": "(S,)",
    "compare_flip": "(S,)",
    "compare_flip_logits": "(F, A)",
}

#: Start of every symbol's ``compare_flip``: the flip's two parameters multiply, so at 0 both gradients are zero.
#: Measured on bAbI task 9 (1k; answers / supporting facts, %): the comparison start alone 78.0 / 65.4 without
#: the flip, 98.6 / 97.6 with it from 0.1, the same from 0.01; the command's four starts 99.5 / 99.2 with
#: ``compare_flip`` decayed at 3e-2 (``FactAttention.svi_defaults``; undecayed, task 6 fell from 93.0 to 84.7).
FLIP_START = 0.1


def token_weights(choice: torch.Tensor, position: torch.Tensor, question: torch.Tensor,
                  real_tokens: torch.Tensor) -> torch.Tensor:
    """``(c, M)``: ``softmax_m(choice[q_m] + position[min(m, P)])`` over the real tokens (rows on the simplex).

    :param choice: ``(S + 1,)`` logits by symbol, the last (padding's) unused.
    :param position: ``(P,)``; tokens past the ``P``-th share its logit.
    :param question: ``(c, M)``, padding mapped to ``S``.
    :param real_tokens: ``(c, M)`` bool.
    """
    M, P = question.shape[1], position.shape[0]
    by_position = position[:M] if M <= P else position[torch.arange(M, device=question.device).clamp(max=P - 1)]
    logits = choice[question] + by_position
    return log_normalize(logits.masked_fill(~real_tokens, MASKED_LOGIT)).exp()


def field_matches(weights: torch.Tensor, question: torch.Tensor, fields: torch.Tensor,
                  real_fields: torch.Tensor) -> torch.Tensor:
    """``(c, N, F)``: ``match_b(i) = sum_m weights[m] [q_m == f_i^b]``, zero at padded fields; one token at a time
    (no ``(c, M, N, F)`` tensor).

    :param weights: ``(c, M)`` zero at padded tokens. :param question: ``(c, M)``. :param fields: ``(c, N, F)``.
    :param real_fields: ``(c, N, F)`` bool.
    """
    matches = weights.new_zeros(fields.shape)
    for m in range(question.shape[1]):
        same = (fields == question[:, m, None, None]) & real_fields
        matches = matches + weights[:, m, None, None] * same.to(weights.dtype)
    return matches


def flipped_matches(matches: torch.Tensor, flip: torch.Tensor, fields: torch.Tensor,
                    real_fields: torch.Tensor) -> torch.Tensor:
    """``(c, N, 2 F)``: ``[match_b(i), g(i) match_b(i)]``, the features that ``[compare_logits; compare_flip_logits]``
    ``(2 F, A)`` weigh, with ``g(i) = sum_a compare_flip[f_i^a]`` over the real fields.

    :param matches: ``(c, N, F)`` (:func:`field_matches`). :param flip: ``(S + 1,)`` ``compare_flip``, padding's
        entry unused. :param fields: ``(c, N, F)``. :param real_fields: ``(c, N, F)`` bool.
    """
    g = (flip[fields] * real_fields.to(flip.dtype)).sum(-1, keepdim=True)  # (c, N, 1)
    return torch.cat([matches, g * matches], -1)


def comparison_log_probs(matches: torch.Tensor, target: torch.Tensor, logits: torch.Tensor,
                         bias: torch.Tensor) -> torch.Tensor:
    """``(c, N)``: ``log p_compare(target | i)`` for each row's ``target`` ``(c,)``, its normaliser over the
    answers in blocks (:class:`~.symbol_embedding.LogNormaliser`: no ``(c, N, S)`` tensor).

    :param matches: ``(c, N, F)`` (:func:`field_matches`). :param logits: ``(F, S)`` ``compare_logits``.
    :param bias: ``(S,)`` ``compare_bias``.
    """
    c, N, F = matches.shape
    log_norm = LogNormaliser.apply(matches.reshape(c * N, F), logits.t(), bias).view(c, N)
    at_target = (matches * logits.t()[target].unsqueeze(1)).sum(-1) + bias[target].unsqueeze(-1)
    return at_target - log_norm


def comparison_probs(matches: torch.Tensor, logits: torch.Tensor, bias: torch.Tensor) -> torch.Tensor:
    """``(c, N, S)``: ``p_compare(t | i)`` for every answer ``t`` (predictions)."""
    return torch.addmm(bias, matches.flatten(0, 1), logits).softmax(-1).view(*matches.shape[:2], -1)
