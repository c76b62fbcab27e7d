"""Posterior path queries on the chained head's hop chain, against brute-force enumeration of all hop paths
with explicit query/key/value vectors (tests/oracle.py), and Pyro's ``infer_discrete`` against the same exact
path posterior."""

import math

import oracle
import pyro
import pytest
import torch
from factories import HOPS, MASKED, N, random_chained_head, random_obs
from pyro import poutine
from pyro.infer import infer_discrete

from pyro_multihop import ChainedAttention, Observations
from pyro_multihop.engine.log_space import chain_entropy, chain_k_best, chain_sample_paths, chain_sample_posterior

def log_emission_of(head, obs):
    """``(n, N)`` log emission of each observation's target from each position's value."""
    return head.emission.detach().log()[obs.values, obs.target.unsqueeze(-1)]


def exact_log_joints(head, obs):
    tables = oracle.head_path_tables(head, obs)
    return [oracle.log_joints_of(table) for table in tables]


def repeated(obs, copies):
    """``copies`` copies of the observations, copy-major: row ``c * n + r`` is observation ``r``."""
    mask = None if obs.mask is None else obs.mask.repeat(copies, 1)
    return Observations(
        obs.keys.repeat(copies, 1), obs.values.repeat(copies, 1), obs.query.repeat(copies), obs.target.repeat(copies), mask
    )


@HOPS
@MASKED
def test_entropy_and_k_best_of_the_heads_chain_match_brute_force(hops, masked):
    head, obs = random_chained_head(hops, seed=1), random_obs(5, seed=2, masked=masked)
    with torch.no_grad():
        chain, log_emission = head.hop_chain(obs), log_emission_of(head, obs)
    tables = exact_log_joints(head, obs)
    expected = torch.tensor([oracle.path_entropy(table) for table in tables], dtype=torch.float64)
    assert torch.allclose(chain_entropy(chain, log_emission), expected, rtol=0, atol=1e-10)
    k = N**hops + 2  # every path, then -inf rows
    paths, log_probs = chain_k_best(chain, log_emission, k)
    for row, table in enumerate(tables):
        ranked = oracle.sorted_paths(table)
        wanted = [value for _, value in ranked] + [-math.inf] * (k - len(ranked))
        assert torch.allclose(log_probs[row], torch.tensor(wanted, dtype=torch.float64), rtol=0, atol=1e-10)
        exact = dict(ranked)
        for path, value in zip(paths[row].tolist(), log_probs[row].tolist()):
            if value > -math.inf:
                assert exact[tuple(path)] == pytest.approx(value, abs=1e-10)
            else:
                assert path == [0] * hops


@HOPS
@MASKED
def test_infer_discrete_and_posterior_sampling_draw_from_the_exact_path_posterior(hops, masked):
    head, obs = random_chained_head(hops, seed=3, sigma2=0.4), random_obs(3, seed=4, masked=masked)
    exact = [oracle.path_posterior(table) for table in exact_log_joints(head, obs)]
    copies = 4000
    many = repeated(obs, copies)

    pyro.set_rng_seed(5)
    with pyro.get_param_store().scope():
        sampler = infer_discrete(head.model, first_available_dim=-2, temperature=1)
        trace = poutine.trace(sampler).get_trace(many)
    pyro_draws = torch.stack([trace.nodes[f"z_{hop + 1}"]["value"] for hop in range(hops)], -1).view(copies, 3, hops)
    _, dof, p_value = oracle.chi_square_test(oracle.path_counts(pyro_draws), exact)
    assert dof > 0 and p_value > 1e-3

    with torch.no_grad():
        chain, log_emission = head.hop_chain(obs), log_emission_of(head, obs)
    draws = chain_sample_posterior(chain, log_emission, copies, torch.Generator().manual_seed(6))
    _, dof, p_value = oracle.chi_square_test(oracle.path_counts(draws), exact)
    assert dof > 0 and p_value > 1e-3

    # Control: the same test rejects draws from the prior chain (paths not conditioned on the target).
    with torch.no_grad():
        prior_draws = chain_sample_paths(head.hop_chain(many), torch.Generator().manual_seed(7)).view(copies, 3, hops)
    _, _, p_value = oracle.chi_square_test(oracle.path_counts(prior_draws), exact)
    assert p_value < 1e-6


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_small_sigma2_and_long_contexts_give_finite_queries(dtype):
    """sigma2 = 1e-3 and N = 256 with 20% padding: finite entropies in [0, L log N], k-best log-probs
    finite, non-increasing, at most 0, and no padding position in any path or draw."""
    generator = torch.Generator().manual_seed(8)
    n, context, symbols, hops = 6, 256, 40, 3
    mask = torch.rand(n, context, generator=generator) > 0.2
    mask[:, 0] = True
    obs = Observations(
        torch.randint(symbols, (n, context), generator=generator),
        torch.randint(symbols, (n, context), generator=generator),
        torch.randint(symbols, (n,), generator=generator),
        torch.randint(symbols, (n,), generator=generator),
        mask,
    )
    head = ChainedAttention(hops, symbols, symbols, sigma2=1e-3, init="random", seed=0).to(dtype)
    with torch.no_grad():
        chain, log_emission = head.hop_chain(obs), log_emission_of(head, obs)
    entropy = chain_entropy(chain, log_emission)
    assert entropy.dtype == dtype and torch.isfinite(entropy).all()
    assert (entropy >= 0).all() and (entropy <= hops * math.log(context)).all()
    paths, log_probs = chain_k_best(chain, log_emission, 5)
    assert torch.isfinite(log_probs).all() and (log_probs <= 1e-5).all()
    assert (log_probs[:, 1:] <= log_probs[:, :-1]).all()
    draws = chain_sample_posterior(chain, log_emission, 200, torch.Generator().manual_seed(9))
    for found in (paths.reshape(n, -1), draws.permute(1, 0, 2).reshape(n, -1)):
        assert mask.gather(1, found).all()
    if dtype == torch.float32:
        double = head.to(torch.float64)
        with torch.no_grad():
            chain64, log_emission64 = double.hop_chain(obs), log_emission_of(double, obs)
        assert torch.allclose(entropy.double(), chain_entropy(chain64, log_emission64), atol=1e-3)
