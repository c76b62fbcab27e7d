"""The exact hop-chain engine (``pyro_multihop.engine``): speed, a torch-struct peer, memory and scaling.

Every measurement is float32, one thread, ``L = 3`` hops, random key tables and a random emission
(``ChainedAttention(3, S, S, sigma2=0.3, init="random", seed=0, emission=random_emission(S, S))``: with the
default uniform emission every log-likelihood is ``-log T`` and the agreement checks would compare
constants), ``T = S`` targets, and uniform random
observations (keys, values, query and target drawn with ``torch.randint`` from one generator of seed 0,
in chunks of rows written into preallocated tensors, so large data sets never exist twice).

Sections (``--sections``, all by default), each writing ``engine_<section>.md`` and ``.csv`` into ``--out``:

- ``speed`` (issue 11, item 5): at every point of the grid ``N`` in {10, 30, 100, 300} x ``S`` in
  {10, 50, 1000}, ``head.log_likelihood(obs)`` (no grad) and ``head.predict_proba(obs)`` against
  ``ChainedEM(...).e_step(head, obs)`` on the same ``n`` rows, and the collapsed loss + backward
  (``Trace_ELBO().differentiable_loss(head.collapsed_model, head.guide, obs)``) against the enumerated one
  (``TraceEnum_ELBO(max_plate_nesting=1).differentiable_loss(head.model, head.guide, obs)``) on
  ``n_loss`` rows, both in ``pyro.get_param_store().scope()``. Side by side in one process, rotated
  rounds, medians (``chained_loss.time_side_by_side``). ``n`` is chosen per point so that the slowest
  call takes some 20-200 ms; the table says which ``n`` and which engine route (``choose_route``) the
  point took, and, to check that choice, the time of the forward-backward over all chunks
  (``engine.forward_backward_chunks``, the work of ``hop_marginals``) forced onto each route (median of
  3). Checked: ``log_likelihood`` sums to the E-step's log-likelihood, the two losses agree.
  Targets: ``log_likelihood`` and ``predict_proba`` within 1.5x of ``e_step``; the collapsed loss at
  least 5x faster than the enumerated one at ``N >= 50`` with ``S <= 4 N`` (issue 22, item 3), and never
  slower.
- ``paths`` (issue 22, items 1-2): per-row cost of ``map_paths``, ``k_best_paths(k=5)``,
  ``sample_paths(num_samples=10)``, ``path_entropy`` and of ``posterior()`` followed by reading
  ``hop_marginals`` and ``map_paths``, against ``hop_marginals`` on the same rows, side by side in rotated
  rounds, at ``N = 100, S = 50`` and ``N = 30, S = 1000``. Checked before timing: the MAP path is one of
  the best-scoring paths of ``k_best_paths`` (on at least 95% of rows: duplicated pairs tie exactly; a wrong
  fast route misses on most), and the lazy posterior's MAP paths equal ``map_paths``. Targets: each query at most 3x ``hop_marginals``,
  ``posterior()`` + reads at most 2x.
- ``peer``: torch-struct's ``LinearChainCRF`` (``pip install torch-struct``; a benchmark-only peer, not a
  dependency) computing the partition and the edge marginals of the same chains, its
  ``(n, L - 1, N, N)`` log potentials built from ``head.hop_chain(obs)`` with the first-hop distribution
  folded into the first potential and the emission of the target into the last, against
  ``head.posterior(obs)``, ``head.posterior(obs, pairwise=True)`` (torch-struct's marginals are pairwise)
  and ``head.hop_marginals`` + ``head.log_likelihood``, at ``n = 2000``, ``N = 50``, ``S = 50``. Checked:
  the partition equals ``log_likelihood`` and the summed edge marginals equal the hop marginals.
- ``hmm`` (issue 22, item 5): Pyro's ``DiscreteHMM`` as a peer. Its user builds, from the head's score
  tables, the initial logits ``(n, N)`` and the transition logits ``(n, L - 1, N, N)`` of every row
  (``hmm_logits``; the target enters as a ``Delta`` observation with ``log_density`` at the last step,
  ``discrete_hmm``). At every point of ``HMM_GRID`` (``N`` in {10, 30, 50, 100}, ``S`` in {50, 1000}, ``n``
  from 200 to 2000), side by side in rotated rounds: that build, ``DiscreteHMM``'s forward
  (construction + ``log_prob``) on ready-made logits, ``head.log_likelihood`` (both without grad), and loss
  + backward to the head's parameters (the build included for ``DiscreteHMM``). Checked before timing:
  ``log_prob`` equals ``log_likelihood`` row by row (relative 1e-5), the gradients agree, and the rows'
  log-likelihoods are not all equal. Targets: the library at least 2x ahead everywhere, build included, and
  3x from ``N = 50``. Then the peak memory of one forward pass of each at ``n = 20 000``, ``N = 100``,
  ``S = 50`` (each in its own process, ``VmHWM`` reset after the data is loaded; also
  ``engine_hmm_memory.csv``).
- ``memory`` (item 2): ``n = 200 000``, ``N = 100``, ``S = 50``; each query in its own subprocess: the
  peak resident set size minus the resident size after loading the data (and a warm-up on 10 rows, so
  that lazily loaded code is already paid for) minus the size of the output, at the default memory
  budget (``engine.get_memory_budget()``). The kernel's peak counter is reset after the load
  (``/proc/self/clear_refs``, as ``em_vs_numpy.py`` does; ``ru_maxrss`` where it cannot be reset, which
  only over-reports). Target: each at most 1024 MiB. Queries whose implementation is missing (they
  raise ``AttributeError``/``ImportError``) are marked "not available".
- ``sharp``: a trained-like head with a sharp gate (key tables the identity plus uniform noise of 0.1, seeded;
  ``sigma2 = 1e-3``), whose transition weights underflow for most rows on the symbol route (a context seldom
  holds the key that a query's weights are shifted by). At ``SHARP_GRID``, side by side in rotated rounds:
  ``log_likelihood``, ``predict_proba``, ``hop_marginals``, the collapsed and the enumerated loss + backward,
  against the same head at ``sigma2 = 0.3`` on the same rows, and against every row in log space
  (``chain_log_likelihood`` on the dense chain, what each failing row cost before the dense retry). The table
  gives the rows per route of the forward-backward (``forward_backward_chunks``). Checked: the likelihood
  equals the log-space one (relative 1e-5), the predictive rows sum to 1 and both losses are minus the
  likelihood.
- ``scaling`` (item 6): time and peak memory (measured as in ``memory``) of ``log_likelihood`` and
  ``e_step`` for ``n`` in {1e4, 1e5, 1e6} at ``N = 100``, ``S = 50``; for ``N`` in {10, 30, 100, 300,
  1000} at ``n = 10 000``, ``S = 50``; and for ``S`` in {10, 50, 200, 400} at ``N = 100``,
  ``n = 10 000`` (all on the symbol route). One subprocess per data set; the two queries run one after
  the other in it, the peak counter reset between them. The table ends with log-log slopes of the time
  in ``n``, ``N`` and ``S``.

Usage::

    python benchmarks/engine.py --out benchmarks/results                      # every section
    python benchmarks/engine.py --out benchmarks/results --sections speed peer
    python benchmarks/engine.py --out benchmarks/results --sections hmm        # the DiscreteHMM peer
    python benchmarks/engine.py --out benchmarks/results --sections sharp      # sharp gates (sigma2 = 1e-3)
    python benchmarks/engine.py --out /tmp/bench --smoke                      # tiny sizes, in-process
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

from chained_loss import random_emission, time_side_by_side  # benchmarks/, beside this file
from em_vs_numpy import _reset_peak_rss, _status_kib, _trim_heap

HOPS = 3
SIGMA2 = 0.3
SEED = 0
SECTIONS = ("speed", "paths", "peer", "hmm", "memory", "scaling", "sharp")

# (N, S, n for the plug-in queries and the E-step, n for the two losses)
SPEED_GRID = [
    (10, 10, 10000, 1000),
    (10, 50, 2000, 1000),
    (10, 1000, 150, 200),
    (30, 10, 10000, 500),
    (30, 50, 4000, 500),
    (30, 1000, 60, 200),
    (100, 10, 4000, 100),
    (100, 50, 4000, 100),
    (100, 1000, 10, 50),
    (300, 10, 2000, 20),
    (300, 50, 2000, 20),
    (300, 1000, 150, 20),
]
SMOKE_SPEED_GRID = [(6, 8, 60, 30), (4, 30, 40, 20)]
PEER = {"n": 2000, "N": 50, "S": 50}
SMOKE_PEER = {"n": 30, "N": 6, "S": 8}
# (N, S, n) of the DiscreteHMM peer; its memory is measured at HMM_MEMORY.
HMM_GRID = [
    (10, 50, 2000),
    (10, 1000, 200),
    (10, 1000, 2000),
    (30, 50, 2000),
    (30, 1000, 200),
    (50, 50, 2000),
    (50, 1000, 200),
    (50, 1000, 2000),
    (100, 50, 1000),
    (100, 1000, 200),
]
SMOKE_HMM_GRID = [(6, 8, 30), (4, 30, 20)]
HMM_MEMORY = {"n": 20_000, "N": 100, "S": 50}
SMOKE_HMM_MEMORY = {"n": 200, "N": 8, "S": 6}
HMM_AGREEMENT = 1e-5  # per row, relative: the two forward passes of one float32 chain
MEMORY = {"n": 200_000, "N": 100, "S": 50}
SMOKE_MEMORY = {"n": 300, "N": 8, "S": 6}
QUERIES = ("log_likelihood", "predict_proba", "hop_marginals", "value_marginals", "e_step", "map_paths",
           "sample_paths", "path_entropy", "k_best_paths", "posterior")
#: The route each query's chunks take (``choose_route``'s flags): max-product, forward-backward, or forward.
QUERY_ROUTE = {"map_paths": {"max_product": True}, "k_best_paths": {"max_product": True},
               "path_entropy": {"backward": True}, "hop_marginals": {"backward": True},
               "value_marginals": {"backward": True}, "e_step": {"backward": True}, "posterior": {"backward": True}}
SCALING = (
    [("n", 10_000, 100, 50), ("n", 100_000, 100, 50), ("n", 1_000_000, 100, 50)]
    + [("N", 10_000, N, 50) for N in (10, 30, 100, 300, 1000)]
    + [("S", 10_000, 100, S) for S in (10, 50, 200, 400)]
)
SMOKE_SCALING = [("n", 100, 8, 6), ("n", 400, 8, 6), ("N", 100, 4, 6), ("N", 100, 16, 6), ("S", 100, 8, 4),
                 ("S", 100, 8, 12)]
TARGETS = {"plug_in_ratio": 1.5, "collapsed_speedup": 5.0, "collapsed_speedup_from_N": 50,
           "collapsed_speedup_max_S_per_N": 4, "memory_mib": 1024, "hmm_ratio": 2.0, "hmm_ratio_large": 3.0,
           "hmm_ratio_large_from_N": 50}
AGREEMENT = 1e-4  # relative, float32 sums over many rows


# -- data and models --------------------------------------------------------------------------------------------
def random_observations(n: int, context: int, symbols: int, seed: int = SEED, chunk: int = 100_000):
    """``n`` uniform random observations (keys, values ``(n, context)``, query, target ``(n,)`` over ``symbols``
    symbols), drawn in chunks of rows from one seeded generator into preallocated tensors."""
    import torch

    from pyro_multihop import Observations

    generator = torch.Generator().manual_seed(seed)
    keys = torch.empty(n, context, dtype=torch.long)
    values = torch.empty(n, context, dtype=torch.long)
    query = torch.empty(n, dtype=torch.long)
    target = torch.empty(n, dtype=torch.long)
    for start in range(0, n, chunk):
        stop = min(n, start + chunk)
        keys[start:stop] = torch.randint(symbols, (stop - start, context), generator=generator)
        values[start:stop] = torch.randint(symbols, (stop - start, context), generator=generator)
        query[start:stop] = torch.randint(symbols, (stop - start,), generator=generator)
        target[start:stop] = torch.randint(symbols, (stop - start,), generator=generator)
    return Observations(keys, values, query, target)


def make_head(symbols: int):
    """The benchmark's head: random key tables and a random emission (``chained_loss.random_emission``; with the
    default uniform one every log-likelihood would be ``-log T``, and the agreement checks would compare
    constants)."""
    from pyro_multihop import ChainedAttention

    return ChainedAttention(HOPS, symbols, symbols, sigma2=SIGMA2, init="random", seed=SEED,
                            emission=random_emission(symbols, symbols, SEED))


def make_em(symbols: int):
    from pyro_multihop.em import ChainedEM

    return ChainedEM(HOPS, symbols, symbols, sigma2=SIGMA2)


def _setup_torch():
    import warnings

    import torch

    torch.set_num_threads(1)
    warnings.filterwarnings("ignore")  # Pyro's and torch's deprecation chatter in a benchmark's output
    return torch


def _load_average() -> str:
    try:
        return " ".join(open("/proc/loadavg").read().split()[:3])
    except OSError:
        return "unknown"


def _without_grad(head, obs, *names) -> dict:
    """``name -> callable``: ``head.<name>(obs)`` under ``torch.no_grad()``, to time."""
    import torch

    def query(name):
        def run():
            with torch.no_grad():
                return getattr(head, name)(obs)

        return run

    return {name: query(name) for name in names}


def _loss_and_backward(head, model, obs, elbo):
    """A callable: ``elbo``'s loss of ``model`` (with ``head.guide``) on ``obs`` and its backward, the head's
    gradients cleared first; returns the loss as a float."""

    def run():
        head.zero_grad(set_to_none=True)
        loss = elbo.differentiable_loss(model, head.guide, obs)
        loss.backward()
        return float(loss.detach())

    return run


# -- speed ---------------------------------------------------------------------------------------------------------
def speed_point(N: int, S: int, n: int, n_loss: int, repeats: int) -> dict:
    """Median milliseconds of the plug-in queries against the E-step, and of the two losses, at one point."""
    torch = _setup_torch()
    import pyro
    from pyro.infer import Trace_ELBO, TraceEnum_ELBO

    from pyro_multihop import engine

    head, em = make_head(S), make_em(S)
    obs = random_observations(n, N, S)
    route = engine.choose_route(head.hop_factors(), N)

    log_likelihood, predict_proba = _without_grad(head, obs, "log_likelihood", "predict_proba").values()

    def e_step():
        return em.e_step(head, obs)

    total = float(log_likelihood().double().sum())
    em_total = e_step().loglik
    if abs(total - em_total) > AGREEMENT * abs(em_total):
        raise RuntimeError(f"log_likelihood and e_step disagree at N={N} S={S}: {total} vs {em_total}")
    plug_in = time_side_by_side(
        {"log_likelihood": log_likelihood, "predict_proba": predict_proba, "e_step": e_step}, repeats, warmup_rounds=1
    )

    factors = head.hop_factors()

    def forward_backward(route):
        def run():
            for _ in engine.forward_backward_chunks(factors, obs, route=route):
                pass

        return run

    routes = time_side_by_side({r: forward_backward(r) for r in ("symbols", "positions")}, 3, warmup_rounds=1)

    loss_obs = obs[:n_loss] if n_loss <= n else random_observations(n_loss, N, S)
    collapsed_elbo, enumerated_elbo = Trace_ELBO(), TraceEnum_ELBO(max_plate_nesting=1)
    with pyro.get_param_store().scope():
        collapsed = _loss_and_backward(head, head.collapsed_model, loss_obs, collapsed_elbo)
        enumerated = _loss_and_backward(head, head.model, loss_obs, enumerated_elbo)
        losses = collapsed(), enumerated()
        if abs(losses[0] - losses[1]) > AGREEMENT * abs(losses[1]):
            raise RuntimeError(f"collapsed and enumerated losses disagree at N={N} S={S}: {losses}")
        loss_times = time_side_by_side({"collapsed": collapsed, "enumerated": enumerated}, repeats, warmup_rounds=1)
    return {
        "N": N,
        "S": S,
        "route": route,
        "n": n,
        "log_likelihood_ms": plug_in["log_likelihood"],
        "predict_proba_ms": plug_in["predict_proba"],
        "e_step_ms": plug_in["e_step"],
        "log_likelihood_ratio": plug_in["log_likelihood"] / plug_in["e_step"],
        "predict_proba_ratio": plug_in["predict_proba"] / plug_in["e_step"],
        "symbols_fb_ms": routes["symbols"],
        "positions_fb_ms": routes["positions"],
        "n_loss": len(loss_obs),
        "collapsed_ms": loss_times["collapsed"],
        "enumerated_ms": loss_times["enumerated"],
        "collapsed_speedup": loss_times["enumerated"] / loss_times["collapsed"],
    }


def _points(point, grid, repeats: int, describe) -> list:
    """``point(*p, repeats)`` at every ``p`` of ``grid``, each row printed as ``describe(row)``."""
    rows = []
    for arguments in grid:
        rows.append(point(*arguments, repeats))
        print(describe(rows[-1]), flush=True)
    return rows


def speed_section(grid, repeats: int) -> list:
    return _points(speed_point, grid, repeats, lambda row: (
        f"N={row['N']:4d} S={row['S']:5d} {row['route']:9s} n={row['n']:6d}  ll {row['log_likelihood_ms']:8.2f}"
        f"  pp {row['predict_proba_ms']:8.2f}  e_step {row['e_step_ms']:8.2f} ms  ratios "
        f"{row['log_likelihood_ratio']:.2f}/{row['predict_proba_ratio']:.2f} | n={row['n_loss']:5d} collapsed "
        f"{row['collapsed_ms']:8.2f}  enumerated {row['enumerated_ms']:8.2f} ms  x{row['collapsed_speedup']:.1f}"))


def speed_table(rows: list) -> list:
    lines = [
        "| N | S | route | n | `log_likelihood` (ms) | `predict_proba` (ms) | `e_step` (ms) | ratios ll / pp "
        "(target <= 1.5) | n (loss) | collapsed loss + backward (ms) | enumerated (ms) | speed-up (target >= 5 at N >= 50 and S <= 4 N, else >= 1) "
        "| forward-backward on the symbol / position route (ms) |",
        "|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---|",
    ]
    for r in rows:
        ratio_ok = max(r["log_likelihood_ratio"], r["predict_proba_ratio"]) <= TARGETS["plug_in_ratio"]
        needed = (TARGETS["collapsed_speedup"] if r["N"] >= TARGETS["collapsed_speedup_from_N"]
                  and r["S"] <= TARGETS["collapsed_speedup_max_S_per_N"] * r["N"] else 1.0)
        lines.append(
            f"| {r['N']} | {r['S']} | {r['route']} | {r['n']} | {r['log_likelihood_ms']:.2f} | "
            f"{r['predict_proba_ms']:.2f} | {r['e_step_ms']:.2f} | {r['log_likelihood_ratio']:.2f} / "
            f"{r['predict_proba_ratio']:.2f} {'ok' if ratio_ok else '**missed**'} | {r['n_loss']} | "
            f"{r['collapsed_ms']:.2f} | {r['enumerated_ms']:.2f} | {r['collapsed_speedup']:.1f}x "
            f"{'ok' if r['collapsed_speedup'] >= needed else '**missed**'} | {r['symbols_fb_ms']:.1f} / "
            f"{r['positions_fb_ms']:.1f} |"
        )
    return lines


# -- torch-struct peer ------------------------------------------------------------------------------------------
def crf_log_potentials(chain, log_emission):
    """torch-struct's ``(n, L - 1, N, N)`` log potentials ``phi[b, l, z_{l+1}, z_l]`` of the hop chain, the
    first-hop distribution folded into the first and the target's emission into the last, so that the
    partition is the log-likelihood."""
    potentials = chain.trans.permute(1, 0, 3, 2).clone()  # trans[l, b, i, j] -> phi[b, l, j, i]
    potentials[:, 0] += chain.init.unsqueeze(-2)
    potentials[:, -1] += log_emission.unsqueeze(-1)
    return potentials


def peer_point(n: int, N: int, S: int, repeats: int) -> dict:
    torch = _setup_torch()
    try:
        from torch_struct import LinearChainCRF
    except ImportError as error:
        return {"n": n, "N": N, "S": S, "torch_struct": f"not available ({error})"}
    import torch_struct

    head = make_head(S)
    obs = random_observations(n, N, S)

    def build_potentials():
        with torch.no_grad():
            return crf_log_potentials(head.hop_chain(obs), head.log_emission[obs.values, obs.target.unsqueeze(-1)])

    potentials = build_potentials()

    def torch_struct_crf():
        crf = LinearChainCRF(potentials.clone().requires_grad_())
        return crf.partition.detach(), crf.marginals.detach()

    def posterior():
        return head.posterior(obs)

    def posterior_pairwise():
        return head.posterior(obs, pairwise=True)

    def marginals_and_likelihood():
        with torch.no_grad():
            return head.hop_marginals(obs), head.log_likelihood(obs)

    partition, edge_marginals = torch_struct_crf()
    marginals, log_likelihood = marginals_and_likelihood()
    partition_error = float(((partition - log_likelihood).abs() / log_likelihood.abs()).max())
    # edge_marginals[b, l, j, i] = p(z_{l+2} = j, z_{l+1} = i | observation) (0-based l)
    hop_marginals_crf = torch.cat([edge_marginals.sum(-2), edge_marginals[:, -1:].sum(-1)], 1).transpose(0, 1)
    marginal_error = float((hop_marginals_crf - marginals).abs().max())
    if partition_error > AGREEMENT or marginal_error > AGREEMENT:
        raise RuntimeError(f"torch-struct and the engine disagree: partition {partition_error}, marginals {marginal_error}")
    times = time_side_by_side(
        {
            "torch_struct": torch_struct_crf,
            "posterior": posterior,
            "posterior_pairwise": posterior_pairwise,
            "marginals_and_likelihood": marginals_and_likelihood,
            "build_potentials": build_potentials,
        },
        repeats,
        warmup_rounds=1,
    )
    return {
        "n": n,
        "N": N,
        "S": S,
        "torch_struct": torch_struct.__version__ if hasattr(torch_struct, "__version__") else "installed",
        "torch_struct_ms": times["torch_struct"],
        "potentials_ms": times["build_potentials"],
        "posterior_ms": times["posterior"],
        "posterior_pairwise_ms": times["posterior_pairwise"],
        "marginals_and_likelihood_ms": times["marginals_and_likelihood"],
        "partition_max_rel_error": partition_error,
        "marginals_max_abs_error": marginal_error,
    }


def peer_table(row: dict) -> list:
    if "torch_struct_ms" not in row:
        return [f"torch-struct: {row['torch_struct']}"]
    return [
        "| n | N | torch-struct `LinearChainCRF` partition + marginals (ms) | building its potentials (ms) "
        "| `posterior()` (ms) | `posterior(pairwise=True)` (ms) | `hop_marginals` + `log_likelihood` (ms) "
        "| partition: max rel. difference | hop marginals: max abs. difference |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        f"| {row['n']} | {row['N']} | {row['torch_struct_ms']:.1f} | {row['potentials_ms']:.1f} | {row['posterior_ms']:.1f} | "
        f"{row['posterior_pairwise_ms']:.1f} | {row['marginals_and_likelihood_ms']:.1f} | "
        f"{row['partition_max_rel_error']:.1e} | {row['marginals_max_abs_error']:.1e} |",
    ]


# -- Pyro's DiscreteHMM peer -------------------------------------------------------------------------------------
def hmm_logits(factors, obs):
    """The inputs a user of Pyro's ``DiscreteHMM`` builds from the head's score tables ``factors.score_tables``:
    initial logits ``(n, N)`` of hop 1, transition logits ``(n, L - 1, N, N)`` (``[b, l, i, j]``: position ``i``'s
    value meets position ``j``'s key at hop ``l + 2``; unnormalised, ``DiscreteHMM`` normalises them) and the
    target's log emission ``(n, N)`` at each position of the last hop. The logits come from
    ``ScoreTables.chain_logits``, the cheapest route the library offers (one gather from the key tables, never
    the whole ``(L, S, S)`` table), so the build is what a user who knows the library would pay."""
    initial, transition = factors.score_tables.chain_logits(obs)
    emission = factors.log_emission[obs.values, obs.target.unsqueeze(-1)]
    return initial, transition.transpose(0, 1), emission


def discrete_hmm(initial, transition, emission):
    """``(DiscreteHMM, value)`` whose ``log_prob(value)`` is the log-likelihood of each row: the ``L - 1``
    transitions are its time steps, and the target enters as a ``Delta`` observation whose ``log_density`` is
    the log emission at the last step and 0 before it."""
    import pyro.distributions as dist
    import torch

    n, steps, N = transition.shape[:3]
    log_density = torch.cat([emission.new_zeros(n, steps - 1, N), emission.unsqueeze(1)], 1)
    observation = dist.Delta(torch.zeros_like(log_density), log_density=log_density)
    return dist.DiscreteHMM(initial, transition, observation), emission.new_zeros(n, steps)


def _relative_norm(got, want) -> float:
    import torch

    return float(torch.linalg.vector_norm((got - want).double()) / torch.linalg.vector_norm(want.double()))


def hmm_point(N: int, S: int, n: int, repeats: int) -> dict:
    """Pyro's ``DiscreteHMM`` against the library at one point: building its logits from the head, its forward
    pass, and loss + backward (to the head's parameters), timed side by side in rotated rounds (medians)."""
    torch = _setup_torch()
    from pyro_multihop import engine

    head = make_head(S)
    obs = random_observations(n, N, S)
    parameters = list(head.parameters())

    def build():
        with torch.no_grad():
            return hmm_logits(head.hop_factors(), obs)

    def parameter_reads():
        """The part of both sides' work that reads every parameter, whatever the batch: the emission's row
        normalisers (``hop_factors`` forms the log emission) and the key tables' norms."""
        with torch.no_grad():
            return head.hop_factors().score_tables.half_norms()

    ready = build()

    def build_and_backward():
        """The build, differentiated: the part of ``DiscreteHMM``'s loss that reads the parameters and writes their
        gradients, which the library's loss on the position route pays too (it gathers the same logits)."""
        head.zero_grad(set_to_none=True)
        initial, transition, emission = hmm_logits(head.hop_factors(), obs)
        (initial.sum() + transition.sum() + emission.sum()).backward()

    def hmm_forward():
        with torch.no_grad():
            hmm, value = discrete_hmm(*ready)
            return hmm.log_prob(value)

    def library_forward():
        with torch.no_grad():
            return head.log_likelihood(obs)

    def hmm_loss():
        head.zero_grad(set_to_none=True)
        hmm, value = discrete_hmm(*hmm_logits(head.hop_factors(), obs))
        loss = -hmm.log_prob(value).sum()
        loss.backward()
        return loss.detach()

    def library_loss():
        head.zero_grad(set_to_none=True)
        loss = -head.log_likelihood(obs).sum()
        loss.backward()
        return loss.detach()

    def with_gradients(loss):  # for the check only: the timed losses leave their gradients in place, uncopied
        return loss(), [p.grad.clone() for p in parameters]

    # The check before any timing: the same log-likelihood per row, the same gradient.
    hmm_rows, library_rows = hmm_forward(), library_forward()
    row_error = float(((hmm_rows - library_rows).abs() / library_rows.abs()).max())
    (hmm_value, hmm_grads), (library_value, library_grads) = with_gradients(hmm_loss), with_gradients(library_loss)
    grad_error = max(_relative_norm(got, want) for got, want in zip(hmm_grads, library_grads))
    if row_error > HMM_AGREEMENT or grad_error > 100 * HMM_AGREEMENT or not torch.isfinite(hmm_rows).all():
        raise RuntimeError(f"DiscreteHMM and the library disagree at N={N} S={S} n={n}: log-likelihood per row "
                           f"{row_error:.2e} (limit {HMM_AGREEMENT}), gradient {grad_error:.2e}")
    if float(library_rows.std()) == 0.0:
        raise RuntimeError("every row has the same log-likelihood: the agreement check compares constants")
    times = time_side_by_side(
        {"build": build, "hmm_forward": hmm_forward, "library_forward": library_forward, "hmm_loss": hmm_loss,
         "library_loss": library_loss, "parameter_reads": parameter_reads, "build_and_backward": build_and_backward},
        repeats,
        warmup_rounds=1,
    )
    return {
        "N": N,
        "S": S,
        "n": n,
        "route": engine.choose_route(head.hop_factors(), N),
        "build_ms": times["build"],
        "parameter_reads_ms": times["parameter_reads"],
        "hmm_forward_ms": times["hmm_forward"],
        "library_forward_ms": times["library_forward"],
        "hmm_loss_ms": times["hmm_loss"],
        "library_loss_ms": times["library_loss"],
        "forward_ratio": (times["build"] + times["hmm_forward"]) / times["library_forward"],
        "forward_ratio_ready_logits": times["hmm_forward"] / times["library_forward"],
        "build_and_backward_ms": times["build_and_backward"],
        # The ratios the library would reach if its forward cost no more than the build (whose gathers and parameter
        # reads its position route repeats), and its loss no more than the build differentiated.
        "forward_ratio_bound": (times["build"] + times["hmm_forward"]) / times["build"],
        "loss_ratio_bound": times["hmm_loss"] / times["build_and_backward"],
        "loss_ratio": times["hmm_loss"] / times["library_loss"],
        "max_row_rel_difference": row_error,
        "grad_rel_difference": grad_error,
    }


def hmm_section(grid, repeats: int) -> list:
    return _points(hmm_point, grid, repeats, lambda row: (
        f"N={row['N']:4d} S={row['S']:5d} n={row['n']:6d}  build {row['build_ms']:8.2f}  hmm {row['hmm_forward_ms']:8.2f}"
        f"  library {row['library_forward_ms']:8.2f} ms  x{row['forward_ratio']:.1f} | loss hmm {row['hmm_loss_ms']:8.2f}"
        f"  library {row['library_loss_ms']:8.2f} ms  x{row['loss_ratio']:.1f}"))


def hmm_peak(which: str, n: int, N: int, S: int) -> dict:
    """Peak resident memory of one forward pass (no grad) of ``which`` (``"DiscreteHMM"``: building its logits
    from the head, then ``log_prob``; ``"library"``: ``head.log_likelihood``), after the data is loaded and a
    warm-up on 10 rows: ``VmHWM`` reset just before the pass (``ru_maxrss`` where it cannot be reset)."""
    torch = _setup_torch()
    import resource

    head = make_head(S)

    def run(obs):
        with torch.no_grad():
            if which == "library":
                return head.log_likelihood(obs)
            hmm, value = discrete_hmm(*hmm_logits(head.hop_factors(), obs))
            return hmm.log_prob(value)

    run(random_observations(10, N, S))
    obs = random_observations(n, N, S)
    gc.collect()
    _trim_heap()
    reset = _reset_peak_rss()
    rss_before = _status_kib("VmRSS")
    start = time.perf_counter()
    run(obs)
    seconds = time.perf_counter() - start
    peak = _status_kib("VmHWM") if reset else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"implementation": which, "n": n, "N": N, "S": S, "seconds": seconds, "rss_after_load_mib": rss_before / 1024,
            "peak_mib": peak / 1024, "working_mib": max(peak - rss_before, 0) / 1024,
            "peak_counter": "VmHWM, reset" if reset else "ru_maxrss"}


def hmm_table(rows: list, memory: list) -> list:
    def target(N):
        return TARGETS["hmm_ratio_large"] if N >= TARGETS["hmm_ratio_large_from_N"] else TARGETS["hmm_ratio"]

    lines = [
        "Pyro's `DiscreteHMM` given the head's chains: initial logits `(n, N)`, transition logits `(n, L - 1, N, N)` "
        "gathered from the score tables, the target's emission as a `Delta` observation with `log_density` at the "
        "last step. Ratios are `DiscreteHMM`'s time over the library's (> 1: the library is ahead); the forward "
        "ratio counts the build of its logits from the head (its user must do it), the loss ratio too "
        f"(targets: >= {TARGETS['hmm_ratio']:g} everywhere, >= {TARGETS['hmm_ratio_large']:g} from "
        f"N = {TARGETS['hmm_ratio_large_from_N']}). Checked before timing: `log_prob` equals `log_likelihood` per row "
        f"(relative, limit {HMM_AGREEMENT:g}) and the two gradients agree. The build gathers the logits from the key "
        "tables (`ScoreTables.chain_logits`), never forming the whole table where the batch needs fewer entries. "
        "\"parameter reads\" is the part of both the build and the library's forward that reads every parameter "
        "whatever the batch (the emission's row normalisers, the key tables' norms). The two bounds are the ratios "
        "the library would reach if its forward cost no more than the build of `DiscreteHMM`'s logits (whose "
        "gathers and parameter reads the library's position route repeats) and its loss no more than that build "
        "differentiated (\"build + backward\": reading the parameters and writing their dense gradients, `(L + 1) S^2` "
        "entries): where a bound is below the target, no speed-up of the library's own recursion can meet it. "
        "The bounds hold for rows on the position route; the symbol route gathers no pairs, and passes them.",
        "",
        "| N | S | n | library route | build of its logits (ms) | parameter reads (ms) | `DiscreteHMM` forward (ms) "
        "| library forward (ms) | forward ratio, with build | forward bound | forward ratio, ready logits | "
        "`DiscreteHMM` loss + backward (ms) | library loss + backward (ms) | build + backward (ms) | loss ratio | "
        "loss bound | max rel. difference per row | gradient rel. difference |",
        "|---:|---:|---:|---|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---|---:|---:|---:|",
    ]
    for r in rows:
        need = target(r["N"])
        lines.append(
            f"| {r['N']} | {r['S']} | {r['n']} | {r['route']} | {r['build_ms']:.2f} | "
            f"{r.get('parameter_reads_ms', float('nan')):.2f} | {r['hmm_forward_ms']:.2f} | "
            f"{r['library_forward_ms']:.2f} | {r['forward_ratio']:.1f}x {'ok' if r['forward_ratio'] >= need else '**missed**'} | "
            f"{r.get('forward_ratio_bound', float('nan')):.1f}x | "
            f"{r['forward_ratio_ready_logits']:.1f}x | {r['hmm_loss_ms']:.2f} | {r['library_loss_ms']:.2f} | "
            f"{r.get('build_and_backward_ms', float('nan')):.2f} | "
            f"{r['loss_ratio']:.1f}x {'ok' if r['loss_ratio'] >= need else '**missed**'} | "
            f"{r.get('loss_ratio_bound', float('nan')):.1f}x | "
            f"{r['max_row_rel_difference']:.1e} | {r['grad_rel_difference']:.1e} |"
        )
    if memory:
        lines += [
            "",
            "Peak memory of one forward pass (no grad), each in its own process after loading the data: peak resident "
            "set (`VmHWM`, reset after the load) minus the resident set after the load.",
            "",
            "| implementation | n | N | S | time (s) | RSS after load (MiB) | peak RSS (MiB) | peak - load (MiB) |",
            "|---|---:|---:|---:|---:|---:|---:|---:|",
        ]
        lines += [f"| {m['implementation']} | {m['n']} | {m['N']} | {m['S']} | {m['seconds']:.2f} | "
                  f"{m['rss_after_load_mib']:.0f} | {m['peak_mib']:.0f} | {m['working_mib']:.0f} |" for m in memory]
    return lines


# -- memory ----------------------------------------------------------------------------------------------------
def _run_query(query: str, head, obs, em):
    """Run ``query`` once; return its output (a tensor, a tuple of tensors, or the E-step's statistics)."""
    import torch

    with torch.no_grad():
        if query == "e_step":
            return em.e_step(head, obs)
        if query == "sample_paths":
            return head.sample_paths(obs, 1, seed=SEED)
        if query == "k_best_paths":
            return head.k_best_paths(obs, 3)
        if query == "posterior":  # the lazy posterior, read for its marginals and MAP paths
            posterior = head.posterior(obs)
            posterior.map_paths
            return posterior
        return getattr(head, query)(obs)


def _output_bytes(output) -> int:
    import torch

    from pyro_multihop.engine import HopPosterior

    if isinstance(output, HopPosterior):  # what it answers; what it keeps to answer later counts as working memory
        return _output_bytes((output.log_likelihood, output.hop_marginals, output.map_paths))
    if isinstance(output, torch.Tensor):
        return output.numel() * output.element_size()
    if isinstance(output, (tuple, list)):
        return sum(_output_bytes(item) for item in output)
    if hasattr(output, "__dict__"):  # SufficientStats and the like
        return sum(_output_bytes(value) for value in vars(output).values())
    return 0


def measure_queries(queries, n: int, N: int, S: int) -> list:
    """Time and peak memory of each query on one data set: after the load and a warm-up on 10 rows, the heap
    is trimmed and the peak counter reset before each query. Time: the fastest of 3 runs under 1 s, of 2
    under 10 s, else of one; the peak is over all of them."""
    _setup_torch()
    from pyro_multihop import engine

    head, em = make_head(S), make_em(S)
    missing = {}
    for query in queries:  # a warm-up on 10 rows, before the data is loaded
        try:
            _run_query(query, head, random_observations(10, N, S), em)
        except (AttributeError, ImportError, NotImplementedError) as error:
            missing[query] = f"not available ({type(error).__name__}: {error})"
    obs = random_observations(n, N, S) if len(missing) < len(queries) else None
    rows = []
    for query in queries:
        if query in missing:
            rows.append({"query": query, "n": n, "N": N, "S": S, "status": missing[query]})
            continue
        gc.collect()
        _trim_heap()
        reset = _reset_peak_rss()
        rss_before = _status_kib("VmRSS")
        if not reset:
            import resource

            peak_before_query = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        start = time.perf_counter()
        output = _run_query(query, head, obs, em)
        seconds = time.perf_counter() - start
        for _ in range(2 if seconds < 1.0 else 1 if seconds < 10.0 else 0):  # the fastest of up to 3 runs
            del output
            start = time.perf_counter()
            output = _run_query(query, head, obs, em)
            seconds = min(seconds, time.perf_counter() - start)
        if reset:
            peak = _status_kib("VmHWM")
        else:
            import resource

            peak = max(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss, peak_before_query)
        output_mib = _output_bytes(output) / 2**20
        rows.append({
            "query": query,
            "n": n,
            "N": N,
            "S": S,
            "status": "ok",
            "route": engine.choose_route(head.hop_factors(), N, **QUERY_ROUTE.get(query, {})),
            "seconds": seconds,
            "rss_after_load_mib": rss_before / 1024,
            "peak_mib": peak / 1024,
            "output_mib": output_mib,
            "working_mib": max(peak - rss_before, 0) / 1024 - output_mib,
            "peak_counter": "VmHWM, reset" if reset else "ru_maxrss",
            "budget_mib": engine.get_memory_budget() / 2**20,
        })
        del output
    return rows


def memory_table(rows: list) -> list:
    budget = next((r["budget_mib"] for r in rows if r["status"] == "ok"), None)
    lines = [
        f"Memory budget per chunk: {budget:.0f} MiB (`pyro_multihop.engine.get_memory_budget()`, the default)." if budget else "",
        "",
        "| query | n | N | S | route | time (s) | RSS after load (MiB) | peak RSS (MiB) | output (MiB) "
        "| peak - load - output (MiB, target <= 1024) |",
        "|---|---:|---:|---:|---|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        if r["status"] != "ok":
            lines.append(f"| `{r['query']}` | {r['n']} | {r['N']} | {r['S']} | | {r['status']} | | | | |")
            continue
        ok = "ok" if r["working_mib"] <= TARGETS["memory_mib"] else "**missed**"
        lines.append(
            f"| `{r['query']}` | {r['n']} | {r['N']} | {r['S']} | {r['route']} | {r['seconds']:.1f} | "
            f"{r['rss_after_load_mib']:.0f} | {r['peak_mib']:.0f} | {r['output_mib']:.1f} | {r['working_mib']:.0f} {ok} |"
        )
    return lines


# -- scaling --------------------------------------------------------------------------------------------------
def scaling_point(axis: str, n: int, N: int, S: int) -> list:
    rows = measure_queries(("log_likelihood", "e_step"), n, N, S)
    for row in rows:
        row["axis"] = axis
    return rows


def _slope(points) -> float:
    """Least-squares slope of log(time) against log(size)."""
    xs = [math.log(x) for x, _ in points]
    ys = [math.log(y) for _, y in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def scaling_slopes(rows: list) -> dict:
    slopes = {}
    for axis in ("n", "N", "S"):
        for query in ("log_likelihood", "e_step"):
            points = [(r[axis], r["seconds"]) for r in rows
                      if r["axis"] == axis and r["query"] == query and r["status"] == "ok" and r["route"] == "symbols"]
            if len(points) >= 2:
                slopes[f"{query}_{axis}"] = _slope(points)
    return slopes


def scaling_table(rows: list) -> list:
    lines = [
        "| varied | n | N | S | route | query | time (s) | us / row | peak - load - output (MiB) |",
        "|---|---:|---:|---:|---|---|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r['axis']} | {r['n']} | {r['N']} | {r['S']} | {r['route']} | `{r['query']}` | {r['seconds']:.2f} | "
            f"{1e6 * r['seconds'] / r['n']:.1f} | {r['working_mib']:.0f} |"
        )
    slopes = scaling_slopes(rows)
    if slopes:
        lines += ["", "Log-log slopes of the time (1 = linear; least squares over the symbol-route rows of each axis):", ""]
        lines += [f"- `{key.rsplit('_', 1)[0]}` in `{key.rsplit('_', 1)[1]}`: {value:.2f}" for key, value in slopes.items()]
    return lines


# -- driver -----------------------------------------------------------------------------------------------------
def _in_subprocess(function: str, *arguments):
    """Run ``function(*arguments)`` of this module in a fresh interpreter; return its JSON result."""
    command = [sys.executable, __file__, "--worker", function, json.dumps(arguments)]
    completed = subprocess.run(command, capture_output=True, text=True)
    if completed.returncode != 0:
        raise RuntimeError(f"worker {function}{arguments} failed:\n{completed.stderr[-3000:]}")
    return json.loads(completed.stdout.strip().splitlines()[-1])


PATHS_GRID = [(100, 50, 1000), (30, 1000, 200)]  # (N, S, n)
SHARP_GRID = [(300, 1000, 200), (100, 50, 2000), (30, 1000, 2000)]  # (N, S, n)
SMOKE_SHARP_GRID = [(8, 12, 40)]
SHARP_SIGMA2 = 1e-3
SMOKE_PATHS_GRID = [(8, 6, 20)]


def paths_point(N: int, S: int, n: int, repeats: int) -> list:
    """Rows ``{N, S, n, query, us_per_row, ratio}`` of the path queries against ``hop_marginals`` (``paths``)."""
    torch = _setup_torch()
    head, obs = make_head(S), random_observations(n, N, S)
    with torch.no_grad():
        paths, log_probs = head.k_best_paths(obs, 5)
        best = head.map_paths(obs)
        if not torch.equal(head.posterior(obs).map_paths, best):
            raise AssertionError("the lazy posterior's MAP paths differ from map_paths")
        # The MAP path must be one of the k best with the best score: duplicated (key, value) pairs give exact
        # ties, so it need not be the first of them; a wrong fast route misses on most rows, not a few.
        found = (paths == best.unsqueeze(1)).all(-1) & (log_probs >= log_probs[:, :1] - 1e-4)
        if not found.any(-1).float().mean() >= 0.95:
            raise AssertionError(f"map_paths is not among the best-scoring k best paths on "
                                 f"{int((~found.any(-1)).sum())} of {n} rows")
        if not torch.isfinite(log_probs[:, 0]).all():
            raise AssertionError("k_best_paths gave a non-finite best log-probability")

    def posterior_and_reads():
        posterior = head.posterior(obs)
        return posterior.hop_marginals, posterior.map_paths

    calls = {
        "hop_marginals": lambda: head.hop_marginals(obs),
        "map_paths": lambda: head.map_paths(obs),
        "k_best_paths(5)": lambda: head.k_best_paths(obs, 5),
        "sample_paths(10)": lambda: head.sample_paths(obs, 10, seed=0),
        "path_entropy": lambda: head.path_entropy(obs),
        "posterior() + reads": posterior_and_reads,
    }
    with torch.no_grad():
        times = time_side_by_side(calls, repeats, warmup_rounds=1)
    base = times["hop_marginals"]
    return [{"N": N, "S": S, "n": n, "query": name, "us_per_row": 1e3 * t / n, "ratio": t / base}
            for name, t in times.items()]


def paths_table(rows: list) -> list:
    lines = ["| N | S | n | query | us / row | x hop_marginals | target |", "|---:|---:|---:|---|---:|---:|---|"]
    for row in rows:
        limit = None if row["query"] == "hop_marginals" else (2.0 if row["query"].startswith("posterior") else 3.0)
        verdict = "" if limit is None else (f"<= {limit:g}: ok" if row["ratio"] <= limit else f"<= {limit:g}: **missed**")
        lines.append(f"| {row['N']} | {row['S']} | {row['n']} | `{row['query']}` | {row['us_per_row']:.2f} | "
                     f"{row['ratio']:.2f} | {verdict} |")
    return lines


# -- sharp gates -----------------------------------------------------------------------------------------------
def sharp_head(symbols: int, sigma2: float):
    """A trained-like head: key tables the identity plus uniform noise of 0.1 (seeded), a random emission."""
    import torch

    from pyro_multihop import ChainedAttention

    noise = torch.rand(HOPS, symbols, symbols, generator=torch.Generator().manual_seed(SEED))
    return ChainedAttention(HOPS, symbols, symbols, sigma2=sigma2, key_tables=torch.eye(symbols) + 0.1 * noise,
                            emission=random_emission(symbols, symbols, SEED))


def sharp_point(N: int, S: int, n: int, repeats: int) -> list:
    """Rows: per ``sigma2`` (sharp and flat), the median milliseconds of each query, and the rows per route."""
    torch = _setup_torch()
    import pyro
    from pyro.infer import Trace_ELBO, TraceEnum_ELBO

    from pyro_multihop import engine
    from pyro_multihop.engine.log_space import chain_log_likelihood

    obs = random_observations(n, N, S)
    rows = []
    for sigma2 in (SHARP_SIGMA2, SIGMA2):
        head = sharp_head(S, sigma2)
        factors = head.hop_factors()
        elbo = Trace_ELBO()

        queries = _without_grad(head, obs, "log_likelihood", "predict_proba", "hop_marginals")
        log_likelihood, predict_proba = queries["log_likelihood"], queries["predict_proba"]

        def in_log_space():
            with torch.no_grad():
                return chain_log_likelihood(factors.dense_chain(obs), factors.target_log_probs(obs))

        with pyro.get_param_store().scope():
            loss = _loss_and_backward(head, head.collapsed_model, obs, elbo)
            enumerated = _loss_and_backward(head, head.model, obs, TraceEnum_ELBO(max_plate_nesting=1))
            total, reference = float(log_likelihood().double().sum()), float(in_log_space().double().sum())
            if abs(total - reference) > 1e-5 * abs(reference):
                raise RuntimeError(f"sharp: log_likelihood {total} against log space {reference} at N={N} S={S}")
            sums = predict_proba().double().sum(-1)
            if (sums - 1).abs().max() > 1e-4:
                raise RuntimeError(f"sharp: predictive rows sum to {float(sums.min())}..{float(sums.max())}")
            if max(abs(loss() + total), abs(enumerated() + total)) > AGREEMENT * abs(total):
                raise RuntimeError(f"sharp: a loss is not minus the likelihood at N={N} S={S}")
            times = time_side_by_side({**queries, "loss": loss, "enumerated_loss": enumerated,
                                       "in_log_space": in_log_space}, repeats, warmup_rounds=1)
        routes = {}
        for piece in engine.forward_backward_chunks(factors, obs):
            routes[piece.route] = routes.get(piece.route, 0) + len(piece.obs)
        rows.append({"N": N, "S": S, "n": n, "sigma2": sigma2, **{f"{k}_ms": v for k, v in times.items()},
                     "rows_by_route": " ".join(f"{k} {v}" for k, v in routes.items())})
    return rows


def sharp_table(rows: list) -> list:
    lines = ["A trained-like head (key tables the identity plus uniform noise of 0.1) with a sharp gate (sigma2 = "
             f"{SHARP_SIGMA2}) and the same head at sigma2 = {SIGMA2}, on the same rows: median milliseconds. "
             "\"all in log space\" is `chain_log_likelihood` on every row's dense chain, what each underflowing row "
             "cost before the dense retry; \"enumerated\" is the enumerated model's loss + backward "
             "(`TraceEnum_ELBO`), \"x enumerated\" its time over the collapsed loss's; the ratios \"x flat\" are the "
             "sharp gate's time over the flat one's.", "",
             "| N | S | n | sigma2 | rows by route (forward-backward) | log_likelihood | predict_proba | hop_marginals "
             "| loss + backward | enumerated | x enumerated | all in log space | x flat (ll / pp / hm / loss) |",
             "|---:|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    flat = {(r["N"], r["S"], r["n"]): r for r in rows if r["sigma2"] != SHARP_SIGMA2}
    for row in rows:
        ratios = ""
        if row["sigma2"] == SHARP_SIGMA2 and (row["N"], row["S"], row["n"]) in flat:
            base = flat[(row["N"], row["S"], row["n"])]
            ratios = " / ".join(f"{row[k] / base[k]:.1f}" for k in ("log_likelihood_ms", "predict_proba_ms",
                                                                     "hop_marginals_ms", "loss_ms"))
        lines.append(f"| {row['N']} | {row['S']} | {row['n']} | {row['sigma2']:g} | {row['rows_by_route']} | "
                     f"{row['log_likelihood_ms']:.1f} | {row['predict_proba_ms']:.1f} | {row['hop_marginals_ms']:.1f} "
                     f"| {row['loss_ms']:.1f} | {row['enumerated_loss_ms']:.1f} | "
                     f"{row['enumerated_loss_ms'] / row['loss_ms']:.1f}x | {row['in_log_space_ms']:.1f} | {ratios} |")
    return lines


def write_section(out: Path, name: str, rows, table_lines: list, load: str) -> Path:
    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows if isinstance(rows, list) else [rows]).to_csv(out / f"engine_{name}.csv", index=False)
    footer = ["", f"float32, one thread, L = {HOPS}, sigma2 = {SIGMA2}, T = S; load average (1, 5, 15 min) "
              f"before the section: {load} on {os.cpu_count()} cores."]
    path = out / f"engine_{name}.md"
    path.write_text("\n".join(table_lines + footer) + "\n")
    return path


def _points_section(out: Path, name: str, grid, point: str, table, rows_per_point: int, repeats: int, call) -> None:
    """``call(point, *arguments, repeats)`` at every point of ``grid`` (each returns ``rows_per_point`` rows),
    printing each point's rows of ``table`` as they come, then the section's files."""
    load = _load_average()
    rows = []
    for arguments in grid:
        rows += call(point, *arguments, repeats)
        print("\n".join(table(rows[-rows_per_point:])[-rows_per_point:]), flush=True)
    print(f"wrote {write_section(out, name, rows, table(rows), load)}", flush=True)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, every section in this process (seconds)")
    parser.add_argument("--sections", nargs="*", default=list(SECTIONS), choices=SECTIONS)
    parser.add_argument("--repeats", type=int, default=9, help="timed rounds per speed point")
    parser.add_argument("--queries", nargs="*", default=list(QUERIES), choices=QUERIES, help="memory section only")
    parser.add_argument("--worker", nargs=2, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        function, arguments = args.worker
        print(json.dumps(globals()[function](*json.loads(arguments))))
        return 0

    smoke = args.smoke

    def call(function: str, *arguments):
        return globals()[function](*arguments) if smoke else _in_subprocess(function, *arguments)

    if "speed" in args.sections:
        load = _load_average()
        grid, repeats = (SMOKE_SPEED_GRID, 3) if smoke else (SPEED_GRID, args.repeats)
        rows = []
        for point in grid:
            rows += call("speed_section", [point], repeats)
            print(speed_table(rows[-1:])[-1], flush=True)
        print(f"wrote {write_section(args.out, 'speed', rows, speed_table(rows), load)}", flush=True)
    repeats = 3 if smoke else args.repeats
    if "paths" in args.sections:
        _points_section(args.out, "paths", SMOKE_PATHS_GRID if smoke else PATHS_GRID, "paths_point", paths_table,
                        6, repeats, call)  # hop_marginals and five path queries a point
    if "peer" in args.sections:
        load = _load_average()
        sizes = SMOKE_PEER if smoke else PEER
        row = call("peer_point", sizes["n"], sizes["N"], sizes["S"], 3 if smoke else 3)
        print(row, flush=True)
        print(f"wrote {write_section(args.out, 'peer', row, peer_table(row), load)}", flush=True)
    if "hmm" in args.sections:
        load = _load_average()
        grid, repeats = (SMOKE_HMM_GRID, 3) if smoke else (HMM_GRID, args.repeats)
        rows = []
        for point in grid:
            rows += call("hmm_section", [point], repeats)
            print(hmm_table(rows[-1:], [])[-1], flush=True)
        sizes = SMOKE_HMM_MEMORY if smoke else HMM_MEMORY
        memory = [call("hmm_peak", which, sizes["n"], sizes["N"], sizes["S"]) for which in ("DiscreteHMM", "library")]
        print(memory, flush=True)
        print(f"wrote {write_section(args.out, 'hmm', rows, hmm_table(rows, memory), load)}", flush=True)
        import pandas as pd

        pd.DataFrame(memory).to_csv(args.out / "engine_hmm_memory.csv", index=False)
    if "memory" in args.sections:
        load = _load_average()
        sizes = SMOKE_MEMORY if smoke else MEMORY
        rows = []
        if smoke:
            rows = measure_queries(args.queries, sizes["n"], sizes["N"], sizes["S"])
        else:
            for query in args.queries:
                rows += _in_subprocess("measure_queries", [query], sizes["n"], sizes["N"], sizes["S"])
                print(rows[-1], flush=True)
        print(f"wrote {write_section(args.out, 'memory', rows, memory_table(rows), load)}", flush=True)
    if "sharp" in args.sections:
        _points_section(args.out, "sharp", SMOKE_SHARP_GRID if smoke else SHARP_GRID, "sharp_point", sharp_table, 2,
                        repeats, call)
    if "scaling" in args.sections:
        load = _load_average()
        rows = []
        for point in SMOKE_SCALING if smoke else SCALING:
            rows += call("scaling_point", *point)
            print(rows[-2:], flush=True)
        print(f"wrote {write_section(args.out, 'scaling', rows, scaling_table(rows), load)}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
