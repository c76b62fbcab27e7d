"""Symbol embeddings, and inspecting them: alignment, 2-D projection with uncertainty, neighbours, plots.

Both embedding heads hold one embedding per symbol, a matrix ``E`` ``(S, D)``: the tied head
(:class:`~pyro_multihop.models.tied.TiedEmbeddingAttention`, a mean-field posterior) and the structured-facts head
with ``embed_dim=D`` (:class:`~pyro_multihop.models.facts.FactAttention`, a point estimate by default, or a mean-field
posterior with ``embedding_posterior="mean_field"``). Each gives it as a :class:`SymbolEmbeddings` (``mean``, and
``scale`` or None for a point estimate) from ``head.embeddings()``, and every function here takes a head, a
:class:`SymbolEmbeddings` or a plain ``(S, D)`` matrix where it takes the means (:func:`symbol_embeddings`).

The tied head's likelihood depends on the embeddings only through their distances, so a fitted posterior
is defined up to an orthogonal transformation (and, but for the prior, a translation): compare two fits
after :func:`procrustes_align`. :func:`project_2d` maps the means to their first two principal axes and
carries each symbol's diagonal posterior covariance through the same linear map, for
:func:`plot_embedding_posterior` to draw as ellipses.

Example::

    >>> import torch
    >>> from pyro_multihop.embeddings import nearest_neighbours, procrustes_align, project_2d
    >>> mean, scale = torch.randn(10, 4), torch.full((10, 4), 0.1)
    >>> rotation = torch.linalg.qr(torch.randn(4, 4)).Q
    >>> aligned, found = procrustes_align(mean @ rotation, mean)
    >>> bool(torch.allclose(aligned, mean, atol=1e-5))
    True
    >>> projection = project_2d(mean, scale)
    >>> projection.points.shape, projection.covariances.shape
    (torch.Size([10, 2]), torch.Size([10, 2, 2]))
    >>> nearest_neighbours(mean, k=3).indices.shape
    torch.Size([10, 3])
"""

from __future__ import annotations

import math
from typing import NamedTuple, Optional, Sequence

import torch

__all__ = [
    "SymbolEmbeddings",
    "symbol_embeddings",
    "Projection2D",
    "Neighbours",
    "procrustes_align",
    "project_2d",
    "nearest_neighbours",
    "plot_embedding_posterior",
]


class SymbolEmbeddings(NamedTuple):
    """One embedding per symbol: a point estimate (``scale`` None) or a diagonal normal posterior.

    A pair, so that ``mean, scale = head.embeddings()`` reads it.

    :ivar mean: ``(S, D)`` the point estimate, or the posterior means.
    :ivar scale: ``(S, D)`` posterior standard deviations, or None for a point estimate.
    """

    mean: torch.Tensor
    scale: Optional[torch.Tensor] = None

    def sample(self, num_samples: int, seed: Optional[int] = None) -> torch.Tensor:
        """``(num_samples, S, D)`` independent draws ``mean + scale * eps`` (a point estimate: ``mean`` repeated).

        :param seed: seed of a private ``torch.Generator``; None: a fresh random seed.
        """
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
        mean = self.mean.detach()
        if self.scale is None:
            return mean.expand(num_samples, *mean.shape).clone()
        generator = torch.Generator(device=mean.device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(int(seed))
        noise = torch.randn((num_samples, *mean.shape), generator=generator, dtype=mean.dtype, device=mean.device)
        return mean + self.scale.detach() * noise


def symbol_embeddings(source, scale=None) -> SymbolEmbeddings:
    """:class:`SymbolEmbeddings` of ``source``: a head with ``embeddings()`` (the tied head; the facts head with
    ``embed_dim``), a :class:`SymbolEmbeddings`, or an ``(S, D)`` matrix of means with ``scale`` (``(S, D)`` or
    None). ``ValueError`` for a head without embeddings (the facts head's tables) or a scale given twice."""
    if callable(getattr(source, "embeddings", None)):
        found = source.embeddings()
        if found is None:
            raise ValueError(f"{type(source).__name__} has no symbol embeddings (a table head: build it with embed_dim)")
        source = found
    if isinstance(source, SymbolEmbeddings):
        if scale is not None and source.scale is not None:
            raise ValueError("scale is given twice: by the embeddings and by the scale argument")
        return SymbolEmbeddings(source.mean, source.scale if scale is None else scale)
    return SymbolEmbeddings(source, scale)


class Projection2D(NamedTuple):
    """Embeddings projected on their first two principal axes.

    :ivar points: ``(S, 2)`` projected posterior means.
    :ivar covariances: ``(S, 2, 2)`` projected posterior covariances ``W^T diag(scale_s^2) W`` (zeros if no
        scale was given).
    :ivar components: ``(D, 2)`` orthonormal principal axes ``W`` (columns), each signed so that its largest
        loading is positive.
    :ivar center: ``(D,)`` mean of the posterior means (the projection is ``(mean - center) @ W``).
    :ivar explained_variance: ``(2,)`` variance of the means along each axis.
    """

    points: torch.Tensor
    covariances: torch.Tensor
    components: torch.Tensor
    center: torch.Tensor
    explained_variance: torch.Tensor


class Neighbours(NamedTuple):
    """:ivar indices: ``(S, k)`` nearest other symbols, closest first. :ivar distances: ``(S, k)`` Euclidean."""

    indices: torch.Tensor
    distances: torch.Tensor


def _as_matrix(name: str, value, min_rows: int = 1, min_cols: int = 1) -> torch.Tensor:
    tensor = torch.as_tensor(value)
    if not tensor.dtype.is_floating_point:
        tensor = tensor.to(torch.get_default_dtype())
    if tensor.dim() != 2:
        raise ValueError(f"{name} must be a matrix (S, D), got shape {tuple(tensor.shape)}")
    if tensor.shape[0] < min_rows or tensor.shape[1] < min_cols:
        raise ValueError(
            f"{name} must have at least {min_rows} rows and {min_cols} columns, got shape {tuple(tensor.shape)}"
        )
    if not torch.isfinite(tensor).all():
        raise ValueError(f"{name} must be finite, got a NaN or inf entry")
    return tensor.detach()


def procrustes_align(embeddings, reference, center: bool = False):
    """Orthogonal Procrustes: the orthogonal ``R`` minimising ``||embeddings @ R - reference||_F``.

    ``R = U V^T`` from the SVD ``embeddings^T reference = U Sigma V^T`` (reflections allowed: the model is
    invariant to them too).

    :param embeddings: ``(S, D)``, e.g. posterior means of one fit (or a head, or :class:`SymbolEmbeddings`: its
        means).
    :param reference: ``(S, D)``, e.g. those of another fit or a ground truth (or a head, its means).
    :param bool center: remove both column means first and add the reference's back (also aligns a
        translation); default False, a pure rotation/reflection about the origin (the prior's center).
    :returns: ``(aligned (S, D), rotation (D, D))``, ``aligned = embeddings @ rotation`` (centered as asked).
    """
    embeddings = _as_matrix("embeddings", symbol_embeddings(embeddings).mean)
    reference = _as_matrix("reference", symbol_embeddings(reference).mean).to(embeddings.dtype)
    if reference.shape != embeddings.shape:
        raise ValueError(
            f"reference must have the shape of embeddings {tuple(embeddings.shape)}, got {tuple(reference.shape)}"
        )
    source, target = embeddings, reference
    if center:
        source = embeddings - embeddings.mean(0)
        target = reference - reference.mean(0)
    u, _, vh = torch.linalg.svd(source.T @ target)
    rotation = u @ vh
    aligned = source @ rotation
    if center:
        aligned = aligned + reference.mean(0)
    return aligned, rotation


def project_2d(mean, scale=None) -> Projection2D:
    """Project posterior means on their first two principal axes, and the diagonal posterior covariances
    through the same map: ``cov_s = W^T diag(scale_s^2) W``.

    :param mean: ``(S, D)`` posterior means, ``S >= 2``, ``D >= 2`` (or a head, or :class:`SymbolEmbeddings`: its
        means and scales).
    :param scale: ``(S, D)`` posterior standard deviations, or None.
    """
    mean, scale = symbol_embeddings(mean, scale)
    mean = _as_matrix("mean", mean, min_rows=2, min_cols=2)
    if scale is not None:
        scale = _as_matrix("scale", scale).to(mean.dtype)
        if scale.shape != mean.shape:
            raise ValueError(f"scale must have the shape of mean {tuple(mean.shape)}, got {tuple(scale.shape)}")
        if (scale < 0).any():
            raise ValueError("scale must be non-negative (posterior standard deviations)")
    center = mean.mean(0)
    centered = mean - center
    _, singular_values, vh = torch.linalg.svd(centered, full_matrices=False)
    components = vh[:2].T.clone()  # (D, 2)
    # Deterministic signs: the largest loading of each axis is positive.
    largest = components.abs().argmax(0)
    signs = torch.sign(components[largest, torch.arange(2)])
    signs[signs == 0] = 1
    components = components * signs
    points = centered @ components
    variances = torch.zeros_like(mean) if scale is None else scale.pow(2)
    covariances = torch.einsum("da,sd,db->sab", components, variances, components)
    explained = singular_values[:2].pow(2) / mean.shape[0]
    return Projection2D(points, covariances, components, center, explained)


def nearest_neighbours(mean, k: int = 1) -> Neighbours:
    """The ``k`` nearest other symbols of each symbol by Euclidean distance between posterior means
    (ties to the lower index).

    :param mean: ``(S, D)`` (or a head, or :class:`SymbolEmbeddings`: its means). :param int k: ``1 <= k < S``.
    """
    mean = _as_matrix("mean", symbol_embeddings(mean).mean, min_rows=2)
    if isinstance(k, bool) or not isinstance(k, int) or not 1 <= k < mean.shape[0]:
        raise ValueError(f"k must be an integer in [1, S - 1] = [1, {mean.shape[0] - 1}], got {k!r}")
    distances = (mean.unsqueeze(1) - mean.unsqueeze(0)).pow(2).sum(-1).sqrt()
    distances.fill_diagonal_(math.inf)
    order = torch.sort(distances, dim=-1, stable=True).indices[:, :k]
    return Neighbours(order, distances.gather(1, order))


def plot_embedding_posterior(
    ax,
    mean,
    scale=None,
    labels: Optional[Sequence] = None,
    n_std: float = 2.0,
    reference=None,
    color="C0",
    alpha: float = 0.25,
) -> Projection2D:
    """Scatter the 2-D projection of the posterior means on ``ax`` with an ellipse of ``n_std`` posterior
    standard deviations around each (``scale`` given) and the symbols as labels.

    :param ax: a matplotlib ``Axes``.
    :param mean: ``(S, D)`` (or a head, or :class:`SymbolEmbeddings`: its means and scales).
    :param scale: ``(S, D)`` or None (no ellipses).
    :param labels: ``S`` labels; default the symbol indices.
    :param float n_std: ellipse radius in standard deviations along its principal axes.
    :param reference: optional ``(S, D)`` (or a head): align ``mean`` to it first (:func:`procrustes_align`), rotating the
        posterior covariances with it, so that two fits can be drawn in one frame.
    :returns: the :class:`Projection2D` drawn.
    """
    from matplotlib.patches import Ellipse

    mean, scale = symbol_embeddings(mean, scale)
    mean = _as_matrix("mean", mean, min_rows=2, min_cols=2)
    if n_std <= 0 or not math.isfinite(n_std):
        raise ValueError(f"n_std must be a positive finite number, got {n_std!r}")
    if labels is not None and len(labels) != mean.shape[0]:
        raise ValueError(f"labels must have one entry per symbol ({mean.shape[0]}), got {len(labels)}")
    if reference is None:
        projection = project_2d(mean, scale)
    else:
        mean, rotation = procrustes_align(mean, symbol_embeddings(reference).mean)
        projection = project_2d(mean, None)
        if scale is not None:
            # Rotated diagonal covariances are full: R^T diag(s^2) R, then projected.
            scale = _as_matrix("scale", scale).to(mean.dtype)
            full = torch.einsum("dk,sd,de->ske", rotation, scale.pow(2), rotation)
            w = projection.components
            projection = projection._replace(covariances=torch.einsum("da,sde,eb->sab", w, full, w))
    points = projection.points.cpu().numpy()
    ax.scatter(points[:, 0], points[:, 1], s=12, color=color, zorder=3)
    if scale is not None:
        eigenvalues, eigenvectors = torch.linalg.eigh(projection.covariances)  # ascending
        for point, values, vectors in zip(points, eigenvalues, eigenvectors):
            major = vectors[:, 1]
            angle = math.degrees(math.atan2(float(major[1]), float(major[0])))
            width, height = (2 * n_std * values.clamp_min(0).sqrt()).flip(0).tolist()
            ax.add_patch(Ellipse(tuple(point), width, height, angle=angle, facecolor=color, edgecolor=color,
                                 alpha=alpha))
    labels = range(mean.shape[0]) if labels is None else labels
    for point, label in zip(points, labels):
        ax.annotate(str(label), tuple(point), textcoords="offset points", xytext=(3, 3), fontsize=8)
    ax.set_xlabel("principal axis 1")
    ax.set_ylabel("principal axis 2")
    ax.set_aspect("equal", adjustable="datalim")
    return projection
