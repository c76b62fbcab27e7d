"""KL-annealing schedules, the scale_kl handler and the mean-field normal guide."""

import json

import pyro
import pyro.distributions as dist
import pytest
import torch
from pyro import poutine

from pyro_multihop.guides import (
    DEFAULT_PRIOR_STRENGTH,
    AnnealingSchedule,
    Constant,
    LinearAnnealing,
    MeanFieldNormalGuide,
    check_kl_weight,
    make_schedule,
    scale_kl,
)


# -- schedules -------------------------------------------------------------------------------------------
def test_default_ramp_goes_from_about_zero_to_the_default_prior_strength():
    """The default final weight is 0.01 (changed on purpose from the reference's 0.1: docs/tied.md)."""
    schedule = LinearAnnealing()
    assert (schedule.prior_strength, schedule.anneal_steps) == (DEFAULT_PRIOR_STRENGTH, 100) == (0.01, 100)
    for step in range(250):
        assert schedule(step) == pytest.approx(0.01 * min(1.0, (step + 1) / 100), rel=1e-12)
    assert schedule(0) == pytest.approx(0.0001)
    reference = LinearAnnealing(0.1, 100)
    for step in range(250):
        assert reference(step) == pytest.approx(0.1 * min(1.0, (step + 1) / 100), rel=1e-12)


@pytest.mark.parametrize("start", [0.0, 0.02], ids=["start=0", "start=0.02"])
def test_ramp_is_linear_from_start_and_constant_after(start):
    schedule = LinearAnnealing(prior_strength=0.5, anneal_steps=11, start=start)
    weights = [schedule(step) for step in range(30)]
    assert weights[0] == start and weights[10] == 0.5 and set(weights[10:]) == {0.5}
    increments = [b - a for a, b in zip(weights[:10], weights[1:11])]
    assert all(inc == pytest.approx((0.5 - start) / 10, rel=1e-9) for inc in increments)


@pytest.mark.parametrize("anneal_steps", [0, 1], ids=["A=0", "A=1"])
def test_no_ramp_is_prior_strength_from_step_zero(anneal_steps):
    schedule = LinearAnnealing(0.3, anneal_steps)
    assert [schedule(step) for step in range(3)] == [0.3, 0.3, 0.3]
    assert Constant(0.3)(0) == Constant(0.3)(10**6) == 0.3


@pytest.mark.parametrize("schedule", [LinearAnnealing(0.2, 50, start=0.0), Constant(0.7)], ids=["linear", "constant"])
def test_schedule_config_round_trips_through_json(schedule):
    config = json.loads(json.dumps(schedule.config()))
    rebuilt = make_schedule(config)
    assert type(rebuilt) is type(schedule) and rebuilt == schedule
    assert [rebuilt(step) for step in (0, 7, 60)] == [schedule(step) for step in (0, 7, 60)]
    assert make_schedule(schedule) is schedule
    assert make_schedule(None) == LinearAnnealing()
    assert isinstance(schedule, AnnealingSchedule) and "(" in repr(schedule)


@pytest.mark.parametrize(
    "build, field",
    [
        (lambda: LinearAnnealing(prior_strength=-0.1), "prior_strength"),
        (lambda: LinearAnnealing(prior_strength=float("inf")), "prior_strength"),
        (lambda: LinearAnnealing(anneal_steps=-1), "anneal_steps"),
        (lambda: LinearAnnealing(anneal_steps=2.5), "anneal_steps"),
        (lambda: LinearAnnealing(0.1, 10, start=0.2), "start"),
        (lambda: Constant(-1.0), "weight"),
        (lambda: LinearAnnealing()(-1), "step"),
        (lambda: Constant()(1.5), "step"),
        (lambda: make_schedule({"name": "cosine"}), "annealing name"),
        (lambda: check_kl_weight(float("nan")), "kl_weight"),
        (lambda: check_kl_weight(torch.ones(2)), "kl_weight"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_bad_settings_raise_naming_the_field(build, field):
    with pytest.raises(ValueError, match=field):
        build()


def test_make_schedule_rejects_other_types():
    with pytest.raises(TypeError, match="annealing"):
        make_schedule(0.1)


# -- scale_kl --------------------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "value", [0.0, 0.3, 1.0, torch.tensor(0.3), torch.tensor(0.0)], ids=["0", "0.3", "1", "tensor", "tensor-0"]
)
def test_scale_kl_multiplies_only_the_sites_inside(value):
    def model():
        with scale_kl(value):
            pyro.sample("x", dist.Normal(0.0, 1.0), obs=torch.tensor(0.5))
        pyro.sample("y", dist.Normal(0.0, 1.0), obs=torch.tensor(0.5))

    trace = poutine.trace(model).get_trace()
    trace.compute_log_prob()
    unit = float(dist.Normal(0.0, 1.0).log_prob(torch.tensor(0.5)))
    assert float(trace.nodes["x"]["log_prob_sum"]) == pytest.approx(float(value) * unit, rel=1e-7)
    assert float(trace.nodes["y"]["log_prob_sum"]) == pytest.approx(unit, rel=1e-7)


def test_check_kl_weight_accepts_numbers_and_scalar_tensors():
    assert check_kl_weight(0) == 0.0 and check_kl_weight(torch.tensor([0.25])) == 0.25
    with pytest.raises(TypeError, match="kl_weight"):
        check_kl_weight("heavy")


# -- the mean-field guide --------------------------------------------------------------------------------
def test_guide_draws_one_reparameterised_site_with_its_parameters():
    loc, scale = torch.randn(4, 3), torch.rand(4, 3) + 0.1
    guide = MeanFieldNormalGuide("embeddings", loc, scale)
    assert torch.allclose(guide.loc, loc) and torch.allclose(guide.scale, scale, rtol=1e-5)
    assert {name for name, _ in guide.named_parameters()} == {"loc", "scale_unconstrained"}
    trace = poutine.trace(guide).get_trace("ignored", subsample_size=None, kl_weight=0.25)
    site = trace.nodes["embeddings"]
    assert site["scale"] == 0.25 and site["fn"].event_shape == (4, 3) and site["fn"].has_rsample
    site["value"].sum().backward()
    assert torch.allclose(guide.loc.grad, torch.ones(4, 3))


def test_guide_kl_matches_torch_and_draws_match_their_definition():
    loc, scale = torch.randn(5, 2, dtype=torch.float64), torch.rand(5, 2, dtype=torch.float64) + 0.1
    guide = MeanFieldNormalGuide("e", loc, scale)
    expected = torch.distributions.kl_divergence(torch.distributions.Normal(loc, scale),
                                                 torch.distributions.Normal(0.0, 1.0)).sum()
    assert torch.allclose(guide.kl_to_standard_normal(), expected, rtol=1e-12)
    draws = guide.draw(3, seed=4)
    noise = torch.randn((3, 5, 2), generator=torch.Generator().manual_seed(4), dtype=torch.float64)
    assert torch.allclose(draws, loc + scale * noise, rtol=1e-12)


@pytest.mark.parametrize(
    "arguments, field",
    [
        (("", torch.zeros(2), torch.ones(2)), "site"),
        (("e", torch.zeros(2), torch.ones(3)), "scale"),
        (("e", torch.zeros(2), torch.zeros(2)), "scale"),
        (("e", torch.tensor([0.0, float("nan")]), torch.ones(2)), "loc"),
    ],
    ids=["site", "shape", "positive", "finite"],
)
def test_guide_rejects_bad_arguments(arguments, field):
    with pytest.raises(ValueError, match=field):
        MeanFieldNormalGuide(*arguments)
