"""The copy's question terms (``pyro_multihop/models/fact_copy.py``). Their exactness (every query against brute
force, with random values of ``copy_question_equality`` and ``copy_by_question``, with padding) is the oracle
tests' (tests/facts_oracle.py, ``copy_logit``); here: what they are for, learnt, and old checkpoints."""

import pytest
import torch

from pyro_multihop import FactAttention, FactObservations, fit_svi
from tests import factories

RELATIONS = 3


def participant_task(n, entities, seed):
    """Rows of 4 facts ``(x, relation, y)`` over the ``entities`` (symbols from ``RELATIONS`` on), one relation a
    fact; the question names one fact's relation and one of its two participants, in the field order of the fact
    (``(x, relation)`` or ``(relation, y)``), and the answer is the participant it does not name. The
    generating model answers every row right."""
    g = torch.Generator().manual_seed(seed)
    facts = torch.empty(n, RELATIONS, 3, dtype=torch.long)
    facts[..., 1] = torch.stack([torch.randperm(RELATIONS, generator=g) for _ in range(n)])
    picks = torch.stack([entities[torch.randperm(len(entities), generator=g)[:2 * RELATIONS]] for _ in range(n)])
    facts[..., 0], facts[..., 2] = picks[:, :RELATIONS], picks[:, RELATIONS:]
    asked = torch.randint(RELATIONS, (n,), generator=g)
    fact = facts[torch.arange(n), asked]  # (n, 3)
    names_first = torch.rand(n, generator=g) < 0.5
    question = torch.where(names_first.unsqueeze(-1), fact[:, :2], fact[:, 1:])
    target = torch.where(names_first, fact[:, 2], fact[:, 0])
    return FactObservations(facts, question, target, supporting=asked.unsqueeze(-1))


def test_the_copy_answers_with_the_participant_the_question_does_not_name_on_entities_never_seen():
    """The two participants of the attended fact are both copyable, in fields 0 and 2; which one answers depends on
    which the question names. On entities training never showed, ``copy_by_symbol`` knows nothing, so only the
    question terms can pick: the generating model's accuracy (1.0) is reached; without them (a symbol-only copy,
    the terms held at 0) the copy can only split between the fields, about half."""
    S = RELATIONS + 60
    train = participant_task(400, torch.arange(RELATIONS, RELATIONS + 40), seed=0)
    test = participant_task(200, torch.arange(RELATIONS + 40, S), seed=1)
    head = FactAttention(1, 3, S, max_question_len=2, dtype=torch.float64)
    fit_svi(head, train, **{**head.svi_defaults(), "num_steps": 150}, progress=False, seed=0)
    accuracy = float((head.predict_proba(test).argmax(-1) == test.target).double().mean())
    assert accuracy >= 0.97
    with torch.no_grad():
        head.copy_question_equality.zero_()
        head.copy_by_question.zero_()
    without = float((head.predict_proba(test).argmax(-1) == test.target).double().mean())
    assert without <= 0.75


def test_a_checkpoint_without_the_copy_question_terms_loads_as_the_head_it_was(tmp_path):
    """A checkpoint written before the copy had its question terms loads with them at 0, which is the head it was
    trained as (the same likelihood); a state dict that has them keeps its values."""
    from pyro_multihop.checkpoint import load_checkpoint, save_checkpoint

    obs = participant_task(10, torch.arange(RELATIONS, RELATIONS + 20), seed=2)
    head = FactAttention(1, 3, RELATIONS + 20, max_question_len=2, dtype=torch.float64)
    with torch.no_grad():
        head.copy_by_symbol.normal_(generator=torch.Generator().manual_seed(0))
    old, _ = load_checkpoint(factories.checkpoint_without(head, ("copy_question_equality", "copy_by_question"),
                                                          tmp_path))
    assert torch.equal(old.log_likelihood(obs), head.log_likelihood(obs))
    with torch.no_grad():
        head.copy_question_equality.fill_(2.0)
    restored, _ = load_checkpoint(save_checkpoint(tmp_path / "kept.pt", head, step=0))
    assert torch.equal(restored.copy_question_equality, head.copy_question_equality)
    assert not torch.allclose(restored.log_likelihood(obs), old.log_likelihood(obs))
