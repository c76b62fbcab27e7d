"""bAbI 1k (and 10k) with the structured-facts head: answer accuracy, supporting-fact selection, training time.

Every run is :func:`pyro_multihop.experiments.qa.run_babi_facts` (what ``pyro-multihop babi`` runs by default):
the stories as facts of fields (``datasets/babi_facts.py``), the head's own SVI defaults, trained on
question-answer pairs alone, the same settings for every task; hops = the task's number of supporting
facts. One thread per run, runs one after the other. After every run the tables ``{name}.csv`` and
``{name}.md`` under ``--out`` are rewritten (so an interrupted run leaves the finished rows), beside the
published numbers; each run's ``results.json``, ``predictions.jsonl``, figure and checkpoint go under
``--out/babi_facts_runs/`` (``--out/babi_runs/`` with ``--encoding positions``)::

    python benchmarks/babi.py --out benchmarks/results                                   # nine tasks, 1k
    python benchmarks/babi.py --out benchmarks/results --ten-k /work/shared/babi/en-10k  # + the 10k files
    python benchmarks/babi.py --smoke --out /tmp/babi                                    # tiny, for the tests
    python benchmarks/babi.py --data-dir /work/shared/babi/en --tasks $(seq 1 20) --name babi_facts_all --out benchmarks/results

``--data-dir`` reads the 1k files of a release's folder (every task 1-20; default: the nine shipped tasks); a
task outside :data:`TASK_HOPS` takes its hops from the data (the most supporting facts of a training question,
as ``pyro-multihop babi`` does).

``--update`` keeps the rows of the existing ``{name}.csv`` that this invocation does not rerun (marked "kept from an
earlier run" in the table, with the commit it was run on where the row records one), so that one expensive task can
be left as it was. Every row records ``code``, the commit of the library it ran on (:func:`code_version`).

``--seeds S [S ...]`` runs every task once a seed (``pyro-multihop babi --seed S``: the seed draws the held-out tenth
that chooses among a run's starts, the nine tenths that train, the perturbed starts and the mini-batches) and adds
``{name}_summary.md``: each task's mean, worst and best answer and supporting-fact accuracy over the seeds, which
start each seed kept, and the training time::

    python benchmarks/babi.py --data-dir /work/shared/babi/en --tasks 6 9 10 15 --seeds 0 1 2 3 4 --jobs 2 --name babi_seeds --out benchmarks/results

``--starts K`` gives every run ``K`` starts (the command's ``--starts``; its default otherwise), fitted one after
another in the run's process: the seeds table "with K starts" of the one-start tasks::

    python benchmarks/babi.py --data-dir /work/shared/babi/en --tasks 2 13 14 --seeds 0 1 2 3 4 --starts 2 --jobs 2 --name babi_seeds_starts2 --out benchmarks/results

``--encoding positions`` runs the chained head instead (``pyro_multihop.experiments.chained_babi.run_babi``, two
(key, value) positions a statement), the encoding of docs/babi.md's earlier tables.
"""

from __future__ import annotations

import argparse
import ast
import json
import subprocess
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Optional

import pandas as pd
import torch

from pyro_multihop.experiments.chained_babi import run_babi
from pyro_multihop.experiments.qa import run_babi_facts

HERE = Path(__file__).resolve().parent

#: Hops of each task: its number of supporting facts.
TASK_HOPS = {1: 1, 2: 2, 3: 3, 11: 2, 12: 1, 13: 2, 14: 2, 15: 2, 16: 3}
#: Tasks whose en-10k training file is shipped in /work/shared/babi/en-10k.
TEN_K_TASKS = (1, 2, 11, 12, 13, 14, 15, 16)
#: Published test accuracy (%), 1k, answers only: MemN2N 3-hop PE LS RN, the authors' code, single / joint
#: (100 minus the error rates rerun in vinhkhuc/MemN2N-babi-python's bechmarks/README.md), and the goals of
#: issues 20 and 34 (answer / supporting facts; the eleven later tasks: 95 / 90, the facts where every question
#: has the same number of supporting facts).
PUBLISHED = {
    1: ("99.9 / 100", ">= 99 / 99"),
    2: ("91.8 / 86.9", ">= 97 / 95"),
    3: ("58.2 / 76.6", ">= 91 / 85"),
    4: ("95.6 / 94.1", ">= 95 / 90"),
    5: ("86.3 / 87.1", ">= 95 / 90"),
    6: ("92.1 / 96.3", ">= 95 / 90"),
    7: ("79.7 / 77.1", ">= 95"),
    8: ("88.3 / 90.9", ">= 95"),
    9: ("86.4 / 97.3", ">= 95 / 90"),
    10: ("90.3 / 92.8", ">= 95 / 90"),
    11: ("99.3 / 99.2", ">= 99 / 95"),
    12: ("100 / 99.9", ">= 99 / 95"),
    13: ("99.7 / 99.9", ">= 99 / 95"),
    14: ("99.1 / 95.8", ">= 99 / 95"),
    15: ("100 / 100", ">= 99 / 95"),
    16: ("99.6 / 98.8", ">= 99 / 95"),
    17: ("49.0 / 56.4", ">= 95 / 90"),
    18: ("89.5 / 89.5", ">= 95 / 90"),
    19: ("18.6 / 13.3", ">= 95 / 90"),
    20: ("100 / 100", ">= 95 / 90"),
}


def code_version() -> Optional[str]:
    """The commit the library's code is at (``git rev-parse --short HEAD``), with ``+changes`` where a tracked file
    under ``pyro_multihop/`` differs from it; None outside a git checkout. Every row records it (``code``), so that
    a row kept by ``--update`` says which code it was run on."""
    def git(*args) -> str:
        return subprocess.run(["git", *args], cwd=HERE.parent, capture_output=True, text=True, check=True,
                              timeout=60).stdout.strip()
    try:
        head = git("rev-parse", "--short", "HEAD")
        changed = git("status", "--porcelain", "--untracked-files=no", "--", "pyro_multihop")
    except (OSError, subprocess.SubprocessError):
        return None
    return head + ("+changes" if changed else "")


def percent(value) -> str:
    return "-" if value is None else f"{100 * value:.1f}"


def per_hop(shares) -> str:
    return "-" if not shares else " / ".join(percent(share) for share in shares)


def kept_start(row: dict) -> str:
    """Which start a run kept (``results.json``'s ``starts``), or ``-`` for a run of one start."""
    kept = [record["start"] for record in row.get("starts") or () if record.get("kept")]
    return str(kept[0]) if kept else "-"


def spread(fractions: pd.Series):
    """``("mean / worst / best" in %, best - worst in points)``, or ``("-", None)`` where a run has no value."""
    values = 100 * fractions.astype(float)
    if values.isna().any():
        return "-", None
    return f"{values.mean():.1f} / {values.min():.1f} / {values.max():.1f}", values.max() - values.min()


def seed_summary(rows: list) -> list:
    """One line per ``(train_set, task, hops)`` over its seeds' rows: mean / worst / best answer and supporting-fact
    accuracy (%), the seeds, the start each kept, and the range of training seconds."""
    frame = pd.DataFrame(rows)
    lines = ["| task | training | hops | seeds | answer (%) mean / worst / best | supporting facts (%) mean / worst / best "
             "| best - worst (points) | kept start by seed | training (s) |",
             "|---|---|---:|---|---:|---:|---:|---|---:|"]
    for (train_set, task, hops), group in frame.groupby(["train_set", "task", "hops"], sort=True):
        group = group.sort_values("seed")
        answer, answer_range = spread(group["answer_accuracy"])
        facts, facts_range = spread(group["fact_accuracy"])
        widest = max(r for r in (answer_range, facts_range) if r is not None)
        kept = ", ".join(kept_start(row) for row in group.to_dict("records"))
        seeds = ", ".join(str(int(seed)) for seed in group["seed"])
        lines.append(f"| {task} | {train_set} | {hops} | {seeds} | {answer} | {facts} | {widest:.1f} | {kept} | "
                     f"{group['seconds'].min():.0f}-{group['seconds'].max():.0f} |")
    return lines


def write_tables(rows: list, out: Path, name: str, settings: str, seeds: bool = False,
                 code: Optional[str] = None) -> None:
    out.mkdir(parents=True, exist_ok=True)
    pd.DataFrame(rows).to_csv(out / f"{name}.csv", index=False)
    lines = [
        "| task | training | hops | seed | answer (%) | supporting facts (%) | per hop (%) | training (s) | kept start | MemN2N single / joint (answer %) | goal (answer / facts) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---|---:|---:|",
    ] if seeds else [
        "| task | training | hops | answer (%) | supporting facts (%) | per hop (%) | training (s) | MemN2N single / joint (answer %) | goal (answer / facts) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        memn2n, goal = PUBLISHED.get(row["task"], ("-", "-"))
        run_code = f", code {row['code']}" if isinstance(row.get("code"), str) else ""
        earlier = f" (kept from an earlier run{run_code})" if row.get("earlier_run") else ""
        seed = f" {row['seed']} |" if seeds else ""
        kept = f" {kept_start(row)} |" if seeds else ""
        lines.append(
            f"| {row['task']}{earlier} | {row['train_set']} | {row['hops']} |{seed} {percent(row['answer_accuracy'])} | "
            f"{percent(row['fact_accuracy'])} | {per_hop(row.get('hop_fact_accuracy'))} | {row['seconds']:.0f} |{kept} "
            f"{memn2n} | {goal} |"
        )
    (out / f"{name}.md").write_text(
        "# bAbI (test files, 1000 questions each)\n\n"
        f"`python benchmarks/babi.py`, {settings}; trained on answers alone, one thread, "
        f"{'one run a seed' if seeds else 'one seed (0)'}; "
        "training time in wall-clock seconds on a shared machine. Supporting facts: the question-only MAP hop "
        "path visits the annotated facts in order; per hop: the share whose hop l attends the l-th supporting "
        f"fact.{'' if code is None else f' Code: {code}.'}\n\n" + "\n".join(lines) + "\n"
    )
    if seeds:
        (out / f"{name}_summary.md").write_text(
            "# bAbI over seeds (test files, 1000 questions each)\n\n"
            f"`python benchmarks/babi.py --seeds ...`, {settings}; each task once a seed (the command's `--seed`), "
            "answer and supporting-fact accuracy as mean / worst / best over the seeds, the widest of the two "
            "ranges, the start each seed kept (`-`: a run of one start) and the training seconds.\n\n"
            + "\n".join(seed_summary(rows)) + "\n"
        )


def earlier_rows(path: Path, rerun: set) -> list:
    """The rows of the table at ``path`` whose ``(train_set, task)`` is not in ``rerun``, marked ``earlier_run``."""
    if not path.exists():
        return []
    rows = []
    for row in pd.read_csv(path).to_dict("records"):
        if (row["train_set"], row["task"]) in rerun:
            continue
        shares = row.get("hop_fact_accuracy")
        row["hop_fact_accuracy"] = ast.literal_eval(shares) if isinstance(shares, str) else None
        row["fact_accuracy"] = None if pd.isna(row.get("fact_accuracy")) else row["fact_accuracy"]
        rows.append({**row, "earlier_run": True})
    return rows


def one_run(encoding: str, task: int, hops, train_dir, runs_dir: Path, smoke: bool, data_dir=None,
            seed: Optional[int] = None, starts: Optional[int] = None, steps: Optional[int] = None) -> dict:
    """One task's run (in a worker process, one thread): its results with ``train_set``, ``seed`` and ``seconds``.
    ``seed``: the run's ``--seed`` (None: the command's default, 0), which also names its folder; ``starts``: the
    command's ``--starts`` (None: its default), fitted one after another in this process; ``steps``: the command's
    ``--steps`` (None: the head's ``svi_defaults``)."""
    torch.set_num_threads(1)
    run = run_babi_facts if encoding == "facts" else run_babi
    options = dict(steps=5, max_train=50) if smoke else {}
    if train_dir is not None and not smoke:
        options["batch_size"] = 1000  # the work of one full 1k batch per step
    started = time.perf_counter()
    run_name = f"task{task}" + ("" if hops is None else f"_L{hops}") + ("_10k" if train_dir else "")
    if data_dir is not None:
        options["data_dir"] = data_dir
    if seed is not None:
        options["seed"] = seed
        run_name += f"_seed{seed}"
    if starts is not None:
        options.update(starts=starts, processes=1)
    if steps is not None and not smoke:
        options["steps"] = steps
    result = run(task, runs_dir / run_name, train_dir=train_dir, n_hops=hops, overwrite=True, **options)
    seconds = result.get("seconds", result.get("train_seconds"))
    result.update({"train_set": "10k" if train_dir else "1k", "seed": 0 if seed is None else seed, "seconds": seconds,
                   "wall_seconds": time.perf_counter() - started})
    return result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--tasks", type=int, nargs="+", default=list(TASK_HOPS))
    parser.add_argument("--hops", type=int, nargs="+", default=None,
                        help="run every task with each of these hops (default: the task's supporting facts)")
    parser.add_argument("--ten-k", type=Path, default=None, help="an en-10k directory: also its tasks with 10k training")
    parser.add_argument("--ten-k-tasks", type=int, nargs="*", default=list(TEN_K_TASKS))
    parser.add_argument("--ten-k-only", action="store_true", help="only the 10k runs")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    parser.add_argument("--encoding", choices=["facts", "positions"], default="facts",
                        help="facts: the structured-facts head (default); positions: the chained head")
    parser.add_argument("--name", default=None, help="stem of the table files (default: babi_facts / babi)")
    parser.add_argument("--data-dir", type=Path, default=None,
                        help="a release's 1k folder (e.g. .../en), for tasks beyond the nine shipped (default: the shipped files)")
    parser.add_argument("--update", action="store_true",
                        help="keep the existing table's rows of the tasks not rerun here (marked in the table)")
    parser.add_argument("--jobs", type=int, default=1, help="runs at the same time, one process and thread each (default: 1)")
    parser.add_argument("--seeds", type=int, nargs="+", default=None,
                        help="run every task once a seed and add {name}_summary.md: mean / worst / best over the seeds")
    parser.add_argument("--starts", type=int, default=None,
                        help="every run fits this many starts (the command's --starts; default: the command's own)")
    parser.add_argument("--steps", type=int, default=None,
                        help="SVI steps of every run (the command's --steps; default: the head's svi_defaults)")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    runs = [] if args.ten_k_only else [(task, None) for task in args.tasks]
    if args.ten_k is not None:
        runs += [(task, args.ten_k) for task in args.ten_k_tasks]
    name = args.name or {"facts": "babi_facts", "positions": "babi"}[args.encoding]
    settings = {"facts": "FactAttention with its SVI defaults (FactAttention.svi_defaults)",
                "positions": "ChainedAttention(max_distance) with experiments.chained_babi.BABI_SVI"}[args.encoding]
    if args.smoke:
        settings += ", smoke: 5 steps, 50 questions"
    if args.starts is not None:
        settings += f", {args.starts} starts a run (--starts {args.starts})"
    if args.steps is not None:
        settings += f", {args.steps} steps (--steps {args.steps})"
    if args.seeds is not None and args.update:
        parser.error("--seeds writes a table of its own: give it a --name, not --update")
    jobs = [(args.encoding, task, hops, train_dir, args.out / f"{name}_runs", args.smoke, args.data_dir, seed,
             args.starts, args.steps)
            for task, train_dir in runs for hops in args.hops or [TASK_HOPS.get(task)] for seed in args.seeds or [None]]
    code = code_version()
    rows = earlier_rows(args.out / f"{name}.csv", {(("10k" if train_dir else "1k"), task) for task, train_dir in runs}) \
        if args.update else []
    with ProcessPoolExecutor(max_workers=max(1, args.jobs)) as pool:
        for future in as_completed([pool.submit(one_run, *job) for job in jobs]):
            result = dict(future.result(), code=code)
            print(json.dumps(result), flush=True)
            rows.append(result)
            rows.sort(key=lambda row: (row["train_set"], row["task"], row["hops"], row.get("seed", 0)))
            write_tables(rows, args.out, name, settings, seeds=args.seeds is not None, code=code)
    return 0


if __name__ == "__main__":
    sys.exit(main())
