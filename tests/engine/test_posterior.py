"""Forward-backward over chunks (pyro_multihop/engine/posterior.py): rows that underflow in probability space are
retried on their dense factors, and those that underflow there too recomputed in log space; every answer against
brute force."""

import oracle
import torch
from factories import EMISSION_GAPS, HEADS, HOPS, ROUTES, random_head, random_obs

from pyro_multihop import engine


def routes_taken(head, obs):
    """The routes the chunks of ``obs`` took: ``"symbols"`` or ``"positions"``, ``"dense"`` (retried on their
    dense factors), ``"log"`` (recomputed in log space)."""
    return {piece.route for piece in engine.forward_backward_chunks(head.hop_factors(), obs)}


@HEADS
@HOPS
@ROUTES
@EMISSION_GAPS
def test_underflowing_rows_are_retried_on_dense_factors_then_in_log_space(kind, hops, ratio, emission_gap,
                                                                         monkeypatch):
    """sigma2 = 1e-3 with far-apart keys: gate weights exp(-10^4) underflow in probability space. The likelihood,
    the marginals and the predictive (which has no target to fail on, yet its messages underflow the same way)
    equal brute force."""
    monkeypatch.setattr(engine.routes, "SYMBOL_ROUTE_RATIO", ratio)
    head = random_head(kind, hops, seed=20, sigma2=1e-3, scale=2.0, emission_gap=emission_gap)
    obs = random_obs(n=9, seed=21, masked=True)
    if hops > 1:
        assert "dense" in routes_taken(head, obs)
        assert ("log" in routes_taken(head, obs)) == (emission_gap is not None)
    expected = oracle.brute_force(head, obs)
    log_likelihood = head.log_likelihood(obs)
    assert torch.isfinite(log_likelihood).all()
    assert torch.allclose(log_likelihood, expected["log_likelihood"], rtol=1e-10)
    assert torch.allclose(head.hop_marginals(obs), expected["hop_marginals"], atol=1e-10)
    assert torch.allclose(head.predict_proba(obs), expected["predictive"], atol=1e-10)


@ROUTES
def test_long_underflowing_rows_are_retried_exactly(ratio, monkeypatch):
    """Rows of 20 positions (at least SHORT_ROW: the dense retry's softmax kernel rather than its short-row form),
    sigma2 = 1e-3, padded: the likelihood, marginals, predictive and MAP paths against brute force over the
    400 paths of a row."""
    monkeypatch.setattr(engine.routes, "SYMBOL_ROUTE_RATIO", ratio)
    head = random_head("chained", 2, seed=24, sigma2=1e-3, scale=2.0)
    obs = random_obs(n=5, seed=25, masked=True, context=20)
    assert "dense" in routes_taken(head, obs)
    expected = oracle.brute_force(head, obs)
    assert torch.allclose(head.log_likelihood(obs), expected["log_likelihood"], rtol=1e-10)
    assert torch.allclose(head.hop_marginals(obs), expected["hop_marginals"], atol=1e-10)
    assert torch.allclose(head.predict_proba(obs), expected["predictive"], atol=1e-10)
    oracle.assert_map_paths_are_most_probable(head.map_paths(obs), oracle.exact_path_posterior(head, obs), 1e-9)
