"""A simulated knowledge base of 50,000 entities through ``pyro-multihop qa`` on one core: time, peak memory,
checkpoint size and accuracy on questions whose entities training never saw.

For each hop count (2 and 3) it writes 2,000 training and 500 test questions of up to 40 facts
(:func:`~pyro_multihop.datasets.knowledge_base.knowledge_base_task`; the test questions ask about the part of the
knowledge base that no training question touches), runs the command as a user would, in its own process::

    pyro-multihop qa --train train.jsonl --test test.jsonl --hops L --out run --embed-dim D --collapsed --threads 1

and reads ``results.json``. ``seconds`` is the command's wall time (reading, training, evaluating, writing,
drawing), ``peak_mib`` the process's peak resident memory (``getrusage`` of the finished child), ``symbols`` the
vocabulary the head holds, ``embedded_symbols`` those of at least ``--embed-min-count`` training questions, which
own a row of the embedding. Writes ``OUT/knowledge_base.md`` and ``.csv`` (``--embed-min-count K``:
``knowledge_base_min_count_K``).

``python benchmarks/knowledge_base.py --out benchmarks/results`` (``--smoke``: 2,000 entities, 200 questions,
20 steps).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from pyro_multihop.datasets.knowledge_base import knowledge_base_task  # noqa: E402
from pyro_multihop.datasets.qa_jsonl import QAVocabulary, write_qa_jsonl  # noqa: E402


def run_point(n_hops: int, num_entities: int, n_train: int, n_test: int, embed_dim: int, work: Path,
              steps=None, embed_min_count=None) -> dict:
    train = knowledge_base_task(n_train, n_hops=n_hops, num_entities=num_entities, seed=0)
    test = knowledge_base_task(n_test, n_hops=n_hops, num_entities=num_entities, entities="test", seed=1)
    folder = work / f"L{n_hops}"
    write_qa_jsonl(train, folder / "train.jsonl")
    write_qa_jsonl(test, folder / "test.jsonl")
    command = [sys.executable, "-m", "pyro_multihop", "qa", "--train", str(folder / "train.jsonl"),
               "--test", str(folder / "test.jsonl"), "--hops", str(n_hops), "--out", str(folder / "run"),
               "--embed-dim", str(embed_dim), "--collapsed", "--threads", "1", "--no-progress", "--overwrite"]
    command += [] if steps is None else ["--steps", str(steps)]
    command += [] if embed_min_count is None else ["--embed-min-count", str(embed_min_count)]
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    start = time.perf_counter()
    finished = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.perf_counter() - start
    if finished.returncode:
        raise RuntimeError(f"{' '.join(command)} failed:\n{finished.stderr[-2000:]}")
    peak_kib = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    results = json.loads((folder / "run" / "results.json").read_text())
    return {
        "hops": n_hops,
        "entities": num_entities,
        "symbols": QAVocabulary.build(train).num_symbols,
        "n_train": n_train,
        "n_test": n_test,
        "embed_dim": embed_dim,
        "embedded_symbols": results["embedded_symbols"],
        "answer_accuracy": results["answer_accuracy"],
        "path_accuracy": results["fact_accuracy"],
        "seconds": round(seconds, 1),
        "peak_mib": round(max(peak_kib, before) / 1024, 1),  # ru_maxrss: the largest child so far, in KiB
        "checkpoint_mib": round((folder / "run" / "checkpoint.pt").stat().st_size / 2**20, 2),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "benchmarks" / "results")
    parser.add_argument("--hops", default="2,3")
    parser.add_argument("--embed-dim", type=int, default=32)
    parser.add_argument("--entities", type=int, default=50_000,
                        help="entities of the knowledge base (default 50,000; another number writes "
                             "knowledge_base_<N>.md and .csv)")
    parser.add_argument("--embed-min-count", type=int, default=None,
                        help="the command's --embed-min-count (default: its default; 1 embeds every symbol)")
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    sizes = dict(num_entities=2000, n_train=200, n_test=100, steps=20) if args.smoke else \
        dict(num_entities=args.entities, n_train=2000, n_test=500)
    other_size = not args.smoke and args.entities != 50_000
    stem = f"knowledge_base_{args.entities}" if other_size else "knowledge_base"
    stem += "" if args.embed_min_count is None else f"_min_count_{args.embed_min_count}"
    rows = []
    with tempfile.TemporaryDirectory() as work:
        for n_hops in (int(h) for h in args.hops.split(",")):
            rows.append(run_point(n_hops, embed_dim=args.embed_dim, work=Path(work),
                                  embed_min_count=args.embed_min_count, **sizes))
            print(rows[-1], flush=True)
    frame = pd.DataFrame(rows)
    args.out.mkdir(parents=True, exist_ok=True)
    frame.to_csv(args.out / f"{stem}.csv", index=False)
    lines = [
        f"# A knowledge base of {sizes['num_entities']:,} entities through `pyro-multihop qa` on one core",
        "",
        f"`python benchmarks/knowledge_base.py{' --smoke' if args.smoke else ''}"
        f"{f' --entities {args.entities}' if other_size else ''}"
        f"{'' if args.embed_min_count is None else f' --embed-min-count {args.embed_min_count}'}`: the command with "
        f"`--embed-dim {args.embed_dim} --collapsed --threads 1` and its defaults otherwise, each run in its own "
        "process; test questions hold only entities that no training question holds. `seconds`: the command's wall time "
        "(training, evaluation, outputs); `peak_mib`: its peak resident memory; `symbols`: the head's vocabulary "
        f"(the training file's tokens and copy slots), `embedded_symbols` those that own a row of the embedding (the symbols of "
        f"at least `--embed-min-count` training questions). Load average {os.getloadavg()[0]:.1f} at the end.",
        "",
        frame.to_markdown(index=False),
        "",
    ]
    (args.out / f"{stem}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
