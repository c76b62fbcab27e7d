"""FactAttention's answer per hop (``answer_parts``, models/fact_hop_answers.py) against brute-force enumeration:
every hop path of real facts, each hop's part factor from its formula one fact pair at a time (Python loops over
fields, no padded tables, no einsum), the gates from tests/facts_oracle.py. Likelihood, gradients, posterior
queries given the answer and before it, predictions, the Pyro models; padding, a target without parts; bad input;
a checkpoint round trip."""

import itertools
import math

import pyro
import pytest
import torch
from pyro.infer import TraceEnum_ELBO

from pyro_multihop import FactAttention, engine, load_checkpoint, save_checkpoint
from pyro_multihop.models.facts import PARAMETER_SHAPES
from tests import factories
from tests import facts_oracle as oracle
from tests.models.test_fact_comparison import oracle_tables
from tests.oracle import chi_square_test, path_counts, path_entropy, path_posterior, sorted_paths

N, F, M, S, P = 4, 3, 3, 7, 4
FLOOR = math.log(torch.finfo(torch.float64).tiny)


def parts_of(L):
    """Distinct answer parts of symbols 0 .. S - 2 (symbol S - 1 has none)."""
    if L == 1:
        return {s: [s] for s in range(S - 1)}
    return {s: [s % 2, s // 2, (s // 3) % 2][:L] for s in range(S - 1)}


def hop_answers_head(L, seed, embed_dim=None, scale=0.8):
    """A float64 head with every parameter random (the parts' too)."""
    g = torch.Generator().manual_seed(seed)
    head = FactAttention(L, F, S, max_question_len=P, max_distance=3, dtype=torch.float64, embed_dim=embed_dim,
                         frame_symbols=None if embed_dim else torch.arange(S) % 2 == 0, answer_parts=parts_of(L))
    with torch.no_grad():
        for parameter in head.parameters():
            parameter.copy_(scale * torch.randn(parameter.shape, generator=g, dtype=torch.float64))
    return head


def part_log_probs(p, obs, row, hop, previous, j):
    """``(D,)`` ``log p(d_hop | z_{hop-1} = previous, z_hop = j)`` from the formula (``previous`` None at hop 0)."""
    fj = oracle.real_field_symbols(obs, row, j)
    fi = {} if previous is None else oracle.real_field_symbols(obs, row, previous)
    question = {int(obs.question[row, m]) for m in range(obs.question_len) if bool(obs.real_tokens()[row, m])}
    tables = p["part_tables"][hop]  # (1 + 2 F, F, S, D)
    logits = torch.zeros(tables.shape[-1], dtype=torch.float64)
    for a, symbol in fj.items():
        logits = logits + tables[0, a, symbol]
        for b, other in fj.items():
            logits = logits + float(other in question) * tables[1 + b, a, symbol]
            logits = logits + float(other in fi.values()) * tables[1 + F + b, a, symbol]
    return torch.log_softmax(logits, 0)


def hop_answer_tables(head, obs, params=None):
    """Per row ``{path: (log prior, log joint)}`` and the ``(S,)`` predictive over the answers with parts."""
    p = params if params is not None else oracle_tables(head)
    p = {**p, "revisit": head.revisit, "answer_symbols": None,
         "frame_symbols": getattr(head, "frame_symbols", torch.zeros(S, dtype=torch.bool))}
    parts = {s: v for s, v in parts_of(head.n_hops).items()}
    L, D = head.n_hops, head.max_distance
    tables, predictive = [], []
    for row in range(len(obs)):
        real = [i for i in range(obs.num_facts) if bool(obs.full_mask()[row, i])]
        gates = {(0, None): oracle.gate(p, obs, row, 0, None, D)}
        for hop in range(1, L):
            for i in real:
                gates[(hop, i)] = oracle.gate(p, obs, row, hop, i, D)
        table, mixture = {}, torch.zeros(S, dtype=torch.float64)
        for path in itertools.product(real, repeat=L):
            if any(path[hop] not in gates[(hop, path[hop - 1])] for hop in range(1, L)):
                continue
            prior = gates[(0, None)][path[0]] + sum(gates[(hop, path[hop - 1])][path[hop]] for hop in range(1, L))
            factors = [part_log_probs(p, obs, row, hop, None if hop == 0 else path[hop - 1], path[hop])
                       for hop in range(L)]
            said = {s: sum(factors[hop][d] for hop, d in enumerate(ds)) for s, ds in parts.items()}
            target = int(obs.target[row])
            table[path] = (prior, prior + (said[target] if target in said else FLOOR))
            mixture = mixture + torch.stack([(prior + said[s]).exp() if s in said else torch.zeros((), dtype=torch.float64)
                                             for s in range(S)])
        tables.append(table)
        predictive.append(mixture)
    return tables, predictive


@pytest.fixture(scope="module", params=[(1, None), (2, None), (3, None), (2, 4)],
                ids=lambda p: f"L{p[0]}-{'tables' if p[1] is None else 'embedded'}")
def hop_case(request):
    L, embed_dim = request.param
    head = hop_answers_head(L, seed=L + 20, embed_dim=embed_dim)
    obs = factories.random_fact_observations(5, N, F, M, S, seed=30 + L, padded=True)
    obs.target[0] = S - 1  # a target without parts
    tables, predictive = hop_answer_tables(head, obs)
    return head, obs, tables, predictive, oracle.summaries(tables, N, L)


def test_likelihood_and_predictions_equal_brute_force(hop_case):
    head, obs, tables, predictive, _ = hop_case
    oracle.assert_likelihood_exact(head, obs, oracle.log_likelihood(tables))
    predicted = head.predict_proba(obs, budget=1)
    assert torch.allclose(predicted, torch.stack(predictive), atol=1e-9, rtol=0)
    assert (predicted[:, S - 1] == 0).all() and (predicted.sum(-1) <= 1 + 1e-12).all()


def test_posterior_queries_given_the_answer_and_before_it(hop_case):
    head, obs, _, _, expected = hop_case
    oracle.assert_marginals_and_map_exact(head, obs, expected)
    given = torch.tensor([path_entropy(t) for t in expected["log_joints"]], dtype=torch.float64)
    prior = torch.tensor([path_entropy(t) for t in expected["log_priors"]], dtype=torch.float64)
    assert torch.allclose(head.path_entropy(obs), given, atol=1e-9, rtol=0)
    assert torch.allclose(head.path_entropy(obs, given_target=False), prior, atol=1e-9, rtol=0)
    for given_target, key in ((True, "log_joints"), (False, "log_priors")):
        paths, log_probs = head.k_best_paths(obs, 4, given_target=given_target, budget=1)
        for row, table in enumerate(expected[key]):
            best = sorted_paths(table)[:4]
            assert [tuple(p) for p in paths[row].tolist()][:len(best)] == [path for path, _ in best]
            assert torch.allclose(log_probs[row, :len(best)], torch.tensor([v for _, v in best], dtype=torch.float64),
                                  atol=1e-9, rtol=0)
    # the engine's question-only marginals (qa_apply's): the prior chain's, the parts unread
    prior_marginals = engine.hop_marginals(head.hop_factors(), obs, budget=1, given_target=False)
    for row, table in enumerate(expected["log_priors"]):
        for hop in range(head.n_hops):
            for position in range(N):
                want = sum(math.exp(v) for path, v in table.items() if path[hop] == position)
                assert abs(float(prior_marginals[hop, row, position]) - want) < 1e-9


def test_samples_follow_the_posterior_given_the_answer(hop_case):
    head, obs, _, _, expected = hop_case
    draws = head.sample_paths(obs[1:], 3000, seed=0)
    statistic, dof, p_value = chi_square_test(path_counts(draws),
                                              [path_posterior(t) for t in expected["log_joints"][1:]])
    assert p_value > 1e-3, (statistic, dof)


def test_the_question_only_chain_ignores_the_parts(hop_case):
    """Before the answer is seen, the chain is the gate's alone: the same head without parts gives the same MAP
    path and entropy (its emission differs, its gates do not)."""
    head, obs, _, _, _ = hop_case
    plain = FactAttention(head.n_hops, F, S, max_question_len=P, max_distance=3, dtype=torch.float64,
                          embed_dim=head.embed_dim, frame_symbols=getattr(head, "frame_symbols", None))
    plain.load_state_dict({k: v for k, v in head.state_dict().items() if not k.startswith("part_")})
    assert torch.equal(plain.map_paths(obs, given_target=False), head.map_paths(obs, given_target=False))
    assert torch.allclose(plain.path_entropy(obs, given_target=False), head.path_entropy(obs, given_target=False),
                          atol=1e-12, rtol=0)
    assert not torch.allclose(plain.log_likelihood(obs), head.log_likelihood(obs))


@pytest.mark.parametrize("L", [1, 2, 3])
def test_gradients_and_pyro_models_equal_the_oracles(L):
    head = hop_answers_head(L, seed=L + 50)
    obs = factories.random_fact_observations(3, N, F, M, S, seed=60 + L, padded=True)
    obs.target[:] = torch.tensor([0, 3, 5])  # every target has parts: the enumerated model observes them
    params = {name: p.detach().clone().requires_grad_(True) for name, p in head.named_parameters()}
    oracle.log_likelihood(hop_answer_tables(head, obs, params)[0]).sum().backward()
    exact = head.log_likelihood(obs, budget=1)
    exact.sum().backward()
    for name, parameter in head.named_parameters():
        if name in PARAMETER_SHAPES and name.startswith(("emission", "copy", "compare", "answer")):
            assert parameter.grad is None or parameter.grad.abs().sum() == 0, name  # the last hop's emission is unused
            continue
        if parameter.numel() == 0:
            continue
        want = params[name].grad
        want = torch.zeros_like(parameter) if want is None else want  # a term no path of these rows reads
        assert torch.allclose(parameter.grad, want, atol=1e-9, rtol=0), name
    assert head.part_tables.grad[:, 0].abs().sum() > 0 and head.part_tables.grad[:, 1:1 + F].abs().sum() > 0
    if L > 1:  # the previous fact's matches enter after hop 1
        assert head.part_tables.grad[1:, 1 + F:].abs().sum() > 0
    oracle.pyro_model_losses(head, obs, -exact.detach().sum())


def test_the_enumerated_model_refuses_a_target_without_parts():
    head = hop_answers_head(2, seed=1)
    obs = factories.random_fact_observations(3, N, F, M, S, seed=2)
    obs.target[:] = S - 1
    with pyro.get_param_store().scope(), pytest.raises(ValueError, match=f"target symbols \\[{S - 1}"):
        TraceEnum_ELBO(max_plate_nesting=1).differentiable_loss(head.model, head.guide, obs)


@pytest.mark.parametrize("parts, words", [
    ({}, "at least one"),
    ({S: [0, 1]}, f"symbol {S}"),
    ({1: [0]}, "one part per hop"),
    ({1: [0, -1]}, "non-negative"),
    ({1: [0, 2]}, "unused: [1]"),
    ([(1, [0, 1]), (1, [1, 0])], "twice"),
    ({1: [0, 1], 2: [0, 1]}, "the same parts"),
    ([1, 2], "pair each answer"),
])
def test_bad_answer_parts_are_refused(parts, words):
    with pytest.raises(ValueError, match="answer_parts") as caught:
        FactAttention(2, F, S, answer_parts=parts)
    assert words in str(caught.value)


def test_answer_parts_need_a_point_embedding():
    with pytest.raises(ValueError, match="embedding_posterior='point'"):
        FactAttention(2, F, S, embed_dim=4, embedding_posterior="mean_field", answer_parts=parts_of(2))


def test_the_engine_refuses_to_predict_from_the_last_hop_alone():
    head = hop_answers_head(2, seed=3)
    obs = factories.random_fact_observations(2, N, F, M, S, seed=3)
    with pytest.raises(ValueError, match="target_chain"):
        engine.predict_proba(head.hop_factors(), obs)


def test_a_checkpoint_keeps_the_parts(tmp_path):
    head = hop_answers_head(2, seed=5)
    obs = factories.random_fact_observations(3, N, F, M, S, seed=2)
    save_checkpoint(tmp_path / "head.pt", head)
    restored = load_checkpoint(tmp_path / "head.pt")[0]
    assert restored.answer_parts_config() == head.answer_parts_config()
    assert torch.equal(restored.log_likelihood(obs), head.log_likelihood(obs))
    assert torch.equal(restored.predict_proba(obs), head.predict_proba(obs))
