"""Exact log-likelihood + gradient of the chained head: the enumerated Pyro loss against the fused one.

For each (L, N, n) in a grid, three implementations compute the exact negative log-likelihood of a
batch and its gradient with respect to the parameters:

- ``pyro``: ``TraceEnum_ELBO(max_plate_nesting=1).differentiable_loss(head.model, head.guide, obs)``,
  the hop latents enumerated and eliminated by Pyro's tensor contraction (Pyro's defaults, validation on);
- ``pyro-jit``: the same loss under ``JitTraceEnum_ELBO``, called exactly as ``fit_svi(jit=True)`` calls it
  (compiled before the timed runs), which removes most of Pyro's per-call Python cost;
- ``fused``: ``-head.log_likelihood(obs).sum()``, the library's own forward recursion: since issue 11 it
  runs through the exact engine (:mod:`pyro_multihop.engine`), in probability space on the route that
  ``engine.choose_route`` picks (through symbol space, or on dense ``(n, N, N)`` transitions), with the
  rows that would underflow recomputed in log space. The engine's own benchmark, with the collapsed
  Pyro loss against this enumerated one on a grid of ``N`` and ``S``, is ``benchmarks/engine.py``.

Timing: one subprocess per grid point runs the three implementations in rounds, each round in a rotated
order, and reports the median of ``--repeats`` rounds. Running them side by side in one process means
that the other tenants of a shared machine slow all three alike, which separate processes did not
(single-process medians moved by 30% from run to run). A second subprocess times them the same way at
``n = 1`` with the same ``L`` and ``N``: the fixed per-call cost, which no batch size amortises.

Memory: each implementation runs in its own subprocess, so that the peak is its own: the peak resident set
size (``ru_maxrss``) during its first two runs minus the resident size just before them.

All three losses are checked to agree (rel. 1e-5, float32), with a random emission (``random_emission``: with
the default uniform one every loss is the constant ``n log S``). One thread throughout.

Usage::

    python benchmarks/chained_loss.py --out benchmarks/results          # full grid, a few minutes
    python benchmarks/chained_loss.py --out /tmp/bench --smoke          # seconds
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

GRID = [
    # (hops, context length N, observations n)
    (1, 10, 2000),
    (2, 10, 2000),
    (3, 10, 2000),
    (1, 10, 20000),
    (2, 10, 20000),
    (2, 30, 2000),
    (3, 30, 2000),
    (2, 100, 500),
    (3, 100, 500),
    (2, 300, 100),
]
SMOKE_GRID = [(2, 6, 50)]
IMPLEMENTATIONS = ("pyro", "pyro-jit", "fused")
TARGET_RATIO = 1.5


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def random_observations(n: int, context: int, symbols: int = 30):
    """``n`` uniform random observations over ``symbols`` symbols with ``context`` positions (seed 0)."""
    import torch

    from pyro_multihop import Observations

    generator = torch.Generator().manual_seed(0)
    return Observations(
        torch.randint(symbols, (n, context), generator=generator),
        torch.randint(symbols, (n, context), generator=generator),
        torch.randint(symbols, (n,), generator=generator),
        torch.randint(symbols, (n,), generator=generator),
    )


def random_emission(symbols: int, targets: int, seed: int = 0):
    """``(symbols, targets)`` row-stochastic emission, each row ``softmax(2 * standard normal)`` (seeded).

    Every benchmark head takes it: with the default uniform emission every row's log-likelihood is exactly
    ``-log targets`` whatever the gates, so agreement checks would compare constants and the gradients of the
    key tables would be zero."""
    import torch

    generator = torch.Generator().manual_seed(seed)
    return (2.0 * torch.randn(symbols, targets, generator=generator)).softmax(-1)


def check_agreement(losses: dict, where: str) -> None:
    """Raise if any loss differs from ``losses["fused"]`` by more than 1e-5 relative."""
    fused = losses["fused"]
    for implementation, loss in losses.items():
        if abs(loss - fused) > 1e-5 * abs(fused):
            raise RuntimeError(f"{implementation} and fused losses disagree at {where}: {loss} vs {fused}")


def time_side_by_side(functions: dict, repeats: int, warmup_rounds: int) -> dict:
    """Median milliseconds of each ``name -> callable``, timed in ``repeats`` rounds in a rotated order
    after ``warmup_rounds`` untimed rounds."""
    for _ in range(warmup_rounds):
        for function in functions.values():
            function()
    order = list(functions)
    times = {name: [] for name in order}
    for round_ in range(repeats):
        rotation = round_ % len(order)
        for name in order[rotation:] + order[:rotation]:
            start = time.perf_counter()
            functions[name]()
            times[name].append(time.perf_counter() - start)
    return {name: 1000 * statistics.median(values) for name, values in times.items()}


def _loss_functions(hops: int, context: int, n: int) -> dict:
    """``implementation -> callable`` computing loss + gradient on a random batch; returns the loss."""
    import warnings

    import pyro
    import torch
    from pyro.infer import JitTraceEnum_ELBO, TraceEnum_ELBO

    from pyro_multihop import ChainedAttention

    # The adapters fit_svi(jit=True) uses: observation fields as positional tensors for torch.jit.trace.
    from pyro_multihop.train import JitFields

    warnings.filterwarnings("ignore", category=DeprecationWarning)  # torch.jit.trace, used by Pyro's jit
    symbols = 30
    obs = random_observations(n, context, symbols)
    head = ChainedAttention(hops, symbols, symbols, sigma2=0.1, init="identity", seed=0,
                            emission=random_emission(symbols, symbols))
    elbo = TraceEnum_ELBO(max_plate_nesting=1)
    jit_elbo = JitTraceEnum_ELBO(max_plate_nesting=1, ignore_jit_warnings=True)
    fields = JitFields(obs)
    jit_model, jit_guide = fields.wrap(head.model), fields.wrap(head.guide)
    jit_args, jit_static = fields.arguments(obs, {})
    pyro.get_param_store().scope().__enter__()  # one isolated param store for the worker process

    def compute(implementation):
        def loss_and_gradient():
            head.zero_grad(set_to_none=True)
            if implementation == "pyro":
                loss = elbo.differentiable_loss(head.model, head.guide, obs)
            elif implementation == "pyro-jit":
                loss = jit_elbo.differentiable_loss(jit_model, jit_guide, *jit_args, **jit_static)
            else:
                loss = -head.log_likelihood(obs).sum()
            loss.backward()
            return float(loss.detach())

        return loss_and_gradient

    return {implementation: compute(implementation) for implementation in IMPLEMENTATIONS}


def time_worker(hops: int, context: int, n: int, repeats: int) -> dict:
    """Median milliseconds of each implementation, timed side by side in rotated rounds."""
    import torch

    torch.set_num_threads(1)
    functions = _loss_functions(hops, context, n)
    # The first call also compiles the jit loss; TorchScript optimises the graph over its next two runs.
    check_agreement({i: function() for i, function in functions.items()}, f"L={hops} N={context} n={n}")
    return time_side_by_side(functions, repeats, warmup_rounds=2)


def memory_worker(implementation: str, hops: int, context: int, n: int) -> dict:
    """Peak resident memory (MiB) of the first two loss + gradient calls above the resident size before them.

    No warm-up: memory that the allocator keeps after a call would hide the next call's peak."""
    import torch

    torch.set_num_threads(1)
    function = _loss_functions(hops, context, n)[implementation]
    rss_before = _rss_mb()
    function()
    function()
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB on Linux
    return {"peak_mb": max(peak - rss_before, 0.0)}


def _run_worker(*arguments) -> dict:
    command = [sys.executable, __file__, "--worker", *map(str, arguments)]
    completed = subprocess.run(command, capture_output=True, text=True, check=True)
    return json.loads(completed.stdout.strip().splitlines()[-1])


def run_grid(grid, repeats: int) -> list:
    rows = []
    for hops, context, n in grid:
        times = _run_worker("time", hops, context, n, repeats)
        fixed = _run_worker("time", hops, context, 1, repeats)
        memory = {i: _run_worker("memory", i, hops, context, n)["peak_mb"] for i in ("pyro", "fused")}
        row = {
            "L": hops,
            "N": context,
            "n": n,
            "pyro_ms": times["pyro"],
            "fused_ms": times["fused"],
            "time_ratio": times["pyro"] / times["fused"],
            "pyro_jit_ms": times["pyro-jit"],
            "jit_time_ratio": times["pyro-jit"] / times["fused"],
            "pyro_fixed_ms": fixed["pyro"],
            "pyro_jit_fixed_ms": fixed["pyro-jit"],
            "fused_fixed_ms": fixed["fused"],
            "pyro_peak_mb": memory["pyro"],
            "fused_peak_mb": memory["fused"],
        }
        rows.append(row)
        print(
            f"L={hops} N={context:4d} n={n:6d}  pyro {row['pyro_ms']:8.2f} ms  fused {row['fused_ms']:8.2f} ms"
            f"  ratio {row['time_ratio']:.2f}  jit {row['pyro_jit_ms']:8.2f} ms ratio {row['jit_time_ratio']:.2f}"
            f"  (n=1: pyro {row['pyro_fixed_ms']:.2f}, jit {row['pyro_jit_fixed_ms']:.2f}, fused {row['fused_fixed_ms']:.2f} ms)",
            flush=True,
        )
    return rows


def write_table(rows: list, out: Path) -> Path:
    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out / "chained_loss.csv", index=False)
    lines = [
        "| L | N | n | Pyro (ms) | fused (ms) | ratio | Pyro, jit (ms) | jit ratio "
        "| at n=1: Pyro / jit / fused (ms) | Pyro peak (MiB) | fused peak (MiB) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['L']} | {row['N']} | {row['n']} | {row['pyro_ms']:.2f} | {row['fused_ms']:.2f} | "
            f"{row['time_ratio']:.2f} | {row['pyro_jit_ms']:.2f} | {row['jit_time_ratio']:.2f} | "
            f"{row['pyro_fixed_ms']:.2f} / {row['pyro_jit_fixed_ms']:.2f} / {row['fused_fixed_ms']:.2f} | "
            f"{row['pyro_peak_mb']:.1f} | {row['fused_peak_mb']:.1f} |"
        )
    path = out / "chained_loss.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--smoke", action="store_true", help="one tiny configuration")
    parser.add_argument("--repeats", type=int, default=21, help="timed rounds per grid point")
    parser.add_argument("--worker", nargs="+", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        kind, *rest = args.worker
        if kind == "time":
            print(json.dumps(time_worker(*map(int, rest))))
        else:
            implementation, *sizes = rest
            print(json.dumps(memory_worker(implementation, *map(int, sizes))))
        return
    rows = run_grid(SMOKE_GRID if args.smoke else GRID, 3 if args.smoke else args.repeats)
    print(f"wrote {write_table(rows, args.out)}")


if __name__ == "__main__":
    main()
