"""The chained-loss benchmark runs end to end at smoke size and writes its table."""

import subprocess
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parent.parent


def test_chained_loss_benchmark_smoke(tmp_path):
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "chained_loss.py"), "--smoke", "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    table = pd.read_csv(tmp_path / "chained_loss.csv")
    assert list(table[["L", "N", "n"]].iloc[0]) == [2, 6, 50]
    assert (table[["pyro_ms", "pyro_jit_ms", "fused_ms"]] > 0).all().all()
    assert "| L | N | n |" in (tmp_path / "chained_loss.md").read_text()


def test_pyro_overhead_benchmark_smoke(tmp_path):
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "pyro_overhead.py"), "--smoke", "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    table = (tmp_path / "pyro_overhead.md").read_text()
    for row in ("Pyro, library model", "Pyro, minimal model", "fused", "aten::bmm"):
        assert row in table


def test_threads_benchmark_smoke(tmp_path):
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "threads.py"), "--smoke", "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    table = (tmp_path / "threads.md").read_text()
    for row in ("| train svi |", "| train em |", "| train em (tied) |", "| evaluate |", "| predict |", "| simulate |"):
        assert row in table
    frame = pd.read_csv(tmp_path / "threads.csv")
    assert sorted(set(frame["threads"])) == [1, 2] and (frame["ms"] > 0).all()
