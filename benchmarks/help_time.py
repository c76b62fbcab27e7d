"""How long ``pyro-multihop --help`` takes in a fresh interpreter, and what it imports (issue 19: under 1 s).

    python benchmarks/help_time.py --out benchmarks/results      # writes help_time.md

Each run is a new ``python -m pyro_multihop --help`` subprocess (the import cost is the whole story); the
table gives the median of ``--repeats`` runs and whether torch was imported.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

PROBE = "import sys, runpy; sys.argv = ['pyro-multihop', '--help']\n" \
        "try:\n    runpy.run_module('pyro_multihop', run_name='__main__')\nexcept SystemExit:\n    pass\n" \
        "print('TORCH_LOADED', 'torch' in sys.modules, file=sys.stderr)"


def measure(repeats: int) -> dict:
    seconds, torch_loaded = [], None
    for _ in range(repeats):
        started = time.perf_counter()
        result = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=ROOT)
        seconds.append(time.perf_counter() - started)
        torch_loaded = "TORCH_LOADED True" in result.stderr
        if not result.stdout.startswith("usage: pyro-multihop"):
            raise SystemExit(f"--help failed: {result.stderr[-500:]}")
    return {"median_s": statistics.median(seconds), "max_s": max(seconds), "torch_loaded": torch_loaded}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=None, help="folder for help_time.md (default: print only)")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    result = measure(args.repeats)
    text = ("# `pyro-multihop --help` in a fresh interpreter\n\n"
            f"`python benchmarks/help_time.py`, {args.repeats} runs.\n\n"
            "| median (s) | slowest (s) | torch imported |\n|---:|---:|---|\n"
            f"| {result['median_s']:.2f} | {result['max_s']:.2f} | {result['torch_loaded']} |\n")
    print(text)
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        (args.out / "help_time.md").write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
