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
    assert [line.get_label() for line in loss_axis.get_lines()] == ["training loss", "held-out negative log-likelihood"]


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


def _inside_figure(figure):
    """Everything each axis draws (tick labels, axis labels, title; colourbars included) lies inside the
    canvas that ``savefig`` writes."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    canvas = FigureCanvasAgg(figure)
    canvas.draw()
    renderer = canvas.get_renderer()
    frame = figure.bbox
    for axis in figure.axes:
        box = axis.get_tightbbox(renderer)
        assert frame.x0 - 0.5 <= box.x0 and box.x1 <= frame.x1 + 0.5, (axis, box, frame.bounds)
        assert frame.y0 - 0.5 <= box.y0 and box.y1 <= frame.y1 + 0.5, (axis, box, frame.bounds)


def test_colourbars_are_labelled_and_their_ticks_stay_inside_the_figure():
    head = ChainedAttention(2, 30, 30, sigma2=0.1, seed=0)
    with torch.no_grad():
        head.key_tables.sub_(0.75)  # negative entries: the colourbar gets wide '−0.75' tick labels
    for figure, label in (
        (plot_key_tables(head, title="ChainedAttention (SVI, run/checkpoint.pt): key tables"), "key table entry"),
        (plot_emission(head), "p(target | value)"),
    ):
        colourbar = figure.axes[-1]
        assert label in colourbar.get_ylabel()
        _inside_figure(figure)
    from pyro_multihop import TiedEmbeddingAttention

    figure = plot_embeddings(TiedEmbeddingAttention(10, 4, 10, seed=0))
    assert any(axis.get_ylabel() == "posterior mean" for axis in figure.axes)
    _inside_figure(figure)


def test_training_curves_take_the_x_label_em_curves_count_iterations():
    figure = plot_training_curves(metrics_frame(), x_label="EM iteration")
    assert [axis.get_xlabel() for axis in figure.axes] == ["EM iteration", "EM iteration"]
    assert plot_training_curves(metrics_frame()).axes[0].get_xlabel() == "step"


def test_curves_evaluated_once_show_their_point_and_label_what_the_loss_is():
    """Variational EM evaluates the held-out data at its last iteration only: the point is drawn, the legend
    names only drawn lines, and the y label says the loss is the annealed ELBO."""
    frame = pd.DataFrame({"step": [1, 2, 3], "loss": [0.9, 0.1, 0.002],
                          "val_log_likelihood": [float("nan"), float("nan"), -1.3],
                          "val_accuracy": [float("nan"), float("nan"), 0.68]})
    frame.attrs["loss_label"] = "negative annealed ELBO per observation (nats)"
    loss_axis, accuracy_axis = plot_training_curves(frame).axes
    assert loss_axis.get_ylabel() == "negative annealed ELBO per observation (nats)"
    for axis in (loss_axis, accuracy_axis):
        drawn = {line.get_label(): len(line.get_xdata()) for line in axis.get_lines()}
        legend = [text.get_text() for text in axis.get_legend().get_texts()]
        assert legend and all(drawn[label] >= 1 for label in legend), (legend, drawn)
    (point,) = [line for line in accuracy_axis.get_lines() if line.get_label() == "held-out accuracy"]
    assert list(point.get_xdata()) == [3] and list(point.get_ydata()) == [0.68] and point.get_marker() == "o"
    lower, upper = accuracy_axis.get_xlim()
    assert lower <= 1 and upper >= 3


def test_the_best_held_out_step_is_marked():
    frame = metrics_frame()
    frame.attrs["best_val"] = {"step": 10, "log_likelihood": -1.3, "checkpoint": "runs/x/best.pt"}
    labels = [line.get_label() for line in plot_training_curves(frame).axes[0].get_lines()]
    assert "best held-out (step 10): best.pt" in labels


def test_words_label_the_axes_and_the_map_dots_are_explained(head):
    words = [f"w{s}" for s in range(30)]
    figure = plot_key_tables(head, symbols=words)
    assert [t.get_text() for t in figure.axes[0].get_xticklabels()][:3] == ["w0", "w1", "w2"]
    obs = transitive_task(3, seed=0)
    figure = plot_hop_marginals(head, obs, rows=[0, 1], symbols=words, targets=[f"t{s}" for s in range(30)])
    first = figure.axes[0]
    assert [t.get_text() for t in first.get_legend().get_texts()] == ["MAP hop path (given the target)"]
    key, value = int(obs.keys[0, 0]), int(obs.values[0, 0])
    assert first.get_xticklabels()[0].get_text() == f"w{key}:w{value}"
    assert f"target t{int(obs.target[0])}" in first.get_title()


def test_embedding_circles_have_the_posterior_sd_as_radius_and_symbols_integer_ticks():
    from pyro_multihop import TiedEmbeddingAttention

    model = TiedEmbeddingAttention(10, 4, 10, seed=0)
    figure = plot_embeddings(model)
    heat, scatter = figure.axes[:2]  # heatmap, projection (then the colour bar)
    assert [t.get_text() for t in heat.get_yticklabels()] == [str(s) for s in range(10)]
    _, scale = model.embeddings()
    radii = sorted(patch.get_radius() for patch in scatter.patches)
    assert radii == pytest.approx(sorted(scale.mean(1).tolist()), rel=1e-5)
    assert scatter.get_aspect() == 1.0


def fact_questions(num_facts, n=2, hops=3, seed=0):
    """``(head, data)``: ``n`` questions of ``num_facts`` facts (subject, relation, object) with three supporting
    facts, and a random float64 facts head over their vocabulary (its posterior spreads over many facts)."""
    import random

    import factories

    from pyro_multihop.datasets.qa_jsonl import QARecord, QAVocabulary

    rng = random.Random(seed)
    people = [f"p{i}" for i in range(25)]
    records = []
    for _ in range(n):
        facts = [(rng.choice(people), rng.choice(["parent", "lives"]), rng.choice(people)) for _ in range(num_facts)]
        supporting = tuple(rng.sample(range(num_facts), min(3, num_facts)))
        records.append(QARecord(tuple(facts), ("where", "is", facts[supporting[0]][0]), facts[supporting[-1]][2], supporting))
    vocabulary = QAVocabulary.build(records)
    head = factories.random_fact_head(hops, 3, vocabulary.num_symbols, 3, seed=seed, scale=1.0)
    return head, vocabulary.encode(records)


def drawn_facts(axis):
    """The fact indices of a panel's row labels (``*12: text`` or ``12: text``), top to bottom."""
    return [int(label.get_text().split(":")[0].lstrip("*")) for label in axis.get_yticklabels()]


def test_fact_posteriors_of_a_long_question_draw_the_facts_that_carry_the_mass(tmp_path):
    """40 facts: each hop's most probable fact, the question-only MAP path's facts and the supporting facts are
    drawn (with their text), the MAP dots land on drawn rows inside the panel, hop labels are separate."""
    from pyro_multihop.experiments import qa
    from pyro_multihop.plots import facts_to_draw, plot_fact_posteriors

    assert qa.plot_fact_posteriors is plot_fact_posteriors  # the old import path keeps working
    head, data = fact_questions(40)
    figure = plot_fact_posteriors(head, data, [0, 1])
    saves(figure, tmp_path, "facts.png")
    panels = [axis for axis in figure.axes if axis.get_label() != "<colorbar>"]
    assert len(panels) == 2
    marginals = head.posterior(data.obs[:2]).hop_marginals
    paths = head.map_paths(data.obs[:2], given_target=False)
    for row, axis in enumerate(panels):
        facts = drawn_facts(axis)
        assert facts == sorted(facts) and 3 <= len(facts) <= 16  # a selection, in fact order
        most = marginals[:, row].topk(3, dim=-1).indices.flatten().tolist()  # each hop's 3 most probable facts
        wanted = set(most) | set(paths[row].tolist()) | set(data.records[row].supporting)
        assert wanted <= set(facts)
        for label in axis.get_yticklabels():
            index = int(label.get_text().split(":")[0].lstrip("*"))
            assert label.get_text().endswith(" ".join(data.records[row].facts[index]))
            assert label.get_text().startswith("*") == (index in data.records[row].supporting)
        dots = axis.collections[0].get_offsets()
        assert [facts[int(y)] for y in dots[:, 1]] == paths[row].tolist()
        bottom, top = axis.get_ylim()
        assert all(top <= y <= bottom for y in dots[:, 1])  # inside the panel (imshow's y axis points down)
        assert [label.get_text() for label in axis.get_xticklabels()] == ["hop 1", "hop 2", "hop 3"]
        assert "of 40 facts shown" in axis.get_title(loc="left").replace("\n", " ")
    assert facts_to_draw(marginals[:, 0].numpy(), paths[0].tolist(), None, 10) == list(range(10))


@pytest.mark.parametrize("num_facts", [3, 200])
def test_fact_posteriors_read_alike_from_3_to_200_facts(num_facts, tmp_path):
    from pyro_multihop.plots import plot_fact_posteriors

    head, data = fact_questions(num_facts, n=1, hops=2, seed=1)
    figure = plot_fact_posteriors(head, data, [0])
    saves(figure, tmp_path)
    facts = drawn_facts(figure.axes[0])
    assert facts == list(range(3)) if num_facts == 3 else 3 <= len(facts) <= 16
    assert figure.get_size_inches()[1] < 8  # a long context does not make a tall figure
