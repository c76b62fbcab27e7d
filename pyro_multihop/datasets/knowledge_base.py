"""A simulated knowledge base and its multi-hop questions, as facts records (the ``qa`` command's format).

A knowledge base of ``num_entities`` entities and ``num_relations`` relations holds, for every entity ``e`` and
relation ``r``, with probability ``degree / num_relations``, one fact ``(e, r, o)`` (relations are functional:
at most one object per subject and relation). The entities are split once: a share ``test_share`` of them, with
the facts among them, form the *test* part, the rest the *training* part, and no fact joins the two, so that
test questions hold only entities that training never showed.

An ``L``-hop question starts at an entity ``X`` and follows ``L`` of its facts ``(e_{l-1}, r_l, e_l)``
(``e_0 = X``, entities distinct); its answer is ``e_L``, which the relations determine. Its facts are the
``L`` chain facts and up to ``max_facts - L`` others from ``X``'s ``L``-hop neighbourhood (every fact out of an
entity that fewer than ``L`` facts separate from ``X``, as knowledge-base QA sets cut their subgraphs; drawn at
random when there are more), in random order. Its tokens are the question word of the first kind, then for ``l = L .. 1`` a word naming ``r_l`` (one
of ``words_per_relation`` synonyms, never the relation's own token) and a linking word, then ``X``::

    facts:    (e, r, o) ... with (X, r_1, e_1), (e_1, r_2, e_2) among them
    question: [opener, word(r_2), link, word(r_1), link, X]              (L = 2)
    answer:   e_2;  supporting: the chain facts' indices, in hop order

Every token is a made-up name (``e17``, ``r3``, ``q5``, ``w1``): nothing is read from a token's letters. The
generating structure is the facts head's: hop 1 attends the fact whose subject equals the question's last
token and whose relation the hop's question word names, hop ``l`` the fact whose subject equals the previous
fact's object and whose relation word ``l`` names, and the answer copies the last fact's object.

Example::

    >>> from pyro_multihop.datasets.knowledge_base import knowledge_base_task
    >>> records = knowledge_base_task(3, n_hops=2, num_entities=1000, seed=0)
    >>> len(records), len(records[0].question), records[0].supporting is not None
    (3, 6, True)
"""

from __future__ import annotations

from typing import List, Optional

import numpy as np

from .qa_jsonl import QARecord

__all__ = ["knowledge_base_task"]

_SPLITS = ("train", "test")


def _positive_int(name: str, value, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < least:
        raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
    return int(value)


def _knowledge_base(num_entities: int, num_relations: int, degree: float, test_share: float, seed: int):
    """``(objects (num_entities, num_relations) int64, -1 where no fact; split (num_entities,) bool, True = test)``."""
    generator = np.random.default_rng(seed)
    split = np.zeros(num_entities, dtype=bool)
    split[generator.permutation(num_entities)[:int(round(test_share * num_entities))]] = True
    has_fact = generator.random((num_entities, num_relations)) < degree / num_relations
    objects = np.full((num_entities, num_relations), -1, dtype=np.int64)
    for part in (False, True):
        members = np.flatnonzero(split == part)
        drawn = members[generator.integers(0, len(members), size=(len(members), num_relations))]
        objects[members] = np.where(has_fact[members] & (drawn != members[:, None]), drawn, -1)
    return objects, split


def knowledge_base_task(n: int, n_hops: int = 2, num_entities: int = 50_000, num_relations: int = 20,
                        degree: float = 4.0, max_facts: int = 40, words_per_relation: int = 2,
                        entities: str = "train", test_share: float = 0.2, seed: Optional[int] = 0,
                        kb_seed: int = 0) -> List[QARecord]:
    """``n`` questions of ``n_hops`` hops over one simulated knowledge base (module docstring).

    :param int num_entities: entities of the knowledge base (both parts).
    :param int num_relations: relations; each has ``words_per_relation`` question words.
    :param float degree: the expected number of facts out of an entity.
    :param int max_facts: the most facts of a question (at least ``n_hops``).
    :param str entities: ``'train'`` asks about the training part, ``'test'`` about the test part, whose entities
        no training question holds.
    :param float test_share: the share of entities in the test part.
    :param seed: seed of the questions; ``kb_seed`` of the knowledge base (the same for training and test files).
    :returns: :class:`~pyro_multihop.datasets.qa_jsonl.QARecord` s with ``supporting`` the chain facts in hop order
        and ``id`` their index.
    """
    n = _positive_int("n", n)
    n_hops = _positive_int("n_hops", n_hops)
    num_entities = _positive_int("num_entities", num_entities, 10)
    num_relations = _positive_int("num_relations", num_relations, 2)
    words_per_relation = _positive_int("words_per_relation", words_per_relation)
    max_facts = _positive_int("max_facts", max_facts, n_hops)
    if entities not in _SPLITS:
        raise ValueError(f"entities must be one of {_SPLITS}, got {entities!r}")
    if not 0 < test_share < 1:
        raise ValueError(f"test_share must be in (0, 1), got {test_share!r}")
    if not 0 < degree <= num_relations:
        raise ValueError(f"degree must be in (0, num_relations = {num_relations}], got {degree!r}")
    objects, split = _knowledge_base(num_entities, num_relations, float(degree), test_share, kb_seed)
    generator = np.random.default_rng(seed)
    starts = np.flatnonzero(split == (entities == "test"))
    records: List[QARecord] = []
    tries = 0
    while len(records) < n:
        tries += 1
        if tries > 100 * n + 1000:
            raise ValueError(f"the knowledge base has too few {n_hops}-hop paths for {n} questions: raise degree "
                             f"(got {degree}) or num_entities (got {num_entities})")
        path = _walk(objects, int(generator.choice(starts)), n_hops, generator)
        if path is not None:
            records.append(_question(objects, path, n_hops, max_facts, words_per_relation, generator, len(records)))
    return records


def _walk(objects: np.ndarray, start: int, n_hops: int, generator) -> Optional[list]:
    """``[(e_0, r_1, e_1), ..]``: ``n_hops`` facts from ``start`` through distinct entities, or None."""
    path, seen, entity = [], {start}, start
    for _ in range(n_hops):
        relations = np.flatnonzero((objects[entity] >= 0) & ~np.isin(objects[entity], list(seen)))
        if len(relations) == 0:
            return None
        relation = int(generator.choice(relations))
        path.append((entity, relation, int(objects[entity, relation])))
        entity = path[-1][2]
        seen.add(entity)
    return path


def _question(objects, path, n_hops, max_facts, words_per_relation, generator, index) -> QARecord:
    chain = set(path)
    frontier, reached, neighbourhood = {path[0][0]}, {path[0][0]}, set()
    for _ in range(n_hops):  # the facts within n_hops of X: out of every entity fewer than n_hops facts away
        facts = {(e, int(r), int(objects[e, r])) for e in frontier for r in np.flatnonzero(objects[e] >= 0)}
        neighbourhood |= facts
        frontier = {fact[2] for fact in facts} - reached
        reached |= frontier
    others = sorted(neighbourhood - chain)
    keep = generator.permutation(len(others))[:max_facts - n_hops]
    facts = [others[i] for i in keep] + list(path)
    order = generator.permutation(len(facts))
    facts = [facts[i] for i in order]
    position = {fact: place for place, fact in enumerate(facts)}
    words = []
    for _, relation, _ in reversed(path):
        words += [f"q{relation * words_per_relation + int(generator.integers(words_per_relation))}",
                  f"w{2 + int(generator.integers(2))}"]
    question = (f"w{int(generator.integers(2))}", *words, f"e{path[0][0]}")
    return QARecord(facts=tuple((f"e{e}", f"r{r}", f"e{o}") for e, r, o in facts), question=question,
                    answer=f"e{path[-1][2]}", supporting=tuple(position[fact] for fact in path), id=index)
