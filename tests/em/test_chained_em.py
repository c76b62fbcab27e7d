"""Closed-form EM for the chained head: statistics against brute force over hop paths, the M-step by hand,
additivity, weights, padding, dtypes, the fit loop, and the transitive task."""

import doctest
import logging
import math
import re

import oracle
import pytest
import torch
from factories import HOPS, MASKED, S, T, random_chained_head, random_obs
from torch.overrides import TorchFunctionMode

import pyro_multihop.em.closed_form as em_module
from pyro_multihop import ChainedAttention, Observations, transitive_task
from pyro_multihop.em import ChainedEM, ConvergenceWarning, EMResult, SufficientStats

pytestmark = pytest.mark.filterwarnings("error::pyro_multihop.em.ConvergenceWarning")

ROUTE = pytest.mark.parametrize("route", ["symbols", "positions"])


def concat(*parts):
    def cat(name):
        return torch.cat([getattr(part, name) for part in parts])

    return Observations(cat("keys"), cat("values"), cat("query"), cat("target"))


def brute_force_stats(head, obs, weights=None):
    """Expected statistics by walking every hop path: hop l's key collects the query that arrives at it."""
    tables = oracle.head_path_tables(head, obs)
    L = head.n_hops
    numerators = torch.zeros(L, S, S, dtype=torch.float64)
    masses = torch.zeros(L, S, dtype=torch.float64)
    counts = torch.zeros(S, T, dtype=torch.float64)
    loglik = 0.0
    for row, table in enumerate(tables):
        weight = 1.0 if weights is None else float(weights[row])
        total = sum(joint for _, joint in table.values())
        loglik += weight * math.log(total)
        for path, (_, joint) in table.items():
            probability = weight * joint / total
            incoming = int(obs.query[row])
            for hop, position in enumerate(path):
                key = int(obs.keys[row, position])
                numerators[hop, key, incoming] += probability
                masses[hop, key] += probability
                incoming = int(obs.values[row, position])
            counts[int(obs.values[row, path[-1]]), int(obs.target[row])] += probability
    return numerators, masses, counts, loglik


def assert_stats_close(actual, expected, rtol=1e-10, atol=1e-12):
    for name in ("key_numerators", "key_masses", "emission_counts"):
        a, b = getattr(actual, name), getattr(expected, name)
        assert a.shape == b.shape, name
        assert torch.allclose(a, b, rtol=rtol, atol=atol), (name, (a - b).abs().max())
    assert actual.loglik == pytest.approx(expected.loglik, rel=rtol, abs=atol)
    assert actual.n == pytest.approx(expected.n, rel=rtol)


def em_for(head, **kwargs):
    return ChainedEM(head.n_hops, S, T, sigma2=head.sigma2, **kwargs)


# -- the E-step against brute force ---------------------------------------------------------------------
@HOPS
@MASKED
@ROUTE
@pytest.mark.parametrize("weighted", [False, True], ids=["unweighted", "weighted"])
def test_statistics_are_posterior_expectations_over_hop_paths(hops, masked, route, weighted):
    head, obs = random_chained_head(hops, seed=hops), random_obs(seed=10 + hops, masked=masked)
    weights = None
    if weighted:
        weights = 2 * torch.rand(len(obs), generator=torch.Generator().manual_seed(3), dtype=torch.float64)
    numerators, masses, counts, loglik = brute_force_stats(head, obs, weights)
    stats = em_for(head, route=route).e_step(head, obs, weights)
    assert stats.key_numerators.dtype == torch.float64
    assert torch.allclose(stats.key_numerators, numerators, atol=1e-12)
    assert torch.allclose(stats.key_masses, masses, atol=1e-12)
    assert torch.allclose(stats.emission_counts, counts, atol=1e-12)
    assert stats.loglik == pytest.approx(loglik, rel=1e-12)
    assert stats.n == pytest.approx(len(obs) if weights is None else float(weights.sum()), rel=1e-12)


@HOPS
def test_log_likelihood_is_the_models(hops):
    head, obs = random_chained_head(hops, seed=20), random_obs(n=9, seed=21, masked=True)
    expected = float(head.log_likelihood(obs).detach().sum())
    assert em_for(head).e_step(head, obs).loglik == pytest.approx(expected, rel=1e-12)


def assert_brute_force_stats(stats, head, obs, tolerance):
    numerators, masses, counts, loglik = brute_force_stats(head, obs)
    assert torch.allclose(stats.key_numerators, numerators, atol=tolerance)
    assert torch.allclose(stats.key_masses, masses, atol=tolerance)
    assert torch.allclose(stats.emission_counts, counts, atol=tolerance)
    assert stats.loglik == pytest.approx(loglik, rel=tolerance)


@HOPS
def test_underflowing_gates_are_retried_on_their_dense_factors(hops, caplog):
    # sigma2 = 1e-3 with keys of norm ~5: symbol-space gate weights exp(-10^4) underflow even in float64.
    head = random_chained_head(hops, seed=30, sigma2=1e-3, scale=2.0)
    obs = random_obs(n=8, seed=31, masked=True)
    caplog.set_level(logging.DEBUG, logger=em_module.__name__)
    stats = em_for(head, route="symbols").e_step(head, obs)
    if hops > 1:
        assert "retried on their dense factors" in caplog.text
    assert_brute_force_stats(stats, head, obs, tolerance=1e-10)


@ROUTE
@pytest.mark.parametrize("hops", [2, 3], ids=lambda h: f"L={h}")
def test_rows_underflowing_on_their_dense_factors_too_fall_back_to_log_space(route, hops, caplog):
    """An emission whose target probabilities differ by e^700 across values (beyond float64's range of sums): a
    sharp last hop that attends a position of the wrong value leaves the likelihood below the underflow floor on
    the dense factors too, and the row goes to log space; the statistics stay exact."""
    keys = random_chained_head(hops, seed=30, sigma2=1e-3, scale=2.0).key_tables.detach()
    log_emission = torch.where(torch.arange(S).unsqueeze(-1) % T == torch.arange(T), 0.0, -700.0).double()
    head = ChainedAttention(hops, S, T, sigma2=1e-3, key_tables=keys, emission=log_emission.softmax(-1))
    obs = random_obs(n=8, seed=31, masked=True)
    caplog.set_level(logging.DEBUG, logger=em_module.__name__)
    stats = em_for(head, route=route).e_step(head, obs)
    retried, in_log_space = map(int, re.search(r"(\d+) observations retried .*, (\d+) more", caplog.text).groups())
    assert retried > 0 and in_log_space > 0
    assert_brute_force_stats(stats, head, obs, tolerance=1e-10)


@ROUTE
def test_float32_model_gives_float32_statistics(route):
    obs = random_obs(n=40, seed=41, masked=True)
    head64 = random_chained_head(3, seed=40)
    head32 = ChainedAttention(
        3, S, T, sigma2=0.6, key_tables=head64.key_tables.detach().float(), emission=head64.emission.detach().float()
    )
    em = em_for(head64, route=route)
    stats32, stats64 = em.e_step(head32, obs), em.e_step(head64, obs)
    assert stats32.key_numerators.dtype == stats32.emission_counts.dtype == torch.float32
    as32 = SufficientStats(
        stats64.key_numerators.float(), stats64.key_masses.float(), stats64.emission_counts.float(),
        stats64.loglik, stats64.n,
    )
    assert_stats_close(stats32, as32, rtol=1e-4, atol=1e-5)
    model = em.m_step(stats32)
    assert model.key_tables.dtype == torch.float32


class _LargestTensor(TorchFunctionMode):
    """Records the largest tensor any torch function returns while active."""

    def __init__(self):
        super().__init__()
        self.largest = 0

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor):
                self.largest = max(self.largest, tensor.numel())
        return out


@pytest.mark.parametrize("route, bounded", [("symbols", True), ("positions", False)])
def test_symbol_route_e_step_allocates_nothing_of_pair_size(route, bounded):
    """No (n, N, N) tensor on the symbol route, let alone the seed's (n, N, N, S); the position route has them."""
    n, context = 64, 8
    head, obs = random_chained_head(3, seed=50), random_obs(n=n, seed=51, context=context)
    em = em_for(head, route=route)
    with _LargestTensor() as spy:
        em.e_step(head, obs)
    hops = 3  # the hop marginals (L, n, N) are the largest tensor of the symbol route, below n N^2
    assert (spy.largest <= hops * n * max(context, S)) == bounded, spy.largest
    assert spy.largest < n * context * context * S


# -- the M-step --------------------------------------------------------------------------------------
def test_one_em_iteration_by_hand_one_hop():
    # Zero key tables: a uniform gate, so the posterior over positions is proportional to the emission.
    head = ChainedAttention(
        1, 2, 2, sigma2=0.5, key_tables=torch.zeros(1, 2, 2, dtype=torch.float64),
        emission=torch.tensor([[0.9, 0.1], [0.2, 0.8]], dtype=torch.float64),
    )
    obs = Observations(keys=[[0, 1], [0, 0]], values=[[0, 1], [1, 0]], query=[0, 1], target=[0, 1])
    em = ChainedEM(1, 2, 2, sigma2=0.5, emission_smoothing=0.5)
    stats = em.e_step(head, obs)
    # Row 0 (target 0): values (0, 1) give 0.9 and 0.2, posterior (9/11, 2/11). Row 1: (8/9, 1/9).
    assert stats.loglik == pytest.approx(math.log(0.5 * 0.9 + 0.5 * 0.2) + math.log(0.5 * 0.8 + 0.5 * 0.1), rel=1e-14)
    expected_numerators = torch.tensor([[[9 / 11, 1.0], [2 / 11, 0.0]]], dtype=torch.float64)
    assert torch.allclose(stats.key_numerators, expected_numerators, atol=1e-15)
    assert torch.allclose(stats.key_masses, torch.tensor([[20 / 11, 2 / 11]], dtype=torch.float64), atol=1e-15)
    expected_counts = torch.tensor([[9 / 11, 1 / 9], [2 / 11, 8 / 9]], dtype=torch.float64)
    assert torch.allclose(stats.emission_counts, expected_counts, atol=1e-15)

    model = em.m_step(stats)
    expected_tables = torch.tensor([[[9 / 20, 11 / 20], [1.0, 0.0]]], dtype=torch.float64)
    assert torch.allclose(model.key_tables.detach(), expected_tables)
    smoothed = expected_counts + 0.5
    assert torch.allclose(model.emission.detach(), smoothed / smoothed.sum(-1, keepdim=True), atol=1e-15)
    assert model.sigma2 == 0.5 and model.n_hops == 1


def test_one_em_iteration_by_hand_two_hops():
    # Uniform gates over two positions: every path has prior 1/4; values (1, 0), target 0.
    head = ChainedAttention(
        2, 2, 2, sigma2=0.5, key_tables=torch.zeros(2, 2, 2, dtype=torch.float64),
        emission=torch.tensor([[0.9, 0.1], [0.2, 0.8]], dtype=torch.float64),
    )
    obs = Observations(keys=[[0, 1]], values=[[1, 0]], query=[0], target=[0])
    em = ChainedEM(2, 2, 2, sigma2=0.5, emission_smoothing=0.0)
    stats = em.e_step(head, obs)
    # p(z1 = i, z2 = j | target) = 1/11 for j = 0 (value 1, emission 0.2), 9/22 for j = 1 (value 0, 0.9).
    assert stats.loglik == pytest.approx(math.log(0.5 * 0.2 + 0.5 * 0.9), rel=1e-14)
    hop1 = [[0.5, 0.0], [0.5, 0.0]]  # keys 0 and 1 each get half of query 0
    hop2 = [[1 / 11, 1 / 11], [9 / 22, 9 / 22]]  # key of j, value of i
    def tensor(values):
        return torch.tensor(values, dtype=torch.float64)

    assert torch.allclose(stats.key_numerators, tensor([hop1, hop2]), atol=1e-15)
    assert torch.allclose(stats.key_masses, tensor([[0.5, 0.5], [2 / 11, 9 / 11]]), atol=1e-15)
    assert torch.allclose(stats.emission_counts, tensor([[9 / 11, 0.0], [2 / 11, 0.0]]), atol=1e-15)
    model = em.m_step(stats)
    assert torch.allclose(model.key_tables.detach(), tensor([[[1.0, 0.0], [1.0, 0.0]], [[0.5, 0.5], [0.5, 0.5]]]))
    assert torch.allclose(model.emission.detach(), tensor([[1.0, 0.0], [1.0, 0.0]]))


@HOPS
def test_m_step_applies_the_closed_form_to_brute_force_statistics(hops):
    head, obs = random_chained_head(hops, seed=60), random_obs(n=10, seed=61, masked=True)
    numerators, masses, counts, _ = brute_force_stats(head, obs)
    smoothing = 0.3
    model = em_for(head, emission_smoothing=smoothing).m_step(em_for(head).e_step(head, obs))
    for hop in range(hops):
        for key in range(S):
            expected = numerators[hop, key] / max(float(masses[hop, key]), 1e-9)
            assert torch.allclose(model.key_tables.detach()[hop, key], expected, atol=1e-12)
    for value in range(S):
        row = counts[value] + smoothing
        assert torch.allclose(model.emission.detach()[value], row / row.sum(), atol=1e-12)


def test_m_step_leaves_unvisited_keys_at_zero_and_unvisited_values_uniform_without_smoothing():
    head = random_chained_head(2, seed=70)
    obs = Observations(keys=[[1, 2]], values=[[2, 3]], query=[1], target=[0])
    model = em_for(head, emission_smoothing=0.0).m_step(em_for(head).e_step(head, obs))
    assert (model.key_tables.detach()[:, [0, 3, 4]] == 0).all()
    assert torch.allclose(model.emission.detach()[0], torch.full((T,), 1 / T, dtype=torch.float64))
    assert torch.allclose(model.emission.detach().sum(-1), torch.ones(S, dtype=torch.float64))


# -- additivity, weights, padding ---------------------------------------------------------------------
@ROUTE
def test_statistics_of_parts_add_to_those_of_the_whole(route):
    head, obs = random_chained_head(3, seed=80), random_obs(n=20, seed=81, masked=True)
    em = em_for(head, route=route)
    whole = em.e_step(head, obs)
    halves = em.e_step(head, obs[:7]) + em.e_step(head, obs[7:])
    assert_stats_close(halves, whole)
    assert_stats_close(sum(em.e_step(head, obs[i : i + 5]) for i in range(0, 20, 5)), whole)
    assert_stats_close(em_for(head, route=route, chunk_size=3).e_step(head, obs), whole)
    assert_stats_close(em.e_step(head, obs[:0]) + whole, whole)


def test_adding_statistics_of_different_shapes_fails():
    small = SufficientStats.zeros(2, S, T, torch.float64)
    with pytest.raises(ValueError, match="shapes"):
        small + SufficientStats.zeros(3, S, T, torch.float64)


@ROUTE
def test_zero_weight_rows_have_no_effect(route):
    head, obs = random_chained_head(2, seed=90), random_obs(n=12, seed=91, masked=True)
    weights = torch.tensor([1.0, 0.0, 2.5, 0.0] * 3, dtype=torch.float64)
    em = em_for(head, route=route)
    kept = weights > 0
    assert_stats_close(em.e_step(head, obs, weights), em.e_step(head, obs[kept], weights[kept]))


def test_integer_weights_are_repeated_rows_and_scaling_weights_scales_statistics():
    head, obs = random_chained_head(3, seed=100), random_obs(n=6, seed=101)
    em = em_for(head)
    weights = torch.tensor([1, 2, 1, 3, 1, 1])
    repeated = concat(obs, obs[1], obs[3], obs[3])
    assert_stats_close(em.e_step(head, obs, weights), em.e_step(head, repeated))
    plain, tripled = em.e_step(head, obs), em.e_step(head, obs, torch.full((6,), 3.0))
    assert torch.allclose(tripled.key_numerators, 3 * plain.key_numerators, rtol=1e-12)
    assert tripled.loglik == pytest.approx(3 * plain.loglik, rel=1e-12) and tripled.n == 18
    assert torch.allclose(em.m_step(tripled).key_tables, em.m_step(plain).key_tables, rtol=1e-12)


def test_a_zero_likelihood_row_fails_unless_its_weight_is_zero():
    emission = torch.full((S, T), 1 / (T - 1), dtype=torch.float64)
    emission[:, 0] = 0.0  # target 0 impossible from every value
    zeros = torch.zeros(2, S, S, dtype=torch.float64)
    head = ChainedAttention(2, S, T, sigma2=0.6, key_tables=zeros, emission=emission)
    obs = Observations(keys=[[0, 1], [1, 2]], values=[[2, 3], [3, 4]], query=[0, 1], target=[0, 1])
    with pytest.raises(ValueError, match="zero likelihood"):
        em_for(head).e_step(head, obs)
    stats = em_for(head).e_step(head, obs, weights=[0.0, 1.0])
    assert math.isfinite(stats.loglik) and stats.n == 1


def test_fit_with_zero_weights_equals_fit_on_the_kept_rows():
    train = transitive_task(200, seed=3)
    weights = (torch.arange(200) % 3 != 0).double()
    em = ChainedEM(2, 30, 30)
    with pytest.warns(ConvergenceWarning):
        weighted = em.fit(train, weights, max_iters=5, tol=0.0, seed=4)
    with pytest.warns(ConvergenceWarning):
        subset = em.fit(train[weights > 0], max_iters=5, tol=0.0, seed=4)
    assert weighted.loglik == pytest.approx(subset.loglik, rel=1e-6)
    assert torch.allclose(weighted.model.key_tables, subset.model.key_tables, atol=1e-6)


@pytest.mark.parametrize(
    "weights, message",
    [
        ([1.0, -1.0, 1.0, 1.0, 1.0, 1.0], "non-negative"),
        ([1.0, float("nan"), 1.0, 1.0, 1.0, 1.0], "finite"),
        ([1.0, 1.0], r"shape \(6,\)"),
    ],
    ids=["negative", "nan", "wrong-shape"],
)
def test_bad_weights_are_rejected(weights, message):
    head, obs = random_chained_head(2), random_obs()
    em = em_for(head)
    for call in (lambda: em.e_step(head, obs, weights), lambda: em.random_stats(obs, weights=weights)):
        with pytest.raises(ValueError, match="weights") as error:
            call()
        assert error.match(message)


@ROUTE
def test_padding_gets_no_mass_and_equals_a_shorter_context(route):
    generator = torch.Generator().manual_seed(110)
    real = Observations(
        1 + torch.randint(S - 1, (8, 3), generator=generator),
        1 + torch.randint(S - 1, (8, 3), generator=generator),
        1 + torch.randint(S - 1, (8,), generator=generator),
        torch.randint(T, (8,), generator=generator),
    )
    pad = torch.full((8, 2), -1)
    mask = torch.cat([torch.ones(8, 3, dtype=torch.bool), torch.zeros(8, 2, dtype=torch.bool)], 1)
    padded = Observations(
        torch.cat([real.keys, pad], 1), torch.cat([real.values, pad], 1), real.query, real.target, mask
    )
    head = random_chained_head(3, seed=111)
    em = em_for(head, route=route)
    stats = em.e_step(head, padded)
    assert_stats_close(stats, em.e_step(head, real))
    initial = em.random_stats(padded, seed=0, dtype=torch.float64)
    for s in (stats, initial):  # padding is stored as symbol 0, which no real position uses
        assert (s.key_masses[:, 0] == 0).all() and (s.key_numerators[:, 0] == 0).all()
        assert (s.key_numerators[:, :, 0] == 0).all() and (s.emission_counts[0] == 0).all()


# -- initialisation and the fit loop ---------------------------------------------------------------------
def test_random_stats_are_responsibilities_of_each_observation():
    obs = random_obs(n=30, seed=120, masked=True)
    em = ChainedEM(3, S, T)
    stats = em.random_stats(obs, seed=5, dtype=torch.float64)
    assert math.isnan(stats.loglik) and stats.n == 30
    assert torch.allclose(stats.key_masses.sum(-1), torch.full((3,), 30.0, dtype=torch.float64))
    assert torch.allclose(stats.key_numerators.sum(-1), stats.key_masses)
    assert stats.emission_counts.sum() == pytest.approx(30.0)
    again = em.random_stats(obs, seed=5, dtype=torch.float64)
    other = em.random_stats(obs, seed=6, dtype=torch.float64)
    assert torch.equal(stats.key_numerators, again.key_numerators)
    assert not torch.allclose(stats.key_numerators, other.key_numerators)


def test_fit_is_reproducible_and_returns_the_best_model():
    train = transitive_task(300, seed=7)
    em = ChainedEM(2, 30, 30)
    calls = []
    first = em.fit(
        train, max_iters=50, tol=1e-6, seed=1, callback=lambda k, model, stats: calls.append((k, stats.loglik))
    )
    second = em.fit(train, max_iters=50, tol=1e-6, seed=1)
    assert isinstance(first, EMResult) and first.converged
    assert first.loglik == second.loglik
    assert torch.equal(first.model.key_tables, second.model.key_tables)
    assert [k for k, _ in calls] == list(range(len(first.loglik))) and [ll for _, ll in calls] == first.loglik
    assert first.n_iter == len(first.loglik) - 1
    assert first.loglik[first.best_iteration] == max(first.loglik) == first.best_loglik
    assert em.e_step(first.model, train).loglik == pytest.approx(first.best_loglik, rel=1e-6)
    assert em.result_ is second and em.model_ is second.model


def test_fit_warns_when_max_iters_is_reached():
    train = transitive_task(100, seed=8)
    with pytest.warns(ConvergenceWarning, match="max_iters = 2"):
        result = ChainedEM(2, 30, 30).fit(train, max_iters=2, tol=0.0)
    assert not result.converged and result.n_iter == 2 and len(result.loglik) == 3


def test_fit_starts_from_a_given_model_or_statistics():
    train = transitive_task(200, seed=9)
    em = ChainedEM(2, 30, 30)
    structure = ChainedAttention(2, 30, 30, 0.1, key_tables=torch.eye(30).expand(2, 30, 30), emission=torch.eye(30))
    from_model = em.fit(train, init=structure, max_iters=30)
    assert from_model.loglik[0] == pytest.approx(em.e_step(structure, train).loglik, rel=1e-6)
    stats = em.random_stats(train, seed=2)
    from_stats = em.fit(train, init=stats, max_iters=30)
    assert from_stats.loglik == em.fit(train, seed=2, max_iters=30).loglik


def test_transitive_task_em_reaches_the_generating_structure_and_one_hop_cannot():
    train, test = transitive_task(2000, seed=0), transitive_task(2000, seed=1)
    structure = ChainedAttention(2, 30, 30, 0.1, key_tables=torch.eye(30).expand(2, 30, 30), emission=torch.eye(30))
    target = structure.evaluate(test)["accuracy"]
    two_hop = ChainedEM(2, 30, 30).fit(train, max_iters=100, tol=1e-6, seed=0)
    one_hop = ChainedEM(1, 30, 30).fit(train, max_iters=100, tol=1e-6, seed=0)
    assert two_hop.converged and one_hop.converged
    assert abs(two_hop.model.evaluate(test)["accuracy"] - target) <= 0.02
    assert one_hop.model.evaluate(test)["accuracy"] < 0.25
    # The key M-step ignores the softmax normaliser: one hop's log-likelihood falls after its first
    # M-step, and fit keeps the best model, not the last.
    assert one_hop.loglik[-1] < max(one_hop.loglik) == one_hop.loglik[one_hop.best_iteration]
    assert one_hop.model is not one_hop.final_model


# -- validation ---------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"n_hops": 0}, "n_hops"),
        ({"num_symbols": 2.5}, "num_symbols"),
        ({"sigma2": -1.0}, "sigma2"),
        ({"emission_smoothing": -1e-3}, "emission_smoothing"),
        ({"chunk_size": 0}, "chunk_size"),
        ({"route": "sparse"}, "route"),
        ({"method": "sparse"}, "method"),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_bad_settings_are_rejected(kwargs, field):
    settings = {"n_hops": 2, "num_symbols": S, "num_targets": T, **kwargs}
    with pytest.raises(ValueError, match=field):
        ChainedEM(**settings)


@pytest.mark.parametrize("method, route", [("factored", "symbols"), ("dense", "positions"), ("auto", "auto")])
def test_the_former_route_names_are_deprecated_aliases(method, route):
    with pytest.warns(DeprecationWarning, match="route"):
        em = ChainedEM(2, S, T, method=method)
    assert em.route == route


@pytest.mark.parametrize(
    "field, head",
    [
        ("n_hops", lambda: random_chained_head(1)),
        ("num_symbols", lambda: ChainedAttention(2, S + 1, T, 0.6)),
        ("num_targets", lambda: ChainedAttention(2, S, T + 1, 0.6)),
        ("sigma2", lambda: random_chained_head(2, sigma2=0.3)),
    ],
    ids=lambda v: v if isinstance(v, str) else None,
)
def test_a_model_of_other_sizes_is_rejected(field, head):
    em = ChainedEM(2, S, T, sigma2=0.6)
    with pytest.raises(ValueError, match=field):
        em.e_step(head(), random_obs())
    with pytest.raises(ValueError, match=f"init.{field}"):
        em.fit(random_obs(), init=head())


@pytest.mark.parametrize("field", ["keys", "values", "query", "target"])
def test_symbols_beyond_the_model_sizes_are_rejected(field):
    obs = random_obs()
    tensors = {name: getattr(obs, name).clone() for name in ("keys", "values", "query", "target")}
    tensors[field].view(-1)[0] = T if field == "target" else S
    bad = Observations(**tensors)
    head = random_chained_head(2)
    em = em_for(head)
    for call in (lambda: em.e_step(head, bad), lambda: em.fit(bad), lambda: em.random_stats(bad)):
        with pytest.raises(ValueError, match=field):
            call()


def test_fit_needs_data_and_positive_weight():
    em, obs = ChainedEM(2, S, T), random_obs()
    with pytest.raises(ValueError, match="at least one observation"):
        em.fit(obs[:0])
    with pytest.raises(ValueError, match="weights"):
        em.fit(obs, weights=torch.zeros(len(obs)))
    with pytest.raises(TypeError, match="obs"):
        em.fit(obs.to_dataframe())
    with pytest.raises(TypeError, match="init"):
        em.fit(obs, init="identity")
    with pytest.raises(TypeError, match="model"):
        em.e_step(object(), obs)
    with pytest.raises(ValueError, match="max_iters"):
        em.fit(obs, max_iters=0)
    with pytest.raises(ValueError, match="stats"):
        em.m_step(SufficientStats.zeros(3, S, T))


def test_docstring_examples_run():
    failures, tried = doctest.testmod(em_module, optionflags=doctest.ELLIPSIS)
    assert tried > 0 and failures == 0
