"""FactAttention's ``answer_symbols``: the learnt parts of the emission (tables, comparison) over a subset of the
symbols. Exact against brute-force enumeration (tests/facts_oracle.py) for the table and the embedded head, with
the comparison on and padding, targets inside and outside the answers; the parameters' shapes; bad input; a
checkpoint round trip."""

import pytest
import torch

from pyro_multihop import FactAttention, load_checkpoint, save_checkpoint
from pyro_multihop.models.facts import parameter_elements
from tests import factories
from tests import facts_oracle as oracle
from tests.models.test_fact_comparison import oracle_tables

N, F, M, S, P = 4, 3, 3, 7, 4
ANSWERS = [5, 1, 3]


def answers_head(L, seed, embed_dim=None, answers=ANSWERS):
    g = torch.Generator().manual_seed(seed)
    head = FactAttention(L, F, S, max_question_len=P, max_distance=3, dtype=torch.float64, embed_dim=embed_dim,
                         answer_symbols=answers)
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.copy_(0.8 * torch.randn(parameter.shape, generator=g, dtype=torch.float64))
        head.emission_mix[-1] = 1.0  # the comparison weighs too
    return head


@pytest.mark.parametrize("L", [1, 2])
@pytest.mark.parametrize("embed_dim", [None, 4], ids=["tables", "embedded"])
def test_restricted_answers_are_exact(L, embed_dim):
    head = answers_head(L, seed=L + 40, embed_dim=embed_dim)
    obs = factories.random_fact_observations(6, N, F, M, S, seed=60 + L, padded=True)
    inside = torch.isin(obs.target, torch.tensor(ANSWERS))
    assert inside.any() and (~inside).any()  # both kinds of target
    tables, predictive = oracle.path_tables(head, obs, oracle_tables(head))
    expected = oracle.log_likelihood(tables)
    summary = oracle.summaries(tables, N, L)
    finite = expected > -700  # a target no component can emit: the oracle says -inf, the head log(tiny)
    assert torch.allclose(head.log_likelihood(obs)[finite], expected[finite], atol=1e-9, rtol=0)
    assert torch.allclose(head.log_likelihood(obs, budget=1)[finite], expected[finite], atol=1e-9, rtol=0)
    assert torch.allclose(head.hop_marginals(obs)[:, finite], summary["hop_marginals"][:, finite], atol=1e-9, rtol=0)
    predicted = head.predict_proba(obs)
    assert torch.allclose(predicted, torch.stack(predictive), atol=1e-9, rtol=0)
    assert torch.allclose(predicted.sum(-1), torch.ones(len(obs), dtype=torch.float64), atol=1e-12, rtol=0)
    # a symbol neither an answer nor in any fact of the row gets nothing
    others = [s for s in range(S) if s not in ANSWERS]
    for row in range(len(obs)):
        held = set(obs.facts[row][obs.full_mask()[row]].flatten().tolist())
        for symbol in others:
            if symbol not in held:
                assert predicted[row, symbol] < 1e-300  # the emission's floor, log(tiny)


def test_gradients_with_restricted_answers_equal_the_oracles():
    head = answers_head(2, seed=3, embed_dim=None)
    obs = factories.random_fact_observations(3, N, F, M, S, seed=14, padded=True)
    obs.target[:] = torch.tensor([5, 3, 1])
    params = {name: p.detach().clone().requires_grad_(True) for name, p in head.named_parameters()}
    oracle.log_likelihood(oracle.path_tables(head, obs, params)[0]).sum().backward()
    head.log_likelihood(obs, budget=1).sum().backward()
    for name, parameter in head.named_parameters():
        assert torch.allclose(parameter.grad, params[name].grad, atol=1e-9, rtol=0), name


@pytest.mark.parametrize("embed_dim", [None, 4])
def test_shapes_follow_the_number_of_answers(embed_dim):
    head = FactAttention(2, F, S, max_question_len=P, embed_dim=embed_dim, answer_symbols=ANSWERS)
    sizes = {name: p.numel() for name, p in head.named_parameters()}
    assert sizes == parameter_elements(2, F, S, P, embed_dim=embed_dim, num_answers=len(ANSWERS))
    assert head.compare_logits.shape == (F, 3) and head.compare_bias.shape == (3,)
    if embed_dim is None:
        assert head.emission_tables.shape == (F, S, 3)
    else:
        assert head.output_embedding.shape == (3, embed_dim) and head.answer_bias.shape == (3,)
    assert "num_answers=3" in repr(head)


def test_without_answer_symbols_nothing_changes():
    """``answer_symbols=range(S)`` in order is the unrestricted head, to the last bit."""
    plain = factories.random_fact_head(2, F, S, P, seed=8)
    every = FactAttention(2, F, S, max_question_len=P, max_distance=3, dtype=torch.float64,
                          answer_symbols=list(range(S)))
    every.load_state_dict(plain.state_dict())
    obs = factories.random_fact_observations(5, N, F, M, S, seed=9)
    assert torch.equal(every.log_likelihood(obs), plain.log_likelihood(obs))
    assert torch.equal(every.predict_proba(obs), plain.predict_proba(obs))


@pytest.mark.parametrize("answers, error, words", [
    ([1, 1], ValueError, "distinct"),
    ([0, S], ValueError, f"got {S}"),
    ([-1], ValueError, "got -1"),
    ([0.5], TypeError, "integer"),
    ([], TypeError, "non-empty"),
    ([[1, 2]], TypeError, "1-D"),
])
def test_bad_answer_symbols_are_refused(answers, error, words):
    with pytest.raises(error, match="answer_symbols") as caught:
        FactAttention(2, F, S, answer_symbols=answers)
    assert words in str(caught.value)


def test_a_checkpoint_keeps_the_answers(tmp_path):
    head = answers_head(2, seed=5, embed_dim=4)
    obs = factories.random_fact_observations(3, N, F, M, S, seed=2)
    save_checkpoint(tmp_path / "head.pt", head)
    restored = load_checkpoint(tmp_path / "head.pt")[0]
    assert restored.answer_symbols.tolist() == ANSWERS
    assert torch.equal(restored.log_likelihood(obs), head.log_likelihood(obs))


def test_one_query_computes_each_normaliser_once_and_a_step_starts_anew():
    """The embedded head's per-query normalisers (symbol_embedding.FieldNormalisers), shared by the chunks of one
    query, give the per-chunk result in every chunking; after a parameter changes in place, the same factors
    recompute them (the versions changed) and agree with a fresh query."""
    head = answers_head(2, seed=11, embed_dim=4)
    obs = factories.random_fact_observations(7, N, F, M, S, seed=3, padded=True)
    whole = head.log_likelihood(obs)
    assert torch.allclose(head.log_likelihood(obs, budget=1), whole, atol=1e-12, rtol=0)
    factors = head.hop_factors()
    first = factors.position_target(obs[:4])
    with torch.no_grad():
        head.output_embedding.mul_(2.0)
    again = factors.position_target(obs[:4])
    assert not torch.allclose(first, again)
    assert torch.allclose(again, head.hop_factors().position_target(obs[:4]), atol=1e-12, rtol=0)
    assert torch.allclose(again, head.target_log_probs(obs[:4]), atol=1e-12, rtol=0)  # the per-chunk path
