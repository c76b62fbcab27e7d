"""The engine on a CUDA device against the CPU (issue 22, item 7): every query, both losses, 20 SVI steps.

The head is the engine benchmark's (``benchmarks/engine.py``: ``ChainedAttention(3, S, S, sigma2=0.3,
init="random", seed=0)`` with a random emission), float32, on uniform random observations. Each workload
runs on the CPU and on the device over the first ``check_rows`` rows, and the device's result must equal the
CPU's:

- tensors of real numbers (log-likelihoods, predictive, hop and value marginals, E-step statistics, entropies,
  the k best paths' log-probabilities, losses, gradients, the 20 SVI losses and final parameters): to 1e-5
  relative, ``||device - cpu|| / ||cpu||`` over the whole tensor;
- hop paths (MAP, k best): at most 1e-3 of the rows may differ (two paths whose probabilities tie to rounding
  may swap between devices; the log-probabilities of the k best are held to 1e-5 above);
- ``sample_paths``: not compared (each device draws from its own random stream); its draws are checked to be
  paths of the right shape and range.

Then each workload is timed on the device at ``n`` rows (default ``n = 1 000 000``, ``N = 100``, ``S = 50``):
the engine's queries on all ``n`` rows, the collapsed loss + backward (``Trace_ELBO`` on
``head.collapsed_model``) and 20 full-batch SVI steps (3 at ``--smoke`` size) of ``fit_svi(collapsed=True)`` on all ``n`` rows, and
the enumerated loss + backward (``TraceEnum_ELBO`` on ``head.model``, whose ``(N, n, N)`` factors do not fit
a million rows) on ``enumerated_rows``. The time is the fastest of two runs (one run when it takes over 10 s),
the device synchronised around each.

Without CUDA the script prints one line saying it skipped and exits 0. ``--device cpu`` runs the whole
procedure with the CPU standing in for the device (what the tests do, at ``--smoke`` size): every difference
is then 0.

Usage::

    python benchmarks/gpu.py --out benchmarks/results             # n = 1e6, N = 100 (a device is needed)
    python benchmarks/gpu.py --out /tmp/bench --small             # n = 1e5
    python benchmarks/gpu.py --out /tmp/bench --smoke --device cpu

Writes ``gpu.md`` and ``gpu.csv`` into ``--out``; exits 1 when a comparison misses its limit (the table is
written first).
"""

from __future__ import annotations

import argparse
import copy
import platform
import sys
import time
import warnings
from pathlib import Path

HOPS, SIGMA2, SEED = 3, 0.3, 0
FULL = {"n": 1_000_000, "N": 100, "S": 50, "check_rows": 5000, "enumerated_rows": 20_000, "svi_steps": 20}
SMALL = {"n": 100_000, "N": 100, "S": 50, "check_rows": 2000, "enumerated_rows": 5000, "svi_steps": 20}
SMOKE = {"n": 120, "N": 6, "S": 8, "check_rows": 40, "enumerated_rows": 60, "svi_steps": 3}
K_BEST, NUM_SAMPLES = 5, 10
LIMITS = {"relative": 1e-5, "paths": 1e-3}
WORKLOADS = ("log_likelihood", "predict_proba", "hop_marginals", "value_marginals", "e_step", "map_paths",
             "k_best_paths", "sample_paths", "path_entropy", "collapsed_loss", "enumerated_loss", "svi_steps")


# -- the workloads ---------------------------------------------------------------------------------------------
def make_head(symbols: int):
    """The engine benchmark's head (random key tables and emission), float32, on the CPU."""
    from chained_loss import random_emission  # benchmarks/, beside this file

    from pyro_multihop import ChainedAttention

    return ChainedAttention(HOPS, symbols, symbols, sigma2=SIGMA2, init="random", seed=SEED,
                            emission=random_emission(symbols, symbols, SEED))


def run_workload(name: str, head, obs, svi_steps: int = 20) -> dict:
    """Run workload ``name`` with ``head`` on ``obs`` (both on one device); ``{part: tensor}`` of its results."""
    import pyro
    import torch
    from pyro.infer import Trace_ELBO, TraceEnum_ELBO

    from pyro_multihop import fit_svi
    from pyro_multihop.em import ChainedEM

    if name in ("collapsed_loss", "enumerated_loss"):
        with pyro.get_param_store().scope():
            if name == "collapsed_loss":
                loss = Trace_ELBO().differentiable_loss(head.collapsed_model, head.guide, obs)
            else:
                loss = TraceEnum_ELBO(max_plate_nesting=1).differentiable_loss(head.model, head.guide, obs)
            names = [name for name, _ in head.named_parameters()]
            grads = torch.autograd.grad(loss, [p for _, p in head.named_parameters()])
        return {"loss": loss.detach(), **{f"gradient {n}": g for n, g in zip(names, grads)}}
    if name == "svi_steps":
        fitted = copy.deepcopy(head)
        metrics = fit_svi(fitted, obs, num_steps=svi_steps, collapsed=True, progress=False, seed=SEED, log_every=1)
        losses = torch.tensor(metrics["loss"].values, dtype=torch.float64)
        return {"losses": losses, **{f"parameter {n}": p.detach() for n, p in fitted.named_parameters()}}
    with torch.no_grad():
        if name == "e_step":
            stats = ChainedEM(HOPS, head.num_symbols, head.num_targets, sigma2=SIGMA2).e_step(head, obs)
            return {"key_numerators": stats.key_numerators, "key_masses": stats.key_masses,
                    "emission_counts": stats.emission_counts, "loglik": torch.tensor([stats.loglik], dtype=torch.float64)}
        if name == "k_best_paths":
            paths, log_probs = head.k_best_paths(obs, K_BEST)
            return {"paths": paths, "log_probs": log_probs}
        if name == "sample_paths":
            return {"draws": head.sample_paths(obs, NUM_SAMPLES, seed=SEED)}
        if name == "map_paths":
            return {"paths": head.map_paths(obs)}
        return {"values": getattr(head, name)(obs)}


# -- comparison --------------------------------------------------------------------------------------------------
def relative_difference(got, want) -> float:
    """``||got - want|| / ||want||`` in float64 over the finite entries (``||got - want||`` when ``want`` is 0);
    inf when the two disagree on which entries are finite or on the shape."""
    import torch

    got, want = got.detach().double().cpu(), want.detach().double().cpu()
    if got.shape != want.shape or not torch.equal(torch.isfinite(got), torch.isfinite(want)):
        return float("inf")
    finite = torch.isfinite(want)
    if not torch.equal(got[~finite], want[~finite]):  # -inf against -inf is equal; -inf against +inf is not
        return float("inf")
    difference = torch.linalg.vector_norm(got[finite] - want[finite])
    scale = torch.linalg.vector_norm(want[finite])
    return float(difference / scale) if scale > 0 else float(difference)


def differing_rows(got, want) -> float:
    """The fraction of rows (dim 0, or dim 1 for ``(samples, n, L)``) on which two path tensors differ."""
    got, want = got.cpu(), want.cpu()
    if got.shape != want.shape:
        return 1.0
    differs = (got != want).reshape(got.shape[0], -1).any(-1)
    return float(differs.double().mean()) if len(differs) else 0.0


def compare(name: str, cpu: dict, device: dict, context_len: int) -> dict:
    """The largest difference of workload ``name``'s parts, device against CPU, and whether it is within the
    limits (:data:`LIMITS`); ``sample_paths`` only by shape and range (positions ``0 .. context_len - 1``)."""
    if name == "sample_paths":
        draws = device["draws"]
        ok = draws.shape == cpu["draws"].shape and bool((draws >= 0).all()) and bool((draws < context_len).all())
        return {"workload": name, "compared": "shape and range only (own random stream)", "relative_difference": None,
                "differing_rows": None, "ok": ok}
    relative, rows = 0.0, 0.0
    for part, want in cpu.items():
        got = device[part]
        if want.dtype.is_floating_point:
            relative = max(relative, relative_difference(got, want))
        else:
            rows = max(rows, differing_rows(got, want))
    ok = relative <= LIMITS["relative"] and rows <= LIMITS["paths"]
    return {"workload": name, "compared": ", ".join(cpu), "relative_difference": relative,
            "differing_rows": rows if any(not t.dtype.is_floating_point for t in cpu.values()) else None, "ok": ok}


# -- timing --------------------------------------------------------------------------------------------------------
def _synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(function, device) -> float:
    """Seconds of ``function()`` on ``device``: the fastest of two runs, one when the first takes over 10 s."""
    best = float("inf")
    for attempt in range(2):
        _synchronize(device)
        start = time.perf_counter()
        function()
        _synchronize(device)
        best = min(best, time.perf_counter() - start)
        if best > 10.0:
            break
    return best


def measure(sizes: dict, device_name: str, workloads=None) -> list:
    """Compare each workload (default :data:`WORKLOADS`) on ``device_name`` against the CPU on ``check_rows``
    rows, then time it there."""
    import torch
    from engine import random_observations  # benchmarks/engine.py, beside this file

    device = torch.device(device_name)
    cpu_head = make_head(sizes["S"])
    device_head = copy.deepcopy(cpu_head).to(device)
    obs = random_observations(sizes["n"], sizes["N"], sizes["S"])
    check = obs[: sizes["check_rows"]]
    check_device = check.to(device)
    device_obs = obs.to(device)
    timing_rows = {"enumerated_loss": min(sizes["n"], sizes["enumerated_rows"])}
    rows = []
    for name in WORKLOADS if workloads is None else workloads:
        start = time.perf_counter()
        cpu_result = run_workload(name, cpu_head, check, sizes["svi_steps"])
        cpu_seconds = time.perf_counter() - start
        device_result = run_workload(name, device_head, check_device, sizes["svi_steps"])  # also the warm-up
        row = compare(name, cpu_result, device_result, sizes["N"])
        n_timed = timing_rows.get(name, sizes["n"])
        data = device_obs if n_timed == sizes["n"] else device_obs[:n_timed]
        seconds = timed(lambda: run_workload(name, device_head, data, sizes["svi_steps"]), device)
        row.update({"check_rows": len(check), "cpu_check_seconds": cpu_seconds, "rows_timed": n_timed,
                    "device_seconds": seconds, "device_us_per_row": 1e6 * seconds / n_timed})
        rows.append(row)
        print(f"{name:16s} {'ok' if row['ok'] else 'MISSED'}  rel {row['relative_difference']}  rows "
              f"{row['differing_rows']}  cpu {cpu_seconds:.3f} s ({len(check)} rows)  {device.type} {seconds:.3f} s "
              f"({n_timed} rows)", flush=True)
    return rows


# -- the table -----------------------------------------------------------------------------------------------------
def _number(value, form: str) -> str:
    return "" if value is None else format(value, form)


def table_lines(rows: list, sizes: dict, device_label: str) -> list:
    """The Markdown table of :func:`measure`'s rows."""
    lines = [
        f"Device: {device_label}. Head: `ChainedAttention(L = {HOPS}, S = {sizes['S']}, sigma2 = {SIGMA2})`, random key "
        f"tables and emission, float32; N = {sizes['N']}. Device against CPU on the first {sizes['check_rows']} rows "
        f"(limits: {LIMITS['relative']:g} relative for numbers, {LIMITS['paths']:g} of the rows for paths); times "
        f"on the device (fastest of two runs); `svi_steps`: {sizes['svi_steps']} full-batch steps of "
        f"`fit_svi(collapsed=True)`.",
        "",
        "| workload | compared | max rel. difference | rows whose paths differ | within limits | CPU on the check rows (s) "
        "| rows timed | device time (s) | device us / row |",
        "|---|---|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| `{r['workload']}` | {r['compared']} | {_number(r['relative_difference'], '.1e')} | "
            f"{_number(r['differing_rows'], '.1e')} | {'ok' if r['ok'] else '**missed**'} | {r['cpu_check_seconds']:.3f} | "
            f"{r['rows_timed']} | {r['device_seconds']:.3f} | {r['device_us_per_row']:.3f} |"
        )
    return lines


def write_table(out: Path, rows: list, sizes: dict, device_label: str) -> Path:
    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out / "gpu.csv", index=False)
    path = out / "gpu.md"
    path.write_text("\n".join(table_lines(rows, sizes, device_label)) + "\n")
    return path


def device_label(device_name: str) -> str:
    import torch

    if device_name.startswith("cuda"):
        return f"{torch.cuda.get_device_name(torch.device(device_name))}, torch {torch.__version__}"
    return f"CPU standing in for the device ({platform.processor() or platform.machine()}), torch {torch.__version__}"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    size = parser.add_mutually_exclusive_group()
    size.add_argument("--small", action="store_true", help="n = 100 000 instead of 1 000 000")
    size.add_argument("--smoke", action="store_true", help="tiny sizes (seconds)")
    parser.add_argument("--device", default="cuda", help="the device to check against the CPU (default cuda)")
    args = parser.parse_args(argv)
    import torch

    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print("gpu.py: skipped: CUDA is not available on this machine (torch.cuda.is_available() is False)")
        return 0
    sizes = SMOKE if args.smoke else SMALL if args.small else FULL
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # Pyro's and torch's deprecation chatter in a benchmark's output
        rows = measure(sizes, args.device)
    path = write_table(args.out, rows, sizes, device_label(args.device))
    print(f"wrote {path}")
    missed = [r["workload"] for r in rows if not r["ok"]]
    if missed:
        print(f"gpu.py: device and CPU differ beyond the limits in: {', '.join(missed)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
