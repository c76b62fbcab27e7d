"""Run every benchmark and write its tables under ``--out`` (``make bench``).

Each benchmark is its own script with ``--out`` and ``--smoke``; this runs them one after the other in
subprocesses and prints where each table went.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
BENCHMARKS = [
    "chained_loss.py", "pyro_overhead.py", "em_vs_numpy.py", "svi_stability.py", "engine.py", "distributed.py", "threads.py",
    "facts.py", "facts_learning.py",
]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=HERE / "results")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes, for the test suite")
    parser.add_argument("--only", nargs="*", default=None, help="run only these scripts")
    args = parser.parse_args(argv)
    failures = 0
    for script in args.only or BENCHMARKS:
        command = [sys.executable, str(HERE / script), "--out", str(args.out)] + (["--smoke"] if args.smoke else [])
        print(f"== {script}", flush=True)
        failures += subprocess.run(command).returncode != 0
    print(f"tables in {args.out}")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
