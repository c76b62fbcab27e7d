"""Diagnostics after a fit: each raised on a constructed failure, silent on a good fit, and from variational EM
(its silence on a good fit is checked in tests/em/test_variational_em.py)."""

import math
import warnings

import pandas as pd
import pytest
import torch

from pyro_multihop import TiedEmbeddingAttention, transitive_task
from pyro_multihop.diagnostics import (
    CopiedHopWarning,
    DiagnosticWarning,
    FixedHopWarning,
    FlatHopWarning,
    HeldOutDeclineWarning,
    ObjectiveMismatchWarning,
    PosteriorCollapseWarning,
    StartsDisagreeWarning,
    TrainingStuckWarning,
    diagnose_fit,
    diagnose_hops,
    diagnose_starts,
    diagnostic_records,
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
    assert len(metrics.attrs["diagnostics"]) == 1 and "collapse" in metrics.attrs["diagnostics"][0]["message"].lower()
    assert metrics.attrs["diagnostics"][0]["kind"] == "posterior_collapse" and "KL weight" in metrics.attrs["diagnostics"][0]["hint"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiagnosticWarning)
        metrics = fit_svi(spread_head(), obs, num_steps=2, lr=1e-6, progress=False)
    assert metrics.attrs["diagnostics"] == []


# -- records: kind, message, hint -----------------------------------------------------------------------------------
def test_a_diagnostic_is_a_cause_and_a_hint_and_keeps_both_across_processes():
    import pickle

    found = TrainingStuckWarning("the loss did not move", "lower --lr, e.g. 0.03")
    assert str(found) == "the loss did not move; lower --lr, e.g. 0.03"
    assert found.record() == {"kind": "training_stuck", "message": "the loss did not move", "hint": "lower --lr, e.g. 0.03"}
    copy = pickle.loads(pickle.dumps(found))
    assert type(copy) is TrainingStuckWarning and copy.record() == found.record()
    assert diagnostic_records([found, UserWarning("other"), "plain"]) == [
        found.record(), {"kind": "diagnostic", "message": "other", "hint": ""},
        {"kind": "diagnostic", "message": "plain", "hint": ""}]
    # the older findings: the same text as before, now with the hint apart
    (collapse,) = diagnose_fit(collapsed_head(), warn=False)
    assert collapse.record()["kind"] == "posterior_collapse" and collapse.hint.startswith("try a smaller KL weight")
    assert str(collapse) == f"{collapse.cause}; {collapse.hint}"


# -- the hop posterior ----------------------------------------------------------------------------------------------
L, ROWS, N = 3, 40, 6


def real_positions() -> torch.Tensor:
    """``(ROWS, N)``: rows with 4 to 6 real positions, padding at the end."""
    lengths = 4 + torch.arange(ROWS) % 3
    return torch.arange(N)[None, :] < lengths[:, None]


def sharp(choices: torch.Tensor, real: torch.Tensor, mass: float = 0.97) -> torch.Tensor:
    """``(ROWS, N)`` marginals with ``mass`` on each row's chosen position, the rest spread over its other real ones."""
    others = real.float().scatter(1, choices[:, None], 0.0)
    spread = (1 - mass) * others / others.sum(-1, keepdim=True)
    return spread.scatter(1, choices[:, None], mass)


def varied(real: torch.Tensor, seed: int) -> torch.Tensor:
    """A real position per row, drawn at random (no fixed one, no copy of another draw)."""
    generator = torch.Generator().manual_seed(seed)
    return (torch.rand(ROWS, generator=generator) * real.sum(-1)).long()


def good_marginals(real) -> torch.Tensor:
    return torch.stack([sharp(varied(real, seed), real) for seed in range(L)])


def hop_kinds(marginals, real, **kwargs) -> list:
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiagnosticWarning)
        found = diagnose_hops(marginals, real, warn=False, **kwargs)
    return [(type(d), d.cause.split("'")[0].split(" ")[1]) for d in found]


def test_a_good_posterior_is_silent():
    real = real_positions()
    marginals = good_marginals(real)
    assert (varied(real, 0) != varied(real, 1)).float().mean() > 0.5  # the draws do not copy each other
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiagnosticWarning)
        assert diagnose_hops(marginals, real) == []


def test_a_flat_hop_is_flagged():
    real = real_positions()
    marginals = good_marginals(real)
    marginals[1] = real.double() / real.sum(-1, keepdim=True)  # hop 2 attends every real fact alike
    with pytest.warns(FlatHopWarning, match=r"hop 2's posterior is flat: its mean entropy is 1.00") as caught:
        found = diagnose_hops(marginals, real)
    assert caught[0].filename == __file__ and [type(d) for d in found] == [FlatHopWarning]  # no copy/fixed on it
    assert "--lr" in found[0].hint
    # nearly flat but still choosing (0.6 on one of 4-6 positions) is not flat
    marginals[1] = sharp(varied(real, 1), real, mass=0.6)
    assert hop_kinds(marginals, real) == []


def test_a_hop_that_copies_the_previous_one_is_flagged():
    real = real_positions()
    marginals = good_marginals(real)
    copied = varied(real, 0).clone()
    copied[:5] = (copied[:5] + 1) % 4  # 35 of 40 rows (87.5 %) copy
    marginals[1] = sharp(copied, real)
    assert hop_kinds(marginals, real) == [(CopiedHopWarning, "2")]
    assert "88%" in diagnose_hops(marginals, real, warn=False)[0].cause
    copied[:10] = (varied(real, 0)[:10] + 1) % 4  # 30 of 40 (75 %): under the share
    marginals[1] = sharp(copied, real)
    assert hop_kinds(marginals, real) == []


def test_a_hop_on_one_fixed_position_is_flagged():
    real = real_positions()
    marginals = good_marginals(real)
    fixed = varied(real, 2).clone()
    fixed[:36] = 0  # hop 3 sits on the first fact on 90 % of the rows
    fixed[36:] = torch.tensor([1, 2, 3, 1])
    marginals[2] = sharp(fixed, real)
    found = diagnose_hops(marginals, real, warn=False)
    assert [type(d) for d in found] == [FixedHopWarning]
    assert "hop 3 chooses position 0 on 90% of the rows" in found[0].cause
    assert hop_kinds(marginals, real, fixed=0.95) == []
    # bAbI task 3's idle first hop sits on the first fact of about 60 % of the rows: most rows, flagged
    fixed[24:] = varied(real, 2)[24:].clamp_min(1)  # 24 of 40 (60 %) on position 0
    marginals[2] = sharp(fixed, real)
    assert hop_kinds(marginals, real) == [(FixedHopWarning, "3")]
    fixed[16:24] = 1  # 16 of 40 (40 %) on position 0, 8 more on position 1 (under half either way)
    marginals[2] = sharp(fixed, real)
    assert (fixed == 0).sum() == 16 and hop_kinds(marginals, real) == []


def test_a_position_chosen_as_often_as_chance_gives_is_not_fixed():
    """Rows of two facts (bAbI task 4): a hop that finds each row's fact lands on position 0 on about half of the
    rows, as a fair coin would; it is flagged only where it sits there well beyond the rows' chance (1.5 times)."""
    real = torch.zeros(ROWS, N, dtype=torch.bool)
    real[:, :2] = True
    chosen = (torch.arange(ROWS) % 5 < 3).long() ^ 1  # position 0 on 60 % of the rows, 1 on the rest
    marginals = torch.stack([sharp(chosen, real)] * L)
    marginals[1] = sharp(1 - chosen, real)  # no hop copies the one before
    assert float((chosen == 0).double().mean()) == 0.6 and hop_kinds(marginals, real) == []
    chosen[: ROWS * 4 // 5] = 0  # 80 % on position 0: over 1.5 times the 50 % of chance
    marginals[2] = sharp(chosen, real)
    assert hop_kinds(marginals, real) == [(FixedHopWarning, "3")]


def test_starts_that_disagree_by_more_than_a_point_are_flagged():
    with pytest.warns(StartsDisagreeWarning, match="3 starts disagree: accuracy from 0.900 to 0.950"):
        found = diagnose_starts([0.95, 0.9, None, 0.93, math.nan])
    assert "--starts" in found[0].hint
    real = real_positions()
    assert [type(d) for d in diagnose_hops(good_marginals(real), real, [0.9, 0.95], warn=False)] == [StartsDisagreeWarning]
    with warnings.catch_warnings():
        warnings.simplefilter("error", DiagnosticWarning)
        assert diagnose_starts([0.9, 0.905, 0.91]) == []
        assert diagnose_starts([0.2]) == [] and diagnose_starts([]) == []
        assert diagnose_hops(good_marginals(real), real, [0.9, 0.91]) == []  # a point exactly: not more


def test_bad_hop_inputs_raise():
    real = real_positions()
    with pytest.raises(ValueError, match="hop_marginals"):
        diagnose_hops(torch.zeros(ROWS, N), real)
    with pytest.raises(ValueError, match="real"):
        diagnose_hops(good_marginals(real), real[:, :3])
    with pytest.raises(ValueError, match="share"):
        diagnose_hops(good_marginals(real), real, share=0.0)
    with pytest.raises(ValueError, match="fixed"):
        diagnose_hops(good_marginals(real), real, fixed=1.5)


def test_the_hops_of_a_head_are_checked_from_its_hop_marginals():
    """A head's ``hop_marginals(obs)`` and the data's ``full_mask()`` are the inputs: the generating structure of
    the relation chains is silent; the untrained facts head (every parameter 0) attends every fact alike at hop 1."""
    from pyro_multihop import FactAttention, fact_chain_task, fact_chain_truth

    obs = fact_chain_task(50, seed=0)
    truth = fact_chain_truth()
    with torch.no_grad():
        assert diagnose_hops(truth.hop_marginals(obs), obs.full_mask(), warn=False) == []
        untrained = FactAttention(2, 3, truth.num_symbols, max_question_len=3)
        found = diagnose_hops(untrained.hop_marginals(obs), obs.full_mask(), warn=False)
    assert [type(d) for d in found] == [FlatHopWarning] and "hop 1's" in found[0].cause
