"""The task simulators: chain, transitive and induction tasks, and fact chains; their structure and arguments."""

import pytest
import torch

from pyro_multihop import chain_task, fact_chain_task, fact_chain_vocabulary, induction_task, transitive_task


def test_transitive_task_structure():
    obs = transitive_task(300, num_symbols=30, pairs=5, seed=0)
    assert obs.keys.shape == (300, 10) and obs.num_symbols <= 30
    a, b = obs.keys[:, :5], obs.values[:, :5]
    b_keys, c = obs.keys[:, 5:], obs.values[:, 5:]
    for row in range(300):
        i = a[row].tolist().index(int(obs.query[row]))
        j = b_keys[row].tolist().index(int(b[row, i]))
        assert int(c[row, j]) == int(obs.target[row])
        assert sorted(b_keys[row].tolist()) == sorted(b[row].tolist())
        assert len(set(a[row].tolist())) == 5


def test_simulators_are_seeded():
    assert transitive_task(20, seed=4) == transitive_task(20, seed=4)
    assert not transitive_task(20, seed=4) == transitive_task(20, seed=5)
    assert induction_task(20, seed=1) == induction_task(20, seed=1)


def test_chain_task_follows_the_chain_for_every_hop_count():
    for hops in (1, 3, 4):
        obs = chain_task(50, n_hops=hops, num_symbols=40, pairs=3, seed=hops)
        assert obs.context_len == 3 * hops
        for row in range(50):
            symbol = int(obs.query[row])
            for hop in range(hops):
                block = slice(3 * hop, 3 * hop + 3)
                position = obs.keys[row, block].tolist().index(symbol)
                symbol = int(obs.values[row, block][position])
            assert symbol == int(obs.target[row])


def test_induction_task_copies_the_successor():
    obs = induction_task(100, num_symbols=20, seq_len=6, seed=2)
    assert obs.keys.shape == (100, 6)
    assert torch.equal(obs.keys[:, 1:], obs.values[:, :-1])
    position = (obs.keys == obs.query[:, None]).long().argmax(-1)
    assert torch.equal(obs.values.gather(1, position[:, None]).squeeze(1), obs.target)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: transitive_task(0), "n must be a positive integer"),
        (lambda: transitive_task(10, num_symbols=3, pairs=5), "num_symbols must be an integer >= pairs"),
        (lambda: chain_task(10, n_hops=0), "n_hops must be a positive integer"),
        (lambda: induction_task(10, num_symbols=5, seq_len=8), "num_symbols must be an integer >= pairs"),
    ],
)
def test_simulator_arguments_are_checked(call, message):
    with pytest.raises(ValueError, match=message):
        call()


def test_fact_chain_task_structure():
    vocabulary = fact_chain_vocabulary(4, 40, 20)
    for entities, pool in (("train", vocabulary.train_entities), ("test", vocabulary.test_entities)):
        obs = fact_chain_task(200, n_hops=3, num_facts=9, entities=entities, seed=1)
        assert obs.facts.shape == (200, 9, 3) and obs.question.shape == (200, 4) and obs.supporting.shape == (200, 3)
        subjects, relations, objects = obs.facts.unbind(-1)
        assert bool(((subjects >= pool.start) & (subjects < pool.stop)).all())
        assert bool((relations < 4).all()) and bool((obs.question[:, :3] - 4 == obs.question[:, :3] - 4).all())
        chain = obs.facts.gather(1, obs.supporting.unsqueeze(-1).expand(-1, -1, 3))  # (n, L, 3) in order
        assert torch.equal(chain[:, 0, 0], obs.question[:, 3])  # hop 1: the question's entity
        assert torch.equal(chain[:, :, 1], obs.question[:, :3] - 4)  # each hop: the relation its word asks
        assert torch.equal(chain[:, 1:, 0], chain[:, :-1, 2])  # next subject = previous object
        assert torch.equal(obs.target, chain[:, -1, 2])
        # no other fact matches both a hop's subject and its relation
        for hop in range(3):
            matches = (subjects == chain[:, hop, 0, None]) & (relations == chain[:, hop, 1, None])
            assert bool((matches.sum(-1) == 1).all())
    assert fact_chain_task(5, seed=2) == fact_chain_task(5, seed=2)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"n": 0}, "n must be a positive integer"),
        ({"n_hops": 2, "num_facts": 3}, "num_facts must be >= 2 n_hops"),
        ({"entities": "valid"}, "entities must be 'train' or 'test'"),
        ({"num_relations": 1}, "num_relations must be an integer >= 2"),
        ({"test_entities": 5, "entities": "test"}, "test_entities must be >= 15"),
    ],
)
def test_fact_chain_task_bad_input(kwargs, message):
    kwargs = {"n": 4, **kwargs}
    with pytest.raises(ValueError, match=message):
        fact_chain_task(**kwargs)


def test_the_old_hops_keyword_warns_and_draws_the_same_rows():
    """``hops=`` (renamed ``n_hops``) is kept for one release: it warns, naming ``n_hops``; positional calls
    are unchanged; both keywords at once, or neither where the count is required, are a TypeError."""
    with pytest.warns(DeprecationWarning, match=r"chain_task\(hops=...\) is deprecated; use chain_task\(n_hops=...\)"):
        old = chain_task(20, hops=3, seed=1)
    assert old == chain_task(20, n_hops=3, seed=1) == chain_task(20, 3, seed=1)
    with pytest.warns(DeprecationWarning, match=r"use fact_chain_task\(n_hops=...\)"):
        old_facts = fact_chain_task(10, hops=3, seed=2)
    assert old_facts == fact_chain_task(10, n_hops=3, seed=2) == fact_chain_task(10, 3, seed=2)
    assert old_facts.supporting.shape == (10, 3)
    with pytest.raises(TypeError, match="got both 'n_hops' and its old keyword 'hops'"), pytest.warns(DeprecationWarning):
        chain_task(20, 3, hops=3)
    with pytest.raises(TypeError, match="got both"), pytest.warns(DeprecationWarning):
        fact_chain_task(10, n_hops=3, hops=3)
    with pytest.raises(TypeError, match="missing required argument: 'n_hops'"):
        chain_task(20)
