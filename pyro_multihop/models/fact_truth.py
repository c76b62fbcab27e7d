"""The generating structure of :func:`~pyro_multihop.data.fact_chain_task` as a
:class:`~pyro_multihop.models.facts.FactAttention`: the head that a fit of that task is measured against."""

from __future__ import annotations

from typing import Optional

import torch

from ..checks import check_number, renamed_keyword
from ..data import fact_chain_vocabulary
from .facts import FactAttention

__all__ = ["fact_chain_truth"]


def fact_chain_truth(n_hops: int = 2, num_relations: int = 4, train_entities: int = 40, test_entities: int = 20,
                     strength: float = 20.0, dtype=None, *, hops: Optional[int] = None) -> FactAttention:
    """The generating structure of :func:`~pyro_multihop.data.fact_chain_task` as a :class:`FactAttention`.

    Hop ``l`` picks question word ``l`` (and hop 1 also the entity, the last token) by position; question word
    ``R + r`` matches relation ``r`` in field 1 (``question_tables``) and the entity matches field 0 by
    equality; from hop 2 on, the previous fact's object (field 2) must equal the candidate's subject
    (``field_equality[l, 2, 0]``); the answer copies the last fact's object. ``strength`` scales every weight.
    ``n_hops``: ``L`` (``hops=``, its old keyword, is deprecated).
    """
    n_hops = renamed_keyword("fact_chain_truth", "n_hops", n_hops, "hops", hops, default=2)
    check_number("strength", strength, strict=True)
    vocabulary = fact_chain_vocabulary(num_relations, train_entities, test_entities)
    L, S, P = n_hops, vocabulary.num_symbols, n_hops + 1
    dtype = torch.get_default_dtype() if dtype is None else dtype
    position = torch.full((L, P), -strength, dtype=dtype)
    for hop in range(L):
        position[hop, hop] = 0.0
    position[0, L] = 0.0  # hop 1 also reads the entity
    question_equality = torch.zeros(L, 3, dtype=dtype)
    question_equality[0, 0] = 2 * strength  # half of hop 1's choice is the entity, matched to the subject
    question_tables = torch.zeros(L, 3, S, S, dtype=dtype)
    for r in vocabulary.relations:
        question_tables[:, 1, vocabulary.question_words[r], r] = strength
    question_tables[0] *= 2  # hop 1 gives the relation word half of its choice
    field_equality = torch.zeros(max(L - 1, 0), 3, 3, dtype=dtype)
    field_equality[:, 2, 0] = strength
    init = {"question_position": position, "question_equality": question_equality, "question_tables": question_tables,
            "field_equality": field_equality, "emission_mix_probs": [0, 0, 0, 0, 0, 1]}
    return FactAttention(n_hops, 3, S, max_question_len=P, dtype=dtype, init=init)
