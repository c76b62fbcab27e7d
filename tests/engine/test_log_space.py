"""Forward-backward, Viterbi and sampling over generic hop chains, against explicit enumeration."""

import itertools

import pytest
import torch

from pyro_multihop.engine.log_space import (
    HopChain,
    chain_log_likelihood,
    chain_posterior,
    chain_sample_paths,
    last_hop_prior,
    masked_log_softmax,
)


def random_chain(n=3, N=4, hops=3, seed=0):
    generator = torch.Generator().manual_seed(seed)
    init = torch.randn(n, N, generator=generator, dtype=torch.float64).log_softmax(-1)
    trans = torch.randn(hops - 1, n, N, N, generator=generator, dtype=torch.float64).log_softmax(-1)
    log_emission = torch.randn(n, N, generator=generator, dtype=torch.float64)
    return HopChain(init, trans), log_emission


def joint_table(chain, log_emission, row):
    N = chain.init.shape[-1]
    table = {}
    for path in itertools.product(range(N), repeat=chain.n_hops):
        log_joint = chain.init[row, path[0]] + log_emission[row, path[-1]]
        for hop in range(chain.n_hops - 1):
            log_joint = log_joint + chain.trans[hop, row, path[hop], path[hop + 1]]
        table[path] = float(log_joint.exp())
    return table


@pytest.mark.parametrize("hops", [1, 2, 4])
def test_posterior_matches_enumeration(hops):
    chain, log_emission = random_chain(hops=hops)
    posterior = chain_posterior(chain, log_emission)
    for row in range(3):
        table = joint_table(chain, log_emission, row)
        total = sum(table.values())
        assert float(posterior.log_likelihood[row].exp()) == pytest.approx(total, rel=1e-12)
        for hop in range(hops):
            for i in range(4):
                marginal = sum(p for path, p in table.items() if path[hop] == i) / total
                assert float(posterior.hop_marginals[hop, row, i]) == pytest.approx(marginal, abs=1e-13)
        best = max(table, key=table.get)
        assert tuple(posterior.map_paths[row].tolist()) == best
    assert torch.allclose(chain_log_likelihood(chain, log_emission), posterior.log_likelihood)


def test_last_hop_prior_is_the_prior_marginal():
    chain, _ = random_chain(hops=3)
    prior = last_hop_prior(chain)
    expected = torch.zeros_like(prior)
    for row in range(3):
        for path, p in joint_table(chain, torch.zeros(3, 4, dtype=torch.float64), row).items():
            expected[row, path[-1]] += p
    assert torch.allclose(prior, expected, atol=1e-14)


def test_sampled_paths_follow_the_chain():
    chain, _ = random_chain(n=1, N=3, hops=2, seed=3)
    generator = torch.Generator().manual_seed(0)
    big = HopChain(chain.init.expand(40000, 3), chain.trans.expand(1, 40000, 3, 3))
    paths = chain_sample_paths(big, generator)
    table = joint_table(chain, torch.zeros(1, 3, dtype=torch.float64), 0)
    for path, p in table.items():
        frequency = float((paths == torch.tensor(path)).all(-1).double().mean())
        assert abs(frequency - p) < 4 * (p * (1 - p) / 40000) ** 0.5 + 1e-9


def test_masked_log_softmax_gives_padding_zero_probability():
    logits = torch.tensor([[1.0, 2.0, 3.0]])
    probs = masked_log_softmax(logits, torch.tensor([[True, False, True]])).exp()
    assert probs[0, 1] == 0 and torch.allclose(probs.sum(-1), torch.ones(1))
