"""Training that does not give up without saying so: the divergence guard's warm-up
(pyro_multihop.train.divergence_guard, ``divergence_warmup``) and the TrainingStuckWarning of
pyro_multihop.train.stuck.

The user's report (issue 35): a kinship knowledge base, 400 questions, 2 hops, the facts head's default lr 0.1.
The guard declared divergences at steps 10, 17, 30 and 63, each time restoring step 1's parameters and cutting
the learning rate, down to 0.001; the run ended at 0.000 answer accuracy and exited 0. The early rise of the
loss, normal for Adam at a large step, was taken for a failure. ``test_a_large_lr_no_longer_collapses``
reproduces it on the relation-chain task (3 hops, lr 0.3, where today's guard fires at once).
"""

import math
import warnings

import pytest
import torch

from pyro_multihop import FactAttention, fact_chain_task, fact_chain_truth, fact_chain_vocabulary
from pyro_multihop.diagnostics import TrainingStuckWarning
from pyro_multihop.train import SVI_DEFAULTS, fit_svi
from pyro_multihop.train.divergence_guard import DivergenceGuard
from pyro_multihop.train.stuck import STUCK_SHARE, suggested_lr, training_stuck
from svi_test_heads import GaussianMean, Points


# -- the guard's warm-up on a constructed loss sequence ---------------------------------------------------------
class _Scalar(torch.nn.Module):
    """A module whose one parameter records the step it was snapshotted at (what a restore brings back)."""

    def __init__(self):
        super().__init__()
        self.at = torch.nn.Parameter(torch.zeros(()))


def observe_all(guard, losses, model):
    """Feed ``losses`` (one per step) to ``guard``; the steps it called divergences (each recovered: the
    parameter is set to the restored step, as a restore would)."""
    fired = []
    for step, loss in enumerate(losses):
        with torch.no_grad():
            model.at.fill_(step)
        if guard.observe(step, loss, "objective", model):
            fired.append(step)
            model.load_state_dict(guard.best_state)
    return fired


# Adam's early rise at a large step: down at step 1, up for 5 steps, then down for good (the user's kinship run).
EARLY_RISE = [3.0, 2.0, 2.6, 2.9, 3.1, 2.8, 2.5, 1.9, 1.6, 1.4, 1.3, 1.2]


def test_without_a_warm_up_the_early_rise_is_a_divergence():
    guard = DivergenceGuard(0.25, 0.5, warmup=0)
    assert observe_all(guard, EARLY_RISE, _Scalar()) == [2, 3, 4, 5, 6]  # today's guard: back to step 1, again


def test_during_the_warm_up_a_rise_is_no_divergence_and_the_reference_restarts_after_it():
    guard, model = DivergenceGuard(0.25, 0.5, warmup=5), _Scalar()
    assert observe_all(guard, EARLY_RISE, model) == []
    assert guard.best_step == len(EARLY_RISE) - 1 and guard.best_loss == EARLY_RISE[-1]
    # The reference restarts at the warm-up's end, at its loss (2.8), not at the warm-up's best (2.0): a rise
    # above 2.8 + 0.25 after it is a divergence, and the restore goes back to step 5, not into the warm-up.
    guard = DivergenceGuard(0.25, 0.5, warmup=5)
    fired = observe_all(guard, EARLY_RISE[:6] + [3.2], model)
    assert fired == [6] and guard.best_step == 5 and float(guard.best_state["at"]) == 5.0


def test_a_non_finite_loss_is_a_divergence_even_during_the_warm_up():
    guard = DivergenceGuard(0.25, 0.5, warmup=10)
    assert observe_all(guard, [3.0, 2.0, math.nan, 1.9], _Scalar()) == [2]
    with pytest.raises(FloatingPointError):
        DivergenceGuard(0.25, 0.5, warmup=10).observe(0, math.inf, "objective", _Scalar())


def test_the_warm_up_state_is_in_the_checkpoint_state():
    guard = DivergenceGuard(0.25, 0.5, warmup=5)
    observe_all(guard, EARLY_RISE[:3], _Scalar())
    resumed = DivergenceGuard(0.25, 0.5, warmup=5)
    resumed.load(guard.state())
    assert resumed.warming_up and observe_all(resumed, [9.0] * 2, _Scalar()) == []  # steps 0, 1: still warming
    old = guard.state()
    del old["warming_up"]  # a checkpoint written before the warm-up existed
    resumed.load(old)
    assert not resumed.warming_up


def test_the_warm_up_is_a_checked_setting():
    assert SVI_DEFAULTS["divergence_warmup"] == 40
    for bad in (-1, 1.5, True):
        with pytest.raises(ValueError, match="divergence_warmup"):
            fit_svi(GaussianMean(), Points([0.0, 1.0]), divergence_warmup=bad, progress=False)


# -- the stuck signs, unit by unit ---------------------------------------------------------------------------------
SETTINGS = {"lr": 0.1, "divergence_warmup": 40}
EVENTS = [{"step": s, "lr": 0.1 * 0.5 ** (i + 1)} for i, s in enumerate((10, 17, 30, 63))]


def test_a_guard_that_fires_more_than_once_is_reported_with_a_lower_lr():
    found = training_stuck(EVENTS, 3.0, 2.0, 300, SETTINGS)
    assert [type(d) for d in found] == [TrainingStuckWarning]
    record = found[0].record()
    assert record["kind"] == "training_stuck"
    assert "fired 4 times (steps 10, 17, 30, 63)" in record["message"] and "ended at 0.0063" in record["message"]
    assert "--lr" in record["hint"] and "e.g. 0.03" in record["hint"] and "--starts" in record["hint"]
    assert suggested_lr(0.1) == 0.03 and suggested_lr(0.05) == 0.02 and suggested_lr(1.0) == 0.3


def test_a_run_that_ends_near_its_starting_loss_is_reported():
    found = training_stuck([], 3.0, 3.0 - STUCK_SHARE * 3.0 / 2, 300, SETTINGS)
    assert [type(d) for d in found] == [TrainingStuckWarning]
    assert "hardly moved" in found[0].cause and "--starts" in found[0].hint
    both = training_stuck(EVENTS, 3.0, 2.99, 300, SETTINGS)
    assert len(both) == 2 and "e.g. 0.03" in both[1].hint  # after divergences: lower, not another, lr


@pytest.mark.parametrize(
    "events, start, kept, steps",
    [(EVENTS[:1], 3.0, 2.0, 300),        # one divergence: the guard did its job
     ([], 3.0, 2.9, 300),                # moved by more than the share
     ([], 3.0, 3.0, 39),                 # shorter than the warm-up: too short to tell
     ([], None, 3.0, 300),               # no step-0 loss of the same objective (a KL-annealed one)
     ([], math.nan, 3.0, 300)],
    ids=["one-divergence", "moved", "short", "no-start", "nan-start"],
)
def test_a_run_that_got_going_is_not_reported(events, start, kept, steps):
    assert training_stuck(events, start, kept, steps, SETTINGS) == []


# -- fit_svi reports it ----------------------------------------------------------------------------------------
def test_fit_svi_warns_and_records_a_run_that_did_not_move():
    obs = Points(torch.randn(50, generator=torch.Generator().manual_seed(0)) + 3.0)
    with pytest.warns(TrainingStuckWarning, match="hardly moved") as caught:
        metrics = fit_svi(GaussianMean(), obs, num_steps=50, lr=1e-6, progress=False)
    stuck = [w for w in caught if w.category is TrainingStuckWarning]
    assert len(stuck) == 1 and stuck[0].filename == __file__  # points at the caller of fit_svi
    (record,) = metrics.attrs["diagnostics"]
    assert record["kind"] == "training_stuck" and "lr" in record["hint"]
    with warnings.catch_warnings():
        warnings.simplefilter("error", TrainingStuckWarning)
        metrics = fit_svi(GaussianMean(), obs, num_steps=50, lr=0.3, progress=False)
    assert metrics.attrs["diagnostics"] == []


# -- the user's failure, reproduced ------------------------------------------------------------------------------
HOPS, ENTITIES = 3, 60


def chain_task(n, seed):
    return fact_chain_task(n, hops=HOPS, num_facts=9, train_entities=ENTITIES, seed=seed)


def fit_chain_head(**settings):
    vocabulary = fact_chain_vocabulary(4, ENTITIES, 20)
    head = FactAttention(HOPS, 3, vocabulary.num_symbols, max_question_len=HOPS + 1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        metrics = fit_svi(head, chain_task(200, seed=0), lr=0.3, num_steps=150, progress=False, **settings)
    return head, metrics, [w.category for w in caught]


def test_a_large_lr_no_longer_collapses():
    """lr 0.3 on the 3-hop relation chains. Without a warm-up (today's guard) the loss's rise at step 3 is a
    divergence, then at 5, 7, 10, ...: each restores step 2's parameters and halves the learning rate, the run
    ends near step 2 at a learning rate under 0.01, and held-out accuracy collapses. With the default warm-up
    the same run has no divergence and reaches the generating structure's accuracy."""
    train, held_out = chain_task(200, seed=0), chain_task(200, seed=1)
    truth = fact_chain_truth(hops=HOPS, train_entities=ENTITIES).evaluate(train)["accuracy"]
    assert truth == 1.0

    today, metrics, issued = fit_chain_head(divergence_warmup=0)
    events = metrics.attrs["divergences"]
    assert len(events) >= 4 and events[0]["step"] < 10 and events[-1]["lr"] < 0.01
    assert today.evaluate(held_out)["accuracy"] < 0.5
    assert TrainingStuckWarning in issued and metrics.attrs["diagnostics"][0]["kind"] == "training_stuck"

    head, metrics, issued = fit_chain_head()  # the default warm-up
    assert metrics.attrs["divergences"] == [] and TrainingStuckWarning not in issued
    assert head.evaluate(train)["accuracy"] >= 0.99 * truth  # measured 1.0 (0.995 before the mention recency)
    # measured 0.79 (0.795 before the hops' recency among mentions; 0.87 with the neighbours' weights held at 0,
    # docs/facts.md; 0.915 before the order terms by symbol decayed at 3e-3; 0.985 when the equality weights
    # started at 0): learnt, not collapsed (< 0.5 above)
    assert head.evaluate(held_out)["accuracy"] >= 0.75
