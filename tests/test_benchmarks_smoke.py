"""The chained-loss benchmark runs end to end at smoke size and writes its table."""

import importlib.util
import json
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


def test_distributed_benchmark_smoke(tmp_path):
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "distributed.py"), "--smoke", "--out", str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    table = pd.read_csv(tmp_path / "distributed.csv")
    assert table[["method", "processes"]].values.tolist() == [
        ["EM iteration", 1], ["EM iteration", 2], ["SVI step", 1], ["SVI step", 2],
        ["SVI step, collapsed", 1], ["SVI step, collapsed", 2],
    ]
    assert table["rows_per_process"].tolist() == [400, 200, 400, 200, 400, 200]  # each process holds its shard only
    assert (table[["seconds", "peak_rss_mib_per_process"]] > 0).all().all()
    assert "All-reduce alone" in (tmp_path / "distributed.md").read_text()


def test_engine_benchmark_smoke(tmp_path):
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "engine.py"), "--smoke", "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    paths = pd.read_csv(tmp_path / "engine_paths.csv")
    assert set(paths["query"]) == {"hop_marginals", "map_paths", "k_best_paths(5)", "sample_paths(10)", "path_entropy",
                                   "posterior() + reads"} and (paths["us_per_row"] > 0).all()
    speed = pd.read_csv(tmp_path / "engine_speed.csv")
    assert set(speed["route"]) == {"symbols", "positions"}
    assert (speed[["log_likelihood_ms", "predict_proba_ms", "e_step_ms", "collapsed_ms", "enumerated_ms"]] > 0).all().all()
    memory = pd.read_csv(tmp_path / "engine_memory.csv")
    assert list(memory["query"]) == ["log_likelihood", "predict_proba", "hop_marginals", "value_marginals", "e_step",
                                     "map_paths", "sample_paths", "path_entropy", "k_best_paths", "posterior"]
    assert set(memory["route"]) <= {"symbols", "positions"}
    measured = memory[memory["status"] == "ok"]
    assert len(measured) == len(memory)
    assert (measured["seconds"] > 0).all() and (measured["peak_mib"] >= measured["rss_after_load_mib"]).all()
    scaling = pd.read_csv(tmp_path / "engine_scaling.csv")
    assert set(scaling["axis"]) == {"n", "N", "S"} and set(scaling["query"]) == {"log_likelihood", "e_step"}
    assert "Log-log slopes" in (tmp_path / "engine_scaling.md").read_text()
    peer = (tmp_path / "engine_peer.md").read_text()
    assert "torch-struct" in peer
    hmm = pd.read_csv(tmp_path / "engine_hmm.csv")
    assert list(hmm["N"]) == [6, 4] and (hmm[["build_ms", "hmm_forward_ms", "library_forward_ms", "hmm_loss_ms",
                                               "library_loss_ms", "parameter_reads_ms"]] > 0).all().all()
    assert (hmm["max_row_rel_difference"] <= 1e-5).all() and (hmm["grad_rel_difference"] <= 1e-3).all()
    hmm_memory = pd.read_csv(tmp_path / "engine_hmm_memory.csv")
    assert list(hmm_memory["implementation"]) == ["DiscreteHMM", "library"] and (hmm_memory["peak_mib"] > 0).all()
    assert "forward ratio, with build" in (tmp_path / "engine_hmm.md").read_text()
    sharp = pd.read_csv(tmp_path / "engine_sharp.csv")
    assert sorted(sharp["sigma2"]) == [1e-3, 0.3]
    # the sharp gate underflows on the symbol route at these sizes, and its rows are retried on the dense route
    assert "dense" in sharp.loc[sharp["sigma2"] == 1e-3, "rows_by_route"].item()
    assert (sharp.filter(like="_ms") > 0).all().all()


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


def test_facts_benchmarks_smoke(tmp_path):
    for script in ("facts.py", "facts_learning.py"):
        subprocess.run(
            [sys.executable, str(ROOT / "benchmarks" / script), "--smoke", "--out", str(tmp_path)],
            check=True,
            capture_output=True,
            timeout=300,
        )
    speed = pd.read_csv(tmp_path / "facts_speed.csv")
    assert (speed[["facts_train_s_per_1k", "chained_train_s_per_1k", "train_ratio"]] > 0).all().all()
    assert list(pd.read_csv(tmp_path / "facts_memory.csv")["n"]) == [200, 400]
    learning = pd.read_csv(tmp_path / "facts_learning.csv")
    assert list(learning["route"]) == ["collapsed", "enumerated", "collapsed, embed_dim=16"]
    assert (learning["truth_test_accuracy"] == 1.0).all()
    assert "| route |" in (tmp_path / "facts_learning.md").read_text()


def test_knowledge_base_benchmark_smoke(tmp_path):
    """benchmarks/knowledge_base.py --smoke: the qa command on a small simulated knowledge base, in its own process,
    with its time, peak memory, checkpoint size and accuracies recorded."""
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "knowledge_base.py"), "--smoke", "--hops", "2",
                    "--embed-dim", "8", "--out", str(tmp_path)], check=True, capture_output=True, timeout=300)
    frame = pd.read_csv(tmp_path / "knowledge_base.csv")
    assert list(frame["hops"]) == [2] and (frame["symbols"] > 200).all()
    assert ((frame[["seconds", "peak_mib", "checkpoint_mib"]] > 0).all().all()
            and frame["answer_accuracy"].between(0, 1).all())
    assert "| hops |" in " ".join((tmp_path / "knowledge_base.md").read_text().split())


def test_babi_benchmark_seeds_smoke(tmp_path):
    """benchmarks/babi.py --seeds: one run a seed, each in its own folder with its own seed, and a summary whose
    mean / worst / best are those of the per-seed rows; --starts gives every run that many starts."""
    subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "babi.py"), "--smoke", "--tasks", "1", "--seeds", "0", "3",
         "--starts", "2", "--jobs", "2", "--name", "seeds", "--out", str(tmp_path)],
        check=True,
        capture_output=True,
        timeout=300,
    )
    rows = pd.read_csv(tmp_path / "seeds.csv")
    assert sorted(rows["seed"]) == [0, 3]
    for seed in (0, 3):
        run = json.loads((tmp_path / "seeds_runs" / f"task1_L1_seed{seed}" / "results.json").read_text())
        assert run["seed"] == seed
        assert [start["start"] for start in run["starts"]] == [0, 1]
    answers = 100 * rows["answer_accuracy"]
    line = next(line for line in (tmp_path / "seeds_summary.md").read_text().splitlines() if line.startswith("| 1 |"))
    assert f"| 0, 3 | {answers.mean():.1f} / {answers.min():.1f} / {answers.max():.1f} |" in line
    # every row records the commit it ran on, as git names it here (none outside a git checkout)
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
    if head.returncode == 0:
        assert all(str(code).split("+")[0] == head.stdout.strip() for code in rows["code"])
    else:
        assert rows["code"].isna().all()


def test_babi_benchmark_update_marks_kept_rows_with_their_code(tmp_path):
    """--update keeps the rows not rerun; the table marks them, with the commit each was run on where it is known."""
    spec = importlib.util.spec_from_file_location("babi_benchmark", ROOT / "benchmarks" / "babi.py")
    babi = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(babi)
    row = {"task": 4, "train_set": "1k", "hops": 1, "answer_accuracy": 1.0, "fact_accuracy": 1.0,
           "hop_fact_accuracy": [1.0], "seconds": 9.0, "seed": 0}
    babi.write_tables([dict(row, code="abc1234"), dict(row, task=5)], tmp_path, "table", "settings", code="def5678")
    kept = babi.earlier_rows(tmp_path / "table.csv", rerun={("1k", 5)})
    assert [r["task"] for r in kept] == [4] and kept[0]["code"] == "abc1234"
    babi.write_tables(kept + [dict(row, task=5, code="def5678")], tmp_path, "table", "settings", code="def5678")
    text = (tmp_path / "table.md").read_text()
    assert "| 4 (kept from an earlier run, code abc1234) |" in text and "| 5 | 1k |" in text
    assert "Code: def5678." in text
