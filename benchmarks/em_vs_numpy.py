"""One closed-form EM iteration (E-step + M-step): ``ChainedEM`` against a naive numpy implementation.

Both implementations compute, in float64, the same E+M iteration of the chained head on the same data and
model (``chain_task`` with ``L`` hops, ``S`` symbols, ``N = L * pairs`` positions, ``n`` observations; the
model is EM's own first M-step from random responsibilities, seed 0):

- ``torch``: :meth:`pyro_multihop.ChainedEM.e_step` then :meth:`~pyro_multihop.ChainedEM.m_step`;
- ``numpy``: written here the way the original specification does it: squared distances between every
  incoming one-hot query and every key vector, i.e. an ``(n, N, N, S)`` tensor per hop transition, explicit
  ``(n, N, N)`` transition and pairwise arrays, einsum forward-backward, and ``np.add.at`` accumulation.

Each implementation runs in its own subprocess (``--threads`` threads, 1 by default, set before numpy and
torch are imported). Peak memory is the growth of the resident set during one iteration: the process does
its setup and a warm-up iteration on 10 rows (so that lazily loaded libraries and thread pools are already
paid for), hands every free heap page back to the kernel (``malloc_trim(0)``, so that memory freed during
set-up and reused by the iteration is counted again), resets the kernel's peak-RSS counter
(``/proc/self/clear_refs``, Linux >= 4.0), runs one full iteration, and reports ``VmHWM`` (peak RSS) minus
the RSS just before it. This sees every allocation, numpy's and torch's alike, which ``tracemalloc`` would
not (torch's CPU allocator bypasses it). Where the counter cannot be reset it falls back to ``ru_maxrss``,
which can only over-report (it includes the set-up). Times are the median of ``--repeats`` further
iterations. The statistics (key numerators and masses, emission counts, log-likelihood, relative for the
latter) and the updated parameters of the two must agree to 1e-8, else the script exits with 1.

Usage::

    python benchmarks/em_vs_numpy.py --out benchmarks/results            # L=3, S=30, N=30, n=2000
    python benchmarks/em_vs_numpy.py --out /tmp/bench --smoke            # seconds

Writes ``em_vs_numpy.csv`` and ``em_vs_numpy.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import json
import math
import os
import platform
import re
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

FULL = {"hops": 3, "num_symbols": 30, "pairs": 10, "n": 2000, "repeats": 5}
SMOKE = {"hops": 3, "num_symbols": 8, "pairs": 2, "n": 50, "repeats": 2}
TARGETS = {"speedup": 30.0, "memory_ratio": 3.0}
TOLERANCE = 1e-8
SIGMA2 = 0.1
SMOOTHING = 1e-4
IMPLEMENTATIONS = ("torch", "numpy")
_THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "NUMEXPR_NUM_THREADS")


# -- the naive numpy reference ------------------------------------------------------------------------
def numpy_em_iteration(key_tables, emission, sigma2, keys, values, query, target, smoothing):
    """One E+M iteration with explicit distance tensors. Returns ``(stats dict, key_tables, emission)``."""
    import numpy as np

    L, S, _ = key_tables.shape
    T = emission.shape[1]
    n, N = keys.shape
    eye = np.eye(S)

    def softmax(scores, axis):
        scores = scores - scores.max(axis=axis, keepdims=True)
        weights = np.exp(scores)
        return weights / weights.sum(axis=axis, keepdims=True)

    # Gates: the distance from each incoming one-hot query to each position's key vector.
    first_difference = eye[query][:, None, :] - key_tables[0][keys]  # (n, N, S)
    first = softmax(-np.sum(first_difference**2, axis=2) / (2 * sigma2), axis=1)
    transitions = []
    for hop in range(1, L):
        difference = eye[values][:, :, None, :] - key_tables[hop][keys][:, None, :, :]  # (n, N, N, S)
        transitions.append(softmax(-np.sum(difference**2, axis=3) / (2 * sigma2), axis=2))
        del difference

    # Forward-backward in probability space.
    alphas = [first]
    for transition in transitions:
        alphas.append(np.einsum("ni,nij->nj", alphas[-1], transition))
    last_emission = emission[values, target[:, None]]  # (n, N)
    likelihood = np.maximum(np.einsum("ni,ni->n", alphas[-1], last_emission), 1e-300)
    betas = [last_emission]
    for transition in reversed(transitions):
        betas.insert(0, np.einsum("nij,nj->ni", transition, betas[0]))
    gammas = [alpha * beta / likelihood[:, None] for alpha, beta in zip(alphas, betas)]
    pairwise = [
        alphas[hop][:, :, None] * transitions[hop] * betas[hop + 1][:, None, :] / likelihood[:, None, None]
        for hop in range(L - 1)
    ]

    # Statistics: expected incoming one-hot queries per key, and emission counts.
    key_numerators = np.zeros((L, S, S))
    key_masses = np.zeros((L, S))
    incoming = gammas[0][:, :, None] * eye[query][:, None, :]  # (n, N, S)
    np.add.at(key_numerators[0], keys.ravel(), incoming.reshape(-1, S))
    np.add.at(key_masses[0], keys.ravel(), gammas[0].ravel())
    for hop in range(1, L):
        incoming = np.einsum("nij,nis->njs", pairwise[hop - 1], eye[values])  # (n, N, S)
        np.add.at(key_numerators[hop], keys.ravel(), incoming.reshape(-1, S))
        np.add.at(key_masses[hop], keys.ravel(), pairwise[hop - 1].sum(axis=1).ravel())
    emission_counts = np.zeros((S, T))
    np.add.at(emission_counts, (values.ravel(), np.repeat(target, N)), gammas[-1].ravel())

    # M-step.
    new_key_tables = key_numerators / np.maximum(key_masses, 1e-9)[:, :, None]
    smoothed = emission_counts + smoothing
    new_emission = smoothed / smoothed.sum(axis=1, keepdims=True)
    stats = {
        "key_numerators": key_numerators,
        "key_masses": key_masses,
        "emission_counts": emission_counts,
        "loglik": np.array(np.log(likelihood).sum()),
    }
    return stats, new_key_tables, new_emission


# -- memory -------------------------------------------------------------------------------------------
def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        return int(re.search(rf"^{field}:\s+(\d+) kB", status.read(), re.MULTILINE).group(1))


def _reset_peak_rss() -> bool:
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def _trim_heap() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _peak_rss_kib(reset: bool) -> int:
    if reset:
        return _status_kib("VmHWM")
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


# -- one implementation, in its own process --------------------------------------------------------------
def worker(implementation: str, config: dict, threads: int, result_path: Path) -> None:
    import numpy as np
    import torch

    from pyro_multihop import chain_task
    from pyro_multihop.em import ChainedEM

    torch.set_num_threads(threads)
    obs = chain_task(config["n"], n_hops=config["hops"], num_symbols=config["num_symbols"], pairs=config["pairs"],
                     seed=0)
    em = ChainedEM(config["hops"], config["num_symbols"], config["num_symbols"], SIGMA2, SMOOTHING)
    model = em.m_step(em.random_stats(obs, seed=0, dtype=torch.float64))

    if implementation == "torch":

        def iteration(batch):
            stats = em.e_step(model, batch)
            updated = em.m_step(stats)
            arrays = {
                "key_numerators": stats.key_numerators.numpy(),
                "key_masses": stats.key_masses.numpy(),
                "emission_counts": stats.emission_counts.numpy(),
                "loglik": np.array(stats.loglik),
            }
            return arrays, updated.key_tables.detach().numpy(), updated.emission.detach().numpy()

    else:
        key_tables = model.key_tables.detach().numpy().copy()
        emission = model.emission.detach().numpy().copy()
        arrays = {name: getattr(obs, name).numpy() for name in ("keys", "values", "query", "target")}

        def iteration(batch):
            rows = slice(0, len(batch))
            return numpy_em_iteration(
                key_tables, emission, SIGMA2, arrays["keys"][rows], arrays["values"][rows],
                arrays["query"][rows], arrays["target"][rows], SMOOTHING,
            )

    iteration(obs[:10])  # warm-up: lazy imports, thread pools, kernel caches
    _trim_heap()
    reset = _reset_peak_rss()
    rss_before = _status_kib("VmRSS")
    start = time.perf_counter()
    stats, new_key_tables, new_emission = iteration(obs)
    first_seconds = time.perf_counter() - start
    peak_increase = _peak_rss_kib(reset) - rss_before
    times = []
    for _ in range(config["repeats"]):
        start = time.perf_counter()
        iteration(obs)
        times.append(time.perf_counter() - start)
    np.savez(result_path.with_suffix(".npz"), key_tables=new_key_tables, emission=new_emission, **stats)
    result_path.write_text(
        json.dumps(
            {
                "implementation": implementation,
                "seconds_median": statistics.median(times),
                "seconds_min": min(times),
                "seconds_first": first_seconds,
                "peak_rss_increase_mib": peak_increase / 1024,
                "peak_counter_reset": reset,
                "repeats": config["repeats"],
            }
        )
    )


def _run_worker(implementation: str, config: dict, threads: int, directory: Path) -> dict:
    result_path = directory / f"{implementation}.json"
    environment = dict(os.environ, **{name: str(threads) for name in _THREAD_VARIABLES})
    command = [
        sys.executable, str(Path(__file__).resolve()), "--worker", implementation,
        "--config", json.dumps(config), "--threads", str(threads), "--result", str(result_path),
    ]
    if subprocess.run(command, env=environment).returncode != 0:
        raise RuntimeError(f"the {implementation} worker failed (its traceback is above)")
    return json.loads(result_path.read_text())


def _compare(directory: Path) -> dict:
    import numpy as np

    torch_arrays = np.load(directory / "torch.npz")
    numpy_arrays = np.load(directory / "numpy.npz")
    differences = {}
    for name in torch_arrays.files:
        a, b = torch_arrays[name], numpy_arrays[name]
        scale = max(1.0, float(np.abs(b).max())) if name == "loglik" else 1.0  # loglik: relative
        differences[name] = float(np.abs(a - b).max()) / scale
    return differences


def _ratio(value: float) -> str:
    return "n/a (under 1 MiB)" if math.isnan(value) else f"{value:.1f}x"


def _write_tables(out: Path, config: dict, threads: int, results: dict, differences: dict, smoke: bool) -> str:
    speedup = results["numpy"]["seconds_median"] / results["torch"]["seconds_median"]
    # RSS moves in pages: below 1 MiB (the smoke size) the ratio means nothing.
    measurable = results["torch"]["peak_rss_increase_mib"] >= 1.0
    memory_ratio = math.nan
    if measurable:
        memory_ratio = results["numpy"]["peak_rss_increase_mib"] / results["torch"]["peak_rss_increase_mib"]
    rows = []
    for name in IMPLEMENTATIONS:
        result = results[name]
        rows.append(
            {
                "implementation": name,
                "L": config["hops"], "S": config["num_symbols"], "N": config["hops"] * config["pairs"],
                "n": config["n"], "threads": threads,
                "seconds_median": f"{result['seconds_median']:.6f}",
                "seconds_min": f"{result['seconds_min']:.6f}",
                "peak_rss_increase_mib": f"{result['peak_rss_increase_mib']:.1f}",
                "repeats": result["repeats"],
            }
        )
    with open(out / "em_vs_numpy.csv", "w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)

    size = f"L={config['hops']}, S={config['num_symbols']}, N={config['hops'] * config['pairs']}, n={config['n']}"
    worst = max(differences.values())
    lines = [
        f"### One EM iteration (E+M), {size}, float64, {threads} thread(s){' (smoke size)' if smoke else ''}",
        "",
        "| implementation | time per iteration (median) | peak memory increase |",
        "|---|---:|---:|",
    ]
    for name, label in (("torch", "`ChainedEM` (torch)"), ("numpy", "naive numpy, (n, N, N, S) distances")):
        result = results[name]
        seconds, memory = result["seconds_median"], result["peak_rss_increase_mib"]
        lines.append(f"| {label} | {seconds * 1e3:.1f} ms | {memory:.1f} MiB |")
    if smoke:
        verdict = "Smoke size: times and memory mean nothing here, only the agreement is checked. "
    else:
        verdict = (
            f"Targets: at least {TARGETS['speedup']:.0f}x faster "
            f"({'met' if speedup >= TARGETS['speedup'] else 'NOT met'}) and {TARGETS['memory_ratio']:.0f}x less "
            f"peak memory ({'met' if memory_ratio >= TARGETS['memory_ratio'] else 'NOT met'}). "
        )
    lines += [
        f"| **ratio numpy / torch** | **{speedup:.1f}x** | **{_ratio(memory_ratio)}** |",
        "",
        verdict + f"Largest difference between the two sets of statistics and parameters: {worst:.1e} "
        f"(tolerance {TOLERANCE:g}).",
        "",
        f"Median of {results['torch']['repeats']} timed iterations after a warm-up; memory: peak RSS minus RSS "
        "just before one iteration, each implementation in a fresh process"
        f"{'' if all(r['peak_counter_reset'] for r in results.values()) else ' (ru_maxrss: no peak reset)'}. "
        f"Python {platform.python_version()}, {platform.machine()}.",
    ]
    table = "\n".join(lines) + "\n"
    (out / "em_vs_numpy.md").write_text(table)
    return table


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    parser.add_argument("--threads", type=int, default=1, help="threads of numpy and torch in each worker")
    parser.add_argument("--repeats", type=int, default=None, help="timed iterations per implementation")
    parser.add_argument("--worker", choices=IMPLEMENTATIONS, help=argparse.SUPPRESS)
    parser.add_argument("--config", help=argparse.SUPPRESS)
    parser.add_argument("--result", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.threads < 1:
        parser.error("--threads must be >= 1")
    if args.worker:
        worker(args.worker, json.loads(args.config), args.threads, args.result)
        return 0

    config = dict(SMOKE if args.smoke else FULL)
    if args.repeats is not None:
        if args.repeats < 1:
            parser.error("--repeats must be >= 1")
        config["repeats"] = args.repeats
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        try:
            results = {name: _run_worker(name, config, args.threads, directory) for name in IMPLEMENTATIONS}
        except RuntimeError as error:
            print(error, file=sys.stderr)
            return 1
        differences = _compare(directory)
    print(_write_tables(args.out, config, args.threads, results, differences, args.smoke), end="")
    for name, difference in differences.items():
        if not difference <= TOLERANCE:
            print(f"MISMATCH: {name} differs by {difference:.3g} > {TOLERANCE:g}", file=sys.stderr)
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
