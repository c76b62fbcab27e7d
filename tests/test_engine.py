"""The exact engine: both routes, the log-space recompute, chunking under a budget, and the collapsed loss,
each against brute-force enumeration of every hop path (float64) or against the enumerated Pyro model."""

import math

import oracle
import pyro
import pytest
import torch
from torch.overrides import TorchFunctionMode
from pyro.infer import Trace_ELBO, TraceEnum_ELBO

from pyro_multihop import ChainedAttention, TiedEmbeddingAttention, engine, fit_svi, transitive_task
from pyro_multihop.distributions import CollapsedHopChain

S, T, N = 5, 4, 4
HOPS = pytest.mark.parametrize("hops", [1, 2, 3], ids=lambda h: f"L={h}")
MASKED = pytest.mark.parametrize("masked", [False, True], ids=["full", "padded"])
HEADS = pytest.mark.parametrize("kind", ["chained", "tied"])
# math.inf forces the symbol route at every size, 0 the dense positions route.
ROUTES = pytest.mark.parametrize("ratio", [math.inf, 0.0], ids=["symbols", "positions"])


def make_head(kind, hops, seed=0, sigma2=0.6, scale=1.0, dtype=torch.float64, emission_gap=None):
    """A random head; with ``emission_gap``, an emission whose target log-probabilities are 0 or ``-emission_gap``
    (700: beyond float64's range of sums, so that a sharp last hop attending a value of the wrong kind leaves the
    likelihood below the underflow floor even on the dense factors)."""
    generator = torch.Generator().manual_seed(seed)
    emission = torch.rand(S, T, generator=generator, dtype=dtype).softmax(-1)
    if emission_gap is not None:
        matches = torch.arange(S).unsqueeze(-1) % T == torch.arange(T)
        emission = torch.where(matches, 0.0, -emission_gap).to(dtype).softmax(-1)
    if kind == "chained":
        tables = scale * torch.randn(hops, S, S, generator=generator, dtype=dtype)
        return ChainedAttention(hops, S, T, sigma2=sigma2, key_tables=tables, emission=emission)
    loc = scale * torch.randn(S, 3, generator=generator, dtype=dtype)
    # The engine's checks read the gate at the means (plug_in="mean"); tests/models/test_tied.py checks the
    # default expected-distance table against brute force.
    return TiedEmbeddingAttention(S, 3, T, n_hops=hops, sigma2=sigma2, loc=loc, emission=emission, plug_in="mean")


def vectors(head, obs):
    if isinstance(head, ChainedAttention):
        return oracle.onehot_vectors(head.key_tables, obs)
    embeddings = head.guide.loc.detach().double()
    return embeddings[obs.query], [embeddings[obs.keys]] * head.n_hops, embeddings[obs.values]


def brute_force(head, obs):
    emission = head.emission.detach().double()
    tables = oracle.enumerate_paths(*vectors(head, obs), head.sigma2, emission, obs.values, obs.target, obs.mask)
    return oracle.summarise(tables, obs.context_len, emission=emission, values=obs.values)


def random_obs(n=7, seed=1, masked=False, context=N):
    return oracle.random_observations(n, S, T, context, seed, masked)


@HEADS
@HOPS
@MASKED
@ROUTES
def test_every_query_matches_brute_force_on_both_routes(kind, hops, masked, ratio, monkeypatch):
    monkeypatch.setattr(engine.hop_gates, "SYMBOL_ROUTE_RATIO", ratio)
    head, obs = make_head(kind, hops, seed=hops), random_obs(seed=10 + hops, masked=masked)
    expected = brute_force(head, obs)
    assert torch.allclose(head.log_likelihood(obs), expected["log_likelihood"], rtol=1e-12, atol=0)
    assert torch.allclose(head.hop_marginals(obs), expected["hop_marginals"], atol=1e-13)
    assert torch.allclose(head.pairwise_marginals(obs), expected["pairwise_marginals"], atol=1e-13)
    assert torch.allclose(head.predict_proba(obs), expected["predictive"], atol=1e-13)
    onehot_values = torch.nn.functional.one_hot(obs.values, S).double()  # (n, N, S)
    by_value = torch.einsum("lni,nis->lns", expected["hop_marginals"], onehot_values)
    assert torch.allclose(head.value_marginals(obs), by_value, atol=1e-13)


# Emissions for the underflowing rows: random (they are retried on their dense factors), or with target
# probabilities e^700 apart (some underflow there too, and are recomputed in log space).
EMISSION_GAPS = pytest.mark.parametrize("emission_gap", [None, 700.0], ids=["random emission", "emission e^700 apart"])


def routes_taken(head, obs):
    return {piece.route for piece in engine.forward_backward_chunks(head.hop_gates(), obs)}


@HEADS
@HOPS
@ROUTES
@EMISSION_GAPS
def test_underflowing_rows_are_retried_on_dense_factors_then_in_log_space(kind, hops, ratio, emission_gap,
                                                                         monkeypatch):
    """sigma2 = 1e-3 with far-apart keys: gate weights exp(-10^4) underflow in probability space. The likelihood,
    the marginals and the predictive (which has no target to fail on, yet its messages underflow the same way)
    equal brute force."""
    monkeypatch.setattr(engine.hop_gates, "SYMBOL_ROUTE_RATIO", ratio)
    head = make_head(kind, hops, seed=20, sigma2=1e-3, scale=2.0, emission_gap=emission_gap)
    obs = random_obs(n=9, seed=21, masked=True)
    if hops > 1:
        assert "dense" in routes_taken(head, obs)
        assert ("log" in routes_taken(head, obs)) == (emission_gap is not None)
    expected = brute_force(head, obs)
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
    monkeypatch.setattr(engine.hop_gates, "SYMBOL_ROUTE_RATIO", ratio)
    head = make_head("chained", 2, seed=24, sigma2=1e-3, scale=2.0)
    obs = random_obs(n=5, seed=25, masked=True, context=20)
    assert "dense" in routes_taken(head, obs)
    expected = brute_force(head, obs)
    assert torch.allclose(head.log_likelihood(obs), expected["log_likelihood"], rtol=1e-10)
    assert torch.allclose(head.hop_marginals(obs), expected["hop_marginals"], atol=1e-10)
    assert torch.allclose(head.predict_proba(obs), expected["predictive"], atol=1e-10)
    assert_map_paths_are_most_probable(head.map_paths(obs), exact_path_posterior(head, obs), 1e-9)


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

    monkeypatch.setattr(engine.hop_gates, "SYMBOL_ROUTE_RATIO", ratio)
    for sigma2, scale, gap in ((0.6, 1.0, None), (1e-3, 2.0, None), (1e-3, 2.0, 700.0)):
        head = make_head(kind, hops, seed=30, sigma2=sigma2, scale=scale, emission_gap=gap)
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
@ROUTES
def test_chunking_does_not_change_the_answers(kind, ratio, monkeypatch):
    monkeypatch.setattr(engine.hop_gates, "SYMBOL_ROUTE_RATIO", ratio)
    head, obs = make_head(kind, 3, seed=40), random_obs(n=50, seed=41, masked=True)
    tiny = 1  # byte: one row per chunk
    assert torch.allclose(head.log_likelihood(obs, budget=tiny), head.log_likelihood(obs), rtol=1e-13)
    assert torch.allclose(head.hop_marginals(obs, budget=tiny), head.hop_marginals(obs), atol=1e-14)
    assert torch.allclose(head.predict_proba(obs, budget=tiny), head.predict_proba(obs), atol=1e-14)
    chunked, whole = head.map_paths(obs, budget=tiny), head.map_paths(obs)
    # Positions with the same (key, value) symbols make exactly tied paths, and a chunk of one row takes another
    # route than the whole batch (gathered logits against exponentiated tables), so a tie may break the other
    # way: every differing row must hold two paths of the same, largest, joint probability.
    differing = (chunked != whole).any(-1).nonzero().flatten().tolist()
    if differing:
        joints = brute_force(head, obs)["joints"]
        for row in differing:
            best = max(joints[row].values())
            for path in (chunked[row], whole[row]):
                assert joints[row][tuple(path.tolist())] == pytest.approx(best, rel=1e-12)
    with engine.memory_budget(tiny):
        assert torch.allclose(head.value_marginals(obs), head.value_marginals(obs, budget=2**30), atol=1e-14)


class _LargestTensor(TorchFunctionMode):
    """Records the sizes of the tensors torch functions return while active."""

    def __init__(self):
        super().__init__()
        self.sizes = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor):
                self.sizes.append(tensor.numel())
        return out


@pytest.mark.parametrize("query", ["log_likelihood", "hop_marginals", "predict_proba", "map_paths"])
@ROUTES
@pytest.mark.parametrize("sigma2, scale", [(0.6, 1.0), (1e-3, 2.0)], ids=["sigma2=0.6", "sigma2=1e-3"])
def test_no_intermediate_grows_with_n_beyond_the_budget(query, ratio, sigma2, scale, monkeypatch):
    """With a budget of 64 KiB, nothing but the query's output and tensors the size of one input field (the
    validation of the symbols) is larger than 64 KiB of float64 elements; with sigma2 = 1e-3 most rows are
    retried on their dense factors, in sub-chunks under the same budget."""
    monkeypatch.setattr(engine.hop_gates, "SYMBOL_ROUTE_RATIO", ratio)
    head = make_head("chained", 3, seed=50, sigma2=sigma2, scale=scale)
    obs = random_obs(n=3000, seed=51, context=12)
    if sigma2 < 0.1:
        assert "dense" in routes_taken(head, obs[:50])
    budget = 64 * 1024
    with torch.no_grad(), _LargestTensor() as spy:
        out = getattr(head, query)(obs, budget=budget)
    output_size = out.numel()
    others = [size for size in spy.sizes if size != output_size]
    assert max(others) <= max(budget // 8, obs.keys.numel()), max(others)
    assert len(obs) * 12 * 12 > budget // 8  # an (n, N, N) tensor would have broken the bound


@pytest.mark.parametrize("budget, error", [(0, ValueError), (-5, ValueError), (math.inf, ValueError),
                                           ("1GB", TypeError), (True, TypeError)])
def test_a_bad_budget_is_refused_by_name(budget, error):
    head, obs = make_head("chained", 2), random_obs()
    with pytest.raises(error, match="budget"):
        head.log_likelihood(obs, budget=budget)
    with pytest.raises(error, match="budget"):
        engine.set_memory_budget(budget)
    assert engine.get_memory_budget() == engine.DEFAULT_MEMORY_BUDGET


def test_the_symbol_route_needs_score_tables():
    head, obs = make_head("chained", 2), random_obs()
    gates = head.hop_gates().replace(scores=None)
    assert engine.choose_route(gates, N) == "positions"
    with pytest.raises(ValueError, match="symbols"):
        next(engine.forward_backward_chunks(gates, obs, route="symbols"))


# -- the collapsed distribution ----------------------------------------------------------------------------
def losses_and_grads(head, obs, collapsed, seed=0, **kwargs):
    with pyro.get_param_store().scope():
        pyro.set_rng_seed(seed)
        if collapsed:
            loss = Trace_ELBO().differentiable_loss(head.collapsed_model, head.guide, obs, **kwargs)
        else:
            loss = TraceEnum_ELBO(max_plate_nesting=1).differentiable_loss(head.model, head.guide, obs, **kwargs)
        return loss, torch.autograd.grad(loss, list(head.parameters()))


def relative_error(got, want):
    """Relative error in norm (gradient entries may cancel to about 0)."""
    return float(torch.linalg.vector_norm(got.double() - want.double()) / torch.linalg.vector_norm(want.double()))


@HEADS
@HOPS
def test_collapsed_loss_and_gradient_equal_the_enumerated_ones_in_float64(kind, hops):
    head, obs = make_head(kind, hops, seed=60), random_obs(n=40, seed=61, masked=True, context=6)
    kwargs = {"kl_weight": 0.3} if kind == "tied" else {}
    enumerated, enumerated_grads = losses_and_grads(head, obs, collapsed=False, **kwargs)
    collapsed, collapsed_grads = losses_and_grads(head, obs, collapsed=True, **kwargs)
    assert relative_error(collapsed.detach(), enumerated.detach()) <= 1e-12
    for got, want in zip(collapsed_grads, enumerated_grads):
        assert relative_error(got, want) <= 1e-12


@HEADS
@HOPS
def test_collapsed_loss_and_gradient_in_float32(kind, hops):
    """float32: the losses agree to 1e-6. Two float32 computations of one gradient cannot agree to 1e-6: the
    enumerated gradient itself is 1e-6 to 3e-6 (in norm) away from the float64 one here, so each is held to
    1e-5 of the float64 gradient, and the collapsed one may not be worse than twice the enumerated error."""
    obs = random_obs(n=40, seed=61, masked=True, context=6)
    kwargs = {"kl_weight": 0.3} if kind == "tied" else {}
    _, exact_grads = losses_and_grads(make_head(kind, hops, seed=60), obs, collapsed=False, **kwargs)
    head = make_head(kind, hops, seed=60).float()
    enumerated, enumerated_grads = losses_and_grads(head, obs, collapsed=False, **kwargs)
    collapsed, collapsed_grads = losses_and_grads(head, obs, collapsed=True, **kwargs)
    assert collapsed.dtype == torch.float32
    assert relative_error(collapsed.detach(), enumerated.detach()) <= 1e-6
    for got, want, exact in zip(collapsed_grads, enumerated_grads, exact_grads):
        assert relative_error(want, exact) <= 1e-5
        assert relative_error(got, exact) <= 1e-5
        assert relative_error(got, exact) <= 2 * relative_error(want, exact)


def test_collapsed_loss_is_the_exact_negative_log_likelihood():
    head, obs = make_head("chained", 2, seed=62), random_obs(n=9, seed=63, masked=True)
    loss, _ = losses_and_grads(head, obs, collapsed=True)
    assert torch.allclose(loss, -brute_force(head, obs)["log_likelihood"].sum(), rtol=1e-12)
    distribution = CollapsedHopChain(head.hop_gates(), obs)
    assert distribution.batch_shape == (len(obs),)
    other = torch.randint(T, (len(obs),), generator=torch.Generator().manual_seed(0))
    relabelled = oracle.random_observations(9, S, T, N, 63, True)
    relabelled.target = other
    assert torch.allclose(distribution.log_prob(other), brute_force(head, relabelled)["log_likelihood"], rtol=1e-12)


def test_collapsed_sampling_follows_the_predictive():
    head = make_head("chained", 2, seed=64)
    obs = random_obs(n=1, seed=65)
    obs = obs[torch.zeros(20000, dtype=torch.long)]
    draws = CollapsedHopChain(head.hop_gates(), obs).sample()
    frequencies = torch.bincount(draws, minlength=T).double() / len(obs)
    expected = brute_force(head, obs[:1])["predictive"][0]
    assert torch.allclose(frequencies, expected, atol=0.015)  # 4.5 standard errors at p = 0.5, n = 20000


@HEADS
def test_fit_svi_collapsed_follows_the_enumerated_trajectory(kind):
    train = transitive_task(60, num_symbols=T, pairs=2, seed=0)
    heads = [make_head(kind, 2, seed=70) for _ in range(2)]
    metrics = [fit_svi(head, train, num_steps=20, progress=False, collapsed=collapsed, log_every=5)
               for head, collapsed in zip(heads, (False, True))]
    assert torch.allclose(torch.tensor(metrics[0]["loss"].values), torch.tensor(metrics[1]["loss"].values), rtol=1e-8)
    for a, b in zip(heads[0].parameters(), heads[1].parameters()):
        assert torch.allclose(a, b, rtol=1e-8, atol=1e-10)


def test_fit_svi_collapsed_needs_a_bool():
    head = make_head("chained", 2)
    with pytest.raises(TypeError, match="collapsed"):
        fit_svi(head, random_obs(), num_steps=1, progress=False, collapsed="yes")


# -- the path queries of a head, chunked through the engine ------------------------------------------------------
def exact_path_posterior(head, obs):
    """Per row: ``path -> p(path | observation)`` by brute force, from the joints' logarithms (a joint whose
    product underflows float64 still has its posterior probability)."""
    emission = head.emission.detach().double()
    tables = oracle.enumerate_paths(*vectors(head, obs), head.sigma2, emission, obs.values, obs.target, obs.mask,
                                    log=True)
    posteriors = []
    for table in tables:
        log_joints = {path: log_joint for path, (_, log_joint) in table.items()}
        top = max(log_joints.values())
        total = top + math.log(sum(math.exp(value - top) for value in log_joints.values()))
        posteriors.append({path: math.exp(value - total) for path, value in log_joints.items()})
    return posteriors


@HEADS
@HOPS
def test_path_entropy_and_k_best_paths_match_brute_force(kind, hops):
    head, obs = make_head(kind, hops, seed=80), random_obs(n=6, seed=81, masked=True)
    posteriors = exact_path_posterior(head, obs)
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
    head, obs = make_head(kind, 2, seed=82), random_obs(n=3, seed=83, context=3)
    draws = head.sample_paths(obs, 20000, seed=0, budget=1)
    assert draws.shape == (20000, len(obs), 2)
    assert torch.equal(draws, head.sample_paths(obs, 20000, seed=0, budget=1))  # seeded: reproducible
    for row, post in enumerate(exact_path_posterior(head, obs)):
        for path, p in post.items():
            frequency = float((draws[:, row] == torch.tensor(path)).all(-1).double().mean())
            assert abs(frequency - p) <= 5 * math.sqrt(p * (1 - p) / 20000) + 1e-12, (row, path, frequency, p)


@pytest.mark.parametrize("query, args, name", [("k_best_paths", (0,), "k"), ("sample_paths", (0,), "num_samples"),
                                                ("k_best_paths", (1.5,), "k")])
def test_path_queries_refuse_bad_counts_by_name(query, args, name):
    head, obs = make_head("chained", 2), random_obs()
    with pytest.raises(ValueError, match=name):
        getattr(head, query)(obs, *args)


@HOPS
def test_a_gate_without_score_tables_runs_on_its_dense_factors(hops):
    """A head whose gate has position terms hands the engine only its dense log factors: same answers."""
    head, obs = make_head("chained", hops, seed=90), random_obs(n=12, seed=91, masked=True)
    with_tables = head.hop_gates()
    without = with_tables.replace(scores=None)
    assert torch.allclose(engine.log_likelihood(without, obs), engine.log_likelihood(with_tables, obs), rtol=1e-12)
    assert torch.allclose(engine.hop_marginals(without, obs), engine.hop_marginals(with_tables, obs), atol=1e-13)
    assert torch.allclose(engine.predict_proba(without, obs), engine.predict_proba(with_tables, obs), atol=1e-13)
    assert torch.allclose(engine.pairwise_marginals(without, obs), brute_force(head, obs)["pairwise_marginals"],
                          atol=1e-13)


def test_path_entropy_without_the_target_is_that_of_the_prior_chain():
    head, obs = make_head("chained", 2, seed=84), random_obs(n=5, seed=85, masked=True)
    emission = head.emission.detach().double()
    tables = oracle.enumerate_paths(*vectors(head, obs), head.sigma2, emission, obs.values, obs.target, obs.mask)
    prior_entropy = torch.tensor([-sum(p * math.log(p) for p, _ in table.values() if p > 0) for table in tables],
                                 dtype=torch.float64)
    assert torch.allclose(head.path_entropy(obs, given_target=False), prior_entropy, atol=1e-12)
    assert not torch.allclose(head.path_entropy(obs), prior_entropy, atol=1e-3)  # the target does inform the path


# -- the path queries on the probability-space routes, both forced ------------------------------------------------
def entropies(posteriors):
    return torch.tensor([-sum(p * math.log(p) for p in post.values() if p > 0) for post in posteriors],
                        dtype=torch.float64)


def assert_k_best_match(paths, log_probs, posteriors, k, rtol):
    """Against the brute-force probabilities; paths whose probability underflows float64 there (sigma2 = 1e-3)
    must have log-probabilities below its range (or -inf) here."""
    for row, post in enumerate(posteriors):
        best = sorted((p for p in post.values() if p > 0), reverse=True)[:k]
        got = log_probs[row, : len(best)]
        assert torch.allclose(got.exp(), torch.tensor(best, dtype=torch.float64), rtol=rtol)
        assert (log_probs[row, len(best):].exp() == 0).all()
        finite = log_probs[row][torch.isfinite(log_probs[row])]
        assert (finite.diff() <= 0).all()  # best first
        for path, log_prob in zip(paths[row, : len(best)].tolist(), got.tolist()):
            assert post[tuple(path)] == pytest.approx(math.exp(log_prob), rel=rtol)


def assert_map_paths_are_most_probable(paths, posteriors, rtol):
    for row, post in enumerate(posteriors):
        assert post[tuple(paths[row].tolist())] == pytest.approx(max(post.values()), rel=rtol)


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
    monkeypatch.setattr(engine.hop_gates, "SYMBOL_ROUTE_RATIO", ratio)
    monkeypatch.setattr(engine.transitions, "MAX_TIMES_LOOP_ELEMENTS", 0)
    head = make_head(kind, hops, seed=100 + hops, sigma2=sigma2, scale=scale, emission_gap=emission_gap)
    obs = random_obs(n=8, seed=101 + hops, masked=masked)
    posteriors = exact_path_posterior(head, obs)
    rtol = 1e-9
    assert_map_paths_are_most_probable(head.map_paths(obs), posteriors, rtol)
    assert_k_best_match(*head.k_best_paths(obs, 4), posteriors, 4, rtol)
    assert torch.allclose(head.path_entropy(obs), entropies(posteriors), atol=1e-10)
    emission = head.emission.detach().double()
    tables = oracle.enumerate_paths(*vectors(head, obs), head.sigma2, emission, obs.values, obs.target, obs.mask)
    prior = [{path: p for path, (p, _) in table.items()} for table in tables]
    assert torch.allclose(head.path_entropy(obs, given_target=False), entropies(prior), atol=1e-10)
    assert_map_paths_are_most_probable(head.map_paths(obs, given_target=False), prior, rtol)
    posterior = head.posterior(obs)
    assert_map_paths_are_most_probable(posterior.map_paths, posteriors, rtol)
    assert torch.equal(posterior.map_paths, head.map_paths(obs))
    assert posterior.map_paths is posterior.map_paths  # kept after the first read
    assert torch.allclose(posterior.path_entropy, entropies(posteriors), atol=1e-10)
    assert torch.allclose(posterior.hop_marginals, brute_force(head, obs)["hop_marginals"], atol=1e-10)


@ROUTES
@pytest.mark.parametrize("budget, prepares", [(None, 0), (2**12, "some"), (1, "all")],
                         ids=["all-kept", "first-kept", "none-kept"])
def test_the_lazy_posterior_reads_map_paths_from_its_own_chunks(budget, prepares, ratio, monkeypatch):
    """The posterior keeps its first chunks' prepared transitions within the budget and the MAP read reuses them
    (no second preparation of a chunk on its route), and recomputes the rest; every path is a most probable one,
    underflowing rows (sigma2 = 1e-3, retried on their dense factors) included."""
    from pyro_multihop.engine import paths as engine_paths

    monkeypatch.setattr(engine.hop_gates, "SYMBOL_ROUTE_RATIO", ratio)
    head = make_head("chained", 3, seed=120, sigma2=1e-3, scale=2.0)
    obs = random_obs(n=40, seed=121, masked=True)
    calls = []
    prepare = engine_paths.prepare
    monkeypatch.setattr(engine_paths, "prepare",
                        lambda *args: (args[2] != "dense" and calls.append(len(args[1]))) or prepare(*args))
    posterior = head.posterior(obs, budget=budget)
    paths = posterior.map_paths
    assert_map_paths_are_most_probable(paths, exact_path_posterior(head, obs), 1e-9)
    prepared_rows = sum(calls)
    if prepares == 0:
        assert prepared_rows == 0
    elif prepares == "all":
        assert prepared_rows == len(obs)
    else:
        assert 0 < prepared_rows < len(obs)


@HEADS
@ROUTES
def test_posterior_draws_follow_the_exact_path_posterior_on_both_routes(kind, ratio, monkeypatch):
    monkeypatch.setattr(engine.hop_gates, "SYMBOL_ROUTE_RATIO", ratio)
    head, obs = make_head(kind, 3, seed=110), random_obs(n=2, seed=111, context=3, masked=True)
    draws = head.sample_paths(obs, 20000, seed=1)
    for row, post in enumerate(exact_path_posterior(head, obs)):
        for path, p in post.items():
            frequency = float((draws[:, row] == torch.tensor(path)).all(-1).double().mean())
            assert abs(frequency - p) <= 5 * math.sqrt(p * (1 - p) / 20000) + 1e-12, (row, path, frequency, p)


@ROUTES
@EMISSION_GAPS
def test_underflowing_rows_draw_from_the_exact_path_posterior(ratio, emission_gap, monkeypatch):
    """sigma2 = 1e-3: rows retried on their dense factors or recomputed in log space still draw the paths of
    positive posterior probability."""
    monkeypatch.setattr(engine.hop_gates, "SYMBOL_ROUTE_RATIO", ratio)
    head = make_head("chained", 2, seed=112, sigma2=1e-3, scale=2.0, emission_gap=emission_gap)
    obs = random_obs(n=6, seed=113, masked=True)
    draws = head.sample_paths(obs, 200, seed=2)
    for row, post in enumerate(exact_path_posterior(head, obs)):
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
    log-space k best (itself checked against brute force in tests/test_path_queries.py); the candidates' paths
    are scored all at once or by the k-max product (``ENUMERATED_PATHS``)."""
    from pyro_multihop.engine import log_space, paths as engine_paths

    monkeypatch.setattr(engine.hop_gates, "SYMBOL_ROUTE_RATIO", ratio)
    monkeypatch.setattr(engine_paths, "ENUMERATED_PATHS", enumerated)
    monkeypatch.setattr(engine_paths, "FEW_CANDIDATES", 4)  # pruned rows in both groups
    found = []
    candidates = engine_paths._k_best_candidates

    def spy(*args):
        chosen, needed, fits = candidates(*args)
        found.append((needed, fits))
        return chosen, needed, fits

    monkeypatch.setattr(engine_paths, "_k_best_candidates", spy)
    head = make_head("chained", hops, seed=120, scale=scale)
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
