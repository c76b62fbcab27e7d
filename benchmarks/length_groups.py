"""Length groups in fit_svi on bAbI: seconds per full-batch SVI step with and without ``group_lengths``.

    python benchmarks/length_groups.py --out benchmarks/results       # tasks 1-3, writes length_groups.md
    python benchmarks/length_groups.py --smoke --out /tmp/lg           # tiny, for the tests

Each cell times ``fit_svi(head, train.obs, num_steps=steps, ...)`` (full batches, one thread) and divides by
the steps; ``collapsed`` is the engine-collapsed model under ``Trace_ELBO``, else ``TraceEnum_ELBO``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch

from pyro_multihop.datasets.babi import load_task
from pyro_multihop.experiments.chained_babi import babi_head
from pyro_multihop.train import fit_svi

HERE = Path(__file__).resolve().parent


def seconds_per_step(train, steps: int, collapsed: bool, group_lengths) -> float:
    head = babi_head(train, 2, seed=0)
    started = time.perf_counter()
    fit_svi(head, train.obs, num_steps=steps, log_every=steps, collapsed=collapsed, group_lengths=group_lengths,
            progress=False)
    return (time.perf_counter() - started) / steps


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--tasks", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    lines = ["| task | N | mean length | loss | no groups (s/step) | groups of 10 (s/step) | speed-up |",
             "|---|---:|---:|---|---:|---:|---:|"]
    for task in args.tasks:
        train, _ = load_task(task, max_train=50 if args.smoke else None)
        mean_length = float(train.obs.context_lengths().double().mean())
        for collapsed in (False, True):
            plain = seconds_per_step(train, args.steps, collapsed, None)
            grouped = seconds_per_step(train, args.steps, collapsed, 10)
            name = "collapsed" if collapsed else "enumerated"
            lines.append(f"| {task} | {train.obs.context_len} | {mean_length:.1f} | {name} | {plain:.3f} | "
                         f"{grouped:.3f} | {plain / grouped:.1f}x |")
            print(lines[-1], flush=True)
    text = ("# Length groups in fit_svi (bAbI, 1k training questions, 2 hops, full batches)\n\n"
            f"`python benchmarks/length_groups.py`, {args.steps} steps a cell, one thread.\n\n" + "\n".join(lines) + "\n")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "length_groups.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
