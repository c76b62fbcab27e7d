"""FactAttention(path_normalised=True): one softmax over whole paths of the summed scores (a CRF over the hops), in
place of one softmax per hop. Against brute force: every path of real facts scored from tests/facts_oracle.py's
formula, one softmax over the paths, the emission from its definition; likelihood, gradients, posterior queries,
predictions, the Pyro models, with padding and with an answer per hop; and the per-hop chain differs."""

import itertools
import math

import pytest
import torch

from pyro_multihop import FactAttention, load_checkpoint, save_checkpoint
from pyro_multihop.engine.log_space import path_normalised_logits
from tests import factories
from tests import facts_oracle as oracle
from tests.oracle import path_entropy, sorted_paths

N, F, M, S, P = 4, 3, 3, 6, 4


def path_head(L, seed):
    """A float64 path-normalised head with every parameter random, as factories.random_fact_head's."""
    plain = factories.random_fact_head(L, F, S, P, seed=seed)
    head = FactAttention(L, F, S, max_question_len=P, max_distance=3, dtype=torch.float64, path_normalised=True,
                         frame_symbols=plain.frame_symbols)
    head.load_state_dict(plain.state_dict())
    return head, plain


def path_tables(head, obs, params=None):
    """Per row ``{path: (log prior, log joint)}`` with the prior one softmax over the paths' summed scores, and the
    ``(S,)`` predictive."""
    p = params if params is not None else {k: v.detach() for k, v in head.named_parameters()}
    p = {**p, "answer_symbols": None, "revisit": head.revisit, "frame_symbols": head.frame_symbols}
    L, D = head.n_hops, head.max_distance
    tables, predictive = [], []
    for row in range(len(obs)):
        real = [i for i in range(obs.num_facts) if bool(obs.full_mask()[row, i])]
        scores, emissions = {}, {i: oracle.emission(p, obs, row, i) for i in real}
        for path in itertools.product(real, repeat=L):
            if len(real) > 1 and any(path[hop] == path[hop - 1] for hop in range(1, L)):
                continue  # a revisit: probability zero
            scores[path] = sum(oracle.score(p, obs, row, hop, None if hop == 0 else path[hop - 1], path[hop], D)
                               for hop in range(L))
        paths = list(scores)
        log_prior = torch.log_softmax(torch.stack([torch.as_tensor(scores[q], dtype=torch.float64) for q in paths]), 0)
        target = int(obs.target[row])
        tables.append({q: (lp, lp + emissions[q[-1]][target]) for q, lp in zip(paths, log_prior)})
        predictive.append(sum(lp.exp() * emissions[q[-1]].exp() for q, lp in zip(paths, log_prior)))
    return tables, predictive


@pytest.mark.parametrize("L", [1, 2, 3])
def test_the_path_normalised_chain_equals_brute_force(L):
    head, plain = path_head(L, seed=L + 70)
    obs = factories.random_fact_observations(4, N, F, M, S, seed=80 + L, padded=True)
    params = {name: p.detach().clone().requires_grad_(True) for name, p in head.named_parameters()}
    tables, predictive = path_tables(head, obs, params)
    expected = oracle.log_likelihood(tables)
    expected.sum().backward()
    got = head.log_likelihood(obs, budget=1)
    got.sum().backward()
    assert torch.allclose(got, expected.detach(), atol=1e-9, rtol=0)
    for name, parameter in head.named_parameters():
        if parameter.numel() == 0:  # the previous-fact terms of L = 1
            continue
        want = params[name].grad
        want = torch.zeros_like(parameter) if want is None else want
        assert torch.allclose(parameter.grad, want, atol=1e-9, rtol=0), name
    summary = oracle.summaries([{q: (a.detach(), b.detach()) for q, (a, b) in t.items()} for t in tables], N, L)
    assert torch.allclose(head.predict_proba(obs), torch.stack(predictive).detach(), atol=1e-9, rtol=0)
    assert torch.allclose(head.hop_marginals(obs), summary["hop_marginals"], atol=1e-9, rtol=0)
    assert torch.equal(head.map_paths(obs), summary["map_given"])
    assert torch.equal(head.map_paths(obs, given_target=False), summary["map_prior"])
    prior = torch.tensor([path_entropy(t) for t in summary["log_priors"]], dtype=torch.float64)
    assert torch.allclose(head.path_entropy(obs, given_target=False), prior, atol=1e-9, rtol=0)
    paths, log_probs = head.k_best_paths(obs, 3, given_target=False)
    for row, table in enumerate(summary["log_priors"]):
        best = sorted_paths(table)[:3]
        assert torch.allclose(log_probs[row, :len(best)], torch.tensor([v for _, v in best], dtype=torch.float64),
                              atol=1e-9, rtol=0)
    if L > 1:  # a softmax per hop is another chain
        assert not torch.allclose(plain.log_likelihood(obs), got.detach(), atol=1e-6)
    else:
        assert torch.allclose(plain.log_likelihood(obs), got.detach(), atol=1e-12, rtol=0)


@pytest.mark.parametrize("L", [2, 3])
def test_the_pyro_models_give_the_exact_loss(L):
    head, _ = path_head(L, seed=L + 90)
    obs = factories.random_fact_observations(3, N, F, M, S, seed=91 + L, padded=True)
    oracle.pyro_model_losses(head, obs, -head.log_likelihood(obs).sum())


def test_path_normalised_logits_by_enumeration():
    """The function alone: a softmax per hop of its logits is the softmax over whole paths, masked entries kept
    at probability 0."""
    g = torch.Generator().manual_seed(0)
    first = 3 * torch.randn(2, 4, generator=g, dtype=torch.float64)
    later = [3 * torch.randn(2, 4, 4, generator=g, dtype=torch.float64) for _ in range(2)]
    later[0][:, :, 2] = -1e30
    new_first, new_later = path_normalised_logits(first, later)
    for row in range(2):
        scores = {q: first[row, q[0]] + later[0][row, q[0], q[1]] + later[1][row, q[1], q[2]]
                  for q in itertools.product(range(4), repeat=3)}
        total = torch.logsumexp(torch.stack(list(scores.values())), 0)
        for q, value in scores.items():
            chain = (torch.log_softmax(new_first[row], 0)[q[0]] + torch.log_softmax(new_later[0][row, q[0]], 0)[q[1]]
                     + torch.log_softmax(new_later[1][row, q[1]], 0)[q[2]])
            if q[1] == 2:
                assert chain < -1e29
            else:
                assert math.isclose(float(chain), float(value - total), abs_tol=1e-9)


def test_the_option_is_checked_and_kept_by_a_checkpoint(tmp_path):
    with pytest.raises(TypeError, match="path_normalised"):
        FactAttention(2, F, S, path_normalised=1)
    head, _ = path_head(2, seed=3)
    obs = factories.random_fact_observations(3, N, F, M, S, seed=4)
    save_checkpoint(tmp_path / "head.pt", head)
    restored = load_checkpoint(tmp_path / "head.pt")[0]
    assert restored.path_normalised and torch.equal(restored.log_likelihood(obs), head.log_likelihood(obs))
