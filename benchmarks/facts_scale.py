"""How the structured-facts head scales with the vocabulary ``S``: the embedded head (``embed_dim=D``) at growing ``S``,
the table head at the smallest for comparison.

For each point, in a fresh subprocess (one thread, float32): the number of parameters, seconds per SVI step (the
collapsed loss of ``n`` rows and its backward), seconds per row of ``hop_marginals``, the peak resident memory of the
process (``ru_maxrss``, after importing torch and building the data) and the size of the checkpoint
(``save_checkpoint``). Each column's slope in ``S`` is the least-squares slope of ``log(value)`` on ``log(S)`` over the
embedded points. Random facts (``n`` rows of ``N`` facts of ``F`` fields, questions of 3 tokens) over ``S`` symbols.
Writes ``OUT/facts_scale.md`` and ``.csv``.

``python benchmarks/facts_scale.py --out benchmarks/results`` (``--smoke``: small sizes).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def measure(S: int, embed_dim, n: int, N: int, F: int, L: int, steps: int) -> dict:
    """One point, in this process (run by the subprocess)."""
    import resource
    import time

    import torch

    sys.path.insert(0, str(ROOT))
    from pyro_multihop import FactAttention, FactObservations
    from pyro_multihop.checkpoint import save_checkpoint
    from pyro_multihop.models.facts import parameter_elements

    torch.set_num_threads(1)
    g = torch.Generator().manual_seed(0)
    facts = torch.randint(S, (n, N, F), generator=g)
    question = torch.randint(S, (n, 3), generator=g)
    target = facts[torch.arange(n), torch.randint(N, (n,), generator=g), 2]
    obs = FactObservations(facts, question, target)
    warm = FactAttention(L, F, 10, max_question_len=3, embed_dim=embed_dim)  # torch's lazy start-up, before the base
    warm.log_likelihood(FactObservations(facts[:2] % 10, question[:2] % 10, target[:2] % 10)).sum().backward()
    base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    head = FactAttention(L, F, S, max_question_len=3, embed_dim=embed_dim)
    optimizer = torch.optim.Adam(head.parameters(), lr=0.01)
    times = []
    for _ in range(steps + 1):  # the first step warms up
        start = time.perf_counter()
        optimizer.zero_grad()
        (-head.log_likelihood(obs).sum()).backward()
        optimizer.step()
        times.append(time.perf_counter() - start)
    start = time.perf_counter()
    head.hop_marginals(obs)
    marginal_seconds = (time.perf_counter() - start) / n
    with tempfile.TemporaryDirectory() as folder:
        size = save_checkpoint(Path(folder) / "head.pt", head).stat().st_size
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"head": "tables" if embed_dim is None else f"embedded D={embed_dim}", "S": S,
            "parameters": sum(parameter_elements(L, F, S, 3, embed_dim).values()),
            "step_seconds": min(times[1:]), "marginal_seconds_per_row": marginal_seconds,
            "peak_mib": (peak - base) / 1024, "checkpoint_mib": size / 2**20}


def slope(points, column) -> float:
    import math

    xs = [math.log(p["S"]) for p in points]
    ys = [math.log(max(p[column], 1e-12)) for p in points]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--point", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.point:
        print(json.dumps(measure(**json.loads(args.point))))
        return
    n, N, F, L, D = (20, 5, 3, 2, 8) if args.smoke else (50, 20, 3, 2, 32)
    sizes = [100, 1000] if args.smoke else [1000, 10_000, 100_000, 1_000_000]
    settings = [(sizes[0], None)] + [(S, D) for S in sizes]
    rows = []
    for S, embed_dim in settings:
        point = {"S": S, "embed_dim": embed_dim, "n": n, "N": N, "F": F, "L": L, "steps": 1}
        env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
        done = subprocess.run([sys.executable, __file__, "--point", json.dumps(point)], capture_output=True, text=True,
                              env=env, check=True)
        rows.append(json.loads(done.stdout.strip().splitlines()[-1]))
        print(rows[-1], flush=True)
    import pandas as pd

    table = pd.DataFrame(rows)
    embedded = [r for r in rows if r["head"] != "tables"]
    columns = ["parameters", "step_seconds", "marginal_seconds_per_row", "peak_mib", "checkpoint_mib"]
    slopes = {"head": f"slope in S (log-log, embedded, S = {embedded[0]['S']}..{embedded[-1]['S']})", "S": None,
              **{c: round(slope(embedded, c), 2) for c in columns}}
    table = pd.concat([table, pd.DataFrame([slopes])], ignore_index=True)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "facts_scale.csv", index=False)
    text = (f"# Facts head: scaling with the vocabulary S\n\n`python benchmarks/facts_scale.py` (n = {n} rows, N = {N} "
            f"facts, F = {F} fields, L = {L} hops, D = {D}; one thread, float32; each point in its own process).\n"
            "Seconds per SVI step: the collapsed loss of all n rows and its backward and an Adam step (the second step; the first warms up). "
            "peak_mib: the growth of the process's peak resident memory from before the head is built. "
            "The last row: each column's least-squares slope of log(value) on log(S) over the embedded points.\n\n"
            + table.to_markdown(index=False, floatfmt=".4g") + "\n")
    (args.out / "facts_scale.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
