"""Posterior inspection helpers: Procrustes alignment, 2-D projection with covariances, neighbours, plotting."""

import itertools
import math

import matplotlib.pyplot as plt
import pytest
import torch
from matplotlib.patches import Ellipse

from pyro_multihop.embeddings import (SymbolEmbeddings, nearest_neighbours, plot_embedding_posterior, procrustes_align,
                                      project_2d, symbol_embeddings)
from tests import factories


def random_orthogonal(dim, seed, reflect=False):
    q = torch.linalg.qr(torch.randn(dim, dim, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)).Q
    if reflect and torch.linalg.det(q) > 0:
        q[:, 0] = -q[:, 0]
    return q


def embeddings(S=12, D=4, seed=0):
    generator = torch.Generator().manual_seed(seed)
    return torch.randn(S, D, generator=generator, dtype=torch.float64), 0.05 + torch.rand(
        S, D, generator=generator, dtype=torch.float64
    )


@pytest.mark.parametrize("reflect", [False, True], ids=["rotation", "reflection"])
def test_procrustes_recovers_an_orthogonal_transform(reflect):
    reference, _ = embeddings()
    q = random_orthogonal(4, seed=1, reflect=reflect)
    aligned, rotation = procrustes_align(reference @ q, reference)
    assert torch.allclose(aligned, reference, atol=1e-12)
    assert torch.allclose(rotation, q.T, atol=1e-12)
    assert torch.allclose(rotation @ rotation.T, torch.eye(4, dtype=torch.float64), atol=1e-12)


def test_procrustes_residual_beats_every_other_orthogonal_matrix():
    reference, _ = embeddings(seed=2)
    noisy = reference @ random_orthogonal(4, seed=3) + 0.3 * embeddings(seed=4)[0]
    aligned, _ = procrustes_align(noisy, reference)
    best = float((aligned - reference).norm())
    for seed in range(200):
        other = random_orthogonal(4, seed=100 + seed, reflect=seed % 2 == 1)
        assert best <= float((noisy @ other - reference).norm()) + 1e-12


def test_procrustes_with_centering_also_removes_a_translation():
    reference, _ = embeddings(seed=5)
    moved = reference @ random_orthogonal(4, seed=6) + torch.tensor([3.0, -1.0, 2.0, 0.5], dtype=torch.float64)
    uncentered, _ = procrustes_align(moved, reference)
    centered, _ = procrustes_align(moved, reference, center=True)
    assert torch.allclose(centered, reference, atol=1e-12)
    assert not torch.allclose(uncentered, reference, atol=1e-2)


def test_projection_is_pca_and_covariances_are_propagated():
    mean, scale = embeddings(S=15, D=5, seed=7)
    projection = project_2d(mean, scale)
    centered = mean - mean.mean(0)
    eigenvalues, eigenvectors = torch.linalg.eigh(centered.T @ centered / 15)  # ascending
    top = eigenvectors[:, [4, 3]]
    assert torch.allclose(projection.components.abs(), top.abs(), atol=1e-10)
    assert torch.allclose(projection.explained_variance, eigenvalues[[4, 3]], rtol=1e-10)
    assert torch.allclose(projection.points, centered @ projection.components, atol=1e-12)
    for s in range(15):
        covariance = projection.components.T @ torch.diag(scale[s] ** 2) @ projection.components
        assert torch.allclose(projection.covariances[s], covariance, atol=1e-14)
    # Signs are pinned: the largest loading of each axis is positive, whatever the input's orientation.
    flipped = project_2d(-mean, scale)
    assert torch.allclose(flipped.components, projection.components, atol=1e-12)
    assert (projection.components.abs().argmax(0) == projection.components.argmax(0)).all()


def test_projection_of_two_dimensional_embeddings_keeps_distances():
    mean, scale = embeddings(D=2, seed=8)
    points = project_2d(mean, scale).points
    assert torch.allclose(torch.cdist(points, points), torch.cdist(mean, mean), atol=1e-12)
    assert torch.allclose(project_2d(mean).covariances, torch.zeros(12, 2, 2, dtype=torch.float64))


def test_nearest_neighbours_match_brute_force():
    mean, _ = embeddings(S=9, D=3, seed=9)
    found = nearest_neighbours(mean, k=3)
    for s in range(9):
        others = sorted((math.dist(mean[s].tolist(), mean[t].tolist()), t) for t in range(9) if t != s)[:3]
        assert found.indices[s].tolist() == [t for _, t in others]
        assert torch.allclose(found.distances[s], torch.tensor([d for d, _ in others], dtype=torch.float64))


def test_nearest_neighbour_ties_go_to_the_lower_index():
    square = torch.tensor([[0.0, 0.0], [1.0, 0.0], [0.0, 1.0], [1.0, 1.0]])
    assert nearest_neighbours(square, k=2).indices.tolist() == [[1, 2], [0, 3], [0, 3], [1, 2]]


@pytest.mark.parametrize("n_std", [1.0, 2.0], ids=["1sd", "2sd"])
def test_plot_draws_one_ellipse_per_symbol_with_the_projected_covariance(n_std):
    mean, scale = embeddings(S=6, D=4, seed=10)
    figure, ax = plt.subplots()
    try:
        projection = plot_embedding_posterior(ax, mean, scale, labels=list("abcdef"), n_std=n_std)
        ellipses = [patch for patch in ax.patches if isinstance(patch, Ellipse)]
        assert len(ellipses) == 6 and [t.get_text() for t in ax.texts] == list("abcdef")
        for ellipse, covariance, point in zip(ellipses, projection.covariances, projection.points):
            eigenvalues = torch.linalg.eigvalsh(covariance)
            assert ellipse.width == pytest.approx(2 * n_std * math.sqrt(eigenvalues[1]), rel=1e-9)
            assert ellipse.height == pytest.approx(2 * n_std * math.sqrt(eigenvalues[0]), rel=1e-9)
            assert ellipse.center == pytest.approx(tuple(point.tolist()))
            # The major axis points along the leading eigenvector.
            major = torch.linalg.eigh(covariance).eigenvectors[:, 1]
            angle = math.radians(ellipse.angle)
            assert abs(major[0] * math.cos(angle) + major[1] * math.sin(angle)) == pytest.approx(1.0, abs=1e-9)
    finally:
        plt.close(figure)


def test_plot_aligns_to_a_reference_and_rotates_the_uncertainty():
    reference, scale = embeddings(S=8, D=3, seed=11)
    q = random_orthogonal(3, seed=12)
    figure, ax = plt.subplots()
    try:
        projection = plot_embedding_posterior(ax, reference @ q, scale, reference=reference)
        direct = project_2d(reference)
        assert torch.allclose(projection.points, direct.points, atol=1e-10)
        w = projection.components
        for s in range(8):
            rotation = q.T  # the alignment maps reference @ q back to reference
            rotated = rotation.T @ torch.diag(scale[s] ** 2) @ rotation
            assert torch.allclose(projection.covariances[s], w.T @ rotated @ w, atol=1e-12)
        bare = plot_embedding_posterior(ax, reference, None)
        assert torch.equal(bare.covariances, torch.zeros(8, 2, 2, dtype=torch.float64))
    finally:
        plt.close(figure)


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda: procrustes_align(torch.zeros(3, 2), torch.zeros(3, 3)), "reference"),
        (lambda: procrustes_align(torch.zeros(3), torch.zeros(3)), "embeddings"),
        (lambda: project_2d(torch.zeros(3, 1)), "mean"),
        (lambda: project_2d(torch.zeros(1, 3)), "mean"),
        (lambda: project_2d(torch.zeros(3, 2), torch.zeros(3, 3)), "scale"),
        (lambda: project_2d(torch.zeros(3, 2), -torch.ones(3, 2)), "scale"),
        (lambda: project_2d(torch.tensor([[0.0, float("nan")], [1.0, 1.0]])), "mean"),
        (lambda: nearest_neighbours(torch.zeros(3, 2), k=3), "k"),
        (lambda: nearest_neighbours(torch.zeros(3, 2), k=0), "k"),
        (lambda: plot_embedding_posterior(None, torch.zeros(3, 2), n_std=0.0), "n_std"),
        (lambda: plot_embedding_posterior(None, torch.zeros(3, 2), labels=["a"]), "labels"),
    ],
    ids=lambda value: value if isinstance(value, str) else None,
)
def test_bad_arguments_raise_naming_the_field(call, field):
    with pytest.raises(ValueError, match=field):
        call()


def test_helpers_accept_a_fitted_heads_posterior():
    from pyro_multihop.models.tied import TiedEmbeddingAttention

    mean, scale = TiedEmbeddingAttention(7, 3, 7, seed=0).embeddings()
    assert project_2d(mean, scale).points.shape == (7, 2)
    assert nearest_neighbours(mean, k=2).indices.shape == (7, 2)
    assert list(itertools.chain(*nearest_neighbours(mean, k=6).indices.tolist())).count(0) == 6


def embedded_fact_head(posterior="point", **options):
    from pyro_multihop import FactAttention

    head = FactAttention(2, 3, 9, max_question_len=3, max_distance=3, embed_dim=4, dtype=torch.float64, seed=3,
                         embedding_posterior=posterior, **options)
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name in ("question_bilinear", "content_bilinear", "emission_bilinear", "question_equality"):
            getattr(head, name).copy_(torch.randn(getattr(head, name).shape, generator=g, dtype=torch.float64))
    return head


def test_procrustes_recovers_a_rotation_of_the_facts_heads_embedding():
    """The facts head's likelihood is unchanged when ``E`` is rotated and its bilinear forms counter-rotated; aligning
    the rotated head's ``E`` to the original recovers it and the rotation."""
    from pyro_multihop import FactAttention

    head = embedded_fact_head()
    q = random_orthogonal(4, seed=5, reflect=True)
    init = {name: p.detach() for name, p in head.named_parameters()}
    init.update(symbol_embedding=head.symbol_embedding.detach() @ q,
                question_bilinear=q.T @ head.question_bilinear.detach() @ q,
                content_bilinear=q.T @ head.content_bilinear.detach() @ q,
                emission_bilinear=q.T @ head.emission_bilinear.detach())
    rotated = FactAttention(2, 3, 9, max_question_len=3, max_distance=3, embed_dim=4, dtype=torch.float64, init=init)
    obs = factories.random_fact_observations(4, 5, 3, 3, 9, seed=1)
    assert torch.allclose(rotated.log_likelihood(obs), head.log_likelihood(obs), atol=1e-10, rtol=0)
    aligned, rotation = procrustes_align(rotated, head)
    assert torch.allclose(aligned, head.symbol_embedding.detach(), atol=1e-12)
    assert torch.allclose(rotation, q.T, atol=1e-12)


def test_projection_neighbours_and_plot_read_a_facts_heads_embedding(tmp_path):
    """A mean-field facts head: its posterior's covariances projected, one ellipse a symbol in the written plot; a
    point estimate: no covariance; a table head has no embedding; the tied head's is the same kind of object."""
    from pyro_multihop import FactAttention, TiedEmbeddingAttention

    variational, point = embedded_fact_head("mean_field"), embedded_fact_head()
    assert torch.equal(variational.embeddings().mean, point.embeddings().mean) and point.embeddings().scale is None
    projection = project_2d(variational)
    assert projection.points.shape == (9, 2) and bool((projection.covariances.diagonal(0, 1, 2) > 0).all())
    assert torch.equal(project_2d(point).covariances, torch.zeros(9, 2, 2, dtype=torch.float64))
    assert torch.equal(project_2d(point).points, projection.points)
    assert nearest_neighbours(variational, k=2).indices.shape == (9, 2)
    figure, ax = plt.subplots()
    try:
        plot_embedding_posterior(ax, variational, labels=list("abcdefghi"))
        assert len([patch for patch in ax.patches if isinstance(patch, Ellipse)]) == 9
        figure.savefig(tmp_path / "facts_embedding.png")
    finally:
        plt.close(figure)
    assert (tmp_path / "facts_embedding.png").stat().st_size > 0
    draws = variational.embeddings().sample(3, seed=0)
    assert draws.shape == (3, 9, 4) and not torch.equal(draws[0], draws[1])
    assert torch.equal(point.embeddings().sample(2)[1], point.embeddings().mean)
    with pytest.raises(ValueError, match="has no symbol embeddings"):
        symbol_embeddings(FactAttention(2, 3, 9))
    tied = TiedEmbeddingAttention(7, 3, 7, seed=0).embeddings()
    assert isinstance(tied, SymbolEmbeddings) and tied.scale is not None
