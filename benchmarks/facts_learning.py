"""SVI learns the generating structure of ``fact_chain_task``: held-out accuracy on entities training never showed.

Trains ``FactAttention(2, 3, S, max_question_len=3)`` from zero parameters by ``fit_svi`` with the head's
``svi_defaults()`` (nothing tuned here) on 2000 rows, enumerated (``TraceEnum_ELBO``) and collapsed
(``CollapsedHopChain``), and with symbol embeddings (``embed_dim=16``, collapsed), and compares the held-out accuracy on 1000 rows of unseen entities with that of the
generating structure (``fact_chain_truth``). Writes ``OUT/facts_learning.md`` and ``.csv``.

``python benchmarks/facts_learning.py --out benchmarks/results`` (``--smoke``: 200 rows, 20 steps).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyro_multihop import FactAttention, fact_chain_task, fact_chain_truth, fit_svi  # noqa: E402


#: The symbol embeddings' dimension of the ``embedded`` route (the collapsed model, the head's defaults).
EMBED_DIM = 16


def run(n_train: int, n_test: int, num_steps, routes) -> list:
    train = fact_chain_task(n_train, seed=0)
    test = fact_chain_task(n_test, entities="test", seed=1)
    truth = fact_chain_truth()
    expected = truth.evaluate(test)
    rows = []
    for route in routes:
        collapsed = route != "enumerated"
        embed_dim = EMBED_DIM if route == "embedded" else None
        head = FactAttention(2, 3, truth.num_symbols, max_question_len=3, embed_dim=embed_dim)
        start = time.perf_counter()
        metrics = fit_svi(head, train, collapsed=collapsed, num_steps=num_steps, progress=False, seed=0)
        seconds = time.perf_counter() - start
        scores = head.evaluate(test)
        rows.append({
            "route": route if embed_dim is None else f"collapsed, embed_dim={embed_dim}",
            "n_train": n_train,
            "steps": int(metrics["step"].iloc[-1]),
            "train_log_likelihood": -metrics.attrs["final_loss"],
            "test_accuracy": scores["accuracy"],
            "truth_test_accuracy": expected["accuracy"],
            "gap": expected["accuracy"] - scores["accuracy"],
            "test_log_likelihood": scores["log_likelihood"],
            "seconds": seconds,
        })
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--routes", default="collapsed,enumerated,embedded")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    routes = args.routes.split(",")
    rows = run(200, 100, 20, routes) if args.smoke else run(2000, 1000, None, routes)
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / "facts_learning.csv", index=False)
    header = "| " + " | ".join(frame.columns) + " |"
    lines = [
        "# FactAttention learns fact_chain_task by SVI",
        "",
        f"`python benchmarks/facts_learning.py --out benchmarks/results{' --smoke' if args.smoke else ''}`; "
        f"one thread, load average {os.getloadavg()[0]:.1f} at the end. Test rows hold only entities that "
        "training never showed; `gap` = the generating structure's accuracy minus the learnt head's.",
        "",
        header,
        "|" + "---|" * len(frame.columns),
        *("| " + " | ".join(f"{v:.4g}" if isinstance(v, float) else str(v) for v in row) + " |" for _, row in frame.iterrows()),
        "",
    ]
    (args.out / "facts_learning.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
