"""Several starts, one answer: fit_svi(starts=K) (pyro_multihop.train.multistart).

Start 0 is the plain fit; starts 1..K-1 are perturbed by N(0, init_scale^2) from a generator seeded by (seed, k);
the start with the best held-out log-likelihood, on rows carved from the training data, is kept."""

import math
import warnings

import pytest
import torch

from pyro_multihop import FactAttention, TiedEmbeddingAttention, fact_chain_task, transitive_task
from pyro_multihop.diagnostics import StartsDisagreeWarning
from pyro_multihop.models.fact_parameters import (COPY_DECAY, EQUALITY_WEIGHTS, HELD_COPY_DECAY, WORD_ORDER_TERMS,
                                                  frame_symbols_of)
from pyro_multihop.train import STARTS_VAL_FRACTION, fit_svi, split_validation
from pyro_multihop.train.multistart import perturb_parameters, start_path, start_seed
from svi_test_heads import GaussianMean, Points, small_head

STEPS = 30


def params(head) -> dict:
    return {k: v.detach().clone() for k, v in head.state_dict().items()}


def same_params(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def quiet_fit(head, obs, **kwargs):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return fit_svi(head, obs, num_steps=STEPS, progress=False, **kwargs)


@pytest.fixture(scope="module")
def obs():
    return transitive_task(150, seed=0)


@pytest.fixture(scope="module")
def three(obs):
    """A 3-start fit (one process) and its head."""
    head = small_head()
    return head, quiet_fit(head, obs, starts=3, processes=1)


# -- seeds and perturbations ------------------------------------------------------------------------------------
def test_start_seeds_keep_start_zero_and_differ_for_the_others():
    assert start_seed(7, 0) == 7
    seeds = {start_seed(7, k) for k in range(1, 20)} | {start_seed(8, k) for k in range(1, 20)}
    assert len(seeds) == 38 and all(0 <= s < 2**63 for s in seeds)
    assert start_seed(7, 3) == start_seed(7, 3)


def test_the_perturbation_is_seeded_gaussian_noise_on_every_unconstrained_parameter():
    head = TiedEmbeddingAttention(6, 4, 6, seed=0)
    before = {name: p.detach().clone() for name, p in head.named_parameters()}
    assert "guide.scale_unconstrained" in before  # a constrained parameter: perturbed where it is free
    perturb_parameters(head, 0.5, seed=11)
    noise = torch.cat([(p.detach() - before[name]).reshape(-1) for name, p in head.named_parameters()])
    assert (noise != 0).all() and abs(float(noise.mean())) < 0.1 and float(noise.std()) == pytest.approx(0.5, rel=0.15)
    again = TiedEmbeddingAttention(6, 4, 6, seed=0)
    perturb_parameters(again, 0.5, seed=11)
    assert same_params(params(again), params(head))
    other = TiedEmbeddingAttention(6, 4, 6, seed=0)
    perturb_parameters(other, 0.5, seed=12)
    assert not same_params(params(other), params(head))


def test_start_paths_sit_beside_the_checkpoint(tmp_path):
    assert start_path(tmp_path / "run.pt", 2) == tmp_path / "run.start2.pt"
    assert start_path(None, 2) is None


# -- one start is today's fit ----------------------------------------------------------------------------------------
def test_one_start_is_exactly_the_plain_fit(obs):
    plain, one = small_head(), small_head()
    expected = quiet_fit(plain, obs)
    got = quiet_fit(one, obs, starts=1)
    assert same_params(params(one), params(plain))
    assert got.drop(columns="seconds").equals(expected.drop(columns="seconds"))
    assert "starts" not in got.attrs


def test_start_zero_is_the_plain_fit_on_the_same_split(obs, three):
    _, metrics = three
    plain = small_head()
    quiet_fit(plain, obs, val_fraction=STARTS_VAL_FRACTION, seed=0)
    train, val = split_validation(obs, STARTS_VAL_FRACTION, seed=0)
    first = metrics.attrs["starts"][0]
    assert first["start"] == 0 and first["seed"] == 0
    assert first["val_log_likelihood"] == pytest.approx(plain.evaluate(val)["log_likelihood"], abs=1e-6)
    assert first["train_log_likelihood"] == pytest.approx(plain.evaluate(train)["log_likelihood"], abs=1e-6)


# -- several starts ------------------------------------------------------------------------------------------------
def test_the_best_held_out_start_is_kept_and_every_start_is_recorded(obs, three):
    head, metrics = three
    records = metrics.attrs["starts"]
    assert [r["start"] for r in records] == [0, 1, 2]
    assert [r["seed"] for r in records] == [start_seed(0, k) for k in range(3)]
    assert set(records[0]) == {"start", "seed", "start_from", "train_log_likelihood", "val_log_likelihood",
                               "val_accuracy", "divergences", "diagnostics", "kept"}
    assert records[0]["start_from"] == "the head's own start" and records[1]["start_from"].startswith("perturbed")
    values = [r["val_log_likelihood"] for r in records]
    assert len(set(values)) == 3  # the starts differ
    kept = max(range(3), key=values.__getitem__)
    assert [r["kept"] for r in records] == [k == kept for k in range(3)]
    _, val = split_validation(obs, STARTS_VAL_FRACTION, seed=0)  # carved from the training rows by the seed
    assert head.evaluate(val)["log_likelihood"] == pytest.approx(values[kept], abs=1e-6)
    assert metrics.attrs["final_loss"] is not None and "settings" in metrics.attrs


def test_the_caller_s_held_out_rows_choose_the_start(obs):
    val = transitive_task(40, seed=5)
    head = small_head()
    metrics = quiet_fit(head, obs, starts=2, processes=1, val=val)
    records = metrics.attrs["starts"]
    kept = next(r for r in records if r["kept"])
    assert head.evaluate(val)["log_likelihood"] == pytest.approx(kept["val_log_likelihood"], abs=1e-6)
    assert kept["val_log_likelihood"] == max(r["val_log_likelihood"] for r in records)
    # every training row was trained on: start 0 is the plain fit on all of obs
    plain = small_head()
    quiet_fit(plain, obs, val=val)
    assert records[0]["train_log_likelihood"] == pytest.approx(plain.evaluate(obs)["log_likelihood"], abs=1e-6)


def test_seeds_change_nothing_for_a_zero_initialised_head_and_starts_do():
    """The structured-facts head starts at zero and trains on full batches: every seed gives the same fit (the
    user's report). Its starts differ."""
    obs = fact_chain_task(60, num_facts=4, seed=0)

    def head():
        return FactAttention(2, 3, 68, max_question_len=3)

    fits = []
    for seed in (1, 2):
        fitted = head()
        quiet_fit(fitted, obs, seed=seed)
        fits.append(params(fitted))
    assert same_params(*fits)
    metrics = quiet_fit(head(), obs, starts=3, processes=1)
    assert len({r["val_log_likelihood"] for r in metrics.attrs["starts"]}) == 3


def test_a_head_s_own_start_variant_is_fitted_unperturbed_and_recorded():
    """The facts head with its comparison on offers starts 1-3: its emission without the comparison, the equality
    weights at 0, and both. Each is the plain fit of a head built that way (same rows, not perturbed), and start 4
    is perturbed."""
    obs = fact_chain_task(60, num_facts=4, seed=0)
    with_comparison = FactAttention(2, 3, 68, max_question_len=3, comparison=True)
    metrics = quiet_fit(with_comparison, obs, starts=9, processes=1)
    records = metrics.attrs["starts"]
    own = ["the emission without its comparison component", "the equality weights at 0",
           "the equality weights at 0 and the emission without its comparison component"]
    held = "the word-order terms held at 0"
    assert [r["start_from"] for r in records[1:8]] == own + [held] + [f"{held} and {said}" for said in own]
    assert records[8]["start_from"].startswith("perturbed")
    train, val = split_validation(obs, STARTS_VAL_FRACTION, seed=0)
    template = FactAttention(2, 3, 68, max_question_len=3)
    zero = {name: torch.zeros_like(getattr(template, name)) for name in EQUALITY_WEIGHTS}
    for start, comparison, init in ((1, False, {}), (2, True, zero), (3, False, zero)):
        plain = FactAttention(2, 3, 68, max_question_len=3, comparison=comparison, init=init)
        quiet_fit(plain, train, val=val, seed=start_seed(0, start))
        assert records[start]["val_log_likelihood"] == pytest.approx(plain.evaluate(val)["log_likelihood"],
                                                                      abs=1e-9), start
    assert len({round(r["val_log_likelihood"], 6) for r in records[:4]}) == 4
    # a head without the comparison has one such start, the equality weights at 0; its start 2 is perturbed
    without = FactAttention(2, 3, 68, max_question_len=3)
    assert with_comparison.start_variant(0) is None and without.start_variant(0) is None
    assert without.start_variant(1) == "the equality weights at 0" and without.word_order
    assert all(float(getattr(without, name).abs().max()) == 0 for name in EQUALITY_WEIGHTS)
    assert without.start_variant(2) == "the word-order terms held at 0" and not without.word_order
    assert without.start_variant(3) == "the word-order terms held at 0 and the equality weights at 0"
    assert without.start_variant(4) is None and without.word_order  # past the variants: perturbed, terms on
    embedded = FactAttention(2, 3, 68, max_question_len=3, embed_dim=4)  # it has the pattern, no frame table
    with torch.no_grad():
        embedded.question_pattern.fill_(1.0)
    assert embedded.start_variant(2) == "the word-order terms held at 0" and not embedded.word_order
    assert float(embedded.question_pattern.abs().max()) == 0 and not hasattr(embedded, "frame_content")


def test_the_kept_start_is_read_with_the_head_s_own_terms_after_a_variant_that_held_them():
    """Eight starts in this process, the last (7) with the word-order terms held at 0: whichever is kept, the head
    afterwards computes what a fresh head loaded with its parameters computes."""
    obs = fact_chain_task(60, num_facts=4, seed=0)
    head = FactAttention(2, 3, 68, max_question_len=3, comparison=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        fit_svi(head, obs, num_steps=3, progress=False, starts=8, processes=1)
    fresh = FactAttention(2, 3, 68, max_question_len=3, comparison=True)
    fresh.load_state_dict(head.state_dict())
    assert head.word_order and torch.equal(head.log_likelihood(obs), fresh.log_likelihood(obs))


def test_a_start_with_the_word_order_terms_held_at_0_keeps_them_at_0():
    """Fitted from start_variant(2) (no comparison), the question's pattern and the frame table stay exactly 0, so
    the fitted head and a fresh head loaded with its parameters (the terms on, at 0) give the same likelihood; the
    head's own start moves them (the task's frame symbols, those no question or answer names, given to each)."""
    obs = fact_chain_task(60, num_facts=4, seed=0)
    frame = frame_symbols_of(obs, 68)
    assert frame.any()
    def head():
        return FactAttention(2, 3, 68, max_question_len=3, frame_symbols=frame)

    held, own = head(), head()
    with torch.no_grad():
        held.start_variant(2)
    quiet_fit(held, obs, seed=0)
    quiet_fit(own, obs, seed=0)
    for name in WORD_ORDER_TERMS:
        assert float(getattr(held, name).abs().max()) == 0, name
        assert float(getattr(own, name).abs().max()) > 0, name
    loaded = head()
    loaded.load_state_dict(held.state_dict())
    assert loaded.word_order and torch.equal(loaded.log_likelihood(obs), held.log_likelihood(obs))


def test_a_start_with_the_word_order_terms_held_fits_the_copy_under_the_stronger_prior():
    """The held starts decay ``copy_by_question`` at HELD_COPY_DECAY, the others (and the head after the fit) at
    COPY_DECAY: start 2 of a 3-start fit (no comparison) is the plain fit of a held head at the stronger decay, and
    not the one at the weaker decay."""
    obs = fact_chain_task(60, num_facts=4, seed=0)
    def copy_decay(head):
        return head.svi_defaults()["weight_decay"]["copy_by_question"]

    head = FactAttention(2, 3, 68, max_question_len=3)
    assert HELD_COPY_DECAY > COPY_DECAY and copy_decay(head) == COPY_DECAY
    with torch.no_grad():
        assert head.start_variant(2) == "the word-order terms held at 0" and copy_decay(head) == HELD_COPY_DECAY
        head.start_variant(1)
    assert copy_decay(head) == COPY_DECAY
    head = FactAttention(2, 3, 68, max_question_len=3)  # the variants above set parameters in place
    metrics = quiet_fit(head, obs, starts=3, processes=1)
    assert copy_decay(head) == COPY_DECAY and head.word_order  # start_variant(0) after the fit
    train, val = split_validation(obs, STARTS_VAL_FRACTION, seed=0)
    fitted = {}
    for decay in (HELD_COPY_DECAY, COPY_DECAY):
        held = FactAttention(2, 3, 68, max_question_len=3)
        with torch.no_grad():
            held.start_variant(2)
        weight_decay = {**held.svi_defaults()["weight_decay"], "copy_by_question": decay}
        quiet_fit(held, train, val=val, seed=start_seed(0, 2), weight_decay=weight_decay)
        fitted[decay] = held.evaluate(val)["log_likelihood"]
    assert metrics.attrs["starts"][2]["val_log_likelihood"] == pytest.approx(fitted[HELD_COPY_DECAY], abs=1e-9)
    assert fitted[COPY_DECAY] != pytest.approx(fitted[HELD_COPY_DECAY], abs=1e-9)


def test_seeded_starts_are_reproducible_and_equal_in_processes(obs, three):
    head, metrics = three
    again = small_head()
    repeated = quiet_fit(again, obs, starts=3, processes=1)
    assert repeated.attrs["starts"] == metrics.attrs["starts"] and same_params(params(again), params(head))
    parallel = small_head()
    spawned = quiet_fit(parallel, obs, starts=3, processes=2)
    for got, expected in zip(spawned.attrs["starts"], metrics.attrs["starts"]):
        for key, value in expected.items():
            assert got[key] == (pytest.approx(value, abs=1e-6) if isinstance(value, float) else value), key
    for name, value in params(head).items():
        assert torch.allclose(params(parallel)[name], value, atol=1e-6), name


def test_only_the_kept_start_s_warnings_reach_the_caller():
    """A toy head whose starts all end with the same warnings: each is issued once, from the kept start, at the
    caller's line; a disagreement of the starts is reported too."""
    obs = Points(torch.randn(60, generator=torch.Generator().manual_seed(0)) + 3.0)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = fit_svi(GaussianMean(), obs, num_steps=50, lr=1e-6, starts=3, processes=1, progress=False)
    stuck = [w for w in caught if "hardly moved" in str(w.message)]
    assert len(stuck) == 1 and stuck[0].filename == __file__
    assert all(r["diagnostics"] == ["training_stuck"] for r in metrics.attrs["starts"])
    assert [d["kind"] for d in metrics.attrs["diagnostics"]] == ["training_stuck"]  # accuracy NaN: no comparison


class SignedMean(GaussianMean):
    """The toy head, "right" where its mean is positive: an accuracy that depends on the start."""

    def evaluate(self, obs):
        return dict(super().evaluate(obs), accuracy=float(self.mu > 0))


def test_starts_that_disagree_are_reported():
    obs = Points(torch.randn(60, generator=torch.Generator().manual_seed(0)))
    with pytest.warns(StartsDisagreeWarning, match="accuracy from 0.000 to 1.000") as caught:
        metrics = fit_svi(SignedMean(), obs, num_steps=5, lr=1e-6, starts=4, init_scale=1.0, processes=1,
                          progress=False)
    assert caught[0].filename == __file__
    accuracies = [r["val_accuracy"] for r in metrics.attrs["starts"]]
    assert set(accuracies) == {0.0, 1.0}  # perturbed means on both sides of 0
    assert [d["kind"] for d in metrics.attrs["diagnostics"]] == ["starts_disagree"]


def test_checkpoints_per_start_and_the_kept_one_in_place(tmp_path, obs):
    checkpoint = tmp_path / "run.pt"
    head = small_head()
    metrics = quiet_fit(head, obs, starts=2, processes=1, checkpoint=checkpoint)
    kept = next(r["start"] for r in metrics.attrs["starts"] if r["kept"])
    for k in range(2):
        assert start_path(checkpoint, k).exists() and start_path(tmp_path / "best.pt", k).exists()
    assert checkpoint.read_bytes() == start_path(checkpoint, kept).read_bytes()
    assert (tmp_path / "best.pt").read_bytes() == start_path(tmp_path / "best.pt", kept).read_bytes()
    assert metrics.attrs["best_val"]["checkpoint"] == str(tmp_path / "best.pt")
    resumed = small_head(seed=3)  # other parameters: the finished checkpoints hold the answer
    again = quiet_fit(resumed, obs, starts=2, processes=1, checkpoint=checkpoint)
    assert again.attrs["resumed_from"] == STEPS and again.attrs["starts"] == metrics.attrs["starts"]
    assert same_params(params(resumed), params(head))


@pytest.mark.parametrize(
    "kwargs, match",
    [({"starts": 0}, "starts"), ({"starts": True}, "starts"), ({"starts": 2.0}, "starts"),
     ({"starts": 2, "processes": 0}, "processes"), ({"starts": 2, "init_scale": -0.1}, "init_scale"),
     ({"starts": 2, "init_scale": math.inf}, "init_scale"),
     ({"starts": 2, "val_fraction": 0.2, "val": transitive_task(5, seed=1)}, "val or val_fraction")],
)
def test_bad_start_settings_raise(obs, kwargs, match):
    with pytest.raises(ValueError, match=match):
        fit_svi(small_head(), obs, num_steps=2, progress=False, **kwargs)
