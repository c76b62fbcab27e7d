"""How torch's intra-op thread count (1 or 2) changes the time of each command's work on the library's
small tensors.

Each (workload, threads) pair runs in its own subprocess that calls ``torch.set_num_threads(threads)``
before any work, does one warm-up round, and reports the median wall time of ``--repeats`` rounds. The
workloads are what the commands do on the README's task (transitive, S = 30, 5 pairs, N = 10; ``n`` rows):

- ``train svi``: ``fit_svi`` on the chained head, full batch, evaluated on ``n`` held-out rows every 10
  steps (what ``pyro-multihop train --val`` does); time per step;
- ``train em``: one ``ChainedEM`` iteration (E-step + M-step); time per iteration;
- ``train em (tied)``: one ``TiedEmbeddingVEM`` iteration (S = 18, 3 pairs, D = 8); time per iteration;
- ``evaluate``: ``model.evaluate`` (log-likelihood and accuracy) of the chained head on ``n`` rows;
- ``predict``: ``predict_proba`` and ``map_paths`` on ``n`` rows;
- ``simulate``: ``transitive_task`` of ``n`` rows.

``inspect`` draws figures (matplotlib) around one ``hop_marginals`` call on a few rows; it shares
``predict``'s default. The machine's core count is in the table: on the 2-core machine this was written
for, the second thread is shared with whatever else runs.

Usage::

    python benchmarks/threads.py --out benchmarks/results            # n = 2000, a few minutes
    python benchmarks/threads.py --out /tmp/bench --smoke            # seconds

Writes ``threads.md`` (and ``threads.csv``) into ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path

FULL = {"n": 2000, "svi_steps": 30, "repeats": 5}
SMOKE = {"n": 40, "svi_steps": 3, "repeats": 1}
WORKLOADS = ["train svi", "train em", "train em (tied)", "evaluate", "predict", "simulate"]
THREADS = (1, 2)


def _workload(name: str, size: dict):
    """A function doing one round of ``name``'s work, and the unit a round counts (steps per round)."""
    import warnings

    import pyro_multihop as pm
    from chained_loss import random_emission  # benchmarks/, beside this file
    from pyro_multihop.em.variational import TiedEmbeddingVEM
    from pyro_multihop.train import fit_svi

    n = size["n"]
    train = pm.transitive_task(n, num_symbols=30, pairs=5, seed=0)
    val = pm.transitive_task(n, num_symbols=30, pairs=5, seed=1)
    head = pm.ChainedAttention(2, 30, 30, sigma2=0.1, seed=0, emission=random_emission(30, 30))
    if name == "train svi":
        steps = size["svi_steps"]
        return (lambda: fit_svi(head, train, num_steps=steps, val=val, log_every=10, progress=False)), steps
    if name == "train em":
        em = pm.ChainedEM(2, 30, 30, sigma2=0.1)
        return (lambda: em.fit(train, max_iters=1, tol=0.0, seed=0)), 1
    if name == "train em (tied)":
        tied = pm.transitive_task(min(n, 800), num_symbols=18, pairs=3, seed=0)
        vem = TiedEmbeddingVEM(18, 8, 18, max_iters=5, tol=0.0)

        def run_vem():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                vem.fit(tied)

        return run_vem, 5
    if name == "evaluate":
        return (lambda: head.evaluate(val)), 1
    if name == "predict":
        def run_predict():
            head.predict_proba(val)
            head.map_paths(val)

        return run_predict, 1
    if name == "simulate":
        return (lambda: pm.transitive_task(n, num_symbols=30, pairs=5, seed=2)), 1
    raise ValueError(f"unknown workload {name!r}")


def _worker(name: str, threads: int, size: dict) -> dict:
    import torch

    torch.set_num_threads(threads)
    import warnings

    warnings.filterwarnings("ignore")
    run, per_round = _workload(name, size)
    with torch.no_grad() if name in ("evaluate", "predict") else _nothing():
        run()  # warm-up: lazy imports, allocator, thread pool
        times = []
        for _ in range(size["repeats"]):
            started = time.perf_counter()
            run()
            times.append((time.perf_counter() - started) / per_round)
    return {"workload": name, "threads": threads, "ms": 1e3 * statistics.median(times)}


class _nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    parser.add_argument("--worker", nargs=2, metavar=("WORKLOAD", "THREADS"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    size = SMOKE if args.smoke else FULL
    if args.worker:
        names = WORKLOADS if args.worker[0] == "all" else [args.worker[0]]
        for name in names:
            print(json.dumps(_worker(name, int(args.worker[1]), size)), flush=True)
        return 0

    load_before = _load_average()
    rows = []
    # Each (workload, threads) in its own process; at smoke size one process a thread count runs every
    # workload (the table's shape is what the test suite checks, not the times).
    groups = [("all", WORKLOADS)] if args.smoke else [(name, [name]) for name in WORKLOADS]
    for threads in THREADS:
        for worker, names in groups:
            command = [sys.executable, __file__, "--worker", worker, str(threads)] + (["--smoke"] if args.smoke else [])
            environment = dict(os.environ, OMP_NUM_THREADS=str(threads), MKL_NUM_THREADS=str(threads))
            result = subprocess.run(command, capture_output=True, text=True, env=environment, check=True)
            for line in result.stdout.strip().splitlines()[-len(names):]:
                rows.append(json.loads(line))
                print(f"{rows[-1]['workload']:16s} {threads} thread(s): {rows[-1]['ms']:.2f} ms", flush=True)

    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "threads.csv", "w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=["workload", "threads", "ms"])
        writer.writeheader()
        writer.writerows(rows)
    ms = {(r["workload"], r["threads"]): r["ms"] for r in rows}
    lines = [
        "# Threads: 1 or 2 torch threads on the library's small tensors",
        "",
        f"`python benchmarks/threads.py{' --smoke' if args.smoke else ''}`; n = {size['n']} rows (README task: "
        f"transitive, S = 30, 5 pairs, N = 10), median of {size['repeats']} rounds after a warm-up, each "
        f"(workload, threads) in its own process{' (smoke: one process a thread count)' if args.smoke else ''}. Machine: {os.cpu_count()} logical cores, "
        f"{platform.processor() or platform.machine()}, torch {_torch_version()}; load average (1 min) "
        f"{load_before} before and {_load_average()} after the run (other processes competing for the cores "
        "make a second thread wait, which is the situation the defaults must survive).",
        "",
        "| work | unit | 1 thread (ms) | 2 threads (ms) | 2 threads / 1 thread |",
        "|---|---|---|---|---|",
    ]
    units = {"train svi": "SVI step (with --val every 10 steps)", "train em": "EM iteration",
             "train em (tied)": "VEM iteration (S = 18)", "evaluate": "call", "predict": "call", "simulate": "call"}
    for name in WORKLOADS:
        one, two = ms[(name, 1)], ms[(name, 2)]
        lines.append(f"| {name} | {units[name]} | {one:.2f} | {two:.2f} | {two / one:.2f} |")
    lines += ["", "A ratio above 1 means the second thread costs time (synchronisation on tensors too small "
              "to split), below 1 that it pays."]
    (args.out / "threads.md").write_text("\n".join(lines) + "\n")
    print(f"wrote {args.out / 'threads.md'}")
    return 0


def _load_average() -> str:
    try:
        return f"{os.getloadavg()[0]:.1f}"
    except OSError:  # not available on this platform
        return "unknown"


def _torch_version() -> str:
    import torch

    return torch.__version__


if __name__ == "__main__":
    sys.exit(main())
