"""What a head hands the engine (pyro_multihop/engine/hop_factors.py): the first-hop distribution and the dense log
factors of a gate given by score tables, against the softmax of the table entries written out loop by loop, and
the checks of :class:`HopFactors`."""

import math

import factories
import pytest
import torch

from pyro_multihop import engine
from pyro_multihop.engine import HopFactors, chain_from_scores
from pyro_multihop.engine.hop_factors import first_hop_log_probs

S, T, N = 5, 3, 4


def random_scores(hops, seed=0):
    return torch.randn(hops, S, S, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)


def softmax_over_real(logits, real):
    """``log softmax`` of a list of logits over the positions where ``real`` holds; ``-inf`` elsewhere."""
    top = max(value for value, keep in zip(logits, real) if keep)
    total = top + math.log(sum(math.exp(value - top) for value, keep in zip(logits, real) if keep))
    return [value - total if keep else -math.inf for value, keep in zip(logits, real)]


@pytest.mark.parametrize("hops", [1, 2, 3])
@pytest.mark.parametrize("masked", [False, True], ids=["full", "padded"])
def test_the_dense_factors_are_the_softmax_of_the_table_entries(hops, masked):
    """``init[c, j] = log softmax_j scores[0][query_c, key_cj]`` and ``trans[l, c, i, j] = log softmax_j
    scores[l + 1][value_ci, key_cj]``, padding excluded (probability 0); the first hop's distribution is ``init``."""
    scores = random_scores(hops, seed=hops)
    obs = factories.random_observations(6, S, T, N, seed=10 + hops, masked=masked)
    chain = chain_from_scores(scores, obs)
    assert chain.init.shape == (6, N) and chain.trans.shape == (hops - 1, 6, N, N)
    assert torch.equal(first_hop_log_probs(scores, obs), chain.init)
    for c in range(6):
        real = [True] * N if obs.mask is None else obs.mask[c].tolist()
        logits = [float(scores[0, obs.query[c], obs.keys[c, j]]) for j in range(N)]
        for j, want in enumerate(softmax_over_real(logits, real)):
            assert math.exp(float(chain.init[c, j])) == pytest.approx(math.exp(want), abs=1e-14)
        for hop in range(hops - 1):
            for i in range(N):
                logits = [float(scores[hop + 1, obs.values[c, i], obs.keys[c, j]]) for j in range(N)]
                for j, want in enumerate(softmax_over_real(logits, real)):
                    assert math.exp(float(chain.trans[hop, c, i, j])) == pytest.approx(math.exp(want), abs=1e-14)


def test_one_table_for_every_hop_is_normalised_once_and_shared():
    """Hops sharing one table (a stride-0 expand, as the tied head's) give one normalised factor, viewed at every
    later hop, equal to normalising each hop's copy apart."""
    obs = factories.random_observations(4, S, T, N, seed=2, masked=True)
    one = random_scores(1, seed=3)[0]
    shared = one.unsqueeze(0).expand(3, S, S)
    chain = chain_from_scores(shared, obs)
    assert chain.trans.stride(0) == 0
    copies = chain_from_scores(shared.clone(), obs)
    assert copies.trans.stride(0) != 0
    assert torch.allclose(chain.trans, copies.trans, rtol=0, atol=1e-15)
    assert torch.equal(chain.init, copies.init)


def test_a_position_emission_refuses_score_tables():
    log_emission = torch.zeros(S, T, dtype=torch.float64)
    with pytest.raises(ValueError, match="scores must be None"):
        HopFactors(log_emission, lambda chunk: None, 2, scores=random_scores(2), position_emission=lambda chunk: None)


def test_a_position_mixture_needs_a_position_emission():
    with pytest.raises(ValueError, match="position_emission must be given"):
        HopFactors(torch.zeros(S, T, dtype=torch.float64), lambda chunk: None, 2,
                   position_mixture=lambda chunk, weights: None)


def test_predictions_mix_through_the_heads_mixture_where_it_has_one():
    """A head's ``position_mixture`` equals the engine's own mixture of its ``position_emission``: the same
    predictions either way, and a mixture that differs shows in them (the engine calls it). One chunk of 5 rows."""
    obs = factories.random_observations(5, S, T, N, seed=4, masked=True)
    table = torch.randn(5, N, T, generator=torch.Generator().manual_seed(6), dtype=torch.float64).log_softmax(-1)
    plain = HopFactors(None, lambda chunk: chain_from_scores(random_scores(2, seed=5), chunk), 2,
                       position_emission=lambda chunk: table, num_symbols=S, num_targets=T, dtype=torch.float64,
                       device="cpu")
    mixed = plain.replace(position_mixture=lambda chunk, weights: torch.einsum("cn,cnt->ct", weights, table.exp()))
    doubled = plain.replace(position_mixture=lambda chunk, weights: 2 * torch.einsum("cn,cnt->ct", weights, table.exp()))
    expected = engine.predict_proba(plain, obs)
    assert torch.allclose(engine.predict_proba(mixed, obs), expected, atol=1e-12, rtol=0)
    assert torch.allclose(engine.predict_proba(doubled, obs), 2 * expected, atol=1e-12, rtol=0)


def test_replace_changes_the_given_fields_only():
    log_emission = torch.randn(S, T, dtype=torch.float64).log_softmax(-1)
    factors = HopFactors(log_emission, lambda chunk: None, 2, scores=random_scores(2))
    changed = factors.replace(scores=None, n_hops=3)
    assert changed.score_tables is None and changed.n_hops == 3
    assert changed.log_emission is factors.log_emission and changed.dense_chain is factors.dense_chain
    assert factors.score_tables is not None and factors.n_hops == 2 and factors.num_symbols == S
