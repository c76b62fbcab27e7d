"""``k_best_paths(given_target=False)``: the k most probable paths of the prior chain (the question alone), on the
symbol and the positions routes, pruned and not, against brute force over every path of the chain's factors and
against the log-space k best with a zero emission."""

import math

import oracle
import pytest
import torch

from pyro_multihop import engine
from pyro_multihop.engine import log_space

S, T = 5, 4
ROUTES = pytest.mark.parametrize("ratio", [math.inf, 0.0], ids=["symbols", "positions"])


def chain_of(head, obs):
    with torch.no_grad():
        return head.hop_chain(obs), head.log_emission[obs.values, obs.target.unsqueeze(-1)]


@ROUTES
@pytest.mark.parametrize("hops", [1, 2, 3], ids=lambda h: f"L={h}")
def test_question_only_k_best_is_the_sorted_enumeration_of_the_prior(hops, ratio, monkeypatch):
    monkeypatch.setattr(engine.hop_gates, "SYMBOL_ROUTE_RATIO", ratio)
    head = oracle.random_chained_head(hops, S, T, seed=5, scale=2.0)
    obs = oracle.random_observations(5, S, T, 4, seed=6, masked=True)
    k = 6
    paths, log_probs = head.k_best_paths(obs, k, given_target=False, budget=1)
    given, _ = head.k_best_paths(obs, k)
    chain, log_emission = chain_of(head, obs)
    zero = torch.zeros_like(log_emission)
    differs = False
    for row in range(len(obs)):
        table = oracle.chain_log_joints(chain.init, chain.trans, zero, row)
        best = oracle.sorted_paths(table)[:k]
        # Equal keys tie: the values are the sorted enumeration's, each path has its own value, no path twice.
        assert torch.allclose(log_probs[row, : len(best)], torch.tensor([v for _, v in best], dtype=torch.float64),
                              rtol=0, atol=1e-10)
        returned = [tuple(p) for p in paths[row, : len(best)].tolist()]
        assert len(set(returned)) == len(best)
        for path, log_prob in zip(returned, log_probs[row].tolist()):
            assert table[path] == pytest.approx(log_prob, abs=1e-10)
        assert (log_probs[row, len(best):] == -math.inf).all()
        differs |= not torch.equal(paths[row], given[row])
    assert differs  # the answer moves some row's ranking: the switch is not a no-op


@ROUTES
@pytest.mark.parametrize("hops", [2, 3], ids=lambda h: f"L={h}")
def test_pruned_question_only_k_best_equals_the_log_space_one(hops, ratio, monkeypatch):
    """N = 24 > 16 candidates a hop: the max-marginal pruning runs with an emission of 1 at every real fact."""
    from pyro_multihop.engine import paths as engine_paths

    monkeypatch.setattr(engine.hop_gates, "SYMBOL_ROUTE_RATIO", ratio)
    found = []
    candidates = engine_paths._k_best_candidates

    def spy(*args):
        chosen, needed, fits = candidates(*args)
        found.append(fits)
        return chosen, needed, fits

    monkeypatch.setattr(engine_paths, "_k_best_candidates", spy)
    head = oracle.random_chained_head(hops, S, T, seed=7, scale=2.0)
    obs = oracle.random_observations(30, S, T, 24, seed=8, masked=True)
    paths, log_probs = head.k_best_paths(obs, 3, given_target=False)
    chain, log_emission = chain_of(head, obs)
    expected_paths, expected = log_space.chain_k_best(chain, torch.zeros_like(log_emission), 3)
    assert torch.allclose(log_probs, expected, rtol=1e-10, atol=1e-12)
    rows = torch.arange(len(obs)).unsqueeze(-1)
    scores = chain.init[rows, paths[..., 0]]  # (n, k): each path's prior log-probability
    for hop in range(hops - 1):
        scores = scores + chain.trans[hop][rows, paths[..., hop], paths[..., hop + 1]]
    assert torch.allclose(scores, log_probs, rtol=1e-10, atol=1e-12)
    assert all(len(set(map(tuple, row))) == 3 for row in paths.tolist())
    assert torch.cat(found).any()  # some rows went through the pruned search
