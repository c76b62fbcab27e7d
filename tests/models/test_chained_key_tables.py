"""The chained head's score tables read lazily from its key tables (``models/chained_key_tables.py``): every reader,
values and gradients, against the gate formula written out in full; the engine's likelihood on every reading path
against brute force; and its closed form of the symbol route's likelihood, behind the engine's hook."""

import math

import factories
import oracle
import pytest
import torch

from pyro_multihop import engine
from pyro_multihop.engine.score_tables import DenseScoreTables
from pyro_multihop.models.chained_key_tables import KeyTableScores

S, N = 7, 3


def formula_scores(key_tables, sigma2):
    """``(L, S, S)``: ``(1 - ||onehot(q) - K[l, k]||^2) / 2 sigma2`` at every ``(q, k)``, by broadcasting the
    squared distance itself (the library forms ``K[l, k, q] - ||K[l, k]||^2 / 2`` instead)."""
    L, S_, _ = key_tables.shape
    onehot = torch.eye(S_, dtype=key_tables.dtype)
    distances = ((onehot[None, :, None, :] - key_tables[:, None, :, :]) ** 2).sum(-1)  # (L, q, k)
    return (1.0 - distances) / (2.0 * sigma2)


def formula_weights(scores):
    """The transition weights of the hops after the first: ``exp(scores - row max)``, the shift held constant (it
    cancels in every normalised transition, so the library passes no gradient through it)."""
    later = scores[1:]
    return list((later - later.amax(-1, keepdim=True).detach()).exp().unbind(0))


def random_tables(hops, seed=0, scale=1.0):
    generator = torch.Generator().manual_seed(seed)
    return scale * torch.randn(hops, S, S, generator=generator, dtype=torch.float64)


def random_symbols(shape, seed):
    return torch.randint(S, shape, generator=torch.Generator().manual_seed(seed))


def observations(n=5, seed=3, masked=False):
    return factories.random_observations(n, S, 4, N, seed, masked)


def _readings(tables, obs, whole_first):
    """Every reading of ``tables`` (a ScoreTables, or the formula's ``(L, S, S)`` tensor), as a list of tensors."""
    if isinstance(tables, torch.Tensor):
        scores = tables
        first = scores[0][obs.query.unsqueeze(-1), obs.keys]
        later = scores[1:][:, obs.values.unsqueeze(-1), obs.keys.unsqueeze(-2)]
        hop_last = scores[-1][obs.values, obs.keys]
        return [first, later, first, later, hop_last] + formula_weights(scores) + [scores]
    out = []
    if whole_first:
        out_weights = tables.transition_weights()
    first, later = tables.chain_logits(obs)
    out += [first, later, tables.gather(0, obs.query.unsqueeze(-1), obs.keys),
            tables.later_pair_logits(obs.values, obs.keys), tables.gather(tables.n_hops - 1, obs.values, obs.keys)]
    if not whole_first:
        out_weights = tables.transition_weights()
    return out + list(out_weights) + [tables.dense()]


@pytest.mark.parametrize("hops", [1, 2, 3])
@pytest.mark.parametrize("whole_first", [False, True], ids=["gathers-first", "whole-first"])
@pytest.mark.parametrize("n", [5, 60], ids=["few-pairs", "more-pairs-than-the-tables"])
def test_every_reading_and_its_gradient_equal_the_gate_formula(hops, whole_first, n):
    """Values and the gradient of a random linear function of each reading, lazy tables against the formula (the
    first hop's gathers read the key tables before the whole tables are formed, and the whole first-hop table
    after; gathers of more entries than the tables hold read the whole logit table)."""
    sigma2, obs = 0.4, observations(n=n, seed=hops)
    key_tables = random_tables(hops, seed=hops).requires_grad_()
    got = _readings(KeyTableScores(key_tables, sigma2), obs, whole_first)
    want = _readings(formula_scores(key_tables, sigma2), obs, whole_first)
    assert len(got) == len(want)
    generator = torch.Generator().manual_seed(7)
    for reading, (lazy, formula) in enumerate(zip(got, want)):
        assert lazy.shape == formula.shape, reading
        assert torch.allclose(lazy, formula, rtol=1e-12, atol=1e-12), reading
        if lazy.numel() == 0:
            continue
        weights = torch.randn(lazy.shape, generator=generator, dtype=lazy.dtype)
        lazy_grad, = torch.autograd.grad((lazy * weights).sum(), key_tables, retain_graph=True)
        formula_grad, = torch.autograd.grad((formula * weights).sum(), key_tables, retain_graph=True)
        assert torch.allclose(lazy_grad, formula_grad, rtol=1e-10, atol=1e-10), reading


def test_without_gradients_the_readings_are_the_same():
    obs, key_tables = observations(), random_tables(3).requires_grad_()
    with_grad = _readings(KeyTableScores(key_tables, 0.3), obs, whole_first=False)
    with torch.no_grad():
        without = _readings(KeyTableScores(key_tables, 0.3), obs, whole_first=False)
    for a, b in zip(with_grad, without):
        assert not b.requires_grad
        assert torch.equal(a.detach(), b)


def test_dense_tables_read_the_same_as_lazy_ones():
    obs, key_tables = observations(seed=4), random_tables(3, seed=4)
    lazy = _readings(KeyTableScores(key_tables, 0.3), obs, whole_first=True)
    dense = _readings(DenseScoreTables(formula_scores(key_tables, 0.3)), obs, whole_first=True)
    for a, b in zip(lazy, dense):
        assert torch.allclose(a, b, rtol=1e-12, atol=1e-12)


def test_transition_weights_stay_finite_for_a_sharp_gate():
    """sigma2 = 1e-3 and keys far apart: logits of order 1e4, weights in [0, 1] with each row's maximum 1, and a
    finite gradient."""
    key_tables = random_tables(3, seed=5, scale=3.0).requires_grad_()
    weights = KeyTableScores(key_tables, 1e-3).transition_weights()
    for table in weights:
        assert torch.isfinite(table).all() and (table >= 0).all() and (table <= 1).all()
        assert torch.equal(table.amax(-1), torch.ones(S, dtype=table.dtype))
    grad, = torch.autograd.grad(sum((w * w.detach()).sum() for w in weights), key_tables)
    assert torch.isfinite(grad).all()


# A chunk of c rows reads the tables one of three ways: the symbol route (whole transition weights), the
# position route with c N^2 >= S^2 (whole weights, gathered per pair) and with c N^2 < S^2 (logits gathered from
# the key tables, never the whole table). With S = 7, N = 3: one-row chunks (9 < 49) and whole batches of 6 rows
# (54 >= 49) take the last two.
READING_PATHS = pytest.mark.parametrize(
    "ratio, budget", [(math.inf, None), (0.0, None), (0.0, 1)], ids=["symbols", "positions-whole", "positions-gathered"]
)


@pytest.mark.parametrize("hops", [1, 2, 3])
@READING_PATHS
def test_likelihood_and_gradient_on_every_reading_path_equal_brute_force(hops, ratio, budget, monkeypatch):
    monkeypatch.setattr(engine.routes, "SYMBOL_ROUTE_RATIO", ratio)
    head = factories.random_chained_head(hops, S, 4, seed=hops, sigma2=0.5)
    obs = observations(n=6, seed=10 + hops)
    parameters = [head.key_tables, head.emission_logits]
    log_likelihood = head.log_likelihood(obs, budget=budget)
    grads = torch.autograd.grad(log_likelihood.sum(), parameters)
    eye = torch.eye(S, dtype=torch.float64)
    key_vectors = [table[obs.keys] for table in head.key_tables]  # differentiable, unlike oracle.onehot_vectors
    reference = oracle.log_likelihood_autograd(eye[obs.query], key_vectors, eye[obs.values], head.sigma2,
                                               head.emission, obs.values, obs.target)
    reference_grads = torch.autograd.grad(reference.sum(), parameters)
    assert torch.allclose(log_likelihood, reference, rtol=1e-12, atol=0)
    for got, want in zip(grads, reference_grads):
        assert torch.allclose(got, want, rtol=1e-9, atol=1e-11)


def test_the_chained_head_hands_the_engine_lazy_tables():
    head = factories.random_chained_head(2, S, 4)
    tables = head.hop_factors().score_tables
    assert isinstance(tables, KeyTableScores)
    assert torch.allclose(tables.dense(), head.gate_score_tables(), rtol=1e-12, atol=1e-12)
    assert factories.random_chained_head(2, S, 4, max_distance=3).hop_factors().score_tables is None


def test_tables_formed_without_gradients_do_not_serve_a_differentiable_read():
    """A head's gates read under no_grad first (an evaluation) and then in a loss: the second read must carry
    the gradient, not reuse the tables formed without it."""
    key_tables, obs = random_tables(3, seed=8).requires_grad_(), observations(n=60, seed=8)
    tables = KeyTableScores(key_tables, 0.3)
    with torch.no_grad():
        _readings(tables, obs, whole_first=True)
    got = _readings(tables, obs, whole_first=True)
    want = _readings(formula_scores(key_tables, 0.3), obs, whole_first=True)
    generator = torch.Generator().manual_seed(9)
    for lazy, formula in zip(got, want):
        assert lazy.requires_grad
        weights = torch.randn(lazy.shape, generator=generator, dtype=lazy.dtype)
        lazy_grad, = torch.autograd.grad((lazy * weights).sum(), key_tables, retain_graph=True)
        formula_grad, = torch.autograd.grad((formula * weights).sum(), key_tables, retain_graph=True)
        assert torch.allclose(lazy_grad, formula_grad, rtol=1e-10, atol=1e-10)
    dense = DenseScoreTables(formula_scores(key_tables, 0.3))
    with torch.no_grad():
        dense.transition_weights()
    assert all(weight.requires_grad for weight in dense.transition_weights())


@pytest.mark.parametrize("hops", [2, 3])
def test_the_engine_takes_the_closed_form_from_its_threshold(hops, monkeypatch):
    """With the threshold lowered to these few symbols, the chained head's differentiable log-likelihood goes
    through the closed form on its key tables, the engine's ``symbol_route_total`` hook (spied): its gradient equals brute force, and with sigma2 = 1e-3
    (rows recomputed in log space; gradients of order 1e-13, below the brute force's own rounding) the gradient
    without the closed form."""
    from pyro_multihop.engine import queries

    S, T, N = 6, 4, 5
    monkeypatch.setattr(engine.routes, "SYMBOL_ROUTE_RATIO", math.inf)
    calls = []
    total = KeyTableScores.symbol_route_total
    monkeypatch.setattr(KeyTableScores, "symbol_route_total", lambda *args: calls.append(1) or total(*args))
    full = factories.random_observations(9, S, T, N, seed=21, masked=False)
    padded = factories.random_observations(9, S, T, N, seed=22, masked=True)

    def gradients(obs, sigma2, scale, threshold):
        monkeypatch.setattr(queries, "CLOSED_FORM_MIN_SYMBOLS", threshold)
        head = factories.random_chained_head(hops, S, T, seed=20 + hops, sigma2=sigma2, scale=scale)
        parameters = [head.key_tables, head.emission_logits]
        return head, parameters, torch.autograd.grad(head.log_likelihood(obs).sum(), parameters)

    head, parameters, grads = gradients(full, 0.5, 1.0, threshold=1)
    assert len(calls) == 1
    eye = torch.eye(S, dtype=torch.float64)
    reference = oracle.log_likelihood_autograd(eye[full.query], [t[full.keys] for t in head.key_tables],
                                               eye[full.values], head.sigma2, head.emission, full.values, full.target)
    for got, want in zip(grads, torch.autograd.grad(reference.sum(), parameters)):
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-12)
    # padding, and rows recomputed in log space, against the same head without the closed form
    for obs, sigma2, scale, atol in [(padded, 0.5, 1.0, 1e-12), (full, 1e-3, 3.0, 1e-15), (padded, 1e-3, 3.0, 1e-15)]:
        _, _, grads = gradients(obs, sigma2, scale, threshold=1)
        _, _, without = gradients(obs, sigma2, scale, threshold=10**9)
        for got, want in zip(grads, without):
            assert torch.allclose(got, want, rtol=1e-9, atol=atol)
    assert len(calls) == 4
