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


#: Every query of the engine: name -> (factors, obs) -> result (the sampler's paths by shape only).
EVERY_QUERY = {
    "log_likelihood": lambda factors, obs: engine.log_likelihood(factors, obs),
    "predict_proba": lambda factors, obs: engine.predict_proba(factors, obs),
    "hop_marginals": lambda factors, obs: engine.hop_marginals(factors, obs),
    "pairwise_marginals": lambda factors, obs: engine.pairwise_marginals(factors, obs),
    "prior_marginals": lambda factors, obs: engine.hop_marginals(factors, obs, given_target=False),
    "map_paths": lambda factors, obs: engine.map_paths(factors, obs),
    "k_best_paths": lambda factors, obs: engine.k_best_paths(factors, obs, 3),
    "path_entropy": lambda factors, obs: engine.path_entropy(factors, obs),
    "posterior_map": lambda factors, obs: engine.HopPosterior(factors, obs).map_paths,
    "sample_paths": lambda factors, obs: engine.sample_paths(factors, obs, 4, torch.Generator().manual_seed(0)).shape,
}


@pytest.mark.parametrize("kind, route", [("chained", "symbols"), ("chained", "positions"), ("facts", "positions")])
def test_every_query_goes_through_the_one_fallback(kind, route, monkeypatch):
    """Every query's chunks go through ``routes.run_with_fallback`` (spied in every engine module that uses it): with
    each attempt made to fail on every row, every row takes the fallback, dense retry then log space, and every
    query still gives the answers of probability space (exact against brute force elsewhere); every query called
    the helper. Score tables on either route retry on the dense route first."""
    from pyro_multihop.engine import paths, posterior, queries

    if kind == "facts":  # a position emission has no score tables: the position route only
        head = factories.random_fact_head(2, 3, 6, 4, seed=0)
        obs = factories.random_fact_observations(7, 4, 3, 3, 6, seed=10)
    else:
        head, obs = random_head("chained", 3, seed=5), random_obs(n=7, seed=6, masked=True)
    monkeypatch.setattr(routes, "SYMBOL_ROUTE_RATIO", float("inf") if route == "symbols" else 0.0)
    factors = head.hop_factors()
    with torch.no_grad():
        want = {name: query(factors, obs) for name, query in EVERY_QUERY.items()}
    calls = []

    def failing(factors, chunk, route, attempt, *args, **kwargs):
        def fails(chunk, route):
            value, ok, prepared = attempt(chunk, route)
            calls.append(route)
            return value, torch.zeros_like(ok), prepared

        return routes.run_with_fallback(factors, chunk, route, fails, *args, **kwargs)

    for module in (queries, posterior, paths):
        assert module.run_with_fallback is routes.run_with_fallback
        monkeypatch.setattr(module, "run_with_fallback", failing)
    with torch.no_grad():
        for name, value in want.items():
            before = len(calls)
            got = EVERY_QUERY[name](factors, obs)
            assert len(calls) > before, name
            if name == "k_best_paths":
                assert torch.equal(got[0], value[0]) and torch.allclose(got[1], value[1], rtol=1e-10), name
            elif isinstance(value, torch.Size):
                assert got == value
            elif value.dtype == torch.long:
                assert torch.equal(got, value), name
            else:
                assert torch.allclose(got, value, rtol=1e-10, atol=1e-12), name
    if kind == "chained":
        assert "dense" in calls
