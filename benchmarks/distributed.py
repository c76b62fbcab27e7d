"""Data-parallel EM and SVI: one EM iteration and one SVI step with 1 and 2 processes of one thread each.

The data (``chain_task`` with ``L = 3`` hops, ``S = 30`` symbols, ``N = 30`` positions, ``n = 400 000`` rows)
is written once to a Parquet file. For each process count ``P`` the script spawns ``P`` fresh processes
(``torch.multiprocessing``, one thread each; a gloo process group on localhost when ``P > 1``, none when
``P = 1``, which is the library as one process runs it). Each process reads only its shard
(``Observations.load(path, shard=(rank, P))``) and then measures, after a warm-up on 10 rows:

- **EM**: one iteration of :class:`~pyro_multihop.ChainedEM`: E-step on the shard, the all-reduce of the
  statistics (:func:`~pyro_multihop.distributed.all_reduce_stats`), M-step;
- **SVI**: one full-batch step of :func:`~pyro_multihop.fit_svi`'s loop: the enumerated
  ``TraceEnum_ELBO`` loss share of the shard, backward, the gradient all-reduce, the ClippedAdam step;
  and the same step on the collapsed model (``fit_svi(collapsed=True)``, ``Trace_ELBO``);
- the all-reduce alone (``P > 1``): statistics and gradients, the median of 20, for the cost model.

Time is the slowest rank's (ranks start together after a barrier). Peak memory is each process's peak
resident set (``VmHWM``) during the measured step, reset just before it (``/proc/self/clear_refs``, after
``malloc_trim``), so it counts the shard, the model and the step's intermediates, not the file reading;
the table shows the largest over ranks. The load average of the machine is printed with the table: the
numbers are only comparable on an otherwise idle machine with at least ``P`` cores.

Usage::

    python benchmarks/distributed.py --out benchmarks/results            # n = 400 000 (minutes)
    python benchmarks/distributed.py --out /tmp/bench --smoke            # seconds

Writes ``distributed.csv`` and ``distributed.md`` into ``--out``.
"""

from __future__ import annotations

import argparse
import csv
import ctypes
import datetime
import json
import os
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

FULL = {"n": 400_000, "hops": 3, "num_symbols": 30, "pairs": 10}
SMOKE = {"n": 400, "hops": 3, "num_symbols": 8, "pairs": 2}
PROCESS_COUNTS = (1, 2)
SIGMA2 = 0.1


def _status_kib(field: str) -> int:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    return 0


def _reset_peak() -> None:
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
    except OSError:
        pass


def _peak_mib() -> float:
    return _status_kib("VmHWM") / 1024


def _worker(rank: int, processes: int, port: int, path: str, config: dict, out: str) -> None:
    import torch

    torch.set_num_threads(1)
    import torch.distributed as dist

    from chained_loss import random_emission  # benchmarks/, beside this file
    from pyro_multihop import ChainedAttention, ChainedEM, Observations, distributed
    from pyro_multihop.train.settings import make_optimizer, svi_settings
    from pyro_multihop.train.svi_loss import SviLoss, backward_over_ranks

    if processes > 1:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=processes,
                                timeout=datetime.timedelta(minutes=20))
    shard = Observations.load(path, shard=(rank, processes))
    n = int(distributed.all_reduce_sum(len(shard))[0])
    largest = distributed.all_reduce_max(len(shard))
    L, S = config["hops"], config["num_symbols"]
    em = ChainedEM(L, S, S, sigma2=SIGMA2)
    head = ChainedAttention(L, S, S, sigma2=SIGMA2, seed=0, emission=random_emission(S, S))
    result = {"rank": rank, "rows": len(shard)}

    def timed(step) -> tuple:
        distributed.barrier()
        _reset_peak()
        started = time.perf_counter()
        step()
        seconds = time.perf_counter() - started
        return seconds, _peak_mib()

    # EM: warm-up on 10 rows, then one iteration on the shard.
    em.m_step(distributed.all_reduce_stats(em.e_step(head, shard[:10])))
    holder = {}

    def em_iteration():
        holder["stats"] = distributed.all_reduce_stats(em.e_step(head, shard))
        em.m_step(holder["stats"])

    result["em_seconds"], result["em_peak_mib"] = timed(em_iteration)

    # SVI: one full-batch step of fit_svi's loop (warm-up on 10 rows first).
    import pyro

    with pyro.get_param_store().scope():
        optimizer = make_optimizer(head, svi_settings(head))
        warm = SviLoss(head, shard[:10], None, False)
        backward_over_ranks(warm.train(0), head)
        optimizer.zero_grad(set_to_none=True)
        loss = SviLoss(head, shard, None, False, total=n, largest_shard=largest)

        def svi_step():
            optimizer.zero_grad(set_to_none=True)
            backward_over_ranks(loss.train(0), head)
            optimizer.step()

        result["svi_seconds"], result["svi_peak_mib"] = timed(svi_step)
        warm = SviLoss(head, shard[:10], None, False, collapsed=True)
        backward_over_ranks(warm.train(0), head)
        optimizer.zero_grad(set_to_none=True)
        loss = SviLoss(head, shard, None, False, total=n, largest_shard=largest, collapsed=True)
        result["svi_collapsed_seconds"], result["svi_collapsed_peak_mib"] = timed(svi_step)

    if processes > 1:  # the communication alone
        stats = holder["stats"]
        times_stats, times_grads = [], []
        for _ in range(20):
            distributed.barrier()
            started = time.perf_counter()
            distributed.all_reduce_stats(stats)
            times_stats.append(time.perf_counter() - started)
            distributed.barrier()
            started = time.perf_counter()
            distributed.all_reduce_gradients(head.parameters())
            times_grads.append(time.perf_counter() - started)
        result["allreduce_stats_seconds"] = statistics.median(times_stats)
        result["allreduce_grads_seconds"] = statistics.median(times_grads)
        result["stats_numbers"] = sum(t.numel() for t in (stats.key_numerators, stats.key_masses, stats.emission_counts)) + 2
        result["grad_numbers"] = sum(p.numel() for p in head.parameters())
        dist.destroy_process_group()
    Path(out, f"P{processes}_rank{rank}.json").write_text(json.dumps(result))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run(processes: int, path: Path, config: dict, out: Path) -> list:
    import torch.multiprocessing as mp

    mp.start_processes(_worker, args=(processes, _free_port(), str(path), config, str(out)), nprocs=processes,
                       join=True, start_method="spawn")
    return [json.loads((out / f"P{processes}_rank{r}.json").read_text()) for r in range(processes)]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(__file__).resolve().parent / "results")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    parser.add_argument("--n", type=int, default=None, help="rows (default: 400 000; 400 with --smoke)")
    args = parser.parse_args(argv)
    config = dict(SMOKE if args.smoke else FULL)
    if args.n is not None:
        config["n"] = args.n
    for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS"):
        os.environ[variable] = "1"  # inherited by the spawned processes before they import torch
    from pyro_multihop import chain_task

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as folder:
        folder = Path(folder)
        obs = chain_task(config["n"], n_hops=config["hops"], num_symbols=config["num_symbols"],
                         pairs=config["pairs"], seed=0)
        path = folder / "data.parquet"
        obs.to_dataframe().to_parquet(path, index=False, row_group_size=8192)
        N = obs.context_len
        del obs
        runs = {P: _run(P, path, config, folder) for P in PROCESS_COUNTS}
    load_after = os.getloadavg()

    rows = []
    names = {"em": "EM iteration", "svi": "SVI step", "svi_collapsed": "SVI step, collapsed"}
    for method in names:
        base = max(r[f"{method}_seconds"] for r in runs[1])
        for P, ranks in runs.items():
            seconds = max(r[f"{method}_seconds"] for r in ranks)
            rows.append({
                "method": names[method],
                "processes": P,
                "rows_per_process": max(r["rows"] for r in ranks),
                "seconds": seconds,
                "speedup": base / seconds,
                "peak_rss_mib_per_process": max(r[f"{method}_peak_mib"] for r in ranks),
                "microseconds_per_row": 1e6 * seconds * P / config["n"],
            })
    communication = runs[max(PROCESS_COUNTS)][0]
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "distributed.csv", "w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    lines = [
        f"Data-parallel EM and SVI (`benchmarks/distributed.py`): n = {config['n']}, L = {config['hops']}, "
        f"S = {config['num_symbols']}, N = {N}, float32, one thread per process, gloo on localhost.",
        f"Load average before / after: {load_before[0]:.2f} / {load_after[0]:.2f} on {os.cpu_count()} cores.",
        "",
        "| step | processes | rows per process | seconds (slowest rank) | speedup | peak RSS per process (MiB) | "
        "process-microseconds per row |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['method']} | {row['processes']} | {row['rows_per_process']} | {row['seconds']:.3f} | "
            f"{row['speedup']:.2f} | {row['peak_rss_mib_per_process']:.0f} | {row['microseconds_per_row']:.2f} |"
        )
    lines += [
        "",
        f"All-reduce alone with {max(PROCESS_COUNTS)} processes (median of 20): EM statistics "
        f"({communication['stats_numbers']} numbers, float64) {1e3 * communication['allreduce_stats_seconds']:.3f} ms; "
        f"SVI gradients ({communication['grad_numbers']} numbers, float32) "
        f"{1e3 * communication['allreduce_grads_seconds']:.3f} ms.",
    ]
    (args.out / "distributed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
