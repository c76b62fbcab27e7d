"""bAbI tasks 1-3: answer accuracy and supporting-fact selection of the chained head, 1-3 hops (docs/babi.md).

Every run is ``pyro_multihop.experiments.babi.run_babi`` (what ``pyro-multihop babi`` runs) with the same
settings; one thread per run, runs one after the other. Writes ``babi.csv`` and ``babi.md`` under ``--out``
and each run's ``results.json`` and ``hop_posteriors.png`` under ``--out/babi_runs/``::

    python benchmarks/babi.py --out benchmarks/results                      # tasks 1-3 x hops 1-3, 1k
    python benchmarks/babi.py --out benchmarks/results --ten-k /work/shared/babi/en-10k   # + tasks 1-2, 10k
    python benchmarks/babi.py --smoke --out /tmp/babi                       # tiny, for the tests
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd
import torch

from pyro_multihop.experiments.babi import BABI_SVI, run_babi

HERE = Path(__file__).resolve().parent


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--tasks", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--hops", type=int, nargs="+", default=[1, 2, 3])
    parser.add_argument("--ten-k", type=Path, default=None, help="en-10k directory: also tasks 1-2 with 10k training")
    parser.add_argument("--ten-k-tasks", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--ten-k-hops", type=int, nargs="*", default=[1, 2])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    parser.add_argument("--name", default="babi", help="stem of the table files (default: babi)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    runs = [(task, hops, None) for task in args.tasks for hops in args.hops]
    if args.ten_k is not None:
        runs += [(task, hops, args.ten_k) for task, hops in zip(args.ten_k_tasks, args.ten_k_hops)]
    rows = []
    for task, hops, train_dir in runs:
        name = f"task{task}_L{hops}" + ("_10k" if train_dir else "")
        kwargs = dict(steps=5, max_train=50) if args.smoke else {}
        if train_dir is not None and not args.smoke:
            kwargs["batch_size"] = 1000  # same work per step as a full 1k batch
        result = run_babi(task, args.out / "babi_runs" / name, train_dir=train_dir, hops=hops, overwrite=True, **kwargs)
        result["train_set"] = "10k" if train_dir else "1k"
        print(json.dumps(result), flush=True)
        rows.append(result)
    table = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / f"{args.name}.csv", index=False)
    lines = [
        "| task | training | hops | answer accuracy (%) | fact selection (%) | training time (s) |",
        "|---|---|---|---:|---:|---:|",
    ]
    for row in rows:
        lines.append(
            f"| {row['task']} | {row['train_set']} | {row['hops']} | {100 * row['answer_accuracy']:.1f} | "
            f"{100 * row['fact_accuracy']:.1f} | {row['train_seconds']:.0f} |"
        )
    settings = "smoke: 5 steps, 50 questions" if args.smoke else f"{BABI_SVI}"
    (args.out / f"{args.name}.md").write_text(
        "# bAbI tasks 1-3 (test files, 1000 questions each)\n\n"
        f"`python benchmarks/babi.py`, settings {settings}, one thread.\n\n" + "\n".join(lines) + "\n"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
