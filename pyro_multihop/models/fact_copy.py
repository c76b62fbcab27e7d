"""The copy's weight in the structured-facts head's emission (:class:`~pyro_multihop.models.facts.FactAttention`):
how much copying field ``a`` of the attended fact ``i`` weighs, as a function of the symbol it would copy and of
the question::

    copy_logit(i, a) = copy_by_symbol[f_i^a]                                  # a place, not a time word
                     + copy_question_equality[a] [f_i^a occurs in the question] # the question's own words are not the answer
                     + mean_m copy_by_question[q_m, a]                          # which field the question asks for

The mean runs over the question's real tokens. The second term lets the answer be the participant of a fact that
the question does not name ("who gave the ball to X" copies the giver, "who did Y give the ball to" the
receiver), the third the field a wording asks for ("who received ..." the receiver's field). Every term depends
on the attended fact and the question alone, so the hop chain and every exact query are unchanged; at 0 (the
start) the copy is the symbol-only copy of earlier releases. ``O(c N F M)`` per chunk, ``O(S F)`` parameters,
no ``S x S`` table.
"""

from __future__ import annotations

import torch

from .fact_features import FactFeatures, padded, padded_rows

__all__ = ["copy_logits"]


def copy_logits(chunk: FactFeatures, copy_by_symbol: torch.Tensor, copy_question_equality: torch.Tensor,
                copy_by_question: torch.Tensor) -> torch.Tensor:
    """``(c, N, F)`` unnormalised log weight of copying each field of each fact (padded fields: any value, the
    caller masks them).

    :param chunk: the chunk's :class:`~.fact_features.FactFeatures` (padding mapped to ``S``).
    :param copy_by_symbol: ``(S,)``. :param copy_question_equality: ``(F,)``. :param copy_by_question: ``(S, F)``.
    """
    tokens = chunk.real_tokens.to(copy_by_symbol.dtype)  # (c, M)
    weights = tokens / tokens.sum(-1, keepdim=True).clamp_min(1)  # the mean over the real tokens
    by_question = padded_rows(copy_by_question)[chunk.question]  # (c, M, F), padding 0
    asked = (weights.unsqueeze(-1) * by_question).sum(1)  # (c, F)
    return padded(copy_by_symbol, 1)[chunk.fields] + copy_question_equality * chunk.in_question() + asked.unsqueeze(1)
