"""Diagnostics after a fit: each raised on a constructed failure, silent on a good fit, and from variational EM
(its silence on a good fit is checked in tests/em/test_variational_em.py)."""

import math
import warnings

import pandas as pd
import pytest
import torch

from pyro_multihop import TiedEmbeddingAttention, transitive_task
from pyro_multihop.diagnostics import (
    DiagnosticWarning,
    HeldOutDeclineWarning,
    ObjectiveMismatchWarning,
    PosteriorCollapseWarning,
    diagnose_fit,
    posterior_spread,
)
from pyro_multihop.em import ConvergenceWarning
from pyro_multihop.em.variational import TiedEmbeddingVEM

S, D = 20, 8


def head_with(loc, scale) -> TiedEmbeddingAttention:
    return TiedEmbeddingAttention(S, D, S, loc=loc, scale=scale)


def collapsed_head(seed=0) -> TiedEmbeddingAttention:
    """Means at the prior's centre, scales at the prior's: what the reference's KL weight gave on the user's data."""
    generator = torch.Generator().manual_seed(seed)
    return head_with(0.1 * torch.randn(S, D, generator=generator), torch.full((S, D), 1.05))


def spread_head(seed=0) -> TiedEmbeddingAttention:
    generator = torch.Generator().manual_seed(seed)
    return head_with(torch.randn(S, D, generator=generator), torch.full((S, D), 0.3))


def silent(**kwargs) -> list:
    """diagnose_fit with every DiagnosticWarning an error: the fit must raise none."""
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiagnosticWarning)
        return diagnose_fit(**kwargs)


def held_out_frame(values) -> pd.DataFrame:
    return pd.DataFrame({"step": [10 * i for i in range(len(values))], "loss": 1.0, "val_log_likelihood": values})


# -- posterior collapse -----------------------------------------------------------------------------------
def test_posterior_spread_is_mean_sd_and_mean_pairwise_distance():
    mean = torch.tensor([[0.0, 0.0], [3.0, 4.0], [0.0, 4.0]])
    sd, distance = posterior_spread(mean, torch.full((3, 2), 0.5))
    assert sd == pytest.approx(0.5) and distance == pytest.approx((5.0 + 4.0 + 3.0) / 3)


def test_collapse_is_raised_on_a_collapsed_posterior_with_cause_and_option():
    with pytest.warns(PosteriorCollapseWarning, match=r"sd 1\.05.*KL weight") as record:
        found = diagnose_fit(collapsed_head())
    assert len(record) == 1 and [type(d) for d in found] == [PosteriorCollapseWarning]
    assert "\n" not in str(found[0])
    # The same from the posterior itself, without a head.
    mean, scale = collapsed_head().embeddings()
    assert [type(d) for d in diagnose_fit(posterior=(mean, scale), warn=False)] == [PosteriorCollapseWarning]


def test_collapse_is_silent_on_a_spread_posterior_and_needs_both_measures():
    assert silent(model=spread_head()) == []
    wide_but_spread = head_with(spread_head().embeddings()[0], torch.full((S, D), 1.05))
    narrow_but_close = head_with(collapsed_head().embeddings()[0], torch.full((S, D), 0.1))
    assert silent(model=wide_but_spread) == [] and silent(model=narrow_but_close) == []


def test_heads_without_a_posterior_are_accepted():
    from pyro_multihop import ChainedAttention

    assert silent(model=ChainedAttention(2, 5, 5, seed=0)) == []


# -- held-out decline -------------------------------------------------------------------------------------
def test_held_out_decline_is_raised_after_the_best_point():
    # The user's run: held-out NLL 0.03 at step 150, 0.57 at step 300 (logged every 10 steps).
    values = [-3.0 + 2.97 * i / 15 for i in range(16)] + [-0.03 - 0.54 * i / 15 for i in range(1, 16)]
    with pytest.warns(HeldOutDeclineWarning, match=r"-0\.0300 at step 150 to -0\.5700 at step 300.*best checkpoint"):
        found = diagnose_fit(metrics=held_out_frame(values))
    assert [type(d) for d in found] == [HeldOutDeclineWarning]


@pytest.mark.parametrize(
    "values",
    [[-3.0, -1.0, -0.5, -0.2], [-3.0, -0.5, -0.505, -0.503], [math.nan, math.nan, -0.4]],
    ids=["improving", "within-tolerance", "one-evaluation"],
)
def test_held_out_decline_is_silent_when_the_last_point_is_near_the_best(values):
    assert silent(metrics=held_out_frame(values)) == []


def test_a_frame_without_the_held_out_column_is_skipped_and_bad_frames_raise():
    assert silent(metrics=pd.DataFrame({"step": [0, 1], "loss": [2.0, 1.0]})) == []
    with pytest.raises(TypeError, match="metrics"):
        diagnose_fit(metrics={"step": [0]})
    with pytest.raises(ValueError, match="step"):
        diagnose_fit(metrics=pd.DataFrame({"iteration": [0]}))
    with pytest.raises(ValueError, match="elbo"):
        diagnose_fit(metrics=pd.DataFrame({"step": [0], "log_likelihood": [0.0]}), objective="elbo")
    with pytest.raises(ValueError, match="window"):
        diagnose_fit(metrics=held_out_frame([0.0]), window=0)


# -- objective against the log-likelihood -------------------------------------------------------------------
def test_mismatch_is_raised_when_the_objective_is_far_above_the_log_likelihood():
    # The user's variational EM: "converged" with an ELBO of -0.002 per observation, log-likelihood -1.278.
    frame = pd.DataFrame({"step": range(5), "elbo": [-2.0, -0.5, -0.01, -0.003, -0.002],
                          "log_likelihood": [-2.0, -1.0, -1.2, -1.27, -1.278]})
    with pytest.warns(ObjectiveMismatchWarning, match=r"met its stopping rule on its elbo.*-1\.2780 is 1\.276 below"):
        diagnose_fit(metrics=frame, objective="elbo", converged=True)


def test_mismatch_is_raised_when_the_objective_rises_while_the_log_likelihood_falls():
    steps = range(30)
    frame = pd.DataFrame({"step": steps, "elbo": [-0.30 + 0.001 * t for t in steps],
                          "log_likelihood": [-0.25 - 0.002 * t for t in steps]})
    with pytest.warns(ObjectiveMismatchWarning, match="rose by 0.0100 while the log-likelihood fell by 0.0200"):
        diagnose_fit(metrics=frame, objective="elbo")


def test_mismatch_is_silent_when_the_two_agree():
    steps = range(30)
    frame = pd.DataFrame({"step": steps, "elbo": [-1.0 + 0.8 * (1 - 0.8**t) for t in steps],
                          "log_likelihood": [-0.95 + 0.8 * (1 - 0.8**t) for t in steps]})
    assert silent(metrics=frame, objective="elbo", converged=True) == []


# -- variational EM calls it ----------------------------------------------------------------------------------
def test_variational_em_reports_a_collapsed_fit():
    """Started at the prior (means near 0, sd 1) under the full KL weight, a short fit stays collapsed."""
    obs = transitive_task(30, num_symbols=12, pairs=3, seed=0)
    vem = TiedEmbeddingVEM(12, 4, 12, prior_strength=1.0, anneal_iters=0, init_loc_scale=0.01, init_log_var=0.0,
                           plug_in="mean", max_iters=10, mc=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)  # re-emitted by pytest.warns, not matched
        with pytest.warns(DiagnosticWarning) as record:
            vem.fit(obs)
    issued = {warning.category for warning in record} - {ConvergenceWarning}  # 10 iterations cannot settle
    assert {type(d) for d in vem.diagnostics_} == issued == {PosteriorCollapseWarning, ObjectiveMismatchWarning}



def test_fit_svi_reports_a_collapsed_tied_posterior_and_is_silent_on_a_spread_one():
    """fit_svi runs the head's diagnostics at its end: a posterior left at the prior (a learning rate too small
    to move it) is reported and kept in ``metrics.attrs["diagnostics"]``; a spread posterior is not."""
    from pyro_multihop import fit_svi

    obs = transitive_task(40, num_symbols=S, pairs=3, seed=0)
    with pytest.warns(PosteriorCollapseWarning):
        metrics = fit_svi(collapsed_head(), obs, num_steps=2, lr=1e-6, progress=False)
    assert len(metrics.attrs["diagnostics"]) == 1 and "collapse" in metrics.attrs["diagnostics"][0].lower()
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiagnosticWarning)
        metrics = fit_svi(spread_head(), obs, num_steps=2, lr=1e-6, progress=False)
    assert metrics.attrs["diagnostics"] == []
