"""The log-space recursions over generic hop chains (pyro_multihop/engine/log_space.py) against enumeration of all
N^L paths (tests/oracle.py), in float64: forward-backward, Viterbi and sampling of the prior chain; the posterior
path queries (entropy, k best paths, posterior sampling), with and without padding; their refusals of bad input."""

import itertools
import math

import oracle
import pytest
import torch

from pyro_multihop.engine.log_space import (
    MASKED_LOGIT,
    HopChain,
    chain_entropy,
    chain_k_best,
    chain_log_likelihood,
    chain_map_paths,
    chain_posterior,
    chain_sample_paths,
    chain_sample_posterior,
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


# -- the posterior path queries -------------------------------------------------------------------------------
HOPS = pytest.mark.parametrize("hops", [1, 2, 3], ids=lambda h: f"L={h}")
MASKED = pytest.mark.parametrize("masked", [False, True], ids=["full", "padded"])


def random_padded_chain(n=4, N=4, hops=3, seed=0, masked=False, scale=1.5, dtype=torch.float64):
    """A random chain; with ``masked``, padding positions (position 0 always real) as ``hop_chain`` builds
    them (MASKED_LOGIT), and one zero emission entry per row (``-inf``)."""
    generator = torch.Generator().manual_seed(seed)
    mask = None
    if masked:
        mask = torch.rand(n, N, generator=generator) > 0.4
        mask[:, 0] = True
    init = masked_log_softmax(scale * torch.randn(n, N, generator=generator, dtype=dtype), mask)
    trans_mask = None if mask is None else mask.unsqueeze(-2)
    trans = masked_log_softmax(scale * torch.randn(hops - 1, n, N, N, generator=generator, dtype=dtype), trans_mask)
    log_emission = torch.randn(n, N, generator=generator, dtype=dtype)
    if masked:
        # A zero emission at a real position (never position 0, so every row keeps a possible path).
        log_emission[:, -1] = -math.inf
    return HopChain(init, trans), log_emission, mask


def log_joints(chain, log_emission):
    return [
        oracle.chain_log_joints(chain.init, chain.trans, log_emission, row) for row in range(chain.init.shape[0])
    ]


# -- entropy -----------------------------------------------------------------------------------------------
@HOPS
@MASKED
def test_entropy_matches_enumeration(hops, masked):
    chain, log_emission, _ = random_padded_chain(hops=hops, seed=1, masked=masked)
    entropy = chain_entropy(chain, log_emission)
    assert entropy.shape == (4,) and entropy.dtype == torch.float64
    expected = torch.tensor([oracle.path_entropy(table) for table in log_joints(chain, log_emission)], dtype=torch.float64)
    assert torch.allclose(entropy, expected, rtol=0, atol=1e-10)


def test_entropy_of_a_sharp_posterior_stays_exact_and_non_negative():
    """Scale 40: posteriors nearly deterministic, entropies spanning many orders of magnitude."""
    chain, log_emission, _ = random_padded_chain(n=6, hops=3, seed=2, masked=True, scale=40.0)
    entropy = chain_entropy(chain, log_emission)
    expected = torch.tensor([oracle.path_entropy(table) for table in log_joints(chain, log_emission)], dtype=torch.float64)
    assert (entropy >= 0).all()
    assert torch.allclose(entropy, expected, rtol=1e-6, atol=1e-12)


def test_entropy_of_a_single_possible_path_is_zero():
    chain, log_emission, _ = random_padded_chain(n=2, N=3, hops=2, seed=3)
    mask = torch.tensor([[True, False, False], [True, False, False]])
    init = masked_log_softmax(chain.init, mask)
    trans = masked_log_softmax(chain.trans, mask.unsqueeze(-2))
    assert torch.equal(chain_entropy(HopChain(init, trans), log_emission), torch.zeros(2, dtype=torch.float64))


# -- k best paths ----------------------------------------------------------------------------------------------
def check_k_best(chain, log_emission, k, tolerance=1e-10):
    paths, log_probs = chain_k_best(chain, log_emission, k)
    n, hops = chain.init.shape[0], chain.n_hops
    assert paths.shape == (n, k, hops) and paths.dtype == torch.long
    assert log_probs.shape == (n, k) and log_probs.dtype == chain.init.dtype
    for row, table in enumerate(log_joints(chain, log_emission)):
        ranked = oracle.sorted_paths(table)
        exact = dict(ranked)
        expected = [value for _, value in ranked[:k]] + [-math.inf] * max(0, k - len(ranked))
        got = log_probs[row].tolist()
        assert got == sorted(got, reverse=True)
        # The multiset of log-probabilities (ties may come in any order) ...
        assert torch.allclose(torch.tensor(got, dtype=torch.float64), torch.tensor(expected, dtype=torch.float64), rtol=0, atol=tolerance)
        assert [value == -math.inf for value in got] == [value == -math.inf for value in expected]
        # ... and each returned path is a distinct path of exactly that log-probability.
        finite = [tuple(path) for path, value in zip(paths[row].tolist(), got) if value > -math.inf]
        assert len(set(finite)) == len(finite)
        for path, value in zip(finite, got):
            assert exact[path] == pytest.approx(value, abs=tolerance)
        # Rows without a path of nonzero probability hold path 0.
        assert (paths[row][log_probs[row] == -math.inf] == 0).all()
    return paths, log_probs


@HOPS
@MASKED
@pytest.mark.parametrize("k", [1, 5])
def test_k_best_paths_are_the_sorted_enumeration(hops, masked, k):
    chain, log_emission, _ = random_padded_chain(hops=hops, seed=4, masked=masked)
    check_k_best(chain, log_emission, k)


@HOPS
@MASKED
def test_k_beyond_the_number_of_paths_gives_minus_inf_rows(hops, masked):
    chain, log_emission, _ = random_padded_chain(N=3, hops=hops, seed=5, masked=masked)
    k = 3**hops + 4
    paths, log_probs = check_k_best(chain, log_emission, k)
    assert torch.isinf(log_probs[:, -4:]).all()
    if not masked:
        assert torch.isfinite(log_probs[:, : 3**hops]).all()
        # Every path is listed once, and their probabilities sum to 1.
        assert torch.allclose(log_probs[:, : 3**hops].exp().sum(-1), torch.ones(4, dtype=torch.float64), atol=1e-12)


def test_k_best_with_ties_lists_each_tied_path_once():
    """A uniform chain: all N^L paths tie."""
    N, hops = 3, 2
    init = torch.full((2, N), -math.log(N), dtype=torch.float64)
    trans = torch.full((hops - 1, 2, N, N), -math.log(N), dtype=torch.float64)
    chain, log_emission = HopChain(init, trans), torch.zeros(2, N, dtype=torch.float64)
    paths, log_probs = check_k_best(chain, log_emission, 6)
    assert torch.allclose(log_probs, torch.full((2, 6), -math.log(N**hops), dtype=torch.float64))


@HOPS
@MASKED
def test_best_path_is_the_viterbi_path(hops, masked):
    chain, log_emission, _ = random_padded_chain(n=8, hops=hops, seed=6, masked=masked)
    paths, log_probs = chain_k_best(chain, log_emission, 3)
    assert torch.equal(paths[:, 0], chain_map_paths(chain, log_emission))


# -- posterior sampling ------------------------------------------------------------------------------------------
@HOPS
@MASKED
def test_posterior_draws_fit_the_exact_path_posterior(hops, masked):
    chain, log_emission, mask = random_padded_chain(n=3, N=3, hops=hops, seed=7, masked=masked)
    generator = torch.Generator().manual_seed(8)
    draws = chain_sample_posterior(chain, log_emission, 6000, generator)
    assert draws.shape == (6000, 3, hops) and draws.dtype == torch.long
    exact = [oracle.path_posterior(table) for table in log_joints(chain, log_emission)]
    statistic, dof, p_value = oracle.chi_square_test(oracle.path_counts(draws), exact)
    assert dof > 0 and p_value > 1e-3, (statistic, dof)
    if masked:
        real = mask.unsqueeze(0).unsqueeze(-1).expand(6000, 3, 3, hops).gather(2, draws.unsqueeze(2)).squeeze(2)
        assert real.all()


@HOPS
def test_goodness_of_fit_rejects_draws_from_the_prior(hops):
    """Control: the same test, on draws that ignore the target, must fail."""
    chain, log_emission, _ = random_padded_chain(n=3, N=3, hops=hops, seed=7)
    exact = [oracle.path_posterior(table) for table in log_joints(chain, log_emission)]
    generator = torch.Generator().manual_seed(8)
    repeated = HopChain(chain.init.repeat(6000, 1), chain.trans.repeat(1, 6000, 1, 1))
    prior_draws = chain_sample_paths(repeated, generator).view(6000, 3, hops)
    _, dof, p_value = oracle.chi_square_test(oracle.path_counts(prior_draws), exact)
    assert dof > 0 and p_value < 1e-6


def test_chi_square_p_values_are_the_textbook_quantiles():
    """The oracle's p-value at the 5% critical values of the chi-square table (1 and 10 dof)."""
    # One dof: counts (x, 100 - x) against (1/2, 1/2) give statistic (2x - 100)^2 / 100.
    _, dof, p_value = oracle.chi_square_test([{0: 60, 1: 40}], [{0: 0.5, 1: 0.5}])
    assert dof == 1 and p_value == pytest.approx(0.0455003, rel=1e-5)  # chi2.sf(4, 1)
    counts = {cell: 100 for cell in range(11)}
    counts[0], counts[1] = 100 + 10 * math.sqrt(18.307) / math.sqrt(2), 100 - 10 * math.sqrt(18.307) / math.sqrt(2)
    _, dof, p_value = oracle.chi_square_test([counts], [{cell: 1 / 11 for cell in range(11)}])
    assert dof == 10 and p_value == pytest.approx(0.05, rel=1e-4)


def test_a_draw_of_a_zero_probability_path_fails_the_test():
    _, _, p_value = oracle.chi_square_test([{(0,): 99, (1,): 1}], [{(0,): 1.0, (1,): 0.0}])
    assert p_value == 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("extreme", ["lowest", "highest"])
def test_extreme_uniforms_never_draw_a_padding_position(monkeypatch, dtype, extreme):
    """The sampler's uniforms at 0 and at the largest float below 1 pick the first and the last position of
    positive probability: with positions 0 and 3 padded, 1 and 2, never a padding position (nor an index
    out of range)."""
    chain, log_emission, _ = random_padded_chain(n=2, N=4, hops=3, seed=13, dtype=dtype)
    mask = torch.tensor([False, True, True, False]).expand(2, 4)
    chain = HopChain(masked_log_softmax(chain.init, mask), masked_log_softmax(chain.trans, mask.unsqueeze(-2)))
    value = 0.0 if extreme == "lowest" else 1.0 - torch.finfo(dtype).eps / 2
    monkeypatch.setattr(torch, "rand", lambda *size, **kwargs: torch.full(*size, value, dtype=kwargs["dtype"]))
    draws = chain_sample_posterior(chain, log_emission, 5)
    assert (draws == (1 if extreme == "lowest" else 2)).all()


def test_posterior_draws_are_reproducible_with_a_seeded_generator():
    chain, log_emission, _ = random_padded_chain(hops=3, seed=9)
    first = chain_sample_posterior(chain, log_emission, 50, torch.Generator().manual_seed(1))
    again = chain_sample_posterior(chain, log_emission, 50, torch.Generator().manual_seed(1))
    other = chain_sample_posterior(chain, log_emission, 50, torch.Generator().manual_seed(2))
    assert torch.equal(first, again) and not torch.equal(first, other)


def test_queries_follow_the_chain_dtype_and_keep_no_graph():
    chain, log_emission, _ = random_padded_chain(hops=2, seed=10, dtype=torch.float32)
    chain = HopChain(chain.init.requires_grad_(), chain.trans)
    entropy = chain_entropy(chain, log_emission)
    paths, log_probs = chain_k_best(chain, log_emission, 2)
    draws = chain_sample_posterior(chain, log_emission, 3)
    assert entropy.dtype == log_probs.dtype == torch.float32
    assert not entropy.requires_grad and not log_probs.requires_grad
    assert paths.dtype == draws.dtype == torch.long and draws.shape == (3, 4, 2)


def test_large_chains_with_padding_give_finite_results_in_float32():
    """N = 256, sharp random factors, 30% padding: finite, normalised, never a padding position."""
    chain, log_emission, mask = random_padded_chain(n=4, N=256, hops=3, seed=11, masked=True, scale=300.0, dtype=torch.float32)
    entropy = chain_entropy(chain, log_emission)
    assert torch.isfinite(entropy).all() and (entropy >= 0).all() and (entropy <= 3 * math.log(256)).all()
    paths, log_probs = chain_k_best(chain, log_emission, 4)
    assert torch.isfinite(log_probs).all() and (log_probs <= 0).all()
    assert (log_probs.exp().sum(-1) <= 1 + 1e-5).all()
    draws = chain_sample_posterior(chain, log_emission, 100, torch.Generator().manual_seed(0))
    for found in (paths.transpose(0, 1), draws):  # (k or s, n, L)
        assert mask.gather(1, found.permute(1, 0, 2).reshape(4, -1)).all()


# -- bad input ------------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("k", [0, -2, 1.5, True])
def test_k_must_be_a_positive_integer(k):
    chain, log_emission, _ = random_padded_chain(hops=2)
    with pytest.raises(ValueError, match=r"^k must be a positive integer"):
        chain_k_best(chain, log_emission, k)


@pytest.mark.parametrize("num_samples", [0, -1, 2.0])
def test_num_samples_must_be_a_positive_integer(num_samples):
    chain, log_emission, _ = random_padded_chain(hops=2)
    with pytest.raises(ValueError, match="num_samples must be a positive integer"):
        chain_sample_posterior(chain, log_emission, num_samples)


@pytest.mark.parametrize("query", ["entropy", "k_best", "sample"])
def test_log_emission_must_match_the_chain(query):
    chain, log_emission, _ = random_padded_chain(hops=2)
    call = {
        "entropy": lambda: chain_entropy(chain, log_emission[:, :2]),
        "k_best": lambda: chain_k_best(chain, log_emission[:, :2], 2),
        "sample": lambda: chain_sample_posterior(chain, log_emission[:, :2], 2),
    }[query]
    with pytest.raises(ValueError, match=r"log_emission must have the shape \(n, N\) = \(4, 4\)"):
        call()


def test_masked_logit_is_what_the_factors_carry():
    """The tests' padded chains hold MASKED_LOGIT-level scores, not -inf, in the factors."""
    chain, _, mask = random_padded_chain(hops=2, seed=12, masked=True)
    assert torch.isfinite(chain.init).all() and (chain.init[~mask] < MASKED_LOGIT / 2).all()
    assert torch.isfinite(chain_log_likelihood(chain, torch.zeros_like(chain.init))).all()
