"""The path queries (pyro_multihop/engine/paths.py): their building blocks against their definitions (the k largest
entries of each row, the k best paths of a few candidates scored all at once), and MAP, k best (given the target
and of the prior chain), sampling and entropy against brute force on both routes."""

import itertools
import math

import oracle
import pytest
import torch
from factories import EMISSION_GAPS, HEADS, HOPS, MASKED, ROUTES, random_chained_head, random_head, random_obs

from pyro_multihop import engine
from pyro_multihop.engine import log_space, paths


@pytest.mark.parametrize("k", [1, 3, 8, 9, 12], ids=lambda k: f"k={k}")
def test_the_k_largest_entries_and_the_largest_of_the_rest(k):
    """Against a full sort, on rows with ties (a tie's entries are interchangeable: their values are compared,
    and each position must hold its value); both the rounds of row maxima (k <= 8) and ``topk``."""
    g = torch.Generator().manual_seed(k)
    scores = torch.randint(0, 6, (50, 15), generator=g).double() + torch.rand(50, 15, generator=g).round()
    values, positions, rest = paths._largest(scores, k, rest=True)
    ordered = scores.sort(-1, descending=True).values
    assert torch.equal(values, ordered[:, :k])
    assert torch.equal(rest, ordered[:, k])
    assert torch.equal(scores.gather(1, positions), values)
    assert all(len(set(row)) == k for row in positions.tolist())  # k distinct positions
    assert torch.equal(paths._largest(scores, k)[0], values)


@pytest.mark.parametrize("hops", [1, 2, 3], ids=lambda h: f"L={h}")
def test_the_k_best_of_a_few_candidates_scored_all_at_once(hops):
    """Every path of ``s`` candidates scored by hand: the values (rescaled) and the paths, best first."""
    g = torch.Generator().manual_seed(hops)
    c, s, k = 4, 3, 5
    init = torch.rand(c, s, generator=g, dtype=torch.float64)
    emission = torch.rand(c, s, generator=g, dtype=torch.float64)
    weights = [torch.rand(c, s, s, generator=g, dtype=torch.float64) for _ in range(hops - 1)]
    values, found, log_scale, ok = paths._k_best_by_enumeration(
        [w.permute(1, 2, 0).contiguous() for w in weights], init, emission, hops, k, 1e-300)
    assert ok.all()
    for row in range(c):
        scored = {}
        for path in itertools.product(range(s), repeat=hops):
            p = init[row, path[0]] * emission[row, path[-1]]
            for hop in range(hops - 1):
                p = p * weights[hop][row, path[hop], path[hop + 1]]
            scored[path] = float(p)
        best = sorted(scored.values(), reverse=True)[:k]
        got = (values[row].log() + log_scale[row]).exp()
        assert torch.allclose(got, torch.tensor(best, dtype=torch.float64), rtol=1e-12)
        for path, value in zip(found[row].tolist(), got.tolist()):
            assert scored[tuple(path)] == pytest.approx(value, rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("N", [6, 100, 5000], ids=lambda N: f"N={N}")
def test_the_top_positions_bound_every_other_entry(dtype, N):
    """``_top_positions`` (integer keys; ``_largest`` past 4096 positions): k distinct positions holding their
    values, an upper bound on every other entry, and the exact top k wherever values are apart (here: ties, zeros
    and well-separated values)."""
    g = torch.Generator().manual_seed(N)
    k = 5
    scores = torch.randint(0, 40, (30, N), generator=g).to(dtype) / 7  # many ties
    scores[0] = 0.0
    scores[1, :3] = scores[1, 3]  # a tie across the k-th place
    values, positions, rest = paths._top_positions(scores, k)
    assert all(len(set(row)) == k for row in positions.tolist())
    assert torch.equal(scores.gather(1, positions), values)
    others = scores.scatter(1, positions, -1.0)
    assert (rest >= others.amax(-1)).all()
    assert torch.equal(values.sort(-1, descending=True).values, scores.sort(-1, descending=True).values[:, :k])
    # values within 2^-16 of each other, relatively, may come in either order, but rest stays a bound
    near = torch.full((4, N), 1.0, dtype=dtype) + torch.rand(4, N, generator=g, dtype=dtype) * 1e-6
    values, positions, rest = paths._top_positions(near, k)
    assert (rest >= near.scatter(1, positions, -1.0).amax(-1)).all()
    assert torch.equal(near.gather(1, positions), values)


# -- the path queries of a head, chunked through the engine, against brute force -------------------------------
@HEADS
@HOPS
def test_path_entropy_and_k_best_paths_match_brute_force(kind, hops):
    head, obs = random_head(kind, hops, seed=80), random_obs(n=6, seed=81, masked=True)
    posteriors = oracle.exact_path_posterior(head, obs)
    entropy = torch.tensor([-sum(p * math.log(p) for p in post.values() if p > 0) for post in posteriors],
                           dtype=torch.float64)
    assert torch.allclose(head.path_entropy(obs, budget=1), entropy, atol=1e-12)
    k = 5
    paths, log_probs = head.k_best_paths(obs, k, budget=1)
    assert paths.shape == (len(obs), k, hops) and log_probs.shape == (len(obs), k)
    for row, post in enumerate(posteriors):
        best = sorted((p for p in post.values() if p > 0), reverse=True)[:k]
        got = log_probs[row][torch.isfinite(log_probs[row])]
        assert torch.allclose(got.exp(), torch.tensor(best, dtype=torch.float64), rtol=1e-10)
        assert (log_probs[row, len(best):] == -math.inf).all()  # fewer than k paths with mass in this row
        for path, log_prob in zip(paths[row, : len(best)].tolist(), got.tolist()):
            assert post[tuple(path)] == pytest.approx(math.exp(log_prob), rel=1e-10)


@HEADS
def test_sample_paths_follow_the_exact_path_posterior(kind):
    head, obs = random_head(kind, 2, seed=82), random_obs(n=3, seed=83, context=3)
    draws = head.sample_paths(obs, 20000, seed=0, budget=1)
    assert draws.shape == (20000, len(obs), 2)
    assert torch.equal(draws, head.sample_paths(obs, 20000, seed=0, budget=1))  # seeded: reproducible
    for row, post in enumerate(oracle.exact_path_posterior(head, obs)):
        for path, p in post.items():
            frequency = float((draws[:, row] == torch.tensor(path)).all(-1).double().mean())
            assert abs(frequency - p) <= 5 * math.sqrt(p * (1 - p) / 20000) + 1e-12, (row, path, frequency, p)


@HEADS
def test_sample_paths_without_the_target_follow_the_prior_chain(kind):
    head, obs = random_head(kind, 2, seed=82), random_obs(n=3, seed=83, context=3)
    factors, chain = head.hop_factors(), head.hop_chain(obs)
    draws = engine.sample_paths(factors, obs, 20000, torch.Generator().manual_seed(0), budget=1, given_target=False)
    for row in range(len(obs)):
        prior = oracle.path_posterior(oracle.chain_log_joints(chain.init, chain.trans, torch.zeros_like(chain.init), row))
        for path, p in prior.items():
            frequency = float((draws[:, row] == torch.tensor(path)).all(-1).double().mean())
            assert abs(frequency - p) <= 5 * math.sqrt(p * (1 - p) / 20000) + 1e-12, (row, path, frequency, p)


@pytest.mark.parametrize("query, args, name", [("k_best_paths", (0,), "k"), ("sample_paths", (0,), "num_samples"),
                                                ("k_best_paths", (1.5,), "k")])
def test_path_queries_refuse_bad_counts_by_name(query, args, name):
    head, obs = random_head("chained", 2), random_obs(n=7)
    with pytest.raises(ValueError, match=name):
        getattr(head, query)(obs, *args)


def test_path_entropy_without_the_target_is_that_of_the_prior_chain():
    head, obs = random_head("chained", 2, seed=84), random_obs(n=5, seed=85, masked=True)
    tables = oracle.head_path_tables(head, obs)
    prior_entropy = torch.tensor([-sum(p * math.log(p) for p, _ in table.values() if p > 0) for table in tables],
                                 dtype=torch.float64)
    assert torch.allclose(head.path_entropy(obs, given_target=False), prior_entropy, atol=1e-12)
    assert not torch.allclose(head.path_entropy(obs), prior_entropy, atol=1e-3)  # the target does inform the path


@HEADS
@HOPS
@MASKED
@ROUTES
@pytest.mark.parametrize("sigma2, scale, emission_gap", [(0.6, 1.0, None), (1e-3, 2.0, None), (1e-3, 2.0, 700.0)],
                         ids=["sigma2=0.6", "sigma2=1e-3", "sigma2=1e-3, emission e^700 apart"])
def test_path_queries_match_brute_force_on_both_routes(kind, hops, masked, ratio, sigma2, scale, emission_gap,
                                                       monkeypatch):
    """MAP, k best, entropy (with and without the target) and the lazy posterior; sigma2 = 1e-3 rows underflow in
    probability space and are retried on their dense factors, and with the emission e^700 apart some underflow
    there too and go to log space. The max-products run their looped form here (the broadcast form on
    few rows is checked in tests/engine/test_transitions.py)."""
    monkeypatch.setattr(engine.routes, "SYMBOL_ROUTE_RATIO", ratio)
    monkeypatch.setattr(engine.transitions, "MAX_TIMES_LOOP_ELEMENTS", 0)
    head = random_head(kind, hops, seed=100 + hops, sigma2=sigma2, scale=scale, emission_gap=emission_gap)
    obs = random_obs(n=8, seed=101 + hops, masked=masked)
    posteriors = oracle.exact_path_posterior(head, obs)
    rtol = 1e-9
    oracle.assert_map_paths_are_most_probable(head.map_paths(obs), posteriors, rtol)
    oracle.assert_k_best_match(*head.k_best_paths(obs, 4), posteriors, 4, rtol)
    assert torch.allclose(head.path_entropy(obs), oracle.path_entropies(posteriors), atol=1e-10)
    tables = oracle.head_path_tables(head, obs)
    prior = [{path: p for path, (p, _) in table.items()} for table in tables]
    assert torch.allclose(head.path_entropy(obs, given_target=False), oracle.path_entropies(prior), atol=1e-10)
    oracle.assert_map_paths_are_most_probable(head.map_paths(obs, given_target=False), prior, rtol)
    posterior = head.posterior(obs)
    oracle.assert_map_paths_are_most_probable(posterior.map_paths, posteriors, rtol)
    assert torch.equal(posterior.map_paths, head.map_paths(obs))
    assert posterior.map_paths is posterior.map_paths  # kept after the first read
    assert torch.allclose(posterior.path_entropy, oracle.path_entropies(posteriors), atol=1e-10)
    assert torch.allclose(posterior.hop_marginals, oracle.brute_force(head, obs)["hop_marginals"], atol=1e-10)


@HEADS
@ROUTES
def test_posterior_draws_follow_the_exact_path_posterior_on_both_routes(kind, ratio, monkeypatch):
    monkeypatch.setattr(engine.routes, "SYMBOL_ROUTE_RATIO", ratio)
    head, obs = random_head(kind, 3, seed=110), random_obs(n=2, seed=111, context=3, masked=True)
    draws = head.sample_paths(obs, 20000, seed=1)
    for row, post in enumerate(oracle.exact_path_posterior(head, obs)):
        for path, p in post.items():
            frequency = float((draws[:, row] == torch.tensor(path)).all(-1).double().mean())
            assert abs(frequency - p) <= 5 * math.sqrt(p * (1 - p) / 20000) + 1e-12, (row, path, frequency, p)


@ROUTES
@EMISSION_GAPS
def test_underflowing_rows_draw_from_the_exact_path_posterior(ratio, emission_gap, monkeypatch):
    """sigma2 = 1e-3: rows retried on their dense factors or recomputed in log space still draw the paths of
    positive posterior probability."""
    monkeypatch.setattr(engine.routes, "SYMBOL_ROUTE_RATIO", ratio)
    head = random_head("chained", 2, seed=112, sigma2=1e-3, scale=2.0, emission_gap=emission_gap)
    obs = random_obs(n=6, seed=113, masked=True)
    draws = head.sample_paths(obs, 200, seed=2)
    for row, post in enumerate(oracle.exact_path_posterior(head, obs)):
        for path in draws[:, row].tolist():
            assert post.get(tuple(path), 0.0) > 0, (row, path)


@HOPS
@ROUTES
@pytest.mark.parametrize("scale", [2.0, 0.0], ids=["random", "uniform gate"])
@pytest.mark.parametrize("enumerated", [4096, 0], ids=["enumerated", "k-max"])
def test_k_best_paths_pruned_by_max_marginals_equal_the_log_space_ones(hops, ratio, scale, enumerated, monkeypatch):
    """N = 24 > 16 candidates a hop: rows whose k best paths fit in the candidates of every hop are pruned (the
    spy checks that some are, and with a uniform gate, whose paths tie, that some are not, and that some pruned
    rows need more than k candidates, so that a group holds rows with empty slots), and equal the dense
    log-space k best (itself checked against brute force in tests/engine/test_log_space.py); the candidates' paths
    are scored all at once or by the k-max product (``ENUMERATED_PATHS``)."""
    from pyro_multihop.engine import log_space, paths as engine_paths

    monkeypatch.setattr(engine.routes, "SYMBOL_ROUTE_RATIO", ratio)
    monkeypatch.setattr(engine_paths, "ENUMERATED_PATHS", enumerated)
    monkeypatch.setattr(engine_paths, "FEW_CANDIDATES", 4)  # pruned rows in both groups
    found = []
    candidates = engine_paths._k_best_candidates

    def spy(*args):
        chosen, needed, fits = candidates(*args)
        found.append((needed, fits))
        return chosen, needed, fits

    monkeypatch.setattr(engine_paths, "_k_best_candidates", spy)
    head = random_head("chained", hops, seed=120, scale=scale)
    obs = random_obs(n=40, seed=121, masked=True, context=24)
    paths, log_probs = head.k_best_paths(obs, 3)
    with torch.no_grad():
        chain, log_emission = head.hop_chain(obs), head.log_emission[obs.values, obs.target.unsqueeze(-1)]
        _, expected = log_space.chain_k_best(chain, log_emission, 3)
        log_likelihood = log_space.chain_log_likelihood(chain, log_emission)
    assert torch.allclose(log_probs, expected, rtol=1e-10, atol=1e-12)
    rows = torch.arange(len(obs)).unsqueeze(-1)
    path_scores = chain.init[rows, paths[..., 0]] + log_emission[rows, paths[..., -1]]  # (n, k): each path's joint
    for hop in range(hops - 1):
        path_scores = path_scores + chain.trans[hop][rows, paths[..., hop], paths[..., hop + 1]]
    assert torch.allclose(path_scores - log_likelihood.unsqueeze(-1), log_probs, rtol=1e-10, atol=1e-12)
    assert all(len(set(map(tuple, row))) == 3 for row in paths.tolist())  # distinct paths
    if hops > 1:
        needed, pruned = (torch.cat(parts) for parts in zip(*found))
        assert pruned.any() if scale else not pruned.all()
        # pruned rows of different needs: the group of the larger need holds rows with fewer candidates
        assert len(set(needed[pruned].tolist())) > 1


# -- k best paths of the prior chain (the question alone, ``given_target=False``), against brute force over every
# path of the chain's factors and against the log-space k best with a zero emission -----------------------------
def chain_of(head, obs):
    with torch.no_grad():
        return head.hop_chain(obs), head.log_emission[obs.values, obs.target.unsqueeze(-1)]


@ROUTES
@HOPS
def test_question_only_k_best_is_the_sorted_enumeration_of_the_prior(hops, ratio, monkeypatch):
    monkeypatch.setattr(engine.routes, "SYMBOL_ROUTE_RATIO", ratio)
    head = random_chained_head(hops, seed=5, scale=2.0)
    obs = random_obs(5, seed=6, masked=True)
    k = 6
    paths, log_probs = head.k_best_paths(obs, k, given_target=False, budget=1)
    given, _ = head.k_best_paths(obs, k)
    chain, log_emission = chain_of(head, obs)
    zero = torch.zeros_like(log_emission)
    differs = False
    for row in range(len(obs)):
        table = oracle.chain_log_joints(chain.init, chain.trans, zero, row)
        best = oracle.sorted_paths(table)[:k]
        # Equal keys tie: the values are the sorted enumeration's, each path has its own value, no path twice.
        assert torch.allclose(log_probs[row, : len(best)], torch.tensor([v for _, v in best], dtype=torch.float64),
                              rtol=0, atol=1e-10)
        returned = [tuple(p) for p in paths[row, : len(best)].tolist()]
        assert len(set(returned)) == len(best)
        for path, log_prob in zip(returned, log_probs[row].tolist()):
            assert table[path] == pytest.approx(log_prob, abs=1e-10)
        assert (log_probs[row, len(best):] == -math.inf).all()
        differs |= not torch.equal(paths[row], given[row])
    assert differs  # the answer moves some row's ranking: the switch is not a no-op


@ROUTES
@pytest.mark.parametrize("hops", [2, 3], ids=lambda h: f"L={h}")
def test_pruned_question_only_k_best_equals_the_log_space_one(hops, ratio, monkeypatch):
    """N = 24 > 16 candidates a hop: the max-marginal pruning runs with an emission of 1 at every real fact."""
    from pyro_multihop.engine import paths as engine_paths

    monkeypatch.setattr(engine.routes, "SYMBOL_ROUTE_RATIO", ratio)
    found = []
    candidates = engine_paths._k_best_candidates

    def spy(*args):
        chosen, needed, fits = candidates(*args)
        found.append(fits)
        return chosen, needed, fits

    monkeypatch.setattr(engine_paths, "_k_best_candidates", spy)
    head = random_chained_head(hops, seed=7, scale=2.0)
    obs = random_obs(30, seed=8, masked=True, context=24)
    paths, log_probs = head.k_best_paths(obs, 3, given_target=False)
    chain, log_emission = chain_of(head, obs)
    expected_paths, expected = log_space.chain_k_best(chain, torch.zeros_like(log_emission), 3)
    assert torch.allclose(log_probs, expected, rtol=1e-10, atol=1e-12)
    rows = torch.arange(len(obs)).unsqueeze(-1)
    scores = chain.init[rows, paths[..., 0]]  # (n, k): each path's prior log-probability
    for hop in range(hops - 1):
        scores = scores + chain.trans[hop][rows, paths[..., hop], paths[..., hop + 1]]
    assert torch.allclose(scores, log_probs, rtol=1e-10, atol=1e-12)
    assert all(len(set(map(tuple, row))) == 3 for row in paths.tolist())
    assert torch.cat(found).any()  # some rows went through the pruned search
