"""Exact log-likelihood + gradient of the chained head: the enumerated Pyro loss against the fused one.

For each (L, N, n) in a grid, two implementations compute the exact negative log-likelihood of a batch
and its gradient with respect to the parameters:

- ``pyro``: ``TraceEnum_ELBO(max_plate_nesting=1).differentiable_loss(head.model, head.guide, obs)``,
  the hop latents enumerated and eliminated by Pyro's tensor contraction;
- ``pyro-jit``: the same loss under ``JitTraceEnum_ELBO``, called exactly as ``fit_svi(jit=True)`` calls it
  (compiled once, before the timed runs), which removes most of Pyro's fixed per-call Python cost;
- ``fused``: ``-head.log_likelihood(obs).sum()``, the library's own log-space forward recursion.

Each implementation runs in its own subprocess so that peak memory is its own: the peak resident set
size (``ru_maxrss``) during the timed runs minus the resident size just before them. Times are the
median of ``--repeats`` runs after one warm-up. Both losses are checked to agree (rel. 1e-5, float32).

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
    (2, 30, 2000),
    (3, 30, 2000),
    (2, 100, 500),
    (3, 100, 500),
    (2, 300, 100),
]
SMOKE_GRID = [(2, 6, 50)]


def _rss_mb() -> float:
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * resource.getpagesize() / 2**20


def worker(implementation: str, hops: int, context: int, n: int, repeats: int) -> dict:
    import warnings

    import pyro
    import torch
    from pyro.infer import JitTraceEnum_ELBO, TraceEnum_ELBO

    from pyro_multihop import ChainedAttention, Observations

    # The adapters fit_svi(jit=True) uses: observation fields as positional tensors for torch.jit.trace.
    from pyro_multihop.train import _tensor_arguments, _tensor_signature

    warnings.filterwarnings("ignore", category=DeprecationWarning)  # torch.jit.trace, used by Pyro's jit

    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    symbols = 30
    obs = Observations(
        torch.randint(symbols, (n, context), generator=generator),
        torch.randint(symbols, (n, context), generator=generator),
        torch.randint(symbols, (n,), generator=generator),
        torch.randint(symbols, (n,), generator=generator),
    )
    head = ChainedAttention(hops, symbols, symbols, sigma2=0.1, init="identity", seed=0)
    elbo = TraceEnum_ELBO(max_plate_nesting=1)
    jit_elbo = JitTraceEnum_ELBO(max_plate_nesting=1, ignore_jit_warnings=True)
    jit_model, jit_guide = _tensor_signature(head.model), _tensor_signature(head.guide)
    jit_args, jit_static = _tensor_arguments(obs, {})
    store = pyro.get_param_store().scope()
    store.__enter__()  # one isolated param store for the whole worker process

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

    if implementation == "pyro-jit":
        loss_and_gradient()  # compile outside the measurement

    rss_before = _rss_mb()
    loss = loss_and_gradient()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        loss_and_gradient()
        times.append(time.perf_counter() - start)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # KiB -> MiB on Linux
    return {"loss": loss, "ms": 1000 * statistics.median(times), "peak_mb": max(peak - rss_before, 0.0)}


def run_grid(grid, repeats: int) -> list:
    rows = []
    for hops, context, n in grid:
        results = {}
        for implementation in ("pyro", "pyro-jit", "fused"):
            command = [sys.executable, __file__, "--worker", implementation, str(hops), str(context), str(n), str(repeats)]
            completed = subprocess.run(command, capture_output=True, text=True, check=True)
            results[implementation] = json.loads(completed.stdout.strip().splitlines()[-1])
        fused_loss = results["fused"]["loss"]
        for implementation in ("pyro", "pyro-jit"):
            if abs(results[implementation]["loss"] - fused_loss) > 1e-5 * abs(fused_loss):
                raise RuntimeError(
                    f"{implementation} and fused losses disagree at L={hops} N={context} n={n}: "
                    f"{results[implementation]['loss']} vs {fused_loss}"
                )
        rows.append(
            {
                "L": hops,
                "N": context,
                "n": n,
                "pyro_ms": results["pyro"]["ms"],
                "fused_ms": results["fused"]["ms"],
                "time_ratio": results["pyro"]["ms"] / results["fused"]["ms"],
                "pyro_jit_ms": results["pyro-jit"]["ms"],
                "jit_time_ratio": results["pyro-jit"]["ms"] / results["fused"]["ms"],
                "pyro_peak_mb": results["pyro"]["peak_mb"],
                "fused_peak_mb": results["fused"]["peak_mb"],
            }
        )
        print(
            f"L={hops} N={context:4d} n={n:5d}  pyro {rows[-1]['pyro_ms']:8.2f} ms  fused {rows[-1]['fused_ms']:8.2f} ms"
            f"  ratio {rows[-1]['time_ratio']:.2f}  jit {rows[-1]['pyro_jit_ms']:8.2f} ms ratio {rows[-1]['jit_time_ratio']:.2f}",
            flush=True,
        )
    return rows


def write_table(rows: list, out: Path) -> Path:
    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    frame = pd.DataFrame(rows)
    frame.to_csv(out / "chained_loss.csv", index=False)
    lines = [
        "| L | N | n | Pyro enumerated (ms) | fused (ms) | ratio | Pyro, jit (ms) | jit ratio | Pyro peak (MiB) | fused peak (MiB) |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        lines.append(
            f"| {row['L']} | {row['N']} | {row['n']} | {row['pyro_ms']:.2f} | {row['fused_ms']:.2f} | "
            f"{row['time_ratio']:.2f} | {row['pyro_jit_ms']:.2f} | {row['jit_time_ratio']:.2f} | "
            f"{row['pyro_peak_mb']:.1f} | {row['fused_peak_mb']:.1f} |"
        )
    path = out / "chained_loss.md"
    path.write_text("\n".join(lines) + "\n")
    return path


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results"))
    parser.add_argument("--smoke", action="store_true", help="one tiny configuration")
    parser.add_argument("--repeats", type=int, default=9)
    parser.add_argument("--worker", nargs=5, metavar=("IMPL", "L", "N", "n", "REPEATS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        implementation, hops, context, n, repeats = args.worker
        print(json.dumps(worker(implementation, int(hops), int(context), int(n), int(repeats))))
        return
    rows = run_grid(SMOKE_GRID if args.smoke else GRID, 2 if args.smoke else args.repeats)
    print(f"wrote {write_table(rows, args.out)}")


if __name__ == "__main__":
    main()
