"""The exact chained head against brute-force enumeration over all hop paths (float64)."""

import math

import oracle
import pyro
import pytest
import torch
from factories import HOPS, MASKED, N, S, T, random_chained_head, random_obs
from pyro import poutine
from pyro.infer import TraceEnum_ELBO, infer_discrete

from pyro_multihop import ChainedAttention, Observations, chain_task
from pyro_multihop.engine.log_space import chain_log_likelihood
from pyro_multihop.models.base import attended_values

@HOPS
@MASKED
def test_log_likelihood_matches_brute_force(hops, masked):
    head, obs = random_chained_head(hops), random_obs(masked=masked)
    expected = oracle.brute_force(head, obs)["log_likelihood"]
    actual = head.log_likelihood(obs)
    assert actual.dtype == torch.float64
    assert torch.allclose(actual, expected, rtol=1e-9, atol=0)


@HOPS
@MASKED
def test_enumerated_pyro_loss_is_exact_negative_log_likelihood(hops, masked):
    head, obs = random_chained_head(hops, seed=3), random_obs(seed=4, masked=masked)
    expected = -oracle.brute_force(head, obs)["log_likelihood"].sum()
    loss = oracle.enumerated_loss(head.model, head.guide, obs).detach()
    assert abs(float(loss) - float(expected)) <= 1e-9 * abs(float(expected))


def test_subsampled_loss_is_scaled_to_full_data():
    head, obs = random_chained_head(2), random_obs(n=10)
    pyro.set_rng_seed(0)
    index = poutine.trace(head.model).get_trace(obs, subsample_size=4).nodes["observations"]["value"]
    pyro.set_rng_seed(0)
    loss = oracle.enumerated_loss(head.model, head.guide, obs, subsample_size=4).detach()
    expected = -(10 / 4) * oracle.brute_force(head, obs[index])["log_likelihood"].sum()
    assert len(set(index.tolist())) == 4
    assert float(loss) == pytest.approx(float(expected), rel=1e-9)


@HOPS
@MASKED
def test_predictive_matches_brute_force(hops, masked):
    head, obs = random_chained_head(hops, seed=5), random_obs(seed=6, masked=masked)
    expected = oracle.brute_force(head, obs)["predictive"]
    actual = head.predict_proba(obs.keys, obs.values, obs.query, obs.mask)
    assert torch.allclose(actual, expected, rtol=1e-9, atol=1e-12)
    assert torch.allclose(actual.sum(-1), torch.ones(len(obs), dtype=torch.float64))


@HOPS
@MASKED
def test_hop_and_pairwise_marginals_match_brute_force(hops, masked):
    head, obs = random_chained_head(hops, seed=7), random_obs(seed=8, masked=masked)
    expected = oracle.brute_force(head, obs)
    posterior = head.posterior(obs, pairwise=True)
    assert posterior.hop_marginals.shape == (hops, len(obs), N)
    assert torch.allclose(posterior.hop_marginals, expected["hop_marginals"], atol=1e-12)
    assert torch.allclose(posterior.pairwise_marginals, expected["pairwise_marginals"], atol=1e-12)
    assert torch.allclose(head.pairwise_marginals(obs), expected["pairwise_marginals"], atol=1e-12)
    assert head.posterior(obs).pairwise_marginals is None  # built only when asked for
    assert torch.allclose(head.hop_marginals(obs), expected["hop_marginals"], atol=1e-12)
    if masked:
        assert (posterior.hop_marginals.masked_select(~obs.mask.expand(hops, -1, -1)) == 0).all()


@HOPS
def test_pyro_compute_marginals_agree_with_forward_backward(hops):
    head, obs = random_chained_head(hops, seed=9), random_obs(seed=10)
    with pyro.get_param_store().scope():
        marginals = TraceEnum_ELBO(max_plate_nesting=1).compute_marginals(head.model, head.guide, obs)
    expected = head.hop_marginals(obs)
    for hop in range(hops):
        assert torch.allclose(marginals[f"z_{hop + 1}"].probs, expected[hop], atol=1e-12)


@HOPS
@MASKED
def test_map_paths_are_most_probable_paths(hops, masked):
    head, obs = random_chained_head(hops, seed=11, sigma2=0.3), random_obs(seed=12, masked=masked)
    tables = oracle.enumerate_paths(
        *oracle.onehot_vectors(head.key_tables, obs), head.sigma2, head.emission.detach().double(),
        obs.values, obs.target, obs.mask,
    )
    paths = head.map_paths(obs)
    assert paths.shape == (len(obs), hops) and paths.dtype == torch.long
    for row, table in enumerate(tables):
        best = max(joint for _, joint in table.values())
        assert table[tuple(paths[row].tolist())][1] == pytest.approx(best, rel=1e-12)
    assert torch.equal(head.posterior(obs).map_paths, paths)


@HOPS
def test_map_paths_agree_with_pyro_infer_discrete(hops):
    head, obs = random_chained_head(hops, seed=13, sigma2=0.3), random_obs(seed=14)
    with pyro.get_param_store().scope():
        decoded = infer_discrete(head.model, first_available_dim=-2, temperature=0)
        trace = poutine.trace(decoded).get_trace(obs)
    pyro_paths = torch.stack([trace.nodes[f"z_{hop + 1}"]["value"] for hop in range(hops)], -1)
    assert torch.equal(pyro_paths, head.map_paths(obs))


@HOPS
def test_gradients_match_brute_force(hops):
    head, obs = random_chained_head(hops, seed=15), random_obs(n=3, seed=16)
    eye = torch.eye(S, dtype=torch.float64)

    def brute(key_tables, emission):
        return oracle.log_likelihood_autograd(
            eye[obs.query], [table[obs.keys] for table in key_tables], eye[obs.values],
            head.sigma2, emission, obs.values, obs.target,
        ).sum()

    key_tables = head.key_tables.detach().clone().requires_grad_()
    emission_logits = head.emission_logits.detach().clone().requires_grad_()
    expected = torch.autograd.grad(brute(key_tables, emission_logits.softmax(-1)), [key_tables, emission_logits])

    fused = torch.autograd.grad(head.log_likelihood(obs).sum(), [head.key_tables, head.emission_logits])
    enumerated = torch.autograd.grad(-oracle.enumerated_loss(head.model, head.guide, obs), [head.key_tables, head.emission_logits])
    for got in (fused, enumerated):
        for actual, wanted in zip(got, expected):
            assert torch.allclose(actual, wanted, rtol=1e-9, atol=1e-12)


def test_one_hop_is_a_single_softmax_head_in_closed_form():
    head, obs = random_chained_head(1, seed=17), random_obs(seed=18)
    eye = torch.eye(S, dtype=torch.float64)
    distances = ((eye[obs.query][:, None, :] - head.key_tables.detach()[0][obs.keys]) ** 2).sum(-1)
    attention = torch.softmax(-distances / (2 * head.sigma2), dim=-1)
    predictive = (attention[..., None] * head.emission.detach()[obs.values]).sum(1)
    assert torch.allclose(head.predict_proba(obs), predictive, atol=1e-14)
    assert torch.allclose(head.log_likelihood(obs), predictive[torch.arange(len(obs)), obs.target].log(), atol=1e-14)


def test_identity_structure_solves_the_transitive_chain():
    obs = chain_task(400, n_hops=3, num_symbols=30, pairs=4, seed=3)
    identity = ChainedAttention(3, 30, 30, sigma2=0.1, key_tables=torch.eye(30).expand(3, 30, 30), emission=torch.eye(30))
    two_hop = ChainedAttention(2, 30, 30, sigma2=0.1, key_tables=torch.eye(30).expand(2, 30, 30), emission=torch.eye(30))
    assert identity.evaluate(obs)["accuracy"] > 0.75
    assert two_hop.evaluate(obs)["accuracy"] < 0.2


def test_sampler_frequencies_agree_with_model_probabilities():
    head = random_chained_head(2, seed=19, sigma2=0.4, dtype=torch.float64)
    obs = head.sample(20000, context_len=3, seed=20)
    with torch.no_grad():
        predictive = head.predict_proba(obs)  # (n, T): p(target | this context)
    observed = torch.nn.functional.one_hot(obs.target, T).double()
    # Per target class: sum of indicators vs sum of probabilities, a z-score under the model.
    z = (observed - predictive).sum(0) / (predictive * (1 - predictive)).sum(0).sqrt()
    assert z.abs().max() < 4.0, z
    # Sharper: the probability the model gives to the sampled target, E[p(t_obs)] = E[sum_t p_t^2].
    hit = predictive[torch.arange(len(obs)), obs.target]
    expected_hit = (predictive**2).sum(-1)
    standard_error = (hit - expected_hit).std() / math.sqrt(len(obs))
    assert abs(float((hit - expected_hit).mean())) < 4 * float(standard_error)
    # The sampled hop path follows the gate: its first hop lands where hop 1 attends.
    again = head.sample(20000, context_len=3, seed=20)
    assert again == obs


def test_sampler_is_wrong_if_emission_is_ignored():
    """Control for the statistical test: targets drawn from another model are detected."""
    head, other = random_chained_head(2, seed=21, sigma2=0.4), random_chained_head(2, seed=22, sigma2=0.4)
    obs = other.sample(20000, context_len=3, seed=23)
    with torch.no_grad():
        predictive = head.predict_proba(obs)
    hit = predictive[torch.arange(len(obs)), obs.target]
    expected_hit = (predictive**2).sum(-1)
    standard_error = (hit - expected_hit).std() / math.sqrt(len(obs))
    assert abs(float((hit - expected_hit).mean())) > 4 * float(standard_error)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
def test_no_nan_for_small_sigma2_and_long_contexts(dtype):
    generator = torch.Generator().manual_seed(24)
    n, context, symbols = 8, 512, 40
    mask = torch.rand(n, context, generator=generator) > 0.2
    mask[:, 0] = True
    obs = Observations(
        torch.randint(symbols, (n, context), generator=generator),
        torch.randint(symbols, (n, context), generator=generator),
        torch.randint(symbols, (n,), generator=generator),
        torch.randint(symbols, (n,), generator=generator),
        mask,
    )
    head = ChainedAttention(3, symbols, symbols, sigma2=1e-3, init="random", seed=0).to(dtype)
    log_likelihood = head.log_likelihood(obs)
    assert log_likelihood.dtype == dtype and torch.isfinite(log_likelihood).all()
    (gradient,) = torch.autograd.grad(log_likelihood.sum(), [head.key_tables])
    assert torch.isfinite(gradient).all()
    posterior = head.posterior(obs)
    assert torch.isfinite(posterior.hop_marginals).all()
    assert torch.allclose(posterior.hop_marginals.sum(-1), torch.ones(3, n, dtype=dtype), atol=1e-4)
    assert torch.isfinite(head.predict_proba(obs)).all()
    assert torch.isfinite(oracle.enumerated_loss(head.model, head.guide, obs[:2]))


def test_float32_agrees_with_float64():
    head, obs = random_chained_head(2, seed=25), random_obs(seed=26)
    single = ChainedAttention(2, S, T, head.sigma2, key_tables=head.key_tables.detach().float(), emission=head.emission.detach().float())
    assert single.log_likelihood(obs).dtype == torch.float32
    assert torch.allclose(single.log_likelihood(obs).double(), head.log_likelihood(obs), atol=1e-5)


def test_fused_log_likelihood_uses_the_models_hop_chain():
    head, obs = random_chained_head(2, seed=27), random_obs(seed=28)
    chain = head.hop_chain(obs)
    assert chain.init.shape == (len(obs), N) and chain.trans.shape == (1, len(obs), N, N)
    log_emission = head.emission.log()[obs.values, obs.target[:, None]]
    assert torch.allclose(chain_log_likelihood(chain, log_emission), head.log_likelihood(obs))


# -- bad input --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "field, value",
    [("keys", S), ("values", S + 2), ("query", S)],
)
def test_out_of_range_symbols_are_rejected_by_every_method(field, value):
    head, obs = random_chained_head(2), random_obs()
    tensors = {name: getattr(obs, name).clone() for name in ("keys", "values", "query", "target")}
    tensors[field].view(-1)[0] = value
    bad = Observations(**tensors)
    for method in (head.log_likelihood, head.posterior, head.hop_marginals, head.map_paths, head.evaluate, head.predict_proba):
        with pytest.raises(ValueError, match=rf"{field} must be < num_symbols = {S}, got {value}"):
            method(bad)
    with pytest.raises(ValueError, match=field):
        head.predict_proba(bad.keys, bad.values, bad.query)
    with pytest.raises(ValueError, match=field):
        oracle.enumerated_loss(head.model, head.guide, bad)


def test_out_of_range_target_is_rejected():
    head, obs = random_chained_head(2), random_obs()
    bad = Observations(obs.keys, obs.values, obs.query, torch.full_like(obs.target, T))
    for method in (head.log_likelihood, head.posterior, head.map_paths):
        with pytest.raises(ValueError, match=rf"target must be < num_targets = {T}, got {T}"):
            method(bad)


def test_padding_symbols_are_ignored():
    head, obs = random_chained_head(2), random_obs(masked=True)
    keys = obs.keys.clone()
    keys[~obs.mask] = -1
    assert torch.allclose(head.log_likelihood(Observations(keys, obs.values, obs.query, obs.target, obs.mask)), head.log_likelihood(obs))


@pytest.mark.parametrize("sigma2", [0.0, -1.0, float("nan"), float("inf")])
def test_sigma2_must_be_positive_and_finite(sigma2):
    with pytest.raises(ValueError, match="sigma2 must be a positive finite number"):
        ChainedAttention(2, S, T, sigma2=sigma2)


def test_sigma2_must_be_a_number():
    with pytest.raises(TypeError, match="sigma2"):
        ChainedAttention(2, S, T, sigma2="small")


def test_key_tables_shape_dtype_and_values_are_checked():
    with pytest.raises(ValueError, match=r"key_tables must have shape .* = \(2, 5, 5\), got \(2, 5, 4\)"):
        ChainedAttention(2, S, T, key_tables=torch.zeros(2, S, 4))
    with pytest.raises(TypeError, match="key_tables must be a floating-point tensor"):
        ChainedAttention(2, S, T, key_tables=torch.zeros(2, S, S, dtype=torch.long))
    with pytest.raises(ValueError, match="key_tables must be finite"):
        ChainedAttention(2, S, T, key_tables=torch.full((2, S, S), float("nan")))


def test_emission_must_be_row_stochastic():
    with pytest.raises(ValueError, match="emission rows must sum to 1.*row 0 sums to 2"):
        ChainedAttention(2, S, T, emission=torch.full((S, T), 0.5))
    with pytest.raises(ValueError, match="emission must be non-negative"):
        ChainedAttention(2, S, T, emission=torch.tensor([[1.5, -0.5, 0, 0]] * S))
    with pytest.raises(ValueError, match=r"emission must have shape .* = \(5, 4\), got \(4, 5\)"):
        ChainedAttention(2, S, T, emission=torch.full((T, S), 0.2))


@pytest.mark.parametrize("name, value", [("n_hops", 0), ("num_symbols", -3), ("num_targets", 2.5)])
def test_sizes_must_be_positive_integers(name, value):
    sizes = {"n_hops": 2, "num_symbols": S, "num_targets": T, name: value}
    with pytest.raises(ValueError, match=f"{name} must be a positive integer, got {value}"):
        ChainedAttention(**sizes)


def test_unknown_init_is_rejected():
    with pytest.raises(ValueError, match="init must be"):
        ChainedAttention(2, S, T, init="ones")


def test_methods_reject_non_observations():
    head = random_chained_head(2)
    with pytest.raises(TypeError, match="obs must be pyro_multihop.Observations, got tuple"):
        head.log_likelihood((1, 2, 3, 4))


def test_attended_values_of_an_enumerated_support_and_of_drawn_positions():
    """The enumerated support (a view of values.T) and drawn positions (a gather) give values[..., position]."""
    values = torch.randint(9, (5, 4), generator=torch.Generator().manual_seed(0))
    categorical = pyro.distributions.Categorical(logits=torch.zeros(5, 4))
    support = categorical.enumerate_support(expand=False).reshape(4, 1, 1)
    support._pyro_categorical_support = id(categorical)  # as Pyro's enumeration marks it
    expected = torch.stack([values[:, i] for i in range(4)]).reshape(4, 1, 5)
    assert torch.equal(attended_values(values, support), expected)
    assert torch.equal(attended_values(values, support.clone()), expected)  # unmarked: the gather path
    drawn = torch.tensor([3, 0, 2, 2, 1])
    assert torch.equal(attended_values(values, drawn), values[torch.arange(5), drawn])
