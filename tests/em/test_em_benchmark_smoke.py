"""``benchmarks/em_vs_numpy.py`` runs end to end at its smoke size (both implementations, agreeing)."""

import csv
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "em_vs_numpy.py"


def _load_benchmark():
    import importlib.util

    spec = importlib.util.spec_from_file_location("em_vs_numpy", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_smoke_run_writes_both_tables(tmp_path):
    completed = subprocess.run(
        [sys.executable, str(SCRIPT), "--out", str(tmp_path), "--smoke"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert completed.returncode == 0, completed.stderr
    with open(tmp_path / "em_vs_numpy.csv") as handle:
        rows = list(csv.DictReader(handle))
    assert [row["implementation"] for row in rows] == ["torch", "numpy"]
    for row in rows:
        assert float(row["seconds_median"]) > 0 and float(row["peak_rss_increase_mib"]) >= 0
    table = (tmp_path / "em_vs_numpy.md").read_text()
    assert "| implementation |" in table and "ratio numpy / torch" in table
    assert table in completed.stdout


@pytest.mark.parametrize("hops", [1, 2, 3])
def test_naive_numpy_reference_matches_chained_em(hops):
    """The benchmark's baseline is itself a correct EM iteration (so the speed-up compares like with like)."""
    from pyro_multihop import chain_task
    from pyro_multihop.em import ChainedEM

    benchmark = _load_benchmark()
    obs = chain_task(40, n_hops=hops, num_symbols=9, pairs=3, seed=2)
    em = ChainedEM(hops, 9, 9, sigma2=0.2, emission_smoothing=1e-3)
    model = em.m_step(em.random_stats(obs, seed=3, dtype=torch.float64))
    stats = em.e_step(model, obs)
    updated = em.m_step(stats)
    arrays = [getattr(obs, name).numpy() for name in ("keys", "values", "query", "target")]
    reference, key_tables, emission = benchmark.numpy_em_iteration(
        model.key_tables.detach().numpy(), model.emission.detach().numpy(), 0.2, *arrays, 1e-3
    )
    for name in ("key_numerators", "key_masses", "emission_counts"):
        np.testing.assert_allclose(getattr(stats, name).numpy(), reference[name], atol=1e-10)
    assert float(reference["loglik"]) == pytest.approx(stats.loglik, rel=1e-12)
    np.testing.assert_allclose(updated.key_tables.detach().numpy(), key_tables, atol=1e-10)
    np.testing.assert_allclose(updated.emission.detach().numpy(), emission, atol=1e-12)
