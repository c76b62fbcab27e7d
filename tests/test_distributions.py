"""TableCategorical and GateCategorical against the plain Categorical they stand for; CollapsedHopChain's batch
shapes, expand, vectorised particles, support and sampling against brute force and the enumerated model; the
collapsed model's loss and gradient against the enumerated one's, in float64 and float32, and in fit_svi."""

import factories
import oracle
import pyro
import pyro.distributions as dist
import pytest
import torch
from factories import HEADS, HOPS, random_head, random_obs
from pyro import poutine
from pyro.infer import Trace_ELBO, TraceEnum_ELBO

from pyro_multihop import fit_svi, transitive_task
from pyro_multihop.distributions import CollapsedHopChain, GateCategorical, TableCategorical


def table_and_index():
    generator = torch.Generator().manual_seed(0)
    log_table = torch.randn(5, 4, generator=generator, dtype=torch.float64).log_softmax(-1)
    index = torch.randint(5, (3, 6), generator=generator)
    return log_table, index


def test_log_prob_equals_categorical_of_the_table_rows():
    log_table, index = table_and_index()
    table = TableCategorical(log_table, index)
    plain = dist.Categorical(logits=log_table[index])
    value = torch.randint(4, (6,), generator=torch.Generator().manual_seed(1))
    assert table.batch_shape == plain.batch_shape == (3, 6)
    assert torch.allclose(table.log_prob(value), plain.log_prob(value), atol=1e-15)
    support = table.enumerate_support(expand=False)
    assert support.shape == (4, 1, 1)
    assert torch.allclose(table.log_prob(support), plain.log_prob(plain.enumerate_support(expand=False)), atol=1e-15)
    assert table.enumerate_support().shape == (4, 3, 6)


def test_expand_and_sample():
    log_table, index = table_and_index()
    expanded = TableCategorical(log_table, index[:1]).expand((3, 6))
    assert expanded.batch_shape == (3, 6)
    torch.manual_seed(0)
    draws = TableCategorical(log_table, torch.zeros(20000, dtype=torch.long)).sample()
    frequencies = torch.bincount(draws, minlength=4).double() / 20000
    assert torch.allclose(frequencies, log_table[0].exp(), atol=0.015)


def test_support_validation_rejects_out_of_range_values():
    log_table, index = table_and_index()
    table = TableCategorical(log_table, index, validate_args=True)
    try:
        table.log_prob(torch.full((6,), 4))
    except ValueError as error:
        assert "support" in str(error) or "integer_interval" in str(error)
    else:
        raise AssertionError("a value outside the support was accepted")


# -- GateCategorical ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("length", [5, 20], ids=lambda n: f"N={n}")
def test_gate_categorical_equals_categorical_for_values_and_enumerated_support(length):
    generator = torch.Generator().manual_seed(length)
    logits = 3 * torch.randn(4, 6, length, generator=generator, dtype=torch.float64)
    gate, plain = GateCategorical(logits), dist.Categorical(logits=logits)
    assert gate.batch_shape == plain.batch_shape == (4, 6)
    assert torch.allclose(gate.logits, plain.logits, atol=1e-13)
    value = torch.randint(length, (4, 6), generator=generator)
    assert torch.allclose(gate.log_prob(value), plain.log_prob(value), atol=1e-13)
    # Pyro's fast path for an enumerated support (a transposed view) gives the same numbers.
    support = gate.enumerate_support(expand=False)
    assert torch.allclose(gate.log_prob(support), plain.log_prob(plain.enumerate_support(expand=False)), atol=1e-13)
    expanded = GateCategorical(logits[:1]).expand((4, 6))
    assert expanded.batch_shape == (4, 6) and isinstance(expanded, GateCategorical)
    assert torch.allclose(expanded.log_prob(value), dist.Categorical(logits=logits[:1]).expand((4, 6)).log_prob(value),
                          atol=1e-13)


# -- CollapsedHopChain as a Pyro distribution ---------------------------------------------------------------
S, T, CONTEXT = 6, 5, 4


def tied_head(seed=0):
    from pyro_multihop import TiedEmbeddingAttention

    generator = torch.Generator().manual_seed(seed)
    loc = torch.randn(S, 3, generator=generator, dtype=torch.float64)
    emission = torch.rand(S, T, generator=generator, dtype=torch.float64).softmax(-1)
    return TiedEmbeddingAttention(S, 3, T, n_hops=2, sigma2=0.6, loc=loc, emission=emission)


def replay_draw(head, obs, draw, kl_weight):
    """The guide, replayed at the embeddings ``draw`` ``(S, D)`` (one particle)."""
    trace = poutine.trace(head.guide).get_trace(obs, kl_weight=kl_weight).copy()
    trace.nodes["embeddings"] = dict(trace.nodes["embeddings"], value=draw)
    return poutine.replay(head.guide, trace=trace)


def test_vectorised_particles_loss_and_gradient_are_the_mean_over_single_particles():
    """K vectorised particles of the collapsed tied model against the K draws one at a time in the enumerated
    model (an independent route: Pyro sums the hop sites), on the same draws (recorded from the guide)."""
    head, obs = tied_head(), factories.random_observations(12, S, T, CONTEXT, seed=3, masked=True)
    particles, kl_weight = 3, 0.4
    draws = []

    def recording_guide(*args, **kwargs):
        draws.append(head.guide(*args, **kwargs))

    with pyro.get_param_store().scope():
        pyro.set_rng_seed(0)
        elbo = Trace_ELBO(num_particles=particles, vectorize_particles=True, max_plate_nesting=1)
        loss = elbo.differentiable_loss(head.collapsed_model, recording_guide, obs, kl_weight=kl_weight)
        (draw,) = draws
        assert draw.shape == (particles, 1, S, 3) and not torch.allclose(draw[0], draw[1])
        gradient = torch.autograd.grad(loss, [head.guide.loc, head.emission_logits], retain_graph=True)
        enumerated = TraceEnum_ELBO(max_plate_nesting=1)
        singles = [enumerated.differentiable_loss(head.model, replay_draw(head, obs, draw[k, 0], kl_weight), obs,
                                                  kl_weight=kl_weight) for k in range(particles)]
        mean = torch.stack(singles).mean()
        mean_gradient = torch.autograd.grad(mean, [head.guide.loc, head.emission_logits])
    assert torch.allclose(loss, mean, rtol=1e-12, atol=0)
    assert not torch.allclose(singles[0], singles[1])  # the particles differ, so the mean is a real check
    for got, want in zip(gradient, mean_gradient):
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-12)


def test_batched_gates_give_one_log_likelihood_per_gate():
    head, obs = tied_head(1), factories.random_observations(7, S, T, CONTEXT, seed=4)
    draws = head.sample_embeddings(3, seed=0)  # (3, S, D)
    batched = CollapsedHopChain(head.hop_factors(draws.unsqueeze(1)), obs)
    assert batched.batch_shape == (3, 7)
    got = batched.log_prob(obs.target)
    assert got.shape == (3, 7)
    for k in range(3):
        assert torch.allclose(got[k], CollapsedHopChain(head.hop_factors(draws[k]), obs).log_prob(obs.target),
                              rtol=1e-12, atol=0)
        assert torch.allclose(got[k], oracle_log_likelihood(draws[k], head, obs), rtol=1e-12, atol=0)
    assert batched.sample().shape == (3, 7) and batched.sample((2,)).shape == (2, 3, 7)


def oracle_log_likelihood(embeddings, head, obs):
    embeddings = embeddings.double()
    tables = oracle.enumerate_paths(*oracle.embedding_vectors(embeddings, obs, head.n_hops), head.sigma2,
                                    head.emission.detach().double(), obs.values, obs.target, obs.mask)
    return oracle.summarise(tables, obs.context_len)["log_likelihood"]


def test_expand_under_an_extra_plate_costs_one_pass_and_broadcasts():
    head = factories.random_chained_head(2, S, T, seed=5)
    obs = factories.random_observations(9, S, T, CONTEXT, seed=6, masked=True)
    single = CollapsedHopChain(head.hop_factors(), obs)
    expanded = single.expand((4, 9))
    assert expanded.batch_shape == (4, 9) and isinstance(expanded, CollapsedHopChain)
    want = single.log_prob(obs.target)
    assert torch.allclose(want, oracle.summarise(oracle.head_path_tables(head, obs), CONTEXT)["log_likelihood"],
                          rtol=1e-12, atol=0)
    assert torch.equal(expanded.log_prob(obs.target), want.expand(4, 9))
    other = torch.randint(T, (4, 9), generator=torch.Generator().manual_seed(7))  # a different row per plate entry
    got = expanded.log_prob(other)
    for k in range(4):
        assert torch.allclose(got[k], single.log_prob(other[k]), rtol=1e-12, atol=0)
    for bad in [(4, 8), (9, 4), ()]:
        with pytest.raises(ValueError, match="expand"):
            single.expand(bad)

    def model(data):
        with pyro.plate("repeats", 4, dim=-2), pyro.plate("observations", len(data), dim=-1):
            pyro.sample("target", CollapsedHopChain(head.hop_factors(), data), obs=data.target)

    loss = Trace_ELBO(max_plate_nesting=2).differentiable_loss(model, lambda data: None, obs)
    assert torch.allclose(loss, -4 * want.sum(), rtol=1e-12)


def test_vectorised_particles_without_global_latents_equal_one_particle():
    head = factories.random_chained_head(2, S, T, seed=8)
    obs = factories.random_observations(9, S, T, CONTEXT, seed=9)
    vectorised = Trace_ELBO(num_particles=5, vectorize_particles=True, max_plate_nesting=1)
    loss = vectorised.differentiable_loss(head.collapsed_model, head.guide, obs)
    assert torch.allclose(loss, Trace_ELBO().differentiable_loss(head.collapsed_model, head.guide, obs), rtol=1e-12)


def test_support_and_enumerated_support_cover_the_predictive():
    head = factories.random_chained_head(2, S, T, seed=10)
    obs = factories.random_observations(6, S, T, CONTEXT, seed=11)
    distribution = CollapsedHopChain(head.hop_factors(), obs, validate_args=True)
    assert distribution.has_enumerate_support and distribution.support.check(torch.tensor([0, T - 1])).all()
    support = distribution.enumerate_support(expand=False)
    assert support.shape == (T, 1) and distribution.enumerate_support().shape == (T, 6)
    log_probs = distribution.log_prob(support)  # (T, n): every target of every row
    assert log_probs.shape == (T, 6)
    assert torch.allclose(log_probs.exp().t(), head.predict_proba(obs).detach(), rtol=1e-10, atol=0)
    with pytest.raises(ValueError):
        distribution.log_prob(torch.full((6,), T))


def test_batched_gates_must_share_one_gate_across_rows():
    head, obs = tied_head(2), factories.random_observations(5, S, T, CONTEXT, seed=12)
    draws = head.sample_embeddings(5, seed=0)
    with pytest.raises(ValueError, match="end in 1"):
        CollapsedHopChain(head.hop_factors(draws), obs)  # (5, S, D): one gate per row, not per particle


# -- the collapsed model's loss, gradient and draws against the enumerated model's --------------------------
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
    head, obs = random_head(kind, hops, seed=60), random_obs(n=40, seed=61, masked=True, context=6)
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
    _, exact_grads = losses_and_grads(random_head(kind, hops, seed=60), obs, collapsed=False, **kwargs)
    head = random_head(kind, hops, seed=60).float()
    enumerated, enumerated_grads = losses_and_grads(head, obs, collapsed=False, **kwargs)
    collapsed, collapsed_grads = losses_and_grads(head, obs, collapsed=True, **kwargs)
    assert collapsed.dtype == torch.float32
    assert relative_error(collapsed.detach(), enumerated.detach()) <= 1e-6
    for got, want, exact in zip(collapsed_grads, enumerated_grads, exact_grads):
        assert relative_error(want, exact) <= 1e-5
        assert relative_error(got, exact) <= 1e-5
        assert relative_error(got, exact) <= 2 * relative_error(want, exact)


def test_collapsed_loss_is_the_exact_negative_log_likelihood():
    head, obs = random_head("chained", 2, seed=62), random_obs(n=9, seed=63, masked=True)
    loss, _ = losses_and_grads(head, obs, collapsed=True)
    assert torch.allclose(loss, -oracle.brute_force(head, obs)["log_likelihood"].sum(), rtol=1e-12)
    distribution = CollapsedHopChain(head.hop_factors(), obs)
    assert distribution.batch_shape == (len(obs),)
    other = torch.randint(factories.T, (len(obs),), generator=torch.Generator().manual_seed(0))
    relabelled = factories.random_observations(9, factories.S, factories.T, factories.N, 63, True)
    relabelled.target = other
    assert torch.allclose(distribution.log_prob(other), oracle.brute_force(head, relabelled)["log_likelihood"], rtol=1e-12)


def test_collapsed_sampling_follows_the_predictive():
    head = random_head("chained", 2, seed=64)
    obs = random_obs(n=1, seed=65)
    obs = obs[torch.zeros(20000, dtype=torch.long)]
    draws = CollapsedHopChain(head.hop_factors(), obs).sample()
    frequencies = torch.bincount(draws, minlength=factories.T).double() / len(obs)
    expected = oracle.brute_force(head, obs[:1])["predictive"][0]
    assert torch.allclose(frequencies, expected, atol=0.015)  # 4.5 standard errors at p = 0.5, n = 20000


@HEADS
def test_fit_svi_collapsed_follows_the_enumerated_trajectory(kind):
    train = transitive_task(60, num_symbols=factories.T, pairs=2, seed=0)
    heads = [random_head(kind, 2, seed=70) for _ in range(2)]
    metrics = [fit_svi(head, train, num_steps=20, progress=False, collapsed=collapsed, log_every=5)
               for head, collapsed in zip(heads, (False, True))]
    assert torch.allclose(torch.tensor(metrics[0]["loss"].values), torch.tensor(metrics[1]["loss"].values), rtol=1e-8)
    for a, b in zip(heads[0].parameters(), heads[1].parameters()):
        assert torch.allclose(a, b, rtol=1e-8, atol=1e-10)


def test_fit_svi_collapsed_needs_a_bool():
    head = random_head("chained", 2)
    with pytest.raises(TypeError, match="collapsed"):
        fit_svi(head, random_obs(n=7), num_steps=1, progress=False, collapsed="yes")
