"""The engine's routes (pyro_multihop/engine/routes.py): the symbol route needs score tables, a gate without them
runs on its dense factors, and the dense retry's sub-chunks."""

import factories
import oracle
import pytest
import torch
from factories import HOPS, N, random_head, random_obs

from pyro_multihop import engine
from pyro_multihop.engine import routes
from pyro_multihop.engine.budget import bytes_per_row


def test_the_symbol_route_needs_score_tables():
    head, obs = random_head("chained", 2), random_obs(n=7)
    factors = head.hop_factors().replace(scores=None)
    assert engine.choose_route(factors, N) == "positions"
    with pytest.raises(ValueError, match="symbols"):
        next(engine.forward_backward_chunks(factors, obs, route="symbols"))


@HOPS
def test_a_gate_without_score_tables_runs_on_its_dense_factors(hops):
    """A head whose gate has position terms hands the engine only its dense log factors: same answers."""
    head, obs = random_head("chained", hops, seed=90), random_obs(n=12, seed=91, masked=True)
    with_tables = head.hop_factors()
    without = with_tables.replace(scores=None)
    assert torch.allclose(engine.log_likelihood(without, obs), engine.log_likelihood(with_tables, obs), rtol=1e-12)
    assert torch.allclose(engine.hop_marginals(without, obs), engine.hop_marginals(with_tables, obs), atol=1e-13)
    assert torch.allclose(engine.predict_proba(without, obs), engine.predict_proba(with_tables, obs), atol=1e-13)
    assert torch.allclose(engine.pairwise_marginals(without, obs), oracle.brute_force(head, obs)["pairwise_marginals"],
                          atol=1e-13)


def test_dense_retries_cover_the_failing_rows_in_bounded_sub_chunks(monkeypatch):
    """The failing rows in order, in sub-chunks of at most DENSE_RETRY_ELEMENTS entries a factor and within the
    budget; none for a chunk whose transitions came from its dense factors (its rows go to log space)."""
    from pyro_multihop import ChainedAttention

    S, N = 6, 5
    head = ChainedAttention(2, S, S, sigma2=0.5, init="random", seed=0)
    factors = head.hop_factors()
    chunk = factories.random_observations(40, S, S, N, 3, True)
    failing = torch.tensor([1, 4, 5, 9, 10, 11, 20, 39])
    monkeypatch.setattr(routes, "DENSE_RETRY_ELEMENTS", 3 * N * N)  # 3 rows a sub-chunk
    prepared = routes.prepare(factors, chunk, "symbols")
    slices = routes.dense_retries(factors, prepared, failing)
    assert [s.tolist() for s in slices] == [[1, 4, 5], [9, 10, 11], [20, 39]]
    one_row = bytes_per_row("positions", 2, N, S, 4)  # float32 head: 4-byte entries
    assert [len(s) for s in routes.dense_retries(factors, prepared, failing, budget=int(2 * one_row))] == [2] * 4
    assert routes.dense_retries(factors, prepared, failing[:0]) == []
    assert routes.dense_retries(factors, routes.prepare(factors, chunk, "dense"), failing) == []
