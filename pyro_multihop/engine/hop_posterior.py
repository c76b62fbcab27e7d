"""Every row's posterior over hop paths, as a head's ``posterior(obs)`` returns it: :class:`HopPosterior`.

The posterior classes, by the rows they hold: :class:`HopPosterior` (every row of a query: what the user gets),
:class:`~.posterior.ChunkPosterior` (one chunk, probability space) and
:class:`~.log_space.LogChunkPosterior` (one chunk, log space). This module sits above the queries
(:mod:`.queries`) and the path queries (:mod:`pyro_multihop.engine.paths`) it reads, which build on
:mod:`.posterior`'s forward-backward; hence a module of its own rather than a place in :mod:`.posterior`.
"""

from __future__ import annotations

import functools
from typing import Optional

import torch

from .hop_factors import HopFactors
from .paths import k_best_paths, map_paths, path_entropy, sample_paths
from .queries import posterior_marginals
from .routes import choose_route

__all__ = ["HopPosterior"]


class HopPosterior:
    """The exact posterior over the hop paths of ``n`` observations under a head.

    Built by one forward-backward pass (:func:`~.queries.posterior_marginals`); the path queries run, in
    chunks under the budget, when first read, and are kept. When the max-product takes the pass's route, the pass
    keeps its first chunks' prepared transitions, up to the memory budget in all, and the MAP read runs on them
    rather than preparing those chunks again.

    :ivar log_likelihood: ``(n,)``, ``log p(target | context, query)``.
    :ivar hop_marginals: ``(L, n, N)``, ``p(z_l = i | observation)``.
    :ivar pairwise_marginals: ``(L - 1, n, N, N)``, ``p(z_l = i, z_{l+1} = j | observation)``, when built with
        ``pairwise=True`` (from the same pass), else None (``O(n N^2)`` memory).
    """

    def __init__(self, factors: HopFactors, obs, budget: Optional[int] = None, pairwise: bool = False):
        self.factors, self.obs, self.budget = factors, obs, budget
        N, L = obs.context_len, factors.n_hops
        # The first chunks' prepared transitions are kept (within the memory budget), so that the MAP read later
        # skips preparing them again, when the forward-backward and the max-product take the same route.
        route = choose_route(factors, N, backward=True)
        self._prepared = [] if choose_route(factors, N, max_product=True) == route else None
        if route == "symbols":  # init, real positions, emission (c, N) each, and 1 / R (c, S) a transition
            row_elements = 3 * N + (L - 1) * factors.num_symbols + 2
        else:  # the (c, N, N) weights a transition (and the dense log factors they may come from), 1 / R, init
            row_elements = 2 * (L - 1) * N * N + (L + 3) * N + 2
        row_bytes = row_elements * factors.itemsize
        self.log_likelihood, self.hop_marginals, self.pairwise_marginals = posterior_marginals(
            factors, obs, budget, pairwise=pairwise, keep=self._prepared, kept_bytes_per_row=row_bytes)
        self._k_best = {}

    @functools.cached_property
    def map_paths(self) -> torch.Tensor:
        """``(n, L)`` LongTensor, the most probable hop path (computed on first read)."""
        return map_paths(self.factors, self.obs, self.budget, kept=self._prepared or ())

    @functools.cached_property
    def path_entropy(self) -> torch.Tensor:
        """``(n,)`` entropy, in nats, of the posterior over hop paths (computed on first read)."""
        return path_entropy(self.factors, self.obs, self.budget)

    def k_best_paths(self, k: int):
        """``(paths (n, k, L), log_probs (n, k))``, the ``k`` most probable paths (kept per ``k``)."""
        if k not in self._k_best:
            self._k_best[k] = k_best_paths(self.factors, self.obs, k, self.budget)
        return self._k_best[k]

    def sample_paths(self, num_samples: int, generator: Optional[torch.Generator] = None) -> torch.Tensor:
        """``(num_samples, n, L)`` hop paths drawn from the posterior (fresh draws at every call)."""
        return sample_paths(self.factors, self.obs, num_samples, generator, self.budget)

    def __repr__(self) -> str:
        L, n, N = self.hop_marginals.shape
        return f"HopPosterior(n={n}, L={L}, N={N})"
