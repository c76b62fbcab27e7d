"""The exact hop-chain engine: every plug-in query of every head, in chunks of rows under a memory budget.

A head hands the engine the factors of its hop chain, every hop's gate and the emission, as a :class:`HopFactors`
(``head.hop_factors()``): the ``(S, T)`` log emission table, a callable that builds the dense log factors
(:class:`HopChain`) of a chunk of observations, and, when the gate of hop ``l`` depends on the (query symbol, key
symbol) pair alone, the ``(L, S, S)`` table ``scores[l, q, k]`` of its unnormalised logits. The engine runs one
recursion (:mod:`.recursion`) over the hop chain of each chunk, with the transitions passed in as one of two
implementations of one protocol (:mod:`.transitions`), and the query as the step:

- **symbols**: the transition of hop ``l`` from position ``i`` to ``j`` is ``E_l[value_i, key_j] / R_l[value_i]``,
  so a message crosses a hop as ``(c, S) x (S, S)`` products and a scatter/gather over the positions:
  ``O(S^2 + N)`` per row and hop, no ``(N, N)`` tensor;
- **positions**: the ``(c, N, N)`` transition matrices of the chunk and batched products, ``O(N^2)`` per row
  and hop; used when ``S^2`` is large beside ``N^2`` (see :data:`SYMBOL_ROUTE_RATIO`) or when the gate has
  position-dependent terms (``scores is None``).

Both run in probability space (:mod:`.posterior`); a row that would underflow there is retried on its dense
factors, normalised over its own positions (:func:`~.routes.dense_retries`), and recomputed by
the log-space recursions of :mod:`.log_space` only if it underflows there too, so every row is exact to rounding.

Memory: each query allocates its output, then processes as many rows at a time as keep the chunk's working
tensors under the budget (:func:`get_memory_budget`, default :data:`DEFAULT_MEMORY_BUDGET` = 256 MiB, a
context variable: change it with :func:`set_memory_budget`, the :func:`memory_budget` context manager, or the
``budget=`` argument of every query). Without gradients, peak memory is the budget plus the inputs and the
outputs, whatever ``n``. Chunks are moved to the device of the factors one at a time, so the data may stay
on the CPU.

The observations need only ``len()``, ``context_len``, ``obs[slice or LongTensor]``, ``to(device)``,
``device``, ``mask``, ``full_mask()`` and ``target``; ``keys``, ``values`` and ``query`` are read only where
the symbol tables are (``scores``, ``log_emission`` without a ``position_emission``, :func:`value_marginals`).

Modules, one job each: :mod:`.budget` (the memory budget, the working memory of a row, and chunking),
:mod:`.hop_factors` (what a head hands the engine), :mod:`.score_tables` (the gate's symbol tables, read lazily),
:mod:`.symbol_likelihood` (the symbol route's likelihood gradient in closed form, for many symbols),
:mod:`.recursion` (the one recursion), :mod:`.transitions` (the protocol and its two implementations),
:mod:`.routes` (which route a chunk takes, a chunk prepared on one, the dense retry), :mod:`.posterior`
(forward-backward over chunks), :mod:`.queries` (likelihood, predictive, marginals), :mod:`.paths` (MAP, k
best, sampling, entropy), :mod:`.hop_posterior` (every row's posterior, its path queries read lazily),
:mod:`.log_space` (the log-space recursions on dense chunks), :mod:`.moved_names` (deprecated aliases;
:mod:`.hop_gates`, the old path of :mod:`.hop_factors`, holds nothing else).

The posterior classes are named by the rows they hold: :class:`HopPosterior` (every row: what a head's
``posterior`` returns), :class:`ChunkPosterior` (one chunk, probability space) and :class:`LogChunkPosterior`
(one chunk, log space).

Shapes: ``n`` rows, ``c`` rows of a chunk, ``N`` positions, ``L`` hops, ``S`` symbols, ``T`` targets.
"""

from . import hop_gates  # noqa: F401  the old module path of .hop_factors, kept for one release
from .budget import (
    DEFAULT_MEMORY_BUDGET,
    dense_chunks,
    get_memory_budget,
    memory_budget,
    rows_within_budget,
    set_memory_budget,
)
from .hop_factors import HopFactors, chain_from_scores
from .hop_posterior import HopPosterior
from .log_space import HopChain, LogChunkPosterior
from .moved_names import deprecated_aliases
from .score_tables import DenseScoreTables, ScoreTables, as_score_tables
from .paths import k_best_paths, map_paths, path_entropy, sample_paths
from .posterior import ChunkPosterior, forward_backward_chunks
from .queries import (
    hop_marginals,
    log_likelihood,
    pairwise_marginals,
    posterior_marginals,
    predict_proba,
    value_marginals,
)
from .routes import ROUTES, SYMBOL_ROUTE_RATIO, choose_route
from .transitions import PositionTransitions, SymbolTransitions, Transitions, key_statistics_from_pairwise

__all__ = [
    "HopFactors",
    "HopChain",
    "ScoreTables",
    "DenseScoreTables",
    "as_score_tables",
    "HopPosterior",
    "LogChunkPosterior",
    "DEFAULT_MEMORY_BUDGET",
    "SYMBOL_ROUTE_RATIO",
    "ROUTES",
    "get_memory_budget",
    "set_memory_budget",
    "memory_budget",
    "rows_within_budget",
    "chain_from_scores",
    "choose_route",
    "log_likelihood",
    "predict_proba",
    "hop_marginals",
    "value_marginals",
    "pairwise_marginals",
    "posterior_marginals",
    "map_paths",
    "sample_paths",
    "path_entropy",
    "k_best_paths",
    "forward_backward_chunks",
    "dense_chunks",
    "ChunkPosterior",
    "Transitions",
    "SymbolTransitions",
    "PositionTransitions",
    "key_statistics_from_pairwise",
]

# Renamed (the posterior classes' scheme above; HopGates carries the emission too); the old names are kept for one
# release.
# The chained head's score tables moved to its side (pyro_multihop.models.chained_key_tables), kept for one release.
__getattr__ = deprecated_aliases(__name__, {"ChainPosterior": (__name__, "LogChunkPosterior"),
                                            "HopGates": (__name__, "HopFactors")},
                                 moved_modules=["pyro_multihop.models.chained_key_tables"])
