"""The engine on a CUDA device against the CPU (issue 22, item 7): every query, both losses, 20 SVI steps.

The head is the engine benchmark's (``benchmarks/engine.py``: ``ChainedAttention(3, S, S, sigma2=0.3,
init="random", seed=0)`` with a random emission), on uniform random observations. Each workload runs over the
first ``check_rows`` rows four times: on the CPU and on the device, each in float64 and in float32. Then:

- float64, device against CPU: the numbers (log-likelihoods, predictive, hop and value marginals, E-step
  statistics, entropies, the k best paths' log-probabilities, losses, gradients, the 20 SVI losses and final
  parameters) to 1e-9 relative, ``||device - cpu|| / ||cpu||`` over the whole tensor: the device computes the
  same thing;
- float32, device against CPU: to 1e-5 relative. Where float32 itself is farther than that from the exact
  answer, no device can be held to it: the key-table gradient of the collapsed loss, summed over 5000 rows
  with cancellation, is 8e-6 from float64 on the CPU alone, and 20 Adam steps that follow such gradients end
  2e-4 from float64. There the device's float32 must be as close to the CPU's float64 as the CPU's own
  float32 is, within a factor 2; the table shows both distances;
- hop paths (MAP, k best), in both precisions: positions with the same (key, value) symbols make paths whose
  probabilities tie exactly (a fifth of the rows at N = 100, S = 50), and the order among ties is the
  device's own. A path that differs from the CPU's must be tied with it: its float64 score, computed from the
  key tables and the emission by :func:`path_log_joints` and not through the engine, within 1e-6 nats. At
  most 1e-3 of the rows may hold an untied difference (two paths whose float32 probabilities tie to
  rounding), and the k paths of a row must be distinct;
- ``sample_paths``: not compared (each device draws from its own random stream); its draws are checked to be
  paths of the right shape and range.

Then each workload is timed on the device at ``n`` rows (default ``n = 1 000 000``, ``N = 100``, ``S = 50``):
the engine's queries on all ``n`` rows, the collapsed loss + backward (``Trace_ELBO`` on
``head.collapsed_model``) and 20 full-batch SVI steps (3 at ``--smoke`` size) of ``fit_svi(collapsed=True)`` on all ``n`` rows, and
the enumerated loss + backward (``TraceEnum_ELBO`` on ``head.model``, whose ``(N, n, N)`` factors do not fit
a million rows) on ``enumerated_rows``. The time is the fastest of two runs (one run when it takes over 10 s),
the device synchronised around each; times are in float32.

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
LIMITS = {"float64": 1e-9, "relative": 1e-5, "rounding_factor": 2.0, "tie": 1e-6, "paths": 1e-3}
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


def path_log_joints(head, obs, paths, rows_per_chunk: int = 256):
    """``log p(path, target)`` of each path, in float64 on the CPU, scored straight from the head's key tables
    and emission (the gate of ``ChainedAttention``'s docstring), not through the engine.

    :param paths: ``(n, L)`` or ``(n, k, L)`` positions. :returns: ``(n,)`` or ``(n, k)``.
    """
    import torch

    key_tables = head.key_tables.detach().double().cpu()  # (L, S, S)
    log_emission = head.emission.detach().double().cpu().log()  # (S, T)
    obs, paths = obs.to("cpu"), paths.cpu()
    single = paths.dim() == 2
    paths = paths.unsqueeze(1) if single else paths
    scores = []
    for start in range(0, len(obs), rows_per_chunk):
        chunk, chunk_paths = obs[start:start + rows_per_chunk], paths[start:start + rows_per_chunk]
        rows = torch.arange(len(chunk)).unsqueeze(-1)  # (r, 1)
        query = chunk.query.unsqueeze(-1).expand(chunk_paths.shape[:2])  # (r, k) symbols
        total = torch.zeros(chunk_paths.shape[:2], dtype=torch.float64)
        for hop in range(chunk_paths.shape[-1]):
            keys = key_tables[hop][chunk.keys]  # (r, N, S): row key_i of K[hop]
            # ||onehot(s) - keys_i||^2 for every query symbol s: (r, N, S)
            distance = 1.0 - 2.0 * keys + keys.pow(2).sum(-1, keepdim=True)
            logits = -distance / (2.0 * head.sigma2)
            if chunk.mask is not None:
                logits = logits.masked_fill(~chunk.mask.unsqueeze(-1), -float("inf"))
            position = chunk_paths[..., hop]  # (r, k)
            total += logits.log_softmax(1)[rows, position, query]
            query = chunk.values[rows, position]
        total += log_emission[chunk.values[rows, chunk_paths[..., -1]], chunk.target.unsqueeze(-1)]
        scores.append(total)
    scores = torch.cat(scores)
    return scores.squeeze(1) if single else scores


def path_differences(got, want, head=None, obs=None) -> tuple:
    """``(differing, untied)``: the fraction of rows whose paths differ, and of rows where a differing path is
    not tied with the one it replaces (its float64 score :func:`path_log_joints` differs by more than
    ``LIMITS["tie"]`` nats). Positions of the same (key, value) symbols make exactly tied paths, and the order
    among ties is the device's business; without ``head`` every differing row counts as untied."""
    import torch

    got, want = got.cpu(), want.cpu()
    if got.shape != want.shape:
        return 1.0, 1.0
    n = got.shape[0]
    if n == 0:
        return 0.0, 0.0
    differs = (got != want).reshape(n, -1).any(-1)
    if head is None or not differs.any():
        return float(differs.double().mean()), float(differs.double().mean())
    rows = differs.nonzero().squeeze(-1)
    gap = (path_log_joints(head, obs[rows], got[rows]) - path_log_joints(head, obs[rows], want[rows])).abs()
    untied = torch.zeros(n, dtype=torch.bool)
    untied[rows] = gap.reshape(len(rows), -1).amax(-1) > LIMITS["tie"]
    return float(differs.double().mean()), float(untied.double().mean())


def _distinct_paths(paths) -> bool:
    """Whether the k paths of every row ``(n, k, L)`` are distinct."""
    import torch

    same = (paths.unsqueeze(1) == paths.unsqueeze(2)).all(-1)  # (n, k, k)
    return bool((same.sum((-1, -2)) == paths.shape[1]).all()) if paths.numel() else True


def compare(name: str, cpu: dict, device: dict, context_len: int, head=None, obs=None) -> dict:
    """Workload ``name``'s largest difference, device against CPU (same dtype): ``relative_difference`` over its
    numbers, and for path queries ``differing_rows`` and ``untied_rows`` (:func:`path_differences`, with
    ``head`` and the check rows ``obs`` to score ties); ``sample_paths`` only by shape and range (positions
    ``0 .. context_len - 1``). ``paths_ok``: the paths limit on the untied rows and distinct k best; ``ok``: that
    and the relative limit."""
    if name == "sample_paths":
        draws = device["draws"]
        ok = draws.shape == cpu["draws"].shape and bool((draws >= 0).all()) and bool((draws < context_len).all())
        return {"workload": name, "compared": "shape and range only (own random stream)", "relative_difference": None,
                "differing_rows": None, "untied_rows": None, "paths_ok": ok, "ok": ok}
    relative, differing, untied, distinct = 0.0, None, None, True
    for part, want in cpu.items():
        got = device[part]
        if want.dtype.is_floating_point:
            relative = max(relative, relative_difference(got, want))
        else:
            differing, untied = path_differences(got, want, head, obs)
            if got.dim() == 3:
                distinct = _distinct_paths(got.cpu())
    paths_ok = (untied is None or untied <= LIMITS["paths"]) and distinct
    return {"workload": name, "compared": ", ".join(cpu), "relative_difference": relative,
            "differing_rows": differing, "untied_rows": untied, "paths_ok": paths_ok,
            "ok": paths_ok and relative <= LIMITS["relative"]}


def compare_precisions(name: str, results: dict, context_len: int, head64, obs) -> dict:
    """The row of workload ``name`` from its four results on the check rows, ``results[(device, dtype)]`` with
    keys ``("cpu" | "device", "float64" | "float32")``.

    - float64, device against CPU: within ``LIMITS["float64"]`` (the device computes the same thing);
    - float32, device against CPU: within ``LIMITS["relative"]``; or, where float32 itself is farther than
      that from the exact answer (gradients summed over thousands of rows with cancellation, and 20 Adam
      steps that follow them), the device's float32 must be as close to the CPU's float64 as the CPU's own
      float32 is, within a factor ``LIMITS["rounding_factor"]``.
    """
    exact = compare(name, results[("cpu", "float64")], results[("device", "float64")], context_len, head64, obs)
    single = compare(name, results[("cpu", "float32")], results[("device", "float32")], context_len, head64, obs)
    row = {"workload": name, "compared": single["compared"], "float64_relative_difference": exact["relative_difference"],
           "relative_difference": single["relative_difference"], "differing_rows": single["differing_rows"],
           "untied_rows": single["untied_rows"], "cpu_float32_error": None, "device_float32_error": None}
    float64_ok = exact["ok"] and (exact["relative_difference"] is None
                                  or exact["relative_difference"] <= LIMITS["float64"])
    float32_ok = single["ok"]
    if name != "sample_paths" and single["paths_ok"] and single["relative_difference"] > LIMITS["relative"]:
        cpu_error = compare(name, results[("cpu", "float64")], results[("cpu", "float32")], context_len)
        device_error = compare(name, results[("cpu", "float64")], results[("device", "float32")], context_len)
        row.update(cpu_float32_error=cpu_error["relative_difference"],
                   device_float32_error=device_error["relative_difference"])
        float32_ok = device_error["relative_difference"] <= LIMITS["rounding_factor"] * max(
            cpu_error["relative_difference"], LIMITS["relative"])
    row["ok"] = float64_ok and float32_ok
    return row


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
    rows, in float64 and in float32 (:func:`compare_precisions`), then time it there in float32."""
    import torch
    from engine import random_observations  # benchmarks/engine.py, beside this file

    device = torch.device(device_name)
    heads = {("cpu", "float32"): make_head(sizes["S"])}
    heads[("cpu", "float64")] = copy.deepcopy(heads[("cpu", "float32")]).double()
    heads[("device", "float32")] = copy.deepcopy(heads[("cpu", "float32")]).to(device)
    heads[("device", "float64")] = copy.deepcopy(heads[("cpu", "float64")]).to(device)
    obs = random_observations(sizes["n"], sizes["N"], sizes["S"])
    check = {"cpu": obs[: sizes["check_rows"]], "device": obs[: sizes["check_rows"]].to(device)}
    device_obs = obs.to(device)
    timing_rows = {"enumerated_loss": min(sizes["n"], sizes["enumerated_rows"])}
    rows = []
    for name in WORKLOADS if workloads is None else workloads:
        results, cpu_seconds = {}, None
        for key in (("cpu", "float32"), ("cpu", "float64"), ("device", "float64"), ("device", "float32")):
            start = time.perf_counter()
            results[key] = run_workload(name, heads[key], check[key[0]], sizes["svi_steps"])  # last: the warm-up
            if key == ("cpu", "float32"):
                cpu_seconds = time.perf_counter() - start
        row = compare_precisions(name, results, sizes["N"], heads[("cpu", "float64")], check["cpu"])
        n_timed = timing_rows.get(name, sizes["n"])
        data = device_obs if n_timed == sizes["n"] else device_obs[:n_timed]
        device_head = heads[("device", "float32")]
        seconds = timed(lambda: run_workload(name, device_head, data, sizes["svi_steps"]), device)
        row.update({"check_rows": sizes["check_rows"], "cpu_check_seconds": cpu_seconds, "rows_timed": n_timed,
                    "device_seconds": seconds, "device_us_per_row": 1e6 * seconds / n_timed})
        rows.append(row)
        print(f"{name:16s} {'ok' if row['ok'] else 'MISSED'}  float64 rel {row['float64_relative_difference']}  "
              f"float32 rel {row['relative_difference']} (cpu32 {row['cpu_float32_error']}, device32 "
              f"{row['device_float32_error']} from float64)  rows {row['differing_rows']} untied {row['untied_rows']}  "
              f"cpu {cpu_seconds:.3f} s ({sizes['check_rows']} rows)  {device.type} {seconds:.3f} s ({n_timed} rows)",
              flush=True)
    return rows


# -- the table -----------------------------------------------------------------------------------------------------
def _number(value, form: str) -> str:
    return "" if value is None else format(value, form)


def table_lines(rows: list, sizes: dict, device_label: str) -> list:
    """The Markdown table of :func:`measure`'s rows."""
    lines = [
        f"Device: {device_label}. Head: `ChainedAttention(L = {HOPS}, S = {sizes['S']}, sigma2 = {SIGMA2})`, random key "
        f"tables and emission; N = {sizes['N']}. Device against CPU on the first {sizes['check_rows']} rows, in "
        f"float64 (limit {LIMITS['float64']:g} relative) and in float32 (limit {LIMITS['relative']:g} relative, or, "
        f"where float32 itself is farther from float64, the device's float32 as close to the CPU's float64 as the "
        f"CPU's own float32, within {LIMITS['rounding_factor']:g}x); paths may differ only between tied paths "
        f"(float64 scores within {LIMITS['tie']:g} nats; at most {LIMITS['paths']:g} of the rows otherwise). Times in "
        f"float32 on the device (fastest of two runs); `svi_steps`: {sizes['svi_steps']} full-batch steps of "
        f"`fit_svi(collapsed=True)`.",
        "",
        "| workload | compared | float64: device vs CPU | float32: device vs CPU | float32 vs float64: CPU / device "
        "| rows whose paths differ (untied) | within limits | CPU float32 on the check rows (s) | rows timed "
        "| device time (s) | device us / row |",
        "|---|---|---:|---:|---:|---:|---|---:|---:|---:|---:|",
    ]
    for r in rows:
        rounding = "" if r["cpu_float32_error"] is None else (
            f"{r['cpu_float32_error']:.1e} / {r['device_float32_error']:.1e}")
        paths = "" if r["differing_rows"] is None else f"{r['differing_rows']:.1e} ({r['untied_rows']:.1e})"
        lines.append(
            f"| `{r['workload']}` | {r['compared']} | {_number(r['float64_relative_difference'], '.1e')} | "
            f"{_number(r['relative_difference'], '.1e')} | {rounding} | {paths} | {'ok' if r['ok'] else '**missed**'} | "
            f"{r['cpu_check_seconds']:.3f} | {r['rows_timed']} | {r['device_seconds']:.3f} | "
            f"{r['device_us_per_row']:.3f} |"
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
