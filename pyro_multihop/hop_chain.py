"""Exact inference over the hop chain of latents ``z_1..z_L``: forward-backward, Viterbi, sampling.

The hop latents of every model in this library form a time-inhomogeneous Markov chain over the ``N``
context positions, with an emission only after the last hop. A model describes one batch of chains by
a :class:`HopChain` of log factors; the functions here compute, in log space and in ``O(L N^2)`` per
observation, everything a user or the EM reference needs. They are the fused counterpart of the
enumerated Pyro models (``TraceEnum_ELBO`` computes the same sums by variable elimination).

Shapes: ``n`` observations, ``N`` positions, ``L`` hops.
"""

from __future__ import annotations

from typing import NamedTuple, Optional

import torch

from .gates import log_normalize

__all__ = [
    "HopChain",
    "HopPosterior",
    "MASKED_LOGIT",
    "masked_log_softmax",
    "chain_log_likelihood",
    "last_hop_prior",
    "chain_posterior",
    "chain_map_paths",
    "chain_sample_paths",
]

# Logit given to padding positions: exp() of it is exactly 0 in float32 and float64, yet sums of a few
# of them stay finite, so no inf - inf = NaN appears in the log-space recursions or their gradients.
MASKED_LOGIT = -1e30


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


class HopPosterior(NamedTuple):
    """Exact posterior over hop paths for a batch of observations.

    :ivar log_likelihood: ``(n,)``, ``log p(target | context, query)``.
    :ivar hop_marginals: ``(L, n, N)``, ``p(z_l = i | observation)``.
    :ivar pairwise_marginals: ``(L - 1, n, N, N)``, ``p(z_l = i, z_{l+1} = j | observation)``.
    :ivar map_paths: ``(n, L)`` LongTensor, the most probable hop path.
    """

    log_likelihood: torch.Tensor
    hop_marginals: torch.Tensor
    pairwise_marginals: torch.Tensor
    map_paths: torch.Tensor


def _forward(chain: HopChain) -> list:
    """Log forward messages ``alpha_l[n, i] = log p(z_l = i)`` (prior, no emission), l = 1..L."""
    alphas = [chain.init]
    for trans in chain.trans:
        alphas.append(torch.logsumexp(alphas[-1].unsqueeze(-1) + trans, dim=-2))
    return alphas


def chain_log_likelihood(chain: HopChain, log_emission: torch.Tensor) -> torch.Tensor:
    """``log sum_{z_1..z_L} p(z_1) prod_l p(z_{l+1} | z_l) p(target | z_L)``.

    :param log_emission: ``(n, N)``, log-probability of each observation's target if the last hop
        lands on position ``i``.
    :returns: ``(n,)``, differentiable.
    """
    return torch.logsumexp(_forward(chain)[-1] + log_emission, dim=-1)


def last_hop_prior(chain: HopChain) -> torch.Tensor:
    """``(n, N)``, ``p(z_L = i)`` before seeing the target; the predictive mixes emission rows with it."""
    return _forward(chain)[-1].exp()


def chain_posterior(chain: HopChain, log_emission: torch.Tensor) -> HopPosterior:
    """Forward-backward: log-likelihood, per-hop and pairwise posterior marginals, and the MAP path."""
    alphas = _forward(chain)
    betas = [log_emission]
    for trans in reversed(chain.trans):
        betas.insert(0, torch.logsumexp(trans + betas[0].unsqueeze(-2), dim=-1))
    log_likelihood = torch.logsumexp(alphas[-1] + log_emission, dim=-1)
    normaliser = log_likelihood.unsqueeze(-1)
    hop_marginals = torch.stack([(a + b - normaliser).exp() for a, b in zip(alphas, betas)])
    pairwise = [
        (alpha.unsqueeze(-1) + trans + beta.unsqueeze(-2) - normaliser.unsqueeze(-1)).exp()
        for alpha, trans, beta in zip(alphas[:-1], chain.trans, betas[1:])
    ]
    n, N = chain.init.shape
    pairwise_marginals = torch.stack(pairwise) if pairwise else chain.init.new_zeros(0, n, N, N)
    return HopPosterior(log_likelihood, hop_marginals, pairwise_marginals, chain_map_paths(chain, log_emission))


def chain_map_paths(chain: HopChain, log_emission: torch.Tensor) -> torch.Tensor:
    """Viterbi: ``(n, L)`` LongTensor, ``argmax_{z} p(z_1..z_L, target)`` (ties to the lowest index)."""
    with torch.no_grad():
        score = chain.init
        backpointers = []
        for trans in chain.trans:
            score, best_previous = (score.unsqueeze(-1) + trans).max(dim=-2)
            backpointers.append(best_previous)
        last = (score + log_emission).argmax(-1)
        path = [last]
        for best_previous in reversed(backpointers):
            path.insert(0, best_previous.gather(-1, path[0].unsqueeze(-1)).squeeze(-1))
        return torch.stack(path, dim=-1)


def chain_sample_paths(chain: HopChain, generator: Optional[torch.Generator] = None) -> torch.Tensor:
    """Draw ``(n, L)`` hop paths from the prior chain (no target conditioning)."""
    with torch.no_grad():
        probs = chain.init.exp()
        path = [torch.multinomial(probs, 1, generator=generator).squeeze(-1)]
        for trans in chain.trans:
            row = trans.gather(-2, path[-1][:, None, None].expand(-1, 1, trans.shape[-1])).squeeze(-2)
            path.append(torch.multinomial(row.exp(), 1, generator=generator).squeeze(-1))
        return torch.stack(path, dim=-1)
