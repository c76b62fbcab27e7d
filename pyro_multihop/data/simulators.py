"""Task simulators: seeded batches of observations whose generating structure is known.

- :func:`chain_task`, :func:`transitive_task` and :func:`induction_task`: key/value lookups as
  :class:`~pyro_multihop.data.observations.Observations`;
- :func:`fact_chain_task`: relation chains over facts ``(subject, relation, object)`` as
  :class:`~pyro_multihop.data.fact_observations.FactObservations`, its symbols laid out by
  :func:`fact_chain_vocabulary`.

Example::

    >>> from pyro_multihop.data import fact_chain_task
    >>> obs = fact_chain_task(100, seed=0)
    >>> tuple(obs.facts.shape), obs.question_len, len(obs[:10])
    ((100, 8, 3), 3, 10)
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from ..checks import renamed_keyword
from .fact_observations import FactObservations
from .observations import Observations

__all__ = [
    "chain_task",
    "transitive_task",
    "induction_task",
    "FactChainVocabulary",
    "fact_chain_vocabulary",
    "fact_chain_task",
]


def _generator(seed: Optional[int]) -> torch.Generator:
    """A CPU generator seeded with ``seed``, or from the system's entropy when ``seed`` is None."""
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(int(seed))
    return generator


def _check_task_sizes(n: int, num_symbols: int, pairs: int, n_hops: int) -> None:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if not isinstance(n_hops, int) or n_hops < 1:
        raise ValueError(f"n_hops must be a positive integer, got {n_hops!r}")
    if not isinstance(pairs, int) or pairs < 1:
        raise ValueError(f"pairs must be a positive integer, got {pairs!r}")
    if not isinstance(num_symbols, int) or num_symbols < pairs:
        raise ValueError(f"num_symbols must be an integer >= pairs = {pairs}, got {num_symbols!r}")


def chain_task(n: int, n_hops: Optional[int] = None, num_symbols: int = 30, pairs: int = 5,
               seed: Optional[int] = 0, *, hops: Optional[int] = None) -> Observations:
    """An L-hop lookup chain from ``x0`` to ``xL``, one lookup a hop; ``n_hops = 2`` is :func:`transitive_task`.

    Each row draws ``n_hops + 1`` role sets ``x_0..x_L``, each ``pairs`` distinct symbols out of
    ``num_symbols`` (independently across roles, so a symbol can play two roles and collide). The
    context has ``n_hops`` blocks of ``pairs`` positions; block ``l`` holds the pairs
    ``(key x_{l-1}[j], value x_l[j])``, blocks after the first in shuffled order. The query is
    ``x_0[i]`` and the target ``x_L[i]`` for a random chain ``i``: the identity lookup repeated ``n_hops``
    times finds it, up to collisions between roles. Targets live in the symbol vocabulary.

    :param int n_hops: ``L``, the chain length (required; ``hops=``, its old keyword, is deprecated).
    :returns: Observations with ``N = n_hops * pairs``.
    """
    n_hops = renamed_keyword("chain_task", "n_hops", n_hops, "hops", hops)
    _check_task_sizes(n, num_symbols, pairs, n_hops)
    generator = _generator(seed)
    roles = torch.rand(n, n_hops + 1, num_symbols, generator=generator).argsort(-1)[..., :pairs]  # (n, L+1, P)
    keys, values = [], []
    for hop in range(n_hops):
        order = torch.arange(pairs).expand(n, pairs)
        if hop > 0:
            order = torch.rand(n, pairs, generator=generator).argsort(-1)
        keys.append(roles[:, hop].gather(1, order))
        values.append(roles[:, hop + 1].gather(1, order))
    chain = torch.randint(pairs, (n, 1), generator=generator)
    return Observations(
        keys=torch.cat(keys, 1),
        values=torch.cat(values, 1),
        query=roles[:, 0].gather(1, chain).squeeze(1),
        target=roles[:, n_hops].gather(1, chain).squeeze(1),
    )


def transitive_task(n: int, num_symbols: int = 30, pairs: int = 5, seed: Optional[int] = 0) -> Observations:
    """The transitive lookup ``a -> b -> c``: keys ``[a, perm(b)]``, values ``[b, c]``, query ``a_i``,
    target the ``c`` paired with ``b_i``. Needs two hops; see :func:`chain_task` for the details."""
    return chain_task(n, n_hops=2, num_symbols=num_symbols, pairs=pairs, seed=seed)


def induction_task(n: int, num_symbols: int = 30, seq_len: int = 8, seed: Optional[int] = 0) -> Observations:
    """The induction (copy) task: continue a sequence after an earlier occurrence of the current token.

    Each row is a sequence ``s_0..s_{seq_len}`` of distinct tokens. Position ``t`` of the context holds
    ``(key s_t, value s_{t+1})``, the token and its successor, as a previous-token head would present
    them. The query is ``s_j`` for a random ``j`` and the target is ``s_{j+1}``, the token that followed
    it: one hop with the identity key table copies it (the induction-head circuit).

    :returns: Observations with ``N = seq_len``.
    """
    _check_task_sizes(n, num_symbols, seq_len + 1, 1)
    generator = _generator(seed)
    sequence = torch.rand(n, num_symbols, generator=generator).argsort(-1)[:, : seq_len + 1]
    position = torch.randint(seq_len, (n, 1), generator=generator)
    return Observations(
        keys=sequence[:, :-1],
        values=sequence[:, 1:],
        query=sequence[:, :-1].gather(1, position).squeeze(1),
        target=sequence[:, 1:].gather(1, position).squeeze(1),
    )


# -- relation chains over facts ---------------------------------------------------------------------------
class FactChainVocabulary(NamedTuple):
    """Where the symbols of :func:`fact_chain_task` lie (one vocabulary of ``num_symbols`` symbols).

    :ivar relations: symbols ``[0, R)``, a fact's relation (field 1).
    :ivar question_words: symbols ``[R, 2R)``; question word ``R + r`` asks for relation ``r`` (a different
        symbol, so a head must learn which word matches which relation).
    :ivar train_entities: ``range`` of the entities of ``entities='train'`` rows.
    :ivar test_entities: ``range`` of the entities of ``entities='test'`` rows (never in training).
    :ivar num_symbols: the vocabulary size.
    """

    relations: range
    question_words: range
    train_entities: range
    test_entities: range
    num_symbols: int


def fact_chain_vocabulary(num_relations: int = 4, train_entities: int = 40, test_entities: int = 20) -> FactChainVocabulary:
    """The symbol layout of :func:`fact_chain_task` with these sizes."""
    for name, value in (("num_relations", num_relations), ("train_entities", train_entities), ("test_entities", test_entities)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    R = num_relations
    first = 2 * R
    return FactChainVocabulary(
        range(R), range(R, 2 * R), range(first, first + train_entities),
        range(first + train_entities, first + train_entities + test_entities), first + train_entities + test_entities,
    )


def fact_chain_task(
    n: int,
    n_hops: int = 2,
    num_facts: int = 8,
    num_relations: int = 4,
    entities: str = "train",
    train_entities: int = 40,
    test_entities: int = 20,
    seed: Optional[int] = 0,
    *,
    hops: Optional[int] = None,
) -> FactObservations:
    """Relation chains over facts ``(subject, relation, object)``: "what is the ``r_L`` of ... the ``r_1`` of X?".

    Each row draws distinct entities ``X = e_0, e_1, .., e_L`` and relations ``r_1..r_L`` (uniform, repeats
    allowed) and holds the ``L`` chain facts ``(e_{l-1}, r_l, e_l)`` among ``num_facts - L`` distractors
    in shuffled order. Distractor ``d`` is, in turn, a fact of a chain entity with another relation
    ``(e_{l-1}, r' != r_l, z)``, a fact of the asked relation about another entity ``(z, r_l, z')``, or a
    random fact ``(z, r, z')`` (``z, z'`` fresh entities, never a chain entity). The question is
    ``[word(r_1), .., word(r_L), X]`` (``M = L + 1``, ``word(r) = R + r``) and the target is ``e_L``.

    Generating structure (:func:`pyro_multihop.models.fact_truth.fact_chain_truth`): hop 1 attends the fact
    whose subject equals the question's entity and whose relation the first question word names, hop
    ``l`` the fact whose subject equals the previous fact's object and whose relation word ``l`` names;
    the answer copies the object of the last fact. It answers every row correctly: no distractor matches
    both the entity and the relation of a hop.

    :param int n_hops: ``L``, chain length (at least 1; ``hops=``, its old keyword, is deprecated).
    :param int num_facts: ``N`` (at least ``2 L``).
    :param str entities: ``'train'`` draws entities from ``train_entities`` symbols, ``'test'`` from the
        ``test_entities`` others, never seen in training (see :func:`fact_chain_vocabulary`).
    :returns: :class:`FactObservations` with ``F = 3`` and ``supporting`` the chain facts, in order.
    """
    n_hops = renamed_keyword("fact_chain_task", "n_hops", n_hops, "hops", hops, default=2)
    for name, value in (("n", n), ("n_hops", n_hops), ("num_facts", num_facts)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if num_facts < 2 * n_hops:
        raise ValueError(f"num_facts must be >= 2 n_hops = {2 * n_hops}, got {num_facts}")
    if isinstance(num_relations, bool) or not isinstance(num_relations, int) or num_relations < 2:
        raise ValueError(f"num_relations must be an integer >= 2 (a distractor needs another relation), got {num_relations!r}")
    if entities not in ("train", "test"):
        raise ValueError(f"entities must be 'train' or 'test', got {entities!r}")
    vocabulary = fact_chain_vocabulary(num_relations, train_entities, test_entities)
    pool = vocabulary.train_entities if entities == "train" else vocabulary.test_entities
    distractors = num_facts - n_hops
    needed = n_hops + 1 + 2 * distractors
    if len(pool) < needed:
        raise ValueError(f"{entities}_entities must be >= {needed} (distinct entities a row needs), got {len(pool)}")
    generator = _generator(seed)
    R = num_relations
    drawn = pool.start + torch.rand(n, len(pool), generator=generator).argsort(-1)[:, :needed]  # distinct per row
    chain, fresh = drawn[:, : n_hops + 1], drawn[:, n_hops + 1 :].reshape(n, distractors, 2)
    relations = torch.randint(R, (n, n_hops), generator=generator)
    facts = [torch.stack([chain[:, l], relations[:, l], chain[:, l + 1]], -1) for l in range(n_hops)]
    for d in range(distractors):
        l = d % n_hops
        z, z2 = fresh[:, d, 0], fresh[:, d, 1]
        kind = d // n_hops % 3
        if kind == 0:  # a chain entity with another relation
            other = (relations[:, l] + torch.randint(1, R, (n,), generator=generator)) % R
            facts.append(torch.stack([chain[:, l], other, z], -1))
        elif kind == 1:  # the asked relation about another entity
            facts.append(torch.stack([z, relations[:, l], z2], -1))
        else:  # a random fact
            facts.append(torch.stack([z, torch.randint(R, (n,), generator=generator), z2], -1))
    facts = torch.stack(facts, 1)  # (n, N, 3), chain facts first
    order = torch.rand(n, num_facts, generator=generator).argsort(-1)  # new position -> old index
    facts = facts.gather(1, order.unsqueeze(-1).expand(-1, -1, 3))
    supporting = order.argsort(-1)[:, :n_hops]  # where the chain facts went
    question = torch.cat([R + relations, chain[:, :1]], 1)
    return FactObservations(facts, question, chain[:, n_hops], supporting=supporting)
