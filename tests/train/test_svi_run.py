"""One SVI run (pyro_multihop.train.svi_run): metric rows and attrs, the callback, resuming from a checkpoint,
the progress bar, and a KL-annealed head."""

import math

import pandas as pd
import pytest
import torch

from pyro_multihop import transitive_task
from pyro_multihop.train import fit_svi
from svi_test_heads import exact_loss, small_head


def test_metrics_rows_columns_and_attrs():
    obs, val = transitive_task(120, seed=0), transitive_task(60, seed=1)
    head = small_head()
    initial = exact_loss(head, obs)
    metrics = fit_svi(head, obs, num_steps=25, log_every=10, val=val, progress=False)
    assert list(metrics.columns) == ["step", "loss", "lr", "val_log_likelihood", "val_accuracy", "seconds"]
    assert metrics["step"].tolist() == [0, 10, 20, 25]
    assert metrics["loss"].iloc[0] == pytest.approx(initial, rel=1e-5)  # full-batch loss = exact NLL per observation
    assert metrics["loss"].iloc[-1] == pytest.approx(exact_loss(head, obs), rel=1e-5)
    assert metrics["loss"].iloc[-1] < metrics["loss"].iloc[0]
    assert metrics["seconds"].is_monotonic_increasing
    assert metrics["lr"].iloc[0] == pytest.approx(metrics.attrs["settings"]["lr"])
    assert metrics["lr"].is_monotonic_decreasing
    attrs = metrics.attrs
    assert attrs["divergences"] == [] and attrs["resumed_from"] is None
    assert attrs["best_loss"] <= metrics["loss"].min() + 1e-12
    assert attrs["final_loss"] == pytest.approx(metrics["loss"].iloc[-1])


def test_callback_can_stop_early():
    metrics = fit_svi(small_head(), transitive_task(50, seed=0), num_steps=100, log_every=5,
                      callback=lambda step, model, row: step >= 10, progress=False)
    assert metrics["step"].tolist() == [0, 5, 10, 11]


class _Interrupt(Exception):
    pass


def test_resumed_run_equals_uninterrupted_run(tmp_path):
    obs, val = transitive_task(90, seed=0), transitive_task(30, seed=1)
    settings = dict(num_steps=30, batch_size=16, log_every=5, val=val, seed=3, progress=False, checkpoint_every=10)

    straight = small_head(seed=0)
    expected = fit_svi(straight, obs, checkpoint=tmp_path / "straight.pt", **settings)

    def crash(step, model, row):
        if step == 25:
            raise _Interrupt

    interrupted = small_head(seed=0)
    with pytest.raises(_Interrupt):
        fit_svi(interrupted, obs, checkpoint=tmp_path / "resumed.pt", callback=crash, **settings)
    resumed = small_head(seed=7)  # other initial values: everything must come from the checkpoint
    result = fit_svi(resumed, obs, checkpoint=tmp_path / "resumed.pt", **settings)

    assert result.attrs["resumed_from"] == 20
    for name, value in straight.state_dict().items():
        assert torch.equal(value, resumed.state_dict()[name]), name
    columns = ["step", "loss", "lr", "val_log_likelihood", "val_accuracy"]
    pd.testing.assert_frame_equal(result[columns], expected[columns])
    # A finished checkpoint is returned as is.
    again = fit_svi(small_head(seed=9), obs, checkpoint=tmp_path / "resumed.pt", **settings)
    pd.testing.assert_frame_equal(again[columns], expected[columns])


def test_progress_bar_goes_to_stderr(capsys):
    fit_svi(small_head(), transitive_task(20, seed=0), num_steps=3, progress=True)
    captured = capsys.readouterr()
    assert captured.out == "" and "svi" in captured.err


def test_tied_head_with_kl_annealing():
    tied = pytest.importorskip("pyro_multihop.models.tied")
    obs = transitive_task(60, num_symbols=12, pairs=3, seed=0)
    head = tied.TiedEmbeddingAttention(12, 4, 12, seed=0)
    metrics = fit_svi(head, obs, num_steps=12, batch_size=30, log_every=4, val=obs, progress=False)
    assert metrics["step"].tolist() == [0, 4, 8, 12]
    assert all(math.isfinite(v) for v in metrics["loss"])
    assert metrics.attrs["divergences"] == []
