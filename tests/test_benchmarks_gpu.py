"""benchmarks/gpu.py's CPU-side logic: the whole comparison with the CPU standing in for the device, the
comparison functions on results that differ, and the clean skip without CUDA."""

import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "benchmarks"))
import gpu  # noqa: E402  (benchmarks/gpu.py)


def test_cpu_against_cpu_at_smoke_size_writes_a_table_of_zero_differences(tmp_path):
    assert gpu.main(["--smoke", "--device", "cpu", "--out", str(tmp_path)]) == 0
    table = pd.read_csv(tmp_path / "gpu.csv")
    assert list(table["workload"]) == list(gpu.WORKLOADS)
    assert table["ok"].all()
    compared = table[table["workload"] != "sample_paths"]
    assert (compared["relative_difference"] == 0).all()
    assert (table["device_seconds"] > 0).all() and (table["cpu_check_seconds"] > 0).all()
    assert table.set_index("workload").loc["enumerated_loss", "rows_timed"] == gpu.SMOKE["enumerated_rows"]
    assert table.set_index("workload").loc["log_likelihood", "rows_timed"] == gpu.SMOKE["n"]
    text = (tmp_path / "gpu.md").read_text()
    assert "CPU standing in for the device" in text and "| `svi_steps` |" in text


def test_comparison_flags_numbers_and_paths_beyond_the_limits():
    want = torch.linspace(-3.0, -1.0, 50)
    assert gpu.relative_difference(want.clone(), want) == 0.0
    assert gpu.relative_difference(want * (1 + 1e-4), want) == pytest.approx(1e-4, rel=1e-3)
    assert gpu.relative_difference(want[:-1], want) == float("inf")
    with_inf = torch.tensor([0.0, -float("inf")])
    assert gpu.relative_difference(with_inf.clone(), with_inf) == 0.0
    assert gpu.relative_difference(torch.tensor([0.0, float("inf")]), with_inf) == float("inf")
    close = gpu.compare("log_likelihood", {"values": want}, {"values": want * (1 + 2e-6)}, 4)
    far = gpu.compare("log_likelihood", {"values": want}, {"values": want * (1 + 2e-5)}, 4)
    assert close["ok"] and not far["ok"]
    paths = torch.zeros(2000, 3, dtype=torch.long)
    moved = paths.clone()
    moved[:10, 0] = 1  # 0.5% of the rows
    result = gpu.compare("map_paths", {"paths": paths}, {"paths": moved}, 4)
    assert result["differing_rows"] == pytest.approx(0.005) and not result["ok"]
    draws = torch.zeros(2, 5, 3, dtype=torch.long)
    assert gpu.compare("sample_paths", {"draws": draws}, {"draws": draws + 3}, 4)["ok"]
    assert not gpu.compare("sample_paths", {"draws": draws}, {"draws": draws + 4}, 4)["ok"]


def test_a_missed_comparison_fails_the_run_after_writing_the_table(tmp_path, monkeypatch, capsys):
    real = gpu.run_workload

    calls = []

    def perturbed(name, head, obs, svi_steps=20):
        result = real(name, head, obs, svi_steps)
        calls.append(name)
        if name == "path_entropy" and calls.count(name) == 2:  # the device's run on the check rows
            result = {"values": result["values"] * 1.001}
        return result

    monkeypatch.setattr(gpu, "WORKLOADS", ("log_likelihood", "path_entropy"))
    monkeypatch.setattr(gpu, "run_workload", perturbed)
    assert gpu.main(["--smoke", "--device", "cpu", "--out", str(tmp_path)]) == 1
    assert "path_entropy" in capsys.readouterr().out.splitlines()[-1]
    table = pd.read_csv(tmp_path / "gpu.csv")
    assert list(table["ok"]) == [True, False]


def test_without_cuda_it_skips_with_one_line_and_exit_code_0(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu.main(["--out", str(tmp_path / "results")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "skipped" in lines[0] and "CUDA" in lines[0]
    assert not (tmp_path / "results").exists()
