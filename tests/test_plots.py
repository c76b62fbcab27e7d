"""Figures: each function returns a matplotlib Figure that saves to PNG; errors name the problem."""

import matplotlib.pyplot as plt
import pandas as pd
import pytest
import torch
from matplotlib.figure import Figure

from pyro_multihop import ChainedAttention, Observations, transitive_task
from pyro_multihop.plots import (
    plot_embeddings,
    plot_emission,
    plot_hop_marginals,
    plot_key_tables,
    plot_training_curves,
)


@pytest.fixture
def head():
    return ChainedAttention(2, 30, 30, sigma2=0.1, seed=0)


def metrics_frame(with_val=True):
    frame = pd.DataFrame({"step": [0, 10, 20], "loss": [3.4, 1.2, 0.5], "lr": [0.05, 0.04, 0.03]})
    if with_val:
        frame["val_log_likelihood"] = [-3.4, -1.3, -0.6]
        frame["val_accuracy"] = [0.03, 0.6, 0.85]
    return frame


def saves(figure, tmp_path, name="figure.png"):
    assert isinstance(figure, Figure)
    path = tmp_path / name
    figure.savefig(path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_training_curves(tmp_path):
    both = plot_training_curves(metrics_frame())
    assert len(both.axes) == 2
    saves(both, tmp_path)
    assert len(plot_training_curves(metrics_frame(with_val=False)).axes) == 1
    assert len(plot_training_curves(metrics_frame(), which="accuracy").axes) == 1
    loss_axis = plot_training_curves(metrics_frame(), which="loss", title="run").axes[0]
    assert [line.get_label() for line in loss_axis.get_lines()] == ["training loss", "held-out loss"]


def test_training_curves_mark_divergences():
    frame = metrics_frame()
    frame.attrs["divergences"] = [{"step": 10, "loss": 5.0, "best_loss": 1.0, "best_step": 5, "lr": 0.01}]
    axis = plot_training_curves(frame, which="loss").axes[0]
    assert len(axis.get_lines()) == 3  # two curves and the event


@pytest.mark.parametrize(
    "frame, kwargs, error, match",
    [
        (metrics_frame().drop(columns=["loss"]), {}, ValueError, "loss"),
        (metrics_frame(with_val=False), {"which": "accuracy"}, ValueError, "val_accuracy"),
        (metrics_frame(), {"which": "everything"}, ValueError, "which"),
        ([1, 2, 3], {}, TypeError, "DataFrame"),
    ],
    ids=["no-loss", "no-val", "bad-which", "not-a-frame"],
)
def test_training_curves_errors(frame, kwargs, error, match):
    with pytest.raises(error, match=match):
        plot_training_curves(frame, **kwargs)


def test_key_tables_and_emission(head, tmp_path):
    figure = plot_key_tables(head, title="keys")
    assert len(figure.axes) == 3  # two hops and the colour bar
    saves(figure, tmp_path, "keys.png")
    saves(plot_emission(head), tmp_path, "emission.png")
    assert len(plot_key_tables(ChainedAttention(3, 5, 4)).axes) == 4


def test_hop_marginals(head, tmp_path):
    obs = transitive_task(8, seed=0)
    figure = plot_hop_marginals(head, obs, rows=[0, 3, 7])
    assert len(figure.axes) == 4  # three rows and the colour bar
    saves(figure, tmp_path)
    labels = [t.get_text() for t in figure.axes[0].get_xticklabels()]
    assert labels[0] == f"{int(obs.keys[0, 0])}:{int(obs.values[0, 0])}"


def test_hop_marginals_with_padding(head):
    obs = transitive_task(2, seed=0)
    mask = torch.ones_like(obs.keys, dtype=torch.bool)
    mask[0, -2:] = False
    padded = Observations(obs.keys, obs.values, obs.query, obs.target, mask)
    figure = plot_hop_marginals(head, padded, rows=[0])
    labels = [t.get_text() for t in figure.axes[0].get_xticklabels()]
    assert labels[-2:] == ["pad", "pad"]


def test_hop_marginals_errors(head):
    obs = transitive_task(4, seed=0)
    with pytest.raises(ValueError, match="rows"):
        plot_hop_marginals(head, obs, rows=[4])
    with pytest.raises(ValueError, match="rows"):
        plot_hop_marginals(head, obs, rows=[])


def test_embeddings_of_the_tied_head(tmp_path, head):
    tied = pytest.importorskip("pyro_multihop.models.tied")
    model = tied.TiedEmbeddingAttention(10, 3, 10, seed=0)
    saves(plot_embeddings(model), tmp_path)
    with pytest.raises(TypeError, match="key_tables"):
        plot_key_tables(model)
    with pytest.raises(TypeError, match="embeddings"):
        plot_embeddings(head)


def test_no_pyplot_figures_are_left_open(head):
    before = plt.get_fignums()
    plot_key_tables(head)
    plot_training_curves(metrics_frame())
    assert plt.get_fignums() == before
