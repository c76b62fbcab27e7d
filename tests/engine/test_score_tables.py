"""The score-table protocol (``engine/score_tables.py``): what a head's own tables implement, the hook through which
they hand the engine their own closed form of the symbol route's likelihood, and the aliases of the names that
moved to the chained head's side."""

import math

import factories
import pytest
import torch

from pyro_multihop import engine
from pyro_multihop.engine import queries, score_tables
from pyro_multihop.engine.hop_factors import HopFactors, chain_from_scores
from pyro_multihop.engine.score_tables import DenseScoreTables, ScoreTables, as_score_tables
from pyro_multihop.engine.symbol_likelihood import symbol_route_total

S, T, N = 6, 4, 5


class HookedTables(DenseScoreTables):
    """A head's own tables with a closed form of its own: here the engine's generic one, counted."""

    def __init__(self, scores):
        super().__init__(scores)
        self.calls = 0

    def symbol_route_total(self, factors, chunk, emission):
        self.calls += 1
        init = engine.hop_factors.first_hop_log_probs(self, chunk).exp()
        return symbol_route_total(factors, chunk, init, emission, self.transition_weights())


def test_a_tensor_becomes_dense_tables_and_tables_stay_as_they_are():
    scores = torch.randn(2, S, S, dtype=torch.float64)
    tables = as_score_tables(scores)
    assert isinstance(tables, DenseScoreTables) and tables.dense() is scores
    assert as_score_tables(tables) is tables and as_score_tables(None) is None
    assert ScoreTables.symbol_route_total is None and tables.symbol_route_total is None


@pytest.mark.parametrize("hops", [2, 3])
def test_the_engine_calls_the_tables_own_closed_form_when_they_carry_one(hops, monkeypatch):
    monkeypatch.setattr(engine.routes, "SYMBOL_ROUTE_RATIO", math.inf)
    monkeypatch.setattr(queries, "CLOSED_FORM_MIN_SYMBOLS", 1)
    generator = torch.Generator().manual_seed(hops)
    scores = torch.randn(hops, S, S, generator=generator, dtype=torch.float64, requires_grad=True)
    log_emission = torch.randn(S, T, generator=generator, dtype=torch.float64).log_softmax(-1)
    obs = factories.random_observations(9, S, T, N, seed=hops, masked=True)
    tables = HookedTables(scores)
    hooked = HopFactors(log_emission, lambda chunk: chain_from_scores(scores, chunk), hops, scores=tables)
    plain = HopFactors(log_emission, lambda chunk: chain_from_scores(scores, chunk), hops, scores=scores)
    got = queries.log_likelihood(hooked, obs)
    assert tables.calls == 1
    want = queries.log_likelihood(plain, obs)
    assert torch.allclose(got, want, rtol=1e-12, atol=0)
    (a,), (b,) = torch.autograd.grad(got.sum(), scores), torch.autograd.grad(want.sum(), scores)
    assert torch.allclose(a, b, rtol=1e-10, atol=1e-12)
    with torch.no_grad():  # no gradient: the plain recursion, not the hook
        queries.log_likelihood(hooked, obs)
    assert tables.calls == 1


@pytest.mark.parametrize("module, name", [(engine, "KeyTableScores"), (score_tables, "KeyTableScores"),
                                          (score_tables, "transition_weights_by_key"),
                                          (score_tables, "key_gradient_"),
                                          (engine.symbol_likelihood, "key_table_symbol_route_total")])
def test_the_chained_heads_names_moved_to_its_side_and_warn(module, name):
    from pyro_multihop.models import chained_key_tables

    with pytest.warns(DeprecationWarning, match="pyro_multihop.models.chained_key_tables"):
        assert getattr(module, name) is getattr(chained_key_tables, name)
