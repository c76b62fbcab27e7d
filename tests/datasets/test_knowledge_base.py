"""The simulated knowledge base (datasets/knowledge_base.py): every question is answered by following its relation
words from its entity through its own facts (an independent walk over the record's tokens), its supporting facts
are that walk, test questions share no entity with training ones, sizes and seeds hold, bad input is refused."""

import pytest

from pyro_multihop.datasets.knowledge_base import knowledge_base_task
from pyro_multihop.datasets.qa_jsonl import QAVocabulary

WORDS = 2


def walk(record, n_hops):
    """Follow the question's relation words (``q<k>`` names relation ``k // WORDS``), nearest to the entity first,
    from the entity (the last token) through the facts; ``(answer, fact indices)``, or None where a hop has not
    exactly one fact."""
    relation_words = [token for token in record.question if token.startswith("q")][::-1]
    assert len(relation_words) == n_hops
    entity, used = record.question[-1], []
    for word in relation_words:
        relation = f"r{int(word[1:]) // WORDS}"
        matches = [i for i, fact in enumerate(record.facts) if fact[0] == entity and fact[1] == relation]
        if len(matches) != 1:
            return None
        used.append(matches[0])
        entity = record.facts[matches[0]][2]
    return entity, tuple(used)


@pytest.mark.parametrize("n_hops", [1, 2, 3])
def test_every_question_is_answered_by_its_relation_words(n_hops):
    records = knowledge_base_task(60, n_hops=n_hops, num_entities=3000, words_per_relation=WORDS, seed=n_hops)
    for record in records:
        assert walk(record, n_hops) == (record.answer, record.supporting)
        assert n_hops <= len(record.facts) <= 40 and len(record.question) == 2 * n_hops + 2
        assert len(set(record.facts)) == len(record.facts)


def test_test_questions_hold_no_training_entity():
    train = knowledge_base_task(200, num_entities=2000, seed=0)
    test = knowledge_base_task(100, num_entities=2000, entities="test", seed=1)

    def entities(records):
        return {token for record in records for fact in record.facts for token in (fact[0], fact[2])}

    assert entities(train) and entities(test) and not entities(train) & entities(test)
    assert len(entities(train)) > 1000  # the knowledge base, not one small corner of it


def test_seeds_and_sizes():
    first = knowledge_base_task(20, num_entities=1000, seed=4)
    assert first == knowledge_base_task(20, num_entities=1000, seed=4)
    assert first != knowledge_base_task(20, num_entities=1000, seed=5)
    small = knowledge_base_task(20, n_hops=2, num_entities=1000, max_facts=5, seed=4)
    assert all(len(record.facts) <= 5 for record in small)
    vocabulary = QAVocabulary.build(first)
    assert vocabulary.num_fields == 3


@pytest.mark.parametrize("options, words", [
    (dict(n=0), "n must be"),
    (dict(n=5, n_hops=0), "n_hops must be"),
    (dict(n=5, entities="valid"), "entities must be"),
    (dict(n=5, test_share=1.0), "test_share must be"),
    (dict(n=5, degree=0), "degree must be"),
    (dict(n=5, num_relations=1), "num_relations must be"),
    (dict(n=5, max_facts=1, n_hops=2), "max_facts must be"),
    (dict(n=5, n_hops=30, num_entities=100, degree=1.0), "too few 30-hop paths"),
])
def test_bad_input_is_refused(options, words):
    with pytest.raises(ValueError, match=words):
        knowledge_base_task(**{"num_entities": 1000, **options})
