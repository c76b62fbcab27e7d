"""The divergence guard (pyro_multihop.train.divergence_guard): a divergence restores the best parameters and
lowers the learning rate; the best parameters are restored at the end."""

import logging
import math

import pytest
import torch

from pyro_multihop import transitive_task
from pyro_multihop.train import fit_svi
from svi_test_heads import exact_loss, small_head


def test_divergence_guard_restores_best_and_lowers_lr(caplog):
    obs = transitive_task(100, seed=0)
    head = small_head()

    def sabotage(step, model, row):
        if step == 20:
            with torch.no_grad():
                model.emission_logits.mul_(-3.0)  # the emission now avoids the right targets

    # The sabotage comes after a warm-up of 20 steps (the default warm-up, 40, would cover the whole run).
    with caplog.at_level(logging.WARNING, logger="pyro_multihop.train"):
        metrics = fit_svi(head, obs, num_steps=40, log_every=10, callback=sabotage, divergence_warmup=20,
                          progress=False)
    events = metrics.attrs["divergences"]
    assert [e["step"] for e in events] == [21]
    assert events[0]["best_step"] == 20 and events[0]["loss"] > events[0]["best_loss"] + 0.25
    assert events[0]["lr"] == pytest.approx(metrics["lr"].iloc[2] * 0.5 * (0.1 ** (1 / 40)), rel=1e-6)
    assert "divergence at step 21" in caplog.text
    assert metrics["loss"].iloc[-1] <= events[0]["best_loss"]  # recovered from the restored parameters


def test_best_parameters_restored_at_the_end():
    obs = transitive_task(100, seed=0)
    head = small_head()

    def sabotage(step, model, row):
        if step == 20:
            with torch.no_grad():
                model.emission_logits.mul_(-3.0)

    metrics = fit_svi(head, obs, num_steps=30, log_every=10, callback=sabotage, divergence_threshold=math.inf, progress=False)
    attrs = metrics.attrs
    assert attrs["divergences"] == [] and attrs["restored_best"]
    assert attrs["best_step"] == 20 and attrs["final_loss"] > attrs["best_loss"]
    assert exact_loss(head, obs) == pytest.approx(attrs["best_loss"], rel=1e-5)
