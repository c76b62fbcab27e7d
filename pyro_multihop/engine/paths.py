"""Queries over whole hop paths: the MAP path, the k best paths, posterior samples and the path entropy."""

from __future__ import annotations

import torch

from .budget import device_chunk, row_slices
from .hop_gates import HopGates
from .log_space import chain_entropy, chain_k_best, chain_map_paths, chain_sample_posterior
from .transitions import rows_per_chunk

__all__ = ["dense_chunks", "map_paths", "sample_paths", "path_entropy", "k_best_paths"]


def dense_chunks(gates: HopGates, obs, budget, extra: float = 0.0):
    """``(rows, chunk, chain, log_emission)`` over dense log-space chunks."""
    n, N = len(obs), obs.context_len
    device = gates.log_emission.device
    with torch.no_grad():
        for part in row_slices(n, rows_per_chunk(gates, N, "positions", budget, extra)):
            chunk = device_chunk(obs, part, device)
            yield part, chunk, gates.dense_chain(chunk), gates.target_log_probs(chunk)


def map_paths(gates: HopGates, obs, budget=None, given_target: bool = True) -> torch.Tensor:
    """``(n, L)`` LongTensor, the most probable hop path given the target (Viterbi; ties to the lowest index);
    with ``given_target=False`` the most probable path of the prior chain (targets ignored)."""
    out = torch.empty(len(obs), gates.n_hops, dtype=torch.long, device=gates.log_emission.device)
    for rows, _, chain, log_emission in dense_chunks(gates, obs, budget):
        out[rows] = chain_map_paths(chain, log_emission if given_target else torch.zeros_like(log_emission))
    return out


def sample_paths(gates: HopGates, obs, num_samples: int, generator=None, budget=None) -> torch.Tensor:
    """``(num_samples, n, L)`` hop paths drawn from the posterior given the target (forward filtering,
    backward sampling)."""
    out = torch.empty(num_samples, len(obs), gates.n_hops, dtype=torch.long, device=gates.log_emission.device)
    extra = 2 * num_samples * obs.context_len
    for rows, _, chain, log_emission in dense_chunks(gates, obs, budget, extra):
        out[:, rows] = chain_sample_posterior(chain, log_emission, num_samples, generator)
    return out


def path_entropy(gates: HopGates, obs, budget=None, given_target: bool = True) -> torch.Tensor:
    """``(n,)`` exact entropy (nats) of the posterior over hop paths given the target; with
    ``given_target=False``, of the prior chain (the uncertainty before the target is seen)."""
    out = gates.log_emission.new_empty(len(obs))
    N = obs.context_len
    for rows, _, chain, log_emission in dense_chunks(gates, obs, budget, extra=2 * N * N):
        log_emission = log_emission if given_target else torch.zeros_like(log_emission)
        out[rows] = chain_entropy(chain, log_emission)
    return out


def k_best_paths(gates: HopGates, obs, k: int, budget=None):
    """``(paths (n, k, L), log_probs (n, k))``: the ``k`` most probable hop paths given the target, best
    first, with their posterior log-probabilities; ``-inf`` rows where fewer than ``k`` paths exist."""
    n, L, N = len(obs), gates.n_hops, obs.context_len
    device = gates.log_emission.device
    paths = torch.zeros(n, k, L, dtype=torch.long, device=device)
    log_probs = gates.log_emission.new_empty(n, k)
    for rows, _, chain, log_emission in dense_chunks(gates, obs, budget, extra=3 * N * N * k):
        paths[rows], log_probs[rows] = chain_k_best(chain, log_emission, k)
    return paths, log_probs
