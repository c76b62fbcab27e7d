"""The path queries' building blocks (pyro_multihop/engine/paths.py) against their definitions: the k largest
entries of each row, and the k best paths of a few candidates scored all at once."""

import itertools
import math

import pytest
import torch

from pyro_multihop.engine import paths


@pytest.mark.parametrize("k", [1, 3, 8, 9, 12], ids=lambda k: f"k={k}")
def test_the_k_largest_entries_and_the_largest_of_the_rest(k):
    """Against a full sort, on rows with ties (a tie's entries are interchangeable: their values are compared,
    and each position must hold its value); both the rounds of row maxima (k <= 8) and ``topk``."""
    g = torch.Generator().manual_seed(k)
    scores = torch.randint(0, 6, (50, 15), generator=g).double() + torch.rand(50, 15, generator=g).round()
    values, positions, rest = paths._largest(scores, k, rest=True)
    ordered = scores.sort(-1, descending=True).values
    assert torch.equal(values, ordered[:, :k])
    assert torch.equal(rest, ordered[:, k])
    assert torch.equal(scores.gather(1, positions), values)
    assert all(len(set(row)) == k for row in positions.tolist())  # k distinct positions
    assert torch.equal(paths._largest(scores, k)[0], values)


@pytest.mark.parametrize("hops", [1, 2, 3], ids=lambda h: f"L={h}")
def test_the_k_best_of_a_few_candidates_scored_all_at_once(hops):
    """Every path of ``s`` candidates scored by hand: the values (rescaled) and the paths, best first."""
    g = torch.Generator().manual_seed(hops)
    c, s, k = 4, 3, 5
    init = torch.rand(c, s, generator=g, dtype=torch.float64)
    emission = torch.rand(c, s, generator=g, dtype=torch.float64)
    weights = [torch.rand(c, s, s, generator=g, dtype=torch.float64) for _ in range(hops - 1)]
    values, found, log_scale, ok = paths._k_best_by_enumeration(
        [w.permute(1, 2, 0).contiguous() for w in weights], init, emission, hops, k, 1e-300)
    assert ok.all()
    for row in range(c):
        scored = {}
        for path in itertools.product(range(s), repeat=hops):
            p = init[row, path[0]] * emission[row, path[-1]]
            for hop in range(hops - 1):
                p = p * weights[hop][row, path[hop], path[hop + 1]]
            scored[path] = float(p)
        best = sorted(scored.values(), reverse=True)[:k]
        got = (values[row].log() + log_scale[row]).exp()
        assert torch.allclose(got, torch.tensor(best, dtype=torch.float64), rtol=1e-12)
        for path, value in zip(found[row].tolist(), got.tolist()):
            assert scored[tuple(path)] == pytest.approx(value, rel=1e-12)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=["float32", "float64"])
@pytest.mark.parametrize("N", [6, 100, 5000], ids=lambda N: f"N={N}")
def test_the_top_positions_bound_every_other_entry(dtype, N):
    """``_top_positions`` (integer keys; ``_largest`` past 4096 positions): k distinct positions holding their
    values, an upper bound on every other entry, and the exact top k wherever values are apart (here: ties, zeros
    and well-separated values)."""
    g = torch.Generator().manual_seed(N)
    k = 5
    scores = torch.randint(0, 40, (30, N), generator=g).to(dtype) / 7  # many ties
    scores[0] = 0.0
    scores[1, :3] = scores[1, 3]  # a tie across the k-th place
    values, positions, rest = paths._top_positions(scores, k)
    assert all(len(set(row)) == k for row in positions.tolist())
    assert torch.equal(scores.gather(1, positions), values)
    others = scores.scatter(1, positions, -1.0)
    assert (rest >= others.amax(-1)).all()
    assert torch.equal(values.sort(-1, descending=True).values, scores.sort(-1, descending=True).values[:, :k])
    # values within 2^-16 of each other, relatively, may come in either order, but rest stays a bound
    near = torch.full((4, N), 1.0, dtype=dtype) + torch.rand(4, N, generator=g, dtype=dtype) * 1e-6
    values, positions, rest = paths._top_positions(near, k)
    assert (rest >= near.scatter(1, positions, -1.0).amax(-1)).all()
    assert torch.equal(near.gather(1, positions), values)
