"""Held-out data in fit_svi (pyro_multihop.train.validation): the best checkpoint, patience, the overfitting
warning, and the split by val_fraction."""

import pytest
import torch

from pyro_multihop import transitive_task
from pyro_multihop.checkpoint import load_checkpoint
from pyro_multihop.train import fit_svi
from svi_test_heads import small_head


def shuffled_targets(obs, seed=1):
    """The same contexts with targets permuted: the better a head fits ``obs``, the worse it does here."""
    from pyro_multihop import Observations

    order = torch.randperm(len(obs), generator=torch.Generator().manual_seed(seed))
    return Observations(obs.keys, obs.values, obs.query, obs.target[order], obs.mask)


def test_best_checkpoint_patience_and_the_overfitting_warning(tmp_path):
    from pyro_multihop.train import OverfittingWarning

    obs = transitive_task(80, seed=0)
    head = small_head()
    states = {}

    def record(step, model, row):
        states[step] = {k: v.detach().clone() for k, v in model.state_dict().items()}

    with pytest.warns(OverfittingWarning, match="held-out log-likelihood fell"):
        metrics = fit_svi(head, obs, val=shuffled_targets(obs), num_steps=200, log_every=5, patience=3,
                          checkpoint=tmp_path / "checkpoint.pt", callback=record, progress=False)
    best = metrics.attrs["best_val"]
    values = metrics.set_index("step")["val_log_likelihood"]
    assert best["step"] == values.idxmax() and best["log_likelihood"] == values.max()
    assert best["stopped_early"] and best["checkpoint"] == str(tmp_path / "best.pt")
    # Three evaluations without a better one, then the stop (and the final row one step later).
    assert metrics["step"].tolist()[-4:] == [best["step"] + 5, best["step"] + 10, best["step"] + 15, best["step"] + 16]
    saved, state = load_checkpoint(tmp_path / "best.pt")
    assert state["step"] == best["step"]
    assert state["extra"]["svi_best"]["chosen_by"] == "highest held-out log-likelihood"
    for name, value in states[best["step"]].items():
        assert torch.equal(saved.state_dict()[name], value), name


def test_a_good_fit_keeps_its_last_step_as_best_and_stays_silent(recwarn):
    obs, val = transitive_task(200, seed=0), transitive_task(100, seed=1)
    metrics = fit_svi(small_head(), obs, val=val, num_steps=30, log_every=10, progress=False)
    assert metrics.attrs["best_val"]["step"] == 30 and not metrics.attrs["best_val"]["stopped_early"]
    assert not [w for w in recwarn if "held-out" in str(w.message)]


def test_val_fraction_splits_by_the_seed():
    from pyro_multihop.train import split_validation

    obs = transitive_task(50, seed=0)
    train, held_out = split_validation(obs, 0.2, seed=4)
    again = split_validation(obs, 0.2, seed=4)[1]
    other = split_validation(obs, 0.2, seed=5)[1]
    assert len(train) == 40 and len(held_out) == 10 and held_out == again and not held_out == other
    rows = {tuple(r) for r in torch.cat([obs.keys, obs.target[:, None]], 1).tolist()}
    parts = [tuple(r) for part in (train, held_out) for r in torch.cat([part.keys, part.target[:, None]], 1).tolist()]
    assert sorted(parts) == sorted(tuple(r) for r in torch.cat([obs.keys, obs.target[:, None]], 1).tolist())
    assert len(rows) == len(parts)
    metrics = fit_svi(small_head(), obs, val_fraction=0.2, num_steps=5, log_every=5, seed=4, progress=False)
    assert "val_log_likelihood" in metrics.columns
    with pytest.raises(ValueError, match="val_fraction"):
        split_validation(obs, 1.5)
    with pytest.raises(ValueError, match="patience needs held-out data"):
        fit_svi(small_head(), obs, num_steps=5, patience=2, progress=False)


def test_the_overfitting_warning_is_a_held_out_decline_diagnostic():
    from pyro_multihop.diagnostics import DiagnosticWarning, HeldOutDeclineWarning
    from pyro_multihop.train import OverfittingWarning

    assert issubclass(OverfittingWarning, HeldOutDeclineWarning) and issubclass(OverfittingWarning, DiagnosticWarning)
