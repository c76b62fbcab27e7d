"""The likelihood, predictive and marginals (pyro_multihop/engine/queries.py) on both routes against brute-force
enumeration of every hop path (float64), and the likelihood's gradient against the log-space recursion."""

import oracle
import torch
from factories import HEADS, HOPS, MASKED, ROUTES, S, random_head, random_obs

from pyro_multihop import engine


@HEADS
@HOPS
@MASKED
@ROUTES
def test_every_query_matches_brute_force_on_both_routes(kind, hops, masked, ratio, monkeypatch):
    monkeypatch.setattr(engine.routes, "SYMBOL_ROUTE_RATIO", ratio)
    head, obs = random_head(kind, hops, seed=hops), random_obs(n=7, seed=10 + hops, masked=masked)
    expected = oracle.brute_force(head, obs)
    assert torch.allclose(head.log_likelihood(obs), expected["log_likelihood"], rtol=1e-12, atol=0)
    assert torch.allclose(head.hop_marginals(obs), expected["hop_marginals"], atol=1e-13)
    assert torch.allclose(head.pairwise_marginals(obs), expected["pairwise_marginals"], atol=1e-13)
    assert torch.allclose(head.predict_proba(obs), expected["predictive"], atol=1e-13)
    onehot_values = torch.nn.functional.one_hot(obs.values, S).double()  # (n, N, S)
    by_value = torch.einsum("lni,nis->lns", expected["hop_marginals"], onehot_values)
    assert torch.allclose(head.value_marginals(obs), by_value, atol=1e-13)


@HEADS
@HOPS
@ROUTES
def test_gradient_equals_the_log_space_recursion(kind, hops, ratio, monkeypatch):
    """The differentiable log-likelihood of either route (underflowing rows included) has the gradient of the
    plain log-space forward recursion on the head's dense chain. With sigma2 = 1e-3 the logits are some 1e4 and
    their gradient is scaled by 1 / sigma2: float64 rounding (eps 1e4 / sigma2, about 1e-9) is the reference's own
    error there, where a true gradient is 0 (a row attending two positions of one key half and half), and the
    dense retry's softmax (not log_softmax then exp) does not repeat it: compared to 1e-8 there."""
    from pyro_multihop.engine.log_space import chain_log_likelihood

    monkeypatch.setattr(engine.routes, "SYMBOL_ROUTE_RATIO", ratio)
    for sigma2, scale, gap in ((0.6, 1.0, None), (1e-3, 2.0, None), (1e-3, 2.0, 700.0)):
        head = random_head(kind, hops, seed=30, sigma2=sigma2, scale=scale, emission_gap=gap)
        obs = random_obs(n=8, seed=31, masked=True)
        parameters = list(head.parameters())
        engine_grads = torch.autograd.grad(head.log_likelihood(obs).sum(), parameters, allow_unused=True)
        log_emission = head.log_emission[obs.values, obs.target.unsqueeze(-1)]
        reference = chain_log_likelihood(head.hop_chain(obs), log_emission).sum()
        reference_grads = torch.autograd.grad(reference, parameters, allow_unused=True)
        tolerance = 1e-9 if sigma2 > 0.1 else 1e-8
        for got, want in zip(engine_grads, reference_grads):
            if want is None:  # the tied head's posterior scale: plug-in queries use the posterior means only
                assert got is None
                continue
            assert torch.isfinite(got).all()
            assert torch.allclose(got, want, rtol=tolerance, atol=tolerance)


@HEADS
@HOPS
@MASKED
@ROUTES
def test_prior_chain_marginals_match_brute_force_on_both_routes(kind, hops, masked, ratio, monkeypatch):
    """``given_target=False``: every path weighed by its gates alone (the emission left out), on either route."""
    monkeypatch.setattr(engine.routes, "SYMBOL_ROUTE_RATIO", ratio)
    head, obs = random_head(kind, hops, seed=hops), random_obs(n=7, seed=10 + hops, masked=masked)
    chain = head.hop_chain(obs)
    expected = torch.zeros(hops, len(obs), obs.context_len, dtype=torch.float64)
    for row in range(len(obs)):
        paths = oracle.path_posterior(oracle.chain_log_joints(chain.init, chain.trans, torch.zeros_like(chain.init), row))
        for path, p in paths.items():
            for hop in range(hops):
                expected[hop, row, path[hop]] += p
    marginals = engine.hop_marginals(head.hop_factors(), obs, given_target=False)
    assert torch.allclose(marginals, expected, atol=1e-13)
    assert not torch.allclose(marginals, head.hop_marginals(obs), atol=1e-3)  # the target does weigh otherwise
