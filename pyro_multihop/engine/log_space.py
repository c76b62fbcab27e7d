"""Exact inference over the hop chain of latents ``z_1..z_L``: forward-backward, Viterbi, k-best paths,
posterior sampling, entropy.

The hop latents of every model in this library form a time-inhomogeneous Markov chain over the ``N``
context positions, with an emission only after the last hop. A model describes one batch of chains by
a :class:`HopChain` of log factors; the functions here compute, in log space and in ``O(L N^2)`` per
observation (``O(L N^2 k log k)`` for the k best paths), everything a user or the EM reference needs. They
are the fused counterpart of the enumerated Pyro models (``TraceEnum_ELBO`` computes the same sums by
variable elimination).

There is one recursion, :func:`~pyro_multihop.engine.recursion.recurse`, and the query is the semiring step
passed to it (as in torch-struct): the log semiring (``logsumexp``) gives the likelihood and, run over the transposed factors
from the emission down, the backward messages; the k-max semiring gives the Viterbi path (``k = 1``) and the
k best paths. Posterior sampling and the entropy share the reverse chain: given the target, ``z_l`` depends
on ``z_{l+1}`` alone, through ``p(z_l = i | z_{l+1} = j) ∝ alpha_l(i) p(z_{l+1} = j | z_l = i)``.

Factors are finite: a zero probability is :data:`MASKED_LOGIT` (as ``hop_chain`` builds them); the log
emission may also hold ``-inf``. Shapes: ``n`` observations, ``N`` positions, ``L`` hops.
"""

from __future__ import annotations

from typing import Callable, NamedTuple, Optional, Tuple

import torch

from ..checks import check_positive_int
from ..gate_ops import exp, log_normalize, logsumexp
from .moved_names import deprecated_aliases
from .recursion import recurse

__all__ = [
    "floored_log",
    "log_mixture",
    "HopChain",
    "LogChunkPosterior",
    "draw_by_inverse_cdf",
    "MASKED_LOGIT",
    "masked_log_softmax",
    "chain_log_likelihood",
    "last_hop_prior",
    "chain_posterior",
    "chain_map_paths",
    "chain_sample_paths",
    "chain_sample_posterior",
    "chain_entropy",
    "chain_k_best",
    "path_normalised_logits",
]

# Renamed (<rows>Posterior, Log for log space); the old name is kept for one release.
__getattr__ = deprecated_aliases(__name__, {"ChainPosterior": (__name__, "LogChunkPosterior")})

# Logit given to padding positions: exp() of it is exactly 0 in float32 and float64, yet sums of a few
# of them stay finite, so no inf - inf = NaN appears in the log-space recursions or their gradients.
MASKED_LOGIT = -1e30
# A path score at or below this went through a padding factor (or a -inf emission): probability zero.
# Scores of real paths are sums of L + 1 log-probabilities, never anywhere near -5e29.
_IMPOSSIBLE_SCORE = MASKED_LOGIT / 2


def floored_log(probs: torch.Tensor) -> torch.Tensor:
    """``log(probs)`` with each probability raised to the dtype's smallest normal number first: a probability that
    is 0 gives a finite log (about -708 in float64) and a finite gradient."""
    return probs.clamp_min(torch.finfo(probs.dtype).tiny).log()


def log_mixture(log_probs: torch.Tensor, logit: torch.Tensor, other_log_probs: torch.Tensor) -> torch.Tensor:
    """``log((1 - w) exp(log_probs) + w exp(other_log_probs))`` with ``w = sigmoid(logit)``, in log space: a
    component ``other_log_probs`` mixed into ``log_probs`` (broadcast against each other)."""
    return torch.logaddexp(log_probs + torch.nn.functional.logsigmoid(-logit),
                           torch.nn.functional.logsigmoid(logit) + other_log_probs)


def masked_log_softmax(logits: torch.Tensor, mask: Optional[torch.Tensor]) -> torch.Tensor:
    """``log_softmax`` over the last dim with positions where ``mask`` is False given zero probability.

    :param logits: ``(..., N)``.
    :param mask: bool broadcastable to ``logits`` or None.
    """
    if mask is not None:
        logits = logits.masked_fill(~mask, MASKED_LOGIT)
    return log_normalize(logits)


class HopChain(NamedTuple):
    """Log factors of a batch of hop chains.

    :ivar init: ``(n, N)``, ``log p(z_1 = i)``.
    :ivar trans: ``(L - 1, n, N, N)``, ``trans[l, :, i, j] = log p(z_{l+2} = j | z_{l+1} = i)``.
    """

    init: torch.Tensor
    trans: torch.Tensor

    @property
    def n_hops(self) -> int:
        return 1 + self.trans.shape[0]


class LogChunkPosterior(NamedTuple):
    """Exact posterior over the hop paths of one dense chunk of rows, computed in log space (what
    :func:`chain_posterior` returns; the probability-space counterpart is
    :class:`~pyro_multihop.engine.posterior.ChunkPosterior`, every row's posterior
    :class:`~pyro_multihop.engine.HopPosterior`).

    :ivar log_likelihood: ``(n,)``, ``log p(target | context, query)``.
    :ivar hop_marginals: ``(L, n, N)``, ``p(z_l = i | observation)``.
    :ivar pairwise_marginals: ``(L - 1, n, N, N)``, ``p(z_l = i, z_{l+1} = j | observation)``.
    :ivar map_paths: ``(n, L)`` LongTensor, the most probable hop path.
    """

    log_likelihood: torch.Tensor
    hop_marginals: torch.Tensor
    pairwise_marginals: torch.Tensor
    map_paths: torch.Tensor


# -- the log and k-max steps of the one recursion (:func:`~.recursion.recurse`) ------------------------------
LogStep = Callable[[torch.Tensor, torch.Tensor], Tuple[torch.Tensor, Optional[torch.Tensor]]]


def _over(factors: torch.Tensor, step: LogStep):
    """The recursion step of hop ``hop`` over the log factors ``factors[hop]``."""
    return lambda message, hop: step(message, factors[hop])


def _log_step(message: torch.Tensor, trans: torch.Tensor):
    """Log semiring: ``out[n, j] = logsumexp_i message[n, i] + trans[n, i, j]``; message ``(n, N)``."""
    return logsumexp(message.unsqueeze(-1) + trans, -2), None


def _top(scores: torch.Tensor, k: int, dim: int):
    """The ``min(k, size)`` largest entries along ``dim`` and their indices, best first (``k = 1``: ties to
    the lowest index)."""
    if k == 1:
        return scores.max(dim=dim, keepdim=True)
    return scores.topk(min(k, scores.shape[dim]), dim=dim)


def _kmax_step(k: int) -> LogStep:
    """k-max semiring: the message ``(n, r, N)`` holds, per position, the scores of the ``r <= k`` best paths
    ending there, best first. The pointer ``(n, r', N)`` is the flat index ``rank * N + i`` of each kept
    path's predecessor in the previous message."""

    def step(message, trans):
        scores = message.unsqueeze(-1) + trans.unsqueeze(-3)  # (n, r, N_from, N_to)
        return _top(scores.flatten(-3, -2), k, dim=-2)

    return step


def path_normalised_logits(first: torch.Tensor, later: list) -> Tuple[torch.Tensor, list]:
    """Gate logits of the hop chain whose paths are distributed as one softmax over whole paths of the scores
    ``first[z_1] + sum_l later[l - 2][z_{l-1}, z_l]`` (a linear-chain CRF over the hops), rather than one softmax
    per hop: ``(first + log b_1, [later[l - 2] + log b_l[None, :] ...])``, with the backward messages of the
    unnormalised potentials ``log b_L = 0``, ``log b_{l-1}(i) = logsumexp_j(later[l - 2][i, j] + log b_l(j))``.
    A softmax per hop of the returned logits is that chain (``b_{l-1}(i)`` is constant in ``j``): a hop's choice
    then weighs how well the paths through each candidate go on, where a softmax per hop gives a candidate with no
    good way on the same share as one with.

    :param first: ``(c, N)``. :param later: ``L - 1`` tensors ``(c, N, N)``; masked entries at ``MASKED_LOGIT``.
    """
    beta = torch.zeros_like(first)
    shifted = [None] * len(later)
    for hop in reversed(range(len(later))):
        shifted[hop] = later[hop] + beta.unsqueeze(-2)
        beta = torch.logsumexp(shifted[hop], -1)
    return first + beta, shifted


def _log_forward_messages(chain: HopChain) -> list:
    """Log forward messages ``alpha_l[n, i] = log p(z_l = i)`` (prior, no emission), l = 1..L."""
    return recurse(chain.init, range(chain.n_hops - 1), _over(chain.trans, _log_step))[0]


def _log_backward_messages(chain: HopChain, log_emission: torch.Tensor) -> list:
    """Log backward messages ``beta_l[n, i] = log p(target | z_l = i)``, l = 1..L: the same recursion over the
    transposed factors, from the emission down."""
    betas, _ = recurse(log_emission, reversed(range(chain.n_hops - 1)), _over(chain.trans.transpose(-1, -2), _log_step))
    return betas[::-1]


def _k_best(chain: HopChain, log_emission: torch.Tensor, k: int):
    """The ``min(k, N^L)`` best joint scores ``(n, k')`` and their paths ``(n, k', L)``, best first."""
    N = chain.init.shape[-1]
    messages, pointers = recurse(chain.init.unsqueeze(-2), range(chain.n_hops - 1), _over(chain.trans, _kmax_step(k)))
    final = (messages[-1] + log_emission.unsqueeze(-2)).flatten(-2)  # (n, r * N)
    scores, flat = _top(final, k, dim=-1)
    # Follow the backpointers as flat indices ``rank * N + position`` into each hop's message.
    path = [flat]
    for pointer in reversed(pointers):
        path.insert(0, pointer.flatten(-2).gather(-1, path[0]))
    return scores, torch.stack(path, dim=-1) % N


def _check_log_emission(chain: HopChain, log_emission: torch.Tensor) -> None:
    if log_emission.shape != chain.init.shape:
        raise ValueError(
            f"log_emission must have the shape (n, N) = {tuple(chain.init.shape)} of chain.init, "
            f"got {tuple(log_emission.shape)}"
        )


# -- likelihood, marginals, Viterbi ----------------------------------------------------------------------------
def chain_log_likelihood(chain: HopChain, log_emission: torch.Tensor) -> torch.Tensor:
    """``log sum_{z_1..z_L} p(z_1) prod_l p(z_{l+1} | z_l) p(target | z_L)``.

    :param log_emission: ``(n, N)``, log-probability of each observation's target if the last hop
        lands on position ``i``.
    :returns: ``(n,)``, differentiable.
    """
    return logsumexp(_log_forward_messages(chain)[-1] + log_emission, -1)


def last_hop_prior(chain: HopChain) -> torch.Tensor:
    """``(n, N)``, ``p(z_L = i)`` before seeing the target; the predictive mixes emission rows with it."""
    return _log_forward_messages(chain)[-1].exp()


def chain_posterior(chain: HopChain, log_emission: torch.Tensor) -> LogChunkPosterior:
    """Forward-backward: log-likelihood, per-hop and pairwise posterior marginals, and the MAP path."""
    alphas = _log_forward_messages(chain)
    betas = _log_backward_messages(chain, log_emission)
    log_likelihood = logsumexp(alphas[-1] + log_emission, -1)
    normaliser = log_likelihood.unsqueeze(-1)
    hop_marginals = torch.stack([exp(a + b - normaliser) for a, b in zip(alphas, betas)])
    pairwise = [
        exp(alpha.unsqueeze(-1) + trans + beta.unsqueeze(-2) - normaliser.unsqueeze(-1))
        for alpha, trans, beta in zip(alphas[:-1], chain.trans, betas[1:])
    ]
    n, N = chain.init.shape
    pairwise_marginals = torch.stack(pairwise) if pairwise else chain.init.new_zeros(0, n, N, N)
    return LogChunkPosterior(log_likelihood, hop_marginals, pairwise_marginals, chain_map_paths(chain, log_emission))


def chain_map_paths(chain: HopChain, log_emission: torch.Tensor) -> torch.Tensor:
    """Viterbi: ``(n, L)`` LongTensor, ``argmax_{z} p(z_1..z_L, target)`` (ties to the lowest index).

    The k-max recursion with ``k = 1``, i.e. the max semiring."""
    with torch.no_grad():
        return _k_best(chain, log_emission, 1)[1].squeeze(-2)


# -- posterior path queries ------------------------------------------------------------------------------------
def chain_k_best(chain: HopChain, log_emission: torch.Tensor, k: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """The ``k`` most probable hop paths given the target, best first (k-best Viterbi, the k-max semiring).

    Each position keeps the ``k`` best partial paths ending there with backpointers, so the cost is
    ``O(L N^2 k log k)`` per observation and the paths returned are distinct.

    :param log_emission: ``(n, N)``, as in :func:`chain_log_likelihood`.
    :param int k: how many paths, at least 1.
    :returns: ``paths (n, k, L)`` LongTensor and ``log_probs (n, k)``, ``log p(path | observation)``
        (joint minus log-likelihood), non-increasing along ``k``. Rows beyond the paths of nonzero
        probability (``k > N^L``, or paths through padding or a zero emission) have ``log_prob = -inf``
        and path ``0`` at every hop. Ties between equally probable paths come in no guaranteed order.
    """
    check_positive_int("k", k)
    _check_log_emission(chain, log_emission)
    with torch.no_grad():
        scores, paths = _k_best(chain, log_emission, k)
        log_likelihood = chain_log_likelihood(chain, log_emission)
        impossible = scores <= _IMPOSSIBLE_SCORE
        log_probs = (scores - log_likelihood.unsqueeze(-1)).masked_fill(impossible, float("-inf"))
        paths = paths.masked_fill(impossible.unsqueeze(-1), 0)
        missing = k - scores.shape[-1]  # only when N^L < k
        if missing > 0:
            n, hops = paths.shape[0], paths.shape[-1]
            log_probs = torch.cat([log_probs, log_probs.new_full((n, missing), float("-inf"))], dim=-1)
            paths = torch.cat([paths, paths.new_zeros(n, missing, hops)], dim=-2)
        return paths, log_probs


def chain_sample_posterior(
    chain: HopChain,
    log_emission: torch.Tensor,
    num_samples: int,
    generator: Optional[torch.Generator] = None,
) -> torch.Tensor:
    """Hop paths drawn from the posterior given the target, by forward filtering, backward sampling::

        z_L ~ p(z_L | target)        ∝ alpha_L(z_L) p(target | z_L)
        z_l ~ p(z_l | z_{l+1})       ∝ alpha_l(z_l) p(z_{l+1} | z_l),     l = L-1 .. 1

    with the log forward messages ``alpha_l(i) = log p(z_l = i)``. Positions of zero probability (padding)
    are never drawn.

    :param log_emission: ``(n, N)``, as in :func:`chain_log_likelihood`.
    :param int num_samples: draws per observation, at least 1.
    :param generator: a ``torch.Generator`` on the chain's device, or None for torch's global one.
    :returns: ``(num_samples, n, L)`` LongTensor on the chain's device.
    """
    check_positive_int("num_samples", num_samples)
    _check_log_emission(chain, log_emission)
    with torch.no_grad():
        alphas = _log_forward_messages(chain)
        n, N = chain.init.shape
        # z_L: num_samples draws per observation from one (n, N) distribution.
        position = _inverse_cdf(alphas[-1] + log_emission, num_samples, generator)  # (n, s)
        path = [position]
        for alpha, trans in zip(reversed(alphas[:-1]), reversed(chain.trans)):
            # Column z_{l+1} of each observation's transition, one per draw: (n, s, N_from).
            columns = trans.transpose(-1, -2).gather(-2, position.unsqueeze(-1).expand(n, num_samples, N))
            position = _inverse_cdf(alpha.unsqueeze(-2) + columns, 1, generator).squeeze(-1)
            path.insert(0, position)
        return torch.stack(path, dim=-1).permute(1, 0, 2).contiguous()


def _inverse_cdf(logits: torch.Tensor, num_draws: int, generator: Optional[torch.Generator]) -> torch.Tensor:
    """``num_draws`` independent draws ``(..., num_draws)`` from each row of unnormalised ``logits (..., N)``."""
    return draw_by_inverse_cdf(exp(logits - logits.amax(-1, keepdim=True)), num_draws, generator)


def draw_by_inverse_cdf(weights: torch.Tensor, num_draws: int, generator: Optional[torch.Generator],
                        in_place: bool = False) -> torch.Tensor:
    """``num_draws`` independent draws ``(..., num_draws)`` from each row of non-negative ``weights (..., N)``,
    by inverse CDF (faster than ``torch.multinomial`` on many short rows; ``sample_paths`` in
    benchmarks/results/engine_paths.md).

    ``u`` is uniform below the row total, and the first position whose cumulative weight exceeds ``u``
    has a positive weight, so a position of probability zero is never drawn (a row of zeros gives ``N - 1``).
    With ``in_place``, ``weights`` is overwritten by its running sums (the CDF, whose last entry is the total),
    and no buffer of its size is allocated.
    """
    cdf = weights.cumsum_(-1) if in_place else weights.cumsum(-1)
    total = cdf[..., -1:]
    uniform = torch.rand(cdf.shape[:-1] + (num_draws,), generator=generator, dtype=cdf.dtype, device=cdf.device)
    # rand < 1 keeps rand * total below the total under round-to-nearest; the bound guards it anyway.
    below_total = torch.nextafter(total, torch.zeros_like(total))
    u = torch.minimum(uniform * total, below_total)
    return torch.searchsorted(cdf, u, right=True).clamp_max_(weights.shape[-1] - 1)


def chain_entropy(chain: HopChain, log_emission: torch.Tensor) -> torch.Tensor:
    """Exact entropy, in nats, of the posterior over hop paths given the target.

    By the chain rule on the reverse chain that :func:`chain_sample_posterior` walks::

        H(z_1..z_L | target) = H(z_L | target) + sum_{l<L} E_{z_{l+1} | target} H(z_l | z_{l+1})

    Every term is a sum of ``-p log p >= 0`` over a normalised conditional, so nothing cancels: it stays
    exact as the posterior sharpens (small ``sigma2``), and zero-probability positions contribute 0.

    :param log_emission: ``(n, N)``, as in :func:`chain_log_likelihood`.
    :returns: ``(n,)``, in ``[0, L log N]``; NaN only for a row whose target has probability zero.
    """
    _check_log_emission(chain, log_emission)
    with torch.no_grad():
        alphas = _log_forward_messages(chain)
        log_posterior = log_normalize(alphas[-1] + log_emission)  # log p(z_L | target), (n, N)
        posterior = exp(log_posterior)
        # The emission may hold -inf: take 0 log 0 = 0 explicitly.
        entropy = -torch.where(posterior > 0, posterior * log_posterior, torch.zeros_like(posterior)).sum(-1)
        for alpha, trans, alpha_next in zip(reversed(alphas[:-1]), reversed(chain.trans), reversed(alphas[1:])):
            # log p(z_l = i | z_{l+1} = j) = alpha_l(i) + trans(i, j) - alpha_{l+1}(j), (n, N_i, N_j). The
            # factors are finite, so it is too (0 log 0 never appears); in a column j of probability 0
            # (padding) it is meaningless but <= 0, and weighted by p(z_{l+1} = j | target) = 0.
            log_conditional = (alpha.unsqueeze(-1) + trans - alpha_next.unsqueeze(-2)).clamp_(max=0)
            conditional = exp(log_conditional)
            column_entropy = -(conditional * log_conditional).sum(-2)  # H(z_l | z_{l+1} = j), (n, N_j)
            entropy += (column_entropy * posterior).sum(-1)
            posterior = torch.matmul(conditional, posterior.unsqueeze(-1)).squeeze(-1)  # p(z_l | target)
        return entropy


def chain_sample_paths(chain: HopChain, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Draw ``(n, L)`` hop paths from the prior chain (no target conditioning)."""
    with torch.no_grad():
        probs = chain.init.exp()
        path = [torch.multinomial(probs, 1, generator=generator).squeeze(-1)]
        for trans in chain.trans:
            row = trans.gather(-2, path[-1][:, None, None].expand(-1, 1, trans.shape[-1])).squeeze(-2)
            path.append(torch.multinomial(row.exp(), 1, generator=generator).squeeze(-1))
        return torch.stack(path, dim=-1)
