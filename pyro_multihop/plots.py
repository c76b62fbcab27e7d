"""Figures of training runs and fitted heads. Every function takes data and returns a
:class:`matplotlib.figure.Figure`; nothing is shown or saved, and no pyplot state or backend is touched
(``figure.savefig(path)`` works under any backend, Agg included).

Example::

    >>> from pyro_multihop import ChainedAttention, transitive_task
    >>> from pyro_multihop.plots import plot_hop_marginals, plot_key_tables
    >>> head = ChainedAttention(2, 30, 30, sigma2=0.1, seed=0)
    >>> figure = plot_key_tables(head)
    >>> len(figure.axes) >= 2
    True
    >>> figure = plot_hop_marginals(head, transitive_task(10, seed=0), rows=[0, 1])
"""

from __future__ import annotations

import math
import os
import textwrap
from typing import List, Optional, Sequence

import numpy as np
import pandas as pd
import torch
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, MaxNLocator

__all__ = [
    "plot_training_curves",
    "plot_key_tables",
    "plot_emission",
    "plot_hop_marginals",
    "plot_fact_posteriors",
    "facts_to_draw",
    "plot_embeddings",
]


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().cpu().double().numpy()


def plot_training_curves(
    metrics: pd.DataFrame, which: str = "both", title: Optional[str] = None, x_label: str = "step",
    loss_label: Optional[str] = None,
) -> Figure:
    """Training curves: the loss per observation against step and, if present, the held-out accuracy.

    :param metrics: a DataFrame with columns ``step`` and ``loss`` and optionally ``val_accuracy`` and
        ``val_log_likelihood`` (what :func:`~pyro_multihop.train.fit_svi` returns; the CLI writes the same
        columns for EM, one row per iteration). Held-out values may be NaN where they were not evaluated:
        the points that exist are drawn, with markers. Divergence events in ``metrics.attrs["divergences"]``
        are marked with dotted lines, the best held-out step (``metrics.attrs["best_val"]["step"]``) with a
        dashed line and a star.
    :param str which: ``"loss"``, ``"accuracy"`` (needs ``val_accuracy``) or ``"both"`` (the accuracy panel
        only if there is one).
    :param str title: figure title; say the method and the data (``"chained head, SVI on train.csv"``).
    :param str x_label: label of the x axis, i.e. what the ``step`` column counts: ``"step"`` for SVI,
        ``"EM iteration"`` for EM.
    :param str loss_label: y label of the loss panel, what the ``loss`` column is (default
        ``metrics.attrs["loss_label"]``, else the negative log-likelihood per observation).
    """
    if not isinstance(metrics, pd.DataFrame):
        raise TypeError(f"metrics must be a pandas DataFrame, got {type(metrics).__name__}")
    if which not in ("both", "loss", "accuracy"):
        raise ValueError(f"which must be 'both', 'loss' or 'accuracy', got {which!r}")
    missing = [c for c in ("step", "loss") if c not in metrics.columns]
    if missing:
        raise ValueError(f"metrics must have the columns step and loss; missing {missing}")
    has_val = "val_accuracy" in metrics.columns and metrics["val_accuracy"].notna().any()
    if which == "accuracy" and not has_val:
        raise ValueError("metrics must have a val_accuracy column to plot the accuracy (train with val data)")
    loss_label = loss_label or metrics.attrs.get("loss_label") or "negative log-likelihood per observation (nats)"
    best = metrics.attrs.get("best_val") or {}
    panels = {"loss": ["loss"], "accuracy": ["accuracy"], "both": ["loss"] + (["accuracy"] if has_val else [])}[which]
    figure = Figure(figsize=(5.5 * len(panels), 4), layout="constrained")
    axes = dict(zip(panels, figure.subplots(1, len(panels), squeeze=False)[0]))
    if "loss" in axes:
        axis = axes["loss"]
        axis.plot(metrics["step"], metrics["loss"], color="C0", label="training loss")
        if "val_log_likelihood" in metrics.columns:
            _plot_points(axis, metrics["step"], -metrics["val_log_likelihood"], "C1",
                         "held-out negative log-likelihood", best)
        for event in metrics.attrs.get("divergences", []) or []:
            axis.axvline(event["step"], color="C3", linestyle=":", linewidth=1)
        values = pd.concat([metrics["loss"], -metrics.get("val_log_likelihood", pd.Series(dtype=float))]).dropna()
        if len(values) and (values > 0).all():
            axis.set_yscale("log")
            _plain_log_ticks(axis)
        axis.set_xlabel(x_label)
        axis.set_ylabel(loss_label)
        axis.legend(loc="upper right")
        axis.grid(True, which="both", alpha=0.3)
    if "accuracy" in axes:
        axis = axes["accuracy"]
        _plot_points(axis, metrics["step"], metrics["val_accuracy"], "C2", "held-out accuracy", best)
        axis.set_xlim(float(metrics["step"].min()) - 0.5, float(metrics["step"].max()) + 0.5)
        axis.set_xlabel(x_label)
        axis.set_ylabel("held-out accuracy")
        axis.set_ylim(0, 1)
        axis.legend(loc="lower right")
        axis.grid(True, alpha=0.3)
    if title:
        figure.suptitle(title)
    return figure


def _plot_points(axis, steps: pd.Series, values: pd.Series, color: str, label: str, best: dict) -> None:
    """A held-out series where it was evaluated (markers, so that a single point shows), and its best step."""
    known = values.notna()
    steps, values = steps[known], values[known]
    axis.plot(steps, values, color=color, marker="o", markersize=3, label=label)
    best_step = best.get("step")
    if best_step is not None and (steps == best_step).any():
        where = f": {os.path.basename(best['checkpoint'])}" if best.get("checkpoint") else ""
        axis.axvline(best_step, color=color, linestyle="--", linewidth=1)
        axis.plot([best_step], [values[steps == best_step].iloc[0]], color=color, marker="*", markersize=12,
                  linestyle="none", label=f"best held-out (step {best_step}){where}")


def _plain_log_ticks(axis) -> None:
    """Label a log y axis with plain numbers (0.2, 0.3, 0.5, 1, 2, ...) instead of powers of ten."""

    def label(y, _):
        if y <= 0:
            return ""
        mantissa = round(y / 10 ** math.floor(math.log10(y)), 6)
        return f"{y:g}" if mantissa in (1, 2, 3, 5) else ""

    axis.yaxis.set_major_formatter(FuncFormatter(label))
    axis.yaxis.set_minor_formatter(FuncFormatter(label))


#: Up to this many symbols, heatmap axes name every symbol (a word when a vocabulary is given).
MAX_LABELLED_SYMBOLS = 40


def _symbol_ticks(axis, count: int, names: Optional[Sequence[str]], which: str) -> None:
    """Integer ticks on ``which`` axis ("x" or "y"), labelled with ``names`` (words) when given and few."""
    if count > MAX_LABELLED_SYMBOLS:
        getattr(axis, f"{which}axis").set_major_locator(MaxNLocator(integer=True))
        return
    labels = [str(i) for i in range(count)] if names is None else [str(n) for n in list(names)[:count]]
    ticks = getattr(axis, f"set_{which}ticks")
    ticks(np.arange(count), labels, fontsize=6 if names is not None else 7, rotation=90 if which == "x" else 0)


def plot_key_tables(model, title: Optional[str] = None, symbols: Optional[Sequence[str]] = None) -> Figure:
    """Heatmaps of the key tables ``K[l]`` of a :class:`~pyro_multihop.models.ChainedAttention`, one per hop
    (row: key symbol, column: query symbol). ``symbols``: optional words of the symbols, for the axes."""
    tables = getattr(model, "key_tables", None)
    if not isinstance(tables, torch.Tensor) or tables.dim() != 3:
        raise TypeError(f"model must have (L, S, S) key_tables (a ChainedAttention), got {type(model).__name__}")
    tables = _numpy(tables)
    n_hops = tables.shape[0]
    figure = Figure(figsize=(4.2 * n_hops + 0.8, 4), layout="constrained")
    axes = figure.subplots(1, n_hops, squeeze=False)[0]
    limit = max(float(np.abs(tables).max()), 1e-12)
    image = None
    for hop, axis in enumerate(axes):
        image = axis.imshow(tables[hop], cmap="RdBu_r", vmin=-limit, vmax=limit, interpolation="nearest")
        axis.set_title(f"hop {hop + 1}: K[{hop + 1}]")
        axis.set_xlabel("query symbol")
        axis.set_ylabel("key symbol")
        _symbol_ticks(axis, tables.shape[2], symbols, "x")
        _symbol_ticks(axis, tables.shape[1], symbols, "y")
    figure.colorbar(image, ax=list(axes), shrink=0.8, label="key table entry K[l][key, query]")
    if title:
        figure.suptitle(title)
    return figure


def plot_emission(model, title: Optional[str] = None, symbols: Optional[Sequence[str]] = None,
                  targets: Optional[Sequence[str]] = None) -> Figure:
    """Heatmap of the emission table ``p(target | last attended value)`` (row: value symbol, column: target);
    ``symbols`` and ``targets``: optional words for the axes."""
    emission = getattr(model, "emission", None)
    if not isinstance(emission, torch.Tensor) or emission.dim() != 2:
        raise TypeError(f"model must have an (S, T) emission table, got {type(model).__name__}")
    figure = Figure(figsize=(5, 4.2), layout="constrained")
    axis = figure.subplots()
    image = axis.imshow(_numpy(emission), cmap="viridis", vmin=0, vmax=1, interpolation="nearest")
    axis.set_xlabel("target")
    axis.set_ylabel("value symbol")
    _symbol_ticks(axis, emission.shape[1], targets, "x")
    _symbol_ticks(axis, emission.shape[0], symbols, "y")
    axis.set_title(title or "emission p(target | value)")
    figure.colorbar(image, ax=axis, shrink=0.8, label="p(target | value)")
    return figure


def plot_hop_marginals(model, obs, rows: Sequence[int] = (0,), title: Optional[str] = None,
                       symbols: Optional[Sequence[str]] = None, targets: Optional[Sequence[str]] = None) -> Figure:
    """Posterior hop marginals ``p(z_l = i | observation)`` of chosen rows: one panel per row, hops down,
    context positions across (labelled ``key:value``), the MAP hop path (the most probable path given the
    target) marked with red dots, explained in a legend.

    :param model: a fitted head (``posterior``).
    :param obs: :class:`~pyro_multihop.data.Observations`.
    :param rows: indices of the observations to show.
    :param symbols: optional words of the symbols (keys, values, query); ``targets``: of the targets.
    """

    def word(names, index: int) -> str:
        return str(names[index]) if names is not None and 0 <= index < len(names) else str(index)

    rows = [int(r) for r in rows]
    if not rows:
        raise ValueError("rows must name at least one observation")
    bad = [r for r in rows if not -len(obs) <= r < len(obs)]
    if bad:
        raise ValueError(f"rows must be indices into the {len(obs)} observations, got {bad}")
    subset = obs[torch.tensor(rows)]
    with torch.no_grad():
        posterior = model.posterior(subset)
    marginals = _numpy(posterior.hop_marginals)  # (L, r, N)
    paths = posterior.map_paths.cpu().numpy()
    mask = subset.full_mask().cpu().numpy()
    n_hops = marginals.shape[0]
    figure = Figure(figsize=(max(5.0, 0.55 * subset.context_len + 1.5), 1.0 + (0.45 * n_hops + 0.9) * len(rows)), layout="constrained")
    axes = figure.subplots(len(rows), 1, squeeze=False)[:, 0]
    image = None
    for k, axis in enumerate(axes):
        image = axis.imshow(marginals[:, k, :], cmap="Greys", vmin=0, vmax=1, aspect="auto", interpolation="nearest")
        axis.scatter(paths[k], np.arange(n_hops), color="C3", s=18, label="MAP hop path (given the target)")
        labels = [
            f"{word(symbols, key)}:{word(symbols, value)}" if real else "pad"
            for key, value, real in zip(subset.keys[k].tolist(), subset.values[k].tolist(), mask[k])
        ]
        axis.set_xticks(np.arange(len(labels)), labels, rotation=90, fontsize=7)
        axis.set_yticks(np.arange(n_hops), [f"z_{hop + 1}" for hop in range(n_hops)])
        axis.set_title(
            f"row {rows[k]}: query {word(symbols, int(subset.query[k]))}, "
            f"target {word(targets, int(subset.target[k]))}", fontsize=9
        )
        if k == 0:
            axis.legend(loc="upper left", bbox_to_anchor=(0, 1.6 if n_hops < 3 else 1.35), fontsize=7, frameon=False)
    axes[-1].set_xlabel("context position (key:value)")
    figure.colorbar(image, ax=list(axes), shrink=0.8, label="posterior probability")
    if title:
        figure.suptitle(title)
    return figure


#: Questions with at most this many facts are drawn whole; longer ones show the facts that carry the mass.
MAX_DRAWN_FACTS = 16

#: Characters of a fact's text in its row label (longer texts end in "...").
FACT_LABEL_CHARS = 48


def facts_to_draw(marginals, path: Sequence[int], supporting: Optional[Sequence[int]], num_facts: int,
                  max_facts: int = MAX_DRAWN_FACTS, top: int = 3) -> List[int]:
    """The facts of one question that :func:`plot_fact_posteriors` draws, in order: all ``num_facts`` when there
    are at most ``max_facts``; otherwise the ``top`` most probable facts of each hop (``marginals``, ``(L, N)``
    with ``N >= num_facts``), the supporting facts and those of ``path`` (the MAP path), which hold the posterior
    mass and what the reader compares it with."""
    if num_facts <= max_facts:
        return list(range(num_facts))
    marginals = np.asarray(marginals)[:, :num_facts]
    chosen = {int(fact) for fact in path} | {int(fact) for fact in (supporting or ())}
    for hop in marginals:
        chosen |= {int(fact) for fact in np.argsort(-hop, kind="stable")[:top]}
    return sorted(fact for fact in chosen if 0 <= fact < num_facts)


def _fact_label(index: int, fact: Sequence[str], supporting: set) -> str:
    text = " ".join(fact)
    text = text if len(text) <= FACT_LABEL_CHARS else text[: FACT_LABEL_CHARS - 3] + "..."
    return f"{'*' if index in supporting else ''}{index}: {text}"


def plot_fact_posteriors(head, data, rows: Sequence[int], title: Optional[str] = None,
                         max_facts: int = MAX_DRAWN_FACTS, marginals=None, paths=None,
                         given: str = "question and answer", budget: Optional[int] = None) -> Figure:
    """Hop marginals over the facts of some questions: one panel a question, stacked; facts down (their index and
    text; ``*`` the supporting ones), hops across (``hop 1``, ``hop 2``, ...), the MAP path given the question
    alone as red dots, one colour bar. A question of more than ``max_facts`` facts shows only the facts that
    carry the mass (:func:`facts_to_draw`: the top facts of each hop, the supporting facts, the MAP path's), a
    dashed line where facts are left out, so that 3 or 200 facts read alike.

    :param head: a fitted :class:`~pyro_multihop.models.facts.FactAttention`.
    :param data: encoded questions with ``obs`` (:class:`~pyro_multihop.fact_data.FactObservations`) and
        ``records`` (each with ``facts``, ``question``, ``answer`` and ``supporting``), e.g. a
        :class:`~pyro_multihop.datasets.qa_jsonl.QAData`.
    :param rows: the questions to draw.
    :param marginals: ``(L, len(rows), N)`` hop marginals to draw instead of the posterior given the answers
        (``head.posterior``; e.g. the question-only ones where there is no answer); ``given`` says what they are
        conditioned on. :param paths: ``(len(rows), L)`` instead of ``head.map_paths(given_target=False)``.
    :param budget: the engine's memory budget for those queries (default: the current one).
    """
    rows = [int(row) for row in rows]
    if not rows or any(not 0 <= row < len(data.records) for row in rows):
        raise ValueError(f"rows must be indices into the {len(data.records)} questions, got {rows}")
    subset = data.obs[torch.tensor(rows)]
    with torch.no_grad():
        marginals = head.posterior(subset, budget=budget).hop_marginals if marginals is None else torch.as_tensor(marginals)
        paths = head.map_paths(subset, given_target=False, budget=budget) if paths is None else torch.as_tensor(paths)
    marginals, paths = _numpy(marginals), paths.cpu().numpy()  # (L, r, N), (r, L)
    hops = marginals.shape[0]
    records = [data.records[row] for row in rows]
    drawn = [facts_to_draw(marginals[:, k], paths[k], record.supporting, len(record.facts), max_facts)
             for k, record in enumerate(records)]
    heights = [len(facts) + 2.2 for facts in drawn]  # rows, plus the title's and the hop labels' lines
    figure = Figure(figsize=(4.6 + 0.75 * hops, 0.24 * sum(heights) + 1.0), layout="constrained")
    axes = figure.subplots(len(rows), 1, squeeze=False, gridspec_kw={"height_ratios": heights})[:, 0]
    image = None
    for k, (axis, record, facts) in enumerate(zip(axes, records, drawn)):
        image = axis.imshow(marginals[:, k, facts].T, cmap="Blues", vmin=0, vmax=1, aspect="auto",
                            interpolation="nearest")
        place = {fact: y for y, fact in enumerate(facts)}
        axis.scatter(range(hops), [place[int(fact)] for fact in paths[k]], color="C3", s=18, zorder=3,
                     label="MAP path given the question")
        for y in range(1, len(facts)):
            if facts[y] != facts[y - 1] + 1:  # facts left out between these rows
                axis.axhline(y - 0.5, color="0.55", linestyle="--", linewidth=0.7)
        support = set(record.supporting or ())
        axis.set_yticks(range(len(facts)), [_fact_label(fact, record.facts[fact], support) for fact in facts], fontsize=7)
        axis.set_xticks(range(hops), [f"hop {hop + 1}" for hop in range(hops)], fontsize=7)
        axis.tick_params(axis="x", top=True, labeltop=True, bottom=False, labelbottom=False)
        answer = record.answer if record.answer is not None else "(no answer given)"
        shown = ""
        if len(facts) < len(record.facts):
            mass = ", ".join(f"{100 * float(marginals[hop, k, facts].sum()):.0f}%" for hop in range(hops))
            shown = f"; {len(facts)} of {len(record.facts)} facts shown, holding {mass} of the hops' mass"
        order = f"supporting facts (*) {', '.join(map(str, record.supporting))}" if record.supporting else "no supporting facts"
        heading = f"question {rows[k]}: {' '.join(record.question)} -> {answer} ({order}{shown})"
        axis.set_title("\n".join(textwrap.wrap(heading, 70)), fontsize=8, loc="left")
    figure.suptitle(title or f"hop marginals over facts, given the {given}", fontsize=9)
    figure.legend(*axes[0].get_legend_handles_labels(), loc="outside lower center", fontsize=7, frameon=False)
    figure.colorbar(image, ax=list(axes), shrink=min(0.8, 6.0 / max(sum(heights), 1) + 0.3),
                    label="hop marginal probability")
    return figure


def plot_embeddings(model, title: Optional[str] = None, symbols: Optional[Sequence[str]] = None) -> Figure:
    """Posterior embeddings of a tied-embedding head (``model.embeddings() -> (mean, scale)``): the means as a
    heatmap (left, one row per symbol) and their projection on the first two principal axes (right), each
    symbol labelled and drawn as a circle whose radius is its mean posterior standard deviation, in the units
    of the axes (equal aspect), so that overlapping circles are symbols the posterior cannot tell apart."""
    from matplotlib.patches import Circle

    if not callable(getattr(model, "embeddings", None)):
        raise TypeError(f"model must have embeddings() (a tied-embedding head), got {type(model).__name__}")
    mean, scale = model.embeddings()
    mean, scale = _numpy(mean), _numpy(scale)
    figure = Figure(figsize=(10, 4.6), layout="constrained")
    heat_axis, scatter_axis = figure.subplots(1, 2)
    limit = max(float(np.abs(mean).max()), 1e-12)
    image = heat_axis.imshow(mean, cmap="RdBu_r", vmin=-limit, vmax=limit, aspect="auto", interpolation="nearest")
    heat_axis.set_xlabel("embedding dimension")
    heat_axis.set_ylabel("symbol")
    heat_axis.xaxis.set_major_locator(MaxNLocator(integer=True))
    _symbol_ticks(heat_axis, mean.shape[0], symbols, "y")
    heat_axis.set_title("posterior means")
    figure.colorbar(image, ax=heat_axis, shrink=0.8, label="posterior mean")
    centred = mean - mean.mean(0, keepdims=True)
    if centred.shape[1] >= 2 and np.abs(centred).max() > 0:
        _, _, axes_t = np.linalg.svd(centred, full_matrices=False)
        projected = centred @ axes_t[:2].T
    else:
        projected = np.concatenate([centred[:, :1], np.zeros((centred.shape[0], 1))], axis=1)
    radius = scale.mean(1)
    for index, ((x, y), r) in enumerate(zip(projected, radius)):
        scatter_axis.add_patch(Circle((x, y), r, alpha=0.25, color="C0"))
        name = str(symbols[index]) if symbols is not None and index < len(symbols) else str(index)
        scatter_axis.annotate(name, (x, y), fontsize=7, ha="center", va="center")
    reach = float(np.abs(projected).max() + radius.max()) * 1.05 or 1.0
    scatter_axis.set_xlim(-reach, reach)
    scatter_axis.set_ylim(-reach, reach)
    scatter_axis.set_aspect("equal")
    scatter_axis.set_xlabel("principal axis 1")
    scatter_axis.set_ylabel("principal axis 2")
    scatter_axis.set_title(f"means on the first two principal axes\n(circle radius: mean posterior sd, "
                           f"{radius.min():.2g} to {radius.max():.2g})")
    if title:
        figure.suptitle(title)
    return figure
