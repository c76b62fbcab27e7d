"""Small random heads and brute-force references for the engine's tests (tests/engine/) and the collapsed model's
(tests/test_distributions.py): every hop path enumerated in float64 (tests/oracle.py), and the markers that run a
test on both heads, every number of hops, with and without padding, and on both routes."""

import math

import oracle
import pytest
import torch

from pyro_multihop import ChainedAttention, TiedEmbeddingAttention, engine

S, T, N = 5, 4, 4
HOPS = pytest.mark.parametrize("hops", [1, 2, 3], ids=lambda h: f"L={h}")
MASKED = pytest.mark.parametrize("masked", [False, True], ids=["full", "padded"])
HEADS = pytest.mark.parametrize("kind", ["chained", "tied"])


# math.inf forces the symbol route at every size, 0 the dense positions route.
ROUTES = pytest.mark.parametrize("ratio", [math.inf, 0.0], ids=["symbols", "positions"])


def make_head(kind, hops, seed=0, sigma2=0.6, scale=1.0, dtype=torch.float64, emission_gap=None):
    """A random head; with ``emission_gap``, an emission whose target log-probabilities are 0 or ``-emission_gap``
    (700: beyond float64's range of sums, so that a sharp last hop attending a value of the wrong kind leaves the
    likelihood below the underflow floor even on the dense factors)."""
    generator = torch.Generator().manual_seed(seed)
    emission = torch.rand(S, T, generator=generator, dtype=dtype).softmax(-1)
    if emission_gap is not None:
        matches = torch.arange(S).unsqueeze(-1) % T == torch.arange(T)
        emission = torch.where(matches, 0.0, -emission_gap).to(dtype).softmax(-1)
    if kind == "chained":
        tables = scale * torch.randn(hops, S, S, generator=generator, dtype=dtype)
        return ChainedAttention(hops, S, T, sigma2=sigma2, key_tables=tables, emission=emission)
    loc = scale * torch.randn(S, 3, generator=generator, dtype=dtype)
    # The engine's checks read the gate at the means (plug_in="mean"); tests/models/test_tied.py checks the
    # default expected-distance table against brute force.
    return TiedEmbeddingAttention(S, 3, T, n_hops=hops, sigma2=sigma2, loc=loc, emission=emission, plug_in="mean")


def vectors(head, obs):
    if isinstance(head, ChainedAttention):
        return oracle.onehot_vectors(head.key_tables, obs)
    embeddings = head.guide.loc.detach().double()
    return embeddings[obs.query], [embeddings[obs.keys]] * head.n_hops, embeddings[obs.values]


def brute_force(head, obs):
    emission = head.emission.detach().double()
    tables = oracle.enumerate_paths(*vectors(head, obs), head.sigma2, emission, obs.values, obs.target, obs.mask)
    return oracle.summarise(tables, obs.context_len, emission=emission, values=obs.values)


def random_obs(n=7, seed=1, masked=False, context=N):
    return oracle.random_observations(n, S, T, context, seed, masked)


# Emissions for the underflowing rows: random (they are retried on their dense factors), or with target
# probabilities e^700 apart (some underflow there too, and are recomputed in log space).
EMISSION_GAPS = pytest.mark.parametrize("emission_gap", [None, 700.0], ids=["random emission", "emission e^700 apart"])


def routes_taken(head, obs):
    return {piece.route for piece in engine.forward_backward_chunks(head.hop_gates(), obs)}


def exact_path_posterior(head, obs):
    """Per row: ``path -> p(path | observation)`` by brute force, from the joints' logarithms (a joint whose
    product underflows float64 still has its posterior probability)."""
    emission = head.emission.detach().double()
    tables = oracle.enumerate_paths(*vectors(head, obs), head.sigma2, emission, obs.values, obs.target, obs.mask,
                                    log=True)
    posteriors = []
    for table in tables:
        log_joints = {path: log_joint for path, (_, log_joint) in table.items()}
        top = max(log_joints.values())
        total = top + math.log(sum(math.exp(value - top) for value in log_joints.values()))
        posteriors.append({path: math.exp(value - total) for path, value in log_joints.items()})
    return posteriors


def entropies(posteriors):
    return torch.tensor([-sum(p * math.log(p) for p in post.values() if p > 0) for post in posteriors],
                        dtype=torch.float64)


def assert_k_best_match(paths, log_probs, posteriors, k, rtol):
    """Against the brute-force probabilities; paths whose probability underflows float64 there (sigma2 = 1e-3)
    must have log-probabilities below its range (or -inf) here."""
    for row, post in enumerate(posteriors):
        best = sorted((p for p in post.values() if p > 0), reverse=True)[:k]
        got = log_probs[row, : len(best)]
        assert torch.allclose(got.exp(), torch.tensor(best, dtype=torch.float64), rtol=rtol)
        assert (log_probs[row, len(best):].exp() == 0).all()
        finite = log_probs[row][torch.isfinite(log_probs[row])]
        assert (finite.diff() <= 0).all()  # best first
        for path, log_prob in zip(paths[row, : len(best)].tolist(), got.tolist()):
            assert post[tuple(path)] == pytest.approx(math.exp(log_prob), rel=rtol)


def assert_map_paths_are_most_probable(paths, posteriors, rtol):
    for row, post in enumerate(posteriors):
        assert post[tuple(paths[row].tolist())] == pytest.approx(max(post.values()), rel=rtol)
