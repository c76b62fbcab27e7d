"""ChainedAttention(max_distance=D): the age and offset terms of the gate, against brute force (float64)."""

import oracle
import pyro
import pytest
import torch
from factories import (
    HOPS,
    MASKED,
    MAX_DISTANCE,
    POSITION_GATE_N,
    S,
    T,
    random_position_gate_head,
    random_position_gate_obs,
)
from pyro.infer import TraceEnum_ELBO, infer_discrete

from pyro_multihop import ChainedAttention, ChainedEM, Observations
from pyro_multihop.train import fit_svi

N, D = POSITION_GATE_N, MAX_DISTANCE  # N - 1 = 4 > D: ages and offsets are clipped in these tests


def test_default_head_has_no_position_terms_and_zero_terms_change_nothing():
    plain = ChainedAttention(2, S, T, seed=0, init="random")
    assert plain.max_distance is None and not hasattr(plain, "age_slopes")
    assert not hasattr(plain, "direction_logits")
    assert "max_distance" not in plain.config()
    positional = ChainedAttention(2, S, T, seed=0, init="random", max_distance=D)
    positional.load_state_dict(plain.state_dict(), strict=False)
    obs = random_position_gate_obs(n=8, seed=3, masked=True)
    # Zero age/offset logits add exact zeros: the same dense factors bit for bit. (The plain head's queries take
    # the engine's symbol route, the positional head's its dense factors: equal to rounding.)
    plain_chain, positional_chain = plain.hop_chain(obs), positional.hop_chain(obs)
    assert torch.equal(positional_chain.init, plain_chain.init) and torch.equal(positional_chain.trans, plain_chain.trans)
    assert torch.allclose(positional.log_likelihood(obs), plain.log_likelihood(obs), rtol=1e-6)
    assert positional.config()["max_distance"] == D


@HOPS
@MASKED
def test_log_likelihood_and_marginals_match_brute_force(hops, masked):
    head, obs = random_position_gate_head(hops, seed=hops), random_position_gate_obs(seed=10 + hops, masked=masked)
    expected = oracle.brute_force(head, obs)
    posterior = head.posterior(obs, pairwise=True)
    assert torch.allclose(head.log_likelihood(obs), expected["log_likelihood"], rtol=1e-9, atol=0)
    assert torch.allclose(posterior.hop_marginals, expected["hop_marginals"], atol=1e-12)
    assert torch.allclose(posterior.pairwise_marginals, expected["pairwise_marginals"], atol=1e-12)
    predictive = head.predict_proba(obs)
    assert torch.allclose(predictive, expected["predictive"], rtol=1e-9, atol=1e-12)


@HOPS
@MASKED
def test_map_paths_are_most_probable_paths(hops, masked):
    head, obs = random_position_gate_head(hops, seed=20 + hops, sigma2=0.3), random_position_gate_obs(seed=30 + hops, masked=masked)
    tables = oracle.head_path_tables(head, obs)
    paths = head.map_paths(obs)
    for row, table in enumerate(tables):
        best = max(joint for _, joint in table.values())
        assert table[tuple(paths[row].tolist())][1] == pytest.approx(best, rel=1e-12)


@HOPS
@MASKED
def test_enumerated_pyro_loss_is_brute_force_negative_log_likelihood(hops, masked):
    head, obs = random_position_gate_head(hops, seed=40 + hops), random_position_gate_obs(seed=50 + hops, masked=masked)
    expected = oracle.brute_force(head, obs)
    loss = oracle.enumerated_loss(head.model, head.guide, obs).detach()
    assert abs(float(loss) + float(expected["log_likelihood"].sum())) <= 1e-9 * abs(float(loss))


@HOPS
def test_gradients_match_brute_force_autograd(hops):
    head, obs = random_position_gate_head(hops, seed=60 + hops), random_position_gate_obs(n=3, seed=70 + hops)
    params = [head.key_tables, head.emission_logits, head.age_slopes, head.offset_slopes, head.direction_logits]
    # The library's fused loss and the enumerated Pyro loss, against autograd through explicit path sums.
    fused = torch.autograd.grad(-head.log_likelihood(obs).sum(), params, allow_unused=True)
    pyro_grads = torch.autograd.grad(oracle.enumerated_loss(head.model, head.guide, obs), params, allow_unused=True)

    key_tables = head.key_tables.detach().clone().requires_grad_()
    emission_logits = head.emission_logits.detach().clone().requires_grad_()
    age_slopes = head.age_slopes.detach().clone().requires_grad_()
    offset_slopes = head.offset_slopes.detach().clone().requires_grad_()
    direction_logits = head.direction_logits.detach().clone().requires_grad_()
    eye = torch.eye(S, dtype=torch.float64)
    loss = -oracle.log_likelihood_autograd(
        eye[obs.query], [table[obs.keys] for table in key_tables], eye[obs.values], head.sigma2,
        emission_logits.softmax(-1), obs.values, obs.target, position_logit=oracle.position_logit(age_slopes, offset_slopes, D, direction_logits, obs.values),
    ).sum()
    tables = [key_tables, emission_logits, age_slopes, offset_slopes, direction_logits]
    expected = torch.autograd.grad(loss, tables, allow_unused=True)
    names = ["key", "emission", "age", "offset", "direction"]
    for name, got_fused, got_pyro, want in zip(names, fused, pyro_grads, expected):
        if name in ("offset", "direction") and hops == 1:  # (0,) and (0, S): unused with one hop
            assert want is None and got_fused is None and got_pyro is None
            continue
        assert torch.allclose(got_fused, want, rtol=1e-9, atol=1e-12), name
        assert torch.allclose(got_pyro, want, rtol=1e-9, atol=1e-12), name


@pytest.mark.parametrize("hops", [2, 3], ids=lambda h: f"L={h}")
def test_pyro_marginals_and_infer_discrete_agree(hops):
    head, obs = random_position_gate_head(hops, seed=80 + hops, sigma2=0.3), random_position_gate_obs(seed=90 + hops, masked=True)
    with pyro.get_param_store().scope():
        marginals = TraceEnum_ELBO(max_plate_nesting=1).compute_marginals(head.model, head.guide, obs)
        decoded = infer_discrete(head.model, first_available_dim=-2, temperature=0)
        trace = pyro.poutine.trace(decoded).get_trace(obs)
    expected = head.hop_marginals(obs)
    for hop in range(hops):
        assert torch.allclose(marginals[f"z_{hop + 1}"].probs, expected[hop], atol=1e-12)
    paths = torch.stack([trace.nodes[f"z_{hop + 1}"]["value"] for hop in range(hops)], -1)
    assert torch.equal(paths, head.map_paths(obs))


def test_chained_em_refuses_position_terms():
    head = random_position_gate_head(2)
    em = ChainedEM(2, S, T, sigma2=head.sigma2)
    with pytest.raises(ValueError, match="max_distance"):
        em.e_step(head, random_position_gate_obs())
    with pytest.raises(ValueError, match="max_distance"):
        em.fit(random_position_gate_obs(), init=head, max_iters=2)


def test_bad_max_distance_is_rejected():
    for bad in (0, -1, 2.5, True):
        with pytest.raises((ValueError, TypeError), match="max_distance"):
            ChainedAttention(1, S, T, max_distance=bad)


def latest_match_task(n, seed):
    """The query's symbol appears as a key twice; the target is the value of its *later* occurrence."""
    generator = torch.Generator().manual_seed(seed)
    keys = torch.stack([torch.randperm(S, generator=generator)[:N] for _ in range(n)])
    values = torch.randint(S, (n, N), generator=generator)
    first = torch.randint(N - 1, (n,), generator=generator)
    second = first + 1 + (torch.rand(n, generator=generator) * (N - 1 - first)).long()
    rows = torch.arange(n)
    keys[rows, second] = keys[rows, first]
    return Observations(keys, values, keys[rows, first], values[rows, second])


def test_svi_learns_recency_that_the_plain_gate_cannot_see():
    train, test = latest_match_task(600, seed=0), latest_match_task(2000, seed=1)
    accuracy = {}
    for max_distance in (None, N):
        head = ChainedAttention(1, S, S, sigma2=0.1, seed=0, max_distance=max_distance, emission=torch.eye(S))
        fit_svi(head, train, num_steps=300, progress=False)
        accuracy[max_distance] = head.evaluate(test)["accuracy"]
    # The two matches are indistinguishable by content: the plain gate splits between them (about 0.6 with
    # value collisions); the age term learns "the later one" (ages differ by at least one position).
    assert accuracy[None] < 0.75
    assert accuracy[N] > 0.95
