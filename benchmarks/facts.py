"""Benchmark of the structured-facts head (``FactAttention``) against the chained head's dense route.

Two tables, written to ``OUT/facts.md`` (and ``facts_speed.csv``, ``facts_memory.csv``):

- **speed**: seconds per 1000 rows of the exact log-likelihood, forward alone (no gradient) and forward plus
  backward (one training step's work), for ``FactAttention`` (``F = 3`` fields, a 3-token question, every
  term on) and for ``ChainedAttention(max_distance=D)`` (the chained head whose gate has position terms, so
  the engine runs its dense route on the head's ``(c, N, N)`` factors) at the same ``N`` and ``L``, on one
  thread, the fastest of ``--repeats`` rotated rounds (each round times all four once); ``ratio`` = facts /
  chained.
- **memory**: the working memory (peak resident set minus the resident set before the query, minus the
  output) of ``log_likelihood`` and ``predict_proba`` without gradients under a 32 MiB budget, for growing
  ``n``, each ``n`` in a fresh subprocess (with ``MALLOC_TRIM_THRESHOLD_=0``, so that glibc returns freed
  chunks and the peak counts live memory): flat in ``n`` when the chunking works.

``python benchmarks/facts.py --out benchmarks/results`` (``--smoke``: tiny sizes, for the tests).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyro_multihop import ChainedAttention, FactAttention, FactObservations, Observations  # noqa: E402
from pyro_multihop.models.facts import PARAMETER_SHAPES  # noqa: E402

S, F, M = 50, 3, 3


def make_data(n: int, N: int, seed: int = 0) -> FactObservations:
    g = torch.Generator().manual_seed(seed)
    return FactObservations(torch.randint(S, (n, N, F), generator=g), torch.randint(S, (n, M), generator=g),
                            torch.randint(S, (n,), generator=g))


def make_heads(L: int, N: int):
    g = torch.Generator().manual_seed(0)
    facts = FactAttention(L, F, S, max_question_len=M, max_distance=N)
    with torch.no_grad():
        for name in PARAMETER_SHAPES:
            getattr(facts, name).copy_(0.3 * torch.randn(getattr(facts, name).shape, generator=g))
    chained = ChainedAttention(L, S, S, sigma2=0.5, seed=0, max_distance=N)
    with torch.no_grad():
        for parameter in (chained.age_slopes, chained.offset_slopes, chained.direction_logits):
            parameter.copy_(0.3 * torch.randn(parameter.shape, generator=g))
    return facts, chained


def as_chained(obs: FactObservations) -> Observations:
    """The chained head's view of the same rows: key = field 0, value = field 2, query = the first token."""
    return Observations(obs.facts[..., 0], obs.facts[..., 2], obs.question[:, 0], obs.target)


def best_times(functions: dict, repeats: int) -> dict:
    """``{name: fastest seconds}`` of each function, timed in ``repeats`` rotated rounds (one call of each per
    round, after one warm-up call each), so that a machine whose speed drifts slows every side alike."""
    for function in functions.values():
        function()
    best = {name: float("inf") for name in functions}
    for _ in range(repeats):
        for name, function in functions.items():
            start = time.perf_counter()
            function()
            best[name] = min(best[name], time.perf_counter() - start)
    return best


def speed_point(L: int, N: int, n: int, repeats: int) -> dict:
    facts_head, chained_head = make_heads(L, N)
    data = make_data(n, N)
    chained_data = as_chained(data)
    functions = {}
    for name, head, obs in (("facts", facts_head, data), ("chained", chained_head, chained_data)):
        def forward(head=head, obs=obs):
            with torch.no_grad():
                head.log_likelihood(obs)

        def training_step(head=head, obs=obs):
            head.zero_grad()
            head.log_likelihood(obs).sum().backward()

        functions[f"{name}_forward"], functions[f"{name}_train"] = forward, training_step
    best = best_times(functions, repeats)
    row = {"L": L, "N": N, "n": n, **{f"{name}_s_per_1k": 1000 * seconds / n for name, seconds in best.items()}}
    row["forward_ratio"] = row["facts_forward_s_per_1k"] / row["chained_forward_s_per_1k"]
    row["train_ratio"] = row["facts_train_s_per_1k"] / row["chained_train_s_per_1k"]
    return row


def _status_kib(field: str) -> int:
    """``VmRSS`` or ``VmHWM`` of this process, in KiB (Linux)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def _reset_peak() -> None:
    """Reset the kernel's peak resident set (``VmHWM``); where it cannot, the peak only over-reports."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        pass


def memory_point(L: int, N: int, n: int) -> dict:
    """In this process (run it in a fresh one): the working memory of two queries, in MiB: peak resident set
    minus the resident set before the query (data loaded, code warmed up on 16 rows) minus the output."""
    from pyro_multihop import memory_budget

    head, _ = make_heads(L, N)
    data = make_data(n, N)
    row = {"L": L, "N": N, "n": n}
    with memory_budget(32 * 2**20), torch.no_grad():
        for query in ("log_likelihood", "predict_proba"):
            getattr(head, query)(data[:16])
            before = _status_kib("VmRSS")
            _reset_peak()
            output = getattr(head, query)(data)
            peak = _status_kib("VmHWM")
            output_mib = output.numel() * output.element_size() / 2**20
            row[f"{query}_working_mib"] = (peak - before) / 1024 - output_mib
    return row


def _memory_in_subprocess(L: int, N: int, n: int) -> dict:
    code = f"import json, sys; sys.path.insert(0, {str(ROOT)!r}); sys.path.insert(0, {str(ROOT / 'benchmarks')!r}); " \
           f"import facts; print(json.dumps(facts.memory_point({L}, {N}, {n})))"
    # glibc keeps freed chunk memory above its trim threshold, so without this the peak grows with the number of
    # chunks for every head (the chained head's, measured the same way: 46 MiB at n = 5000, 103 MiB at 80 000).
    env = dict(os.environ, OMP_NUM_THREADS="1", MALLOC_TRIM_THRESHOLD_="0")
    completed = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
    return json.loads(completed.stdout.strip().splitlines()[-1])


def markdown(frame: pd.DataFrame, digits: int = 3) -> list:
    lines = ["| " + " | ".join(frame.columns) + " |", "|" + "---:|" * len(frame.columns)]
    for _, row in frame.iterrows():
        cells = [f"{v:.{digits}g}" if isinstance(v, float) else str(v) for v in row]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes (seconds), for the tests")
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.smoke:
        speed_grid, memory_grid, repeats = [(2, 6, 50)], [(2, 6, 200), (2, 6, 400)], 1
    else:
        speed_grid = [(L, N, 4000 // N * 10) for L in (2, 3) for N in (10, 30, 100)]
        memory_grid = [(2, 30, n) for n in (5_000, 20_000, 80_000)]
        repeats = args.repeats
    speed = pd.DataFrame([speed_point(L, N, n, repeats) for L, N, n in speed_grid])
    # A fresh process a point, so that one point's peak does not hide the next (smoke: in this one, for speed).
    measure = memory_point if args.smoke else _memory_in_subprocess
    memory = pd.DataFrame([measure(L, N, n) for L, N, n in memory_grid])
    args.out.mkdir(parents=True, exist_ok=True)
    speed.to_csv(args.out / "facts_speed.csv", index=False)
    memory.to_csv(args.out / "facts_memory.csv", index=False)
    load = os.getloadavg()[0]
    lines = [
        "# FactAttention against the chained head's dense route",
        "",
        f"`python benchmarks/facts.py --out benchmarks/results{' --smoke' if args.smoke else ''}`; one thread, "
        f"fastest of {repeats} rotated rounds; S = {S}, F = {F} fields, M = {M} question tokens; load average {load:.1f} at the end.",
        "",
        "Seconds per 1000 rows of the exact log-likelihood (forward; forward + backward):",
        "",
        *markdown(speed),
        "",
        "Working memory (MiB: peak resident set beyond the data and the output) under a 32 MiB budget:",
        "",
        *markdown(memory),
        "",
    ]
    (args.out / "facts.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
