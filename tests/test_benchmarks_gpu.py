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
    assert (compared["relative_difference"] == 0).all() and (compared["float64_relative_difference"] == 0).all()
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


@pytest.mark.parametrize("perturbed_call, factor", [(4, 1.001), (3, 1 + 1e-8)])
def test_a_missed_comparison_fails_the_run_after_writing_the_table(tmp_path, monkeypatch, capsys, perturbed_call,
                                                                   factor):
    """Each workload runs on the check rows as CPU float32, CPU float64, device float64, device float32: the
    device's float32 off by 1e-3, or its float64 off by 1e-8, fails the comparison."""
    real = gpu.run_workload
    calls = []

    def perturbed(name, head, obs, svi_steps=20):
        result = real(name, head, obs, svi_steps)
        calls.append(name)
        if name == "path_entropy" and calls.count(name) == perturbed_call:
            result = {"values": result["values"] * factor}
        return result

    monkeypatch.setattr(gpu, "WORKLOADS", ("log_likelihood", "path_entropy"))
    monkeypatch.setattr(gpu, "run_workload", perturbed)
    assert gpu.main(["--smoke", "--device", "cpu", "--out", str(tmp_path)]) == 1
    assert "path_entropy" in capsys.readouterr().out.splitlines()[-1]
    table = pd.read_csv(tmp_path / "gpu.csv")
    assert list(table["ok"]) == [True, False]


def test_path_scores_equal_brute_force_joints():
    """gpu.path_log_joints (used to tell tied paths) against the test oracle's enumeration of every path."""
    from tests import factories, oracle

    head = gpu.make_head(5).double()
    obs = factories.random_observations(6, 5, 5, 4, seed=3, masked=True)
    tables = oracle.enumerate_paths(*oracle.onehot_vectors(head.key_tables, obs), head.sigma2,
                                    head.emission.detach().double(), obs.values, obs.target, obs.mask)
    for row, table in enumerate(tables):
        paths = torch.tensor(list(table)).unsqueeze(0)  # (1, paths, L)
        want = torch.tensor([joint for _, joint in table.values()], dtype=torch.float64).log()
        got = gpu.path_log_joints(head, obs[row:row + 1], paths)[0]
        assert torch.allclose(got, want, rtol=1e-12, atol=0)


def test_paths_may_differ_between_ties_only():
    """Positions 0 and 1 carry the same (key, value) symbols: paths through either are tied exactly."""
    from pyro_multihop import Observations

    head = gpu.make_head(6).double()
    n = 10
    keys = torch.tensor([[2, 2, 3, 4]]).repeat(n, 1)
    values = torch.tensor([[1, 1, 5, 0]]).repeat(n, 1)
    obs = Observations(keys, values, torch.full((n,), 2), torch.zeros(n, dtype=torch.long))
    want = torch.tensor([[0, 2, 3]]).repeat(n, 1)
    tied, untied = want.clone(), want.clone()
    tied[:3, 0] = 1
    untied[:3, 0] = 2
    differing, not_tied = gpu.path_differences(tied, want, head, obs)
    assert differing == pytest.approx(0.3) and not_tied == 0.0
    assert gpu.compare("map_paths", {"paths": want}, {"paths": tied}, 4, head, obs)["ok"]
    differing, not_tied = gpu.path_differences(untied, want, head, obs)
    assert differing == pytest.approx(0.3) and not_tied == pytest.approx(0.3)
    assert not gpu.compare("map_paths", {"paths": want}, {"paths": untied}, 4, head, obs)["ok"]
    repeated = torch.stack([want, want], 1)  # (n, 2, L): the same path twice is no list of k best
    assert not gpu.compare("k_best_paths", {"paths": torch.stack([want, tied], 1)}, {"paths": repeated}, 4, head, obs)["ok"]


def test_float32_may_be_as_far_from_float64_as_the_cpus_own_float32():
    exact = {"values": torch.linspace(1.0, 2.0, 20, dtype=torch.float64)}

    def results(cpu32, device32, device64=1.0):
        return {("cpu", "float64"): exact, ("device", "float64"): {"values": exact["values"] * device64},
                ("cpu", "float32"): {"values": exact["values"] * cpu32},
                ("device", "float32"): {"values": exact["values"] * device32}}

    assert gpu.compare_precisions("log_likelihood", results(1 + 3e-5, 1 - 3e-5), 4, None, None)["ok"]
    row = gpu.compare_precisions("log_likelihood", results(1 + 3e-5, 1 + 2e-4), 4, None, None)
    assert not row["ok"] and row["cpu_float32_error"] == pytest.approx(3e-5, rel=1e-6)
    assert gpu.compare_precisions("log_likelihood", results(1 + 1e-7, 1 - 1e-7), 4, None, None)["ok"]
    assert not gpu.compare_precisions("log_likelihood", results(1 + 1e-7, 1 - 1e-7, 1 + 1e-8), 4, None, None)["ok"]


def test_without_cuda_it_skips_with_one_line_and_exit_code_0(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert gpu.main(["--out", str(tmp_path / "results")]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 and "skipped" in lines[0] and "CUDA" in lines[0]
    assert not (tmp_path / "results").exists()


def test_the_rounding_rule_does_not_excuse_repeated_k_best_paths():
    """A float32 difference within the CPU's own rounding passes only while the k best paths are distinct.
    Positions 0 and 1 carry the same symbols, so the repeated path is tied with the one it replaces."""
    from pyro_multihop import Observations

    head = gpu.make_head(6).double()
    n = 4
    obs = Observations(torch.tensor([[2, 2, 3, 4]]).repeat(n, 1), torch.tensor([[1, 1, 5, 0]]).repeat(n, 1),
                       torch.full((n,), 2), torch.zeros(n, dtype=torch.long))
    paths = torch.tensor([[[0, 2, 3], [1, 2, 3]]]).repeat(n, 1, 1)  # (n, k, L): two tied, distinct paths
    repeated = torch.tensor([[[0, 2, 3], [0, 2, 3]]]).repeat(n, 1, 1)
    log_probs = torch.tensor([[-1.0, -1.0]], dtype=torch.float64).repeat(n, 1)

    def results(device_paths):
        exact = {"paths": paths, "log_probs": log_probs}
        return {("cpu", "float64"): exact, ("device", "float64"): exact,
                ("cpu", "float32"): {"paths": paths, "log_probs": log_probs * (1 + 3e-5)},
                ("device", "float32"): {"paths": device_paths, "log_probs": log_probs * (1 - 3e-5)}}

    assert gpu.compare_precisions("k_best_paths", results(paths), 5, head, obs)["ok"]
    row = gpu.compare_precisions("k_best_paths", results(repeated), 5, head, obs)
    assert row["untied_rows"] == 0.0 and not row["ok"]
