"""Forward-backward over chunks of rows in probability space, with the retry of the rows that underflow on their
dense factors, and the log-space recompute of those that underflow there too: the source of the marginals, the
EM statistics and the path queries.

Forward messages are distributions (transitions are row-stochastic), backward messages are rescaled to a row
maximum of 1 at every hop, and the emission is shifted by its row maximum. A row whose sums would fall below
:func:`~.recursion.underflow_floor` in that form (an underflowing normaliser ``R``, message or likelihood;
tiny ``sigma2`` with far-apart keys) is retried on its dense factors, normalised over the row's own positions
(:func:`~.routes.dense_retries`); a row that underflows there too is recomputed by the log-space recursions
of :mod:`.log_space`, so every row is exact to rounding.
"""

from __future__ import annotations

import math
from typing import Iterator, List, Optional

import torch

from .budget import device_chunk, row_slices, rows_per_chunk
from .hop_factors import HopFactors
from .log_space import chain_posterior
from .recursion import backward_messages, forward_messages, underflow_floor
from .routes import PreparedChunk, choose_route, prepare, rows_in_log_space, run_with_fallback
from .transitions import Transitions, key_statistics_from_pairwise

__all__ = ["ChunkPosterior", "forward_backward_chunks", "posterior_chunk", "shifted_emission", "rows_in_log_space"]


class ChunkPosterior:
    """The posterior of one chunk of rows in probability space, as :func:`forward_backward_chunks` yields it (its
    log-space counterpart is :class:`~.log_space.LogChunkPosterior`, every row's posterior
    :class:`~.hop_posterior.HopPosterior`).

    :ivar rows: LongTensor, the chunk's rows in the data. :ivar obs: the chunk (on the factors' device).
    :ivar log_likelihood: ``(c,)``.
    :ivar route: ``"symbols"``, ``"positions"``, ``"dense"`` (the retry of rows that underflow on either, on their
        dense factors) or ``"log"`` (the log-space recompute of rows that underflow there too).
    :ivar alphas, betas: per hop ``(c, N)`` prior and (rescaled) backward messages (not for ``"log"``).
    :ivar totals: per hop ``(c,)``, ``sum_i alpha[l][i] beta[l][i]`` (the normaliser of hop ``l``'s marginal).
    :ivar transitions: the route's :class:`~.transitions.Transitions` (not for ``"log"``).
    :ivar pairwise: ``(L - 1, c, N, N)`` for the ``"log"`` route or when asked for, else None.

    Not for ``"log"``: ``prepared``, ``emission`` and ``part`` hold the whole chunk's
    :class:`~.routes.PreparedChunk`, its :func:`shifted_emission` triple and its slice of the data.
    """

    def __init__(self, rows, obs, log_likelihood, route, alphas=None, betas=None, totals=None,
                 transitions: Optional[Transitions] = None, pairwise=None, hop_marginals=None,
                 prepared: Optional[PreparedChunk] = None, emission=None):
        self.rows, self.obs, self.log_likelihood, self.route = rows, obs, log_likelihood, route
        self.alphas, self.betas, self.totals, self.transitions = alphas, betas, totals, transitions
        self.pairwise = pairwise
        self._hop_marginals = hop_marginals
        # The whole chunk's prepared transitions and shifted emission (all its rows, the log-space ones too), for
        # a later path query on the same chunk (see HopPosterior); not for "log".
        self.prepared, self.emission, self.part = prepared, emission, None

    @property
    def hop_marginals(self) -> torch.Tensor:
        """``(L, c, N)`` posterior ``p(z_l = i | observation)`` (computed on first use)."""
        if self._hop_marginals is None:
            self._hop_marginals = torch.stack(
                [a * b / t.unsqueeze(-1) for a, b, t in zip(self.alphas, self.betas, self.totals)]
            )
        return self._hop_marginals

    def pairwise_at(self, hop: int) -> torch.Tensor:
        """``(c, N, N)`` pairwise posterior of hops ``hop + 1`` and ``hop + 2`` (0-based ``hop``)."""
        if self.pairwise is not None:
            return self.pairwise[hop]
        return self.transitions.pairwise(hop, self.alphas[hop], self.betas[hop + 1], self.totals[hop + 1])

    def key_statistics(self, hop: int, weights: torch.Tensor, num_symbols: int) -> torch.Tensor:
        """``(S, S)``: ``out[k, s] = sum_c weights[c] sum_ij p(z_{hop+1} = i, z_{hop+2} = j | obs_c)
        [key_cj = k] [value_ci = s]`` (the EM statistics of the keys of hop ``hop + 2``), without an
        ``(N, N)`` tensor on the symbol route."""
        if self.pairwise is not None:
            weighted = self.pairwise[hop] * weights.view(-1, 1, 1)
            return key_statistics_from_pairwise(weighted, self.obs.keys, self.obs.values, num_symbols)
        scale = weights / self.totals[hop + 1]
        return self.transitions.key_statistics(hop, self.alphas[hop], self.betas[hop + 1], scale)


def shifted_emission(factors: HopFactors, chunk, given_target: bool = True, dtype=None):
    """``(exp(log p(target | z_L = i) - shift) * real (c, N), shift (c,), ok (c,))``; with ``given_target=False``
    the emission of the prior chain, 1 at every real position (in ``dtype``, default the emission table's), with
    shift 0 and every row ok."""
    real = chunk.full_mask()
    if not given_target:
        dtype = factors.dtype if dtype is None else dtype
        return real.to(dtype), torch.zeros(len(chunk), dtype=dtype, device=real.device), torch.ones_like(real[:, 0])
    log_emission = factors.target_log_probs(chunk)
    shift = log_emission.masked_fill(~real, -math.inf).amax(-1)
    finite = torch.isfinite(shift)
    shift = torch.where(finite, shift, torch.zeros_like(shift))
    emission = (log_emission - shift.unsqueeze(-1)).exp() * real
    return emission, shift, finite


def posterior_chunk(factors: HopFactors, chunk, route: str, pairwise: bool = False, given_target: bool = True,
                    budget=None) -> List[ChunkPosterior]:
    """Forward-backward of one chunk: a list of :class:`ChunkPosterior` covering its rows once (row indices
    relative to the chunk). The first holds the rows computed in probability space on ``route`` (with the whole
    chunk's ``prepared`` and ``emission``); the rows that underflow there follow, retried on the ``"dense"`` route,
    and the rows that underflow on their dense factors too come last, in log space (route ``"log"``): the fallback
    of :func:`~.routes.run_with_fallback`. With ``given_target=False`` the emission is 1 everywhere (the posterior is
    the prior chain)."""
    factors = factors.given(given_target)
    extra = (factors.n_hops - 1) * chunk.context_len**2 if pairwise else 0.0

    def attempt(chunk, route):
        return _posterior_attempt(factors, chunk, route, pairwise, given_target)

    def in_log_space(sub, chain, log_emission):
        exact = chain_posterior(chain, log_emission if given_target else torch.zeros_like(log_emission))
        rows = torch.arange(len(sub), device=log_emission.device)
        return [ChunkPosterior(rows, sub, exact.log_likelihood, "log", pairwise=exact.pairwise_marginals,
                               hop_marginals=exact.hop_marginals)]

    return run_with_fallback(factors, chunk, route, attempt, in_log_space, budget, extra, combine=_pieces)


def _posterior_attempt(factors: HopFactors, chunk, route: str, pairwise: bool, given_target: bool):
    """``(main, ok (c,), prepared)``: the chunk's forward-backward in probability space on ``route``, ``main`` a
    :class:`ChunkPosterior` of its ``ok`` rows (every row when all are)."""
    L = factors.n_hops
    prepared = prepare(factors, chunk, route)
    alphas = forward_messages(prepared.transitions, prepared.init, L)
    emission, shift, ok_emission = shifted_emission(factors, chunk, given_target, prepared.init.dtype)
    ok = ok_emission
    floor = underflow_floor(emission.dtype)
    betas, scales = backward_messages(prepared.transitions, emission, L)
    ok = ok & prepared.transitions.ok
    for scale in scales:
        ok &= (scale >= floor) & torch.isfinite(scale)
    totals = [(alpha * beta).sum(-1) for alpha, beta in zip(alphas, betas)]
    for total in totals:
        ok &= (total >= floor) & torch.isfinite(total)
    good = None if ok.all() else ok.nonzero().squeeze(-1)

    def keep(x):
        return x if good is None else x[good]

    totals, alphas, betas = [keep(t) for t in totals], [keep(a) for a in alphas], [keep(b) for b in betas]
    transitions = prepared.transitions if good is None else prepared.transitions.select(good)
    pair = None
    if pairwise and L > 1:
        pair = torch.stack([transitions.pairwise(hop, alphas[hop], betas[hop + 1], totals[hop + 1])
                            for hop in range(L - 1)])
    main = ChunkPosterior(slice(None) if good is None else good, chunk if good is None else chunk[good],
                          totals[-1].log() + keep(shift), route, alphas, betas, totals, transitions, pair,
                          prepared=prepared, emission=(emission, shift, ok_emission) if given_target else None)
    return main, ok, prepared


def _pieces(main: ChunkPosterior, ok: torch.Tensor, parts: list) -> List[ChunkPosterior]:
    """The ``combine`` of :func:`posterior_chunk`: ``main`` and the retried parts' pieces, their rows those of the
    chunk; a retry's prepared sub-chunk is not the chunk's, and is not kept for later reads."""
    pieces = [main]
    for rows, part in parts:
        for piece in part:
            piece.rows, piece.prepared, piece.emission = rows[piece.rows], None, None
            pieces.append(piece)
    return pieces


def forward_backward_chunks(factors: HopFactors, obs, budget=None, pairwise: bool = False, route=None,
                            rows: Optional[int] = None, given_target: bool = True) -> Iterator[ChunkPosterior]:
    """Yield :class:`ChunkPosterior` objects covering every row of ``obs`` once (the E-step's source).

    Rows of a chunk that the probability-space route computes are yielded in one object (``route`` =
    ``"symbols"``/``"positions"``, with messages), the rows that underflow there in more: retried on their dense
    factors (``route = "dense"``, with messages, in sub-chunks under the budget), and those that underflow there
    too recomputed in log space (``route = "log"``, with pairwise marginals). Their ``rows`` index ``obs``; only
    the first object of a chunk has ``part``, ``prepared`` and ``emission``.

    :param route: force ``"symbols"`` or ``"positions"`` (default :func:`~.routes.choose_route`).
    :param rows: rows per chunk (default: as many as the budget allows).
    :param given_target: False: the prior chain's posterior (the targets ignored, :func:`posterior_chunk`).
    """
    factors = factors.given(given_target)
    n, N = len(obs), obs.context_len
    route = choose_route(factors, N, backward=True) if route is None else route
    if route == "symbols" and factors.score_tables is None:
        raise ValueError("route 'symbols' needs gate score tables; this gate has position terms")
    device = factors.device
    extra = (factors.n_hops - 1) * N * N if pairwise else 0.0
    rows_per = rows_per_chunk(factors, N, route, budget, extra) if rows is None else rows
    with torch.no_grad():
        for part in row_slices(n, rows_per):
            chunk = device_chunk(obs, part, device)
            offset = torch.arange(part.start, part.stop, device=device)
            for index, piece in enumerate(posterior_chunk(factors, chunk, route, pairwise, given_target, budget)):
                piece.rows = offset[piece.rows]
                if index == 0:
                    piece.part = part
                yield piece
