"""The pyro-multihop command end to end on a small task (in-process through main), its errors, and one real
subprocess call of the installed console script."""

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import torch

from pyro_multihop.checkpoint import load_checkpoint
from pyro_multihop.cli import main

COMMANDS = ["simulate", "train", "evaluate", "predict", "inspect", "babi", "qa", "paths"]
#: The commands that apply a checkpoint to a data file: table data or a facts file.
APPLY_COMMANDS = ["evaluate", "predict", "inspect", "paths"]


@pytest.fixture(scope="module")
def task(tmp_path_factory):
    folder = tmp_path_factory.mktemp("task")
    train, test = folder / "train.csv", folder / "test.parquet"
    assert main(["simulate", "-n", "150", "--seed", "0", "--out", str(train)]) == 0
    assert main(["simulate", "-n", "60", "--seed", "1", "--out", str(test)]) == 0
    return folder, train, test


def one_error_line(capsys, code):
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert code == 2, captured.err
    assert len(lines) == 1 and "error" in lines[0] and "Traceback" not in captured.err, captured.err
    return lines[0]


def test_simulate_writes_a_task_file(tmp_path, capsys):
    out = tmp_path / "chain.csv"
    assert main(["simulate", "--task", "chain", "--hops", "3", "-n", "20", "--pairs", "4", "--out", str(out)]) == 0
    frame = pd.read_csv(out)
    assert len(frame) == 20 and "key_11" in frame.columns and "key_12" not in frame.columns
    assert "wrote 20 observations" in capsys.readouterr().out
    assert main(["simulate", "--task", "induction", "-n", "5", "--seq-len", "6", "--out", str(tmp_path / "i.csv")]) == 0


def test_train_svi_evaluate_predict_inspect(task, tmp_path, capsys):
    folder, train, test = task
    run = tmp_path / "svi"
    code = main(["train", "--data", str(train), "--val", str(test), "--steps", "20", "--log-every", "5",
                 "--no-progress", "--out", str(run)])
    assert code == 0
    for name in ("checkpoint.pt", "metrics.csv", "loss.png", "accuracy.png", "summary.json"):
        assert (run / name).is_file(), name
    metrics = pd.read_csv(run / "metrics.csv")
    assert metrics["step"].tolist() == [0, 5, 10, 15, 20]
    assert {"loss", "val_accuracy", "val_log_likelihood"} <= set(metrics.columns)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["model"] == "ChainedAttention" and summary["settings"]["num_steps"] == 20
    model, state = load_checkpoint(run / "checkpoint.pt")
    assert state["step"] == 20 and state["optimizer"] is not None
    capsys.readouterr()

    assert main(["evaluate", "--checkpoint", str(run / "checkpoint.pt"), "--data", str(test),
                 "--out", str(run / "heldout.json")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["n"] == 60 and 0 <= printed["accuracy"] <= 1
    assert printed["log_likelihood"] == pytest.approx(summary["val"]["log_likelihood"], rel=1e-6)
    assert json.loads((run / "heldout.json").read_text()) == printed

    predictions = tmp_path / "predictions.csv"
    assert main(["predict", "--checkpoint", str(run / "checkpoint.pt"), "--data", str(test), "--out", str(predictions)]) == 0
    frame = pd.read_csv(predictions)
    assert len(frame) == 60
    assert {"row", "query", "target", "predicted", "p_predicted", "p_target", "map_hop_1", "map_hop_2", "prob_29"} <= set(frame.columns)
    probabilities = frame[[f"prob_{t}" for t in range(30)]].to_numpy()
    assert probabilities.sum(1) == pytest.approx(1.0, abs=1e-4)
    assert (frame["predicted"] == probabilities.argmax(1)).all()
    assert frame["map_hop_1"].between(0, 9).all()

    figures = tmp_path / "figures"
    assert main(["inspect", "--checkpoint", str(run / "checkpoint.pt"), "--data", str(test), "--rows", "0", "5",
                 "--out", str(figures)]) == 0
    assert sorted(p.name for p in figures.iterdir()) == ["emission.png", "hop_marginals.png", "key_tables.png"]


def test_train_em_and_predict_without_targets(task, tmp_path, capsys):
    folder, train, test = task
    run = tmp_path / "em"
    assert main(["train", "--data", str(train), "--val", str(test), "--method", "em", "--steps", "5", "--out", str(run)]) == 0
    metrics = pd.read_csv(run / "metrics.csv")
    assert metrics["step"].iloc[0] == 0 and len(metrics) <= 6 and "val_accuracy" in metrics.columns
    model, state = load_checkpoint(run / "checkpoint.pt")
    assert state["extra"]["method"] == "em" and state["optimizer"] is None

    no_target = tmp_path / "context_only.csv"
    pd.read_parquet(test).drop(columns=["target"]).to_csv(no_target, index=False)
    out = tmp_path / "p.csv"
    assert main(["predict", "--checkpoint", str(run / "checkpoint.pt"), "--data", str(no_target), "--out", str(out)]) == 0
    frame = pd.read_csv(out)
    assert "target" not in frame.columns and "p_target" not in frame.columns and "map_hop_2" in frame.columns


def test_train_resume_continues_the_checkpoint(task, tmp_path):
    folder, train, _ = task
    run = tmp_path / "run"
    base = ["train", "--data", str(train), "--steps", "12", "--batch-size", "50", "--checkpoint-every", "4",
            "--no-progress", "--out", str(run)]
    assert main(base) == 0
    first = load_checkpoint(run / "checkpoint.pt")[0]
    assert main(base + ["--resume"]) == 0  # the finished run comes back unchanged
    again = load_checkpoint(run / "checkpoint.pt")[0]
    assert torch.equal(first.key_tables, again.key_tables)


def test_tied_model_trains_and_inspects(task, tmp_path):
    pytest.importorskip("pyro_multihop.models.tied")
    folder, train, test = task
    run = tmp_path / "tied"
    assert main(["train", "--data", str(train), "--model", "tied", "--embed-dim", "4", "--steps", "6",
                 "--no-progress", "--out", str(run)]) == 0
    assert main(["inspect", "--checkpoint", str(run / "checkpoint.pt"), "--out", str(run / "figures")]) == 0
    assert sorted(p.name for p in (run / "figures").iterdir()) == ["embeddings.png", "emission.png"]


@pytest.mark.parametrize("command", COMMANDS)
def test_help_of_every_command(command, capsys):
    assert main([command, "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"usage: pyro-multihop {command}") and "--help" in out
    if command in APPLY_COMMANDS:  # they take qa checkpoints and facts files too
        text = " ".join(out.split())
        assert "a checkpoint written by train, qa or babi" in text and ".jsonl" in text and "qa checkpoint" in text


def test_errors_are_one_line(task, tmp_path, capsys):
    folder, train, test = task
    garbage = tmp_path / "garbage.pt"
    garbage.write_bytes(b"not a checkpoint")
    bad_csv = tmp_path / "bad.csv"
    bad_csv.write_text("query,target\n1,2\n")
    big_symbols = tmp_path / "big.csv"
    main(["simulate", "-n", "5", "--symbols", "40", "--out", str(big_symbols)])
    ckpt = tmp_path / "svi" / "checkpoint.pt"
    main(["train", "--data", str(train), "--steps", "2", "--no-progress", "--out", str(ckpt.parent)])
    truncated = tmp_path / "truncated.pt"
    truncated.write_bytes(ckpt.read_bytes()[:1000])
    float_csv = tmp_path / "floats.csv"
    frame = pd.read_csv(train).astype({"key_3": float})
    frame.loc[1, "key_3"] = 2.5
    frame.to_csv(float_csv, index=False)
    capsys.readouterr()
    cases = [
        (["train", "--data", str(tmp_path / "missing.csv"), "--out", str(tmp_path / "x")], "does not exist"),
        (["train", "--data", str(train), "--steps", "-3", "--out", str(tmp_path / "x")], "--steps"),
        (["train", "--data", str(train), "--model", "nope", "--out", str(tmp_path / "x")], "--model"),
        (["train", "--data", str(bad_csv), "--out", str(tmp_path / "x")], "key_0"),
        (["train", "--data", str(train), "--device", "warp-drive", "--out", str(tmp_path / "x")], "device"),
        (["train", "--data", str(train), "--method", "em", "--lr", "0.1", "--out", str(tmp_path / "x")], "svi only"),
        (["simulate", "--out", str(tmp_path / "data.txt")], ".csv or .parquet"),
        (["train", "--data", str(tmp_path / "facts.jsonl"), "--out", str(tmp_path / "x")], "trained by the qa command"),
        (["evaluate", "--checkpoint", str(ckpt), "--data", str(tmp_path / "data.txt")], ".jsonl (a facts file"),
        (["evaluate", "--checkpoint", str(ckpt), "--data", str(tmp_path / "facts.jsonl")],
         "it takes a .csv or .parquet data file"),
        (["predict", "--checkpoint", str(ckpt), "--data", str(tmp_path / "facts.jsonl"), "--out", str(tmp_path / "p.jsonl")],
         "needs a checkpoint of qa or babi --encoding facts"),
        (["evaluate", "--checkpoint", str(garbage), "--data", str(test)], "is not a checkpoint"),
        (["evaluate", "--checkpoint", str(train), "--data", str(test)], f"{str(train)!r} is not a checkpoint"),
        (["evaluate", "--checkpoint", str(truncated), "--data", str(test)], "is truncated or damaged"),
        (["train", "--data", str(float_csv), "--out", str(tmp_path / "x")], "column 'key_3' row 1: expected an integer symbol, got 2.5"),
        (["evaluate", "--checkpoint", str(tmp_path / "none.pt"), "--data", str(test)], "does not exist"),
        (["evaluate", "--checkpoint", str(ckpt), "--data", str(big_symbols)], "does not fit"),
        (["predict", "--checkpoint", str(ckpt), "--data", str(test), "--out", str(tmp_path / "p.json")], ".csv"),
        (["inspect", "--checkpoint", str(ckpt), "--data", str(test), "--rows", "500", "--out", str(tmp_path / "f")], "--rows"),
        ([], "COMMAND"),
    ]
    for argv, fragment in cases:
        line = one_error_line(capsys, main(argv))
        assert fragment in line, (argv, line)


def test_console_script_help_runs_as_a_subprocess():
    script = Path(sys.executable).with_name("pyro-multihop")
    command = [str(script)] if script.exists() else [shutil.which("pyro-multihop")]
    if command[0] is None:
        pytest.skip("the pyro-multihop console script is not installed")
    result = subprocess.run(command + ["--help"], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("usage: pyro-multihop") and all(c in result.stdout for c in COMMANDS)


def test_demo_script_smoke(tmp_path):
    root = Path(__file__).resolve().parent.parent
    result = subprocess.run(
        [sys.executable, str(root / "scripts" / "demo.py"), "--smoke", "--out", str(tmp_path / "demo")],
        capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"outputs in {tmp_path / 'demo'}" in result.stdout
    table = pd.read_csv(tmp_path / "demo" / "comparison.csv")
    assert table["method"].tolist() == ["SVI", "EM", "generating structure"]
    for name in ("comparison.png", "svi/heldout.json", "em/heldout.json", "svi/figures/hop_marginals.png", "em/predictions.csv"):
        assert (tmp_path / "demo" / name).is_file(), name


# -- interrupts: a real train subprocess, SIGTERM / SIGINT, resume ----------------------------------------
ROOT = Path(__file__).resolve().parent.parent
INTERRUPT_STEPS = 120


def _train_command(data, out, *extra):
    return [sys.executable, "-m", "pyro_multihop", "train", "--data", str(data), "--steps", str(INTERRUPT_STEPS),
            "--log-every", "10", "--checkpoint-every", "100000", "--threads", "1", "--out", str(out), *extra]


def _environment():
    import os

    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""))


def _interrupt_after_progress(command, signum, min_step=10):
    """Start ``command``, read its progress bar on stderr until it shows ``min_step`` steps, send ``signum``."""
    import os
    import re
    import signal as signals
    import time

    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=_environment(), cwd=ROOT)
    seen, deadline = b"", time.monotonic() + 240
    try:
        while time.monotonic() < deadline:
            chunk = os.read(process.stderr.fileno(), 4096)
            if not chunk:
                break
            seen += chunk
            steps = [int(m) for m in re.findall(rb"(\d+)/%d" % INTERRUPT_STEPS, seen)]
            if steps and max(steps) >= min_step:
                process.send_signal(signum)
                break
        out, err = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            process.kill()
    assert steps and max(steps) >= min_step, seen.decode(errors="replace")[-500:]
    assert signum in (signals.SIGINT, signals.SIGTERM)
    return process.returncode, out.decode(), (seen + err).decode(errors="replace")


@pytest.fixture(scope="module")
def uninterrupted(task, tmp_path_factory):
    folder, train, _ = task
    out = tmp_path_factory.mktemp("uninterrupted")
    result = subprocess.run(_train_command(train, out, "--no-progress"), capture_output=True, text=True,
                            env=_environment(), cwd=ROOT, timeout=600)
    assert result.returncode == 0, result.stderr
    return out


@pytest.mark.parametrize("signal_name, status", [("SIGTERM", 143), ("SIGINT", 130)])
def test_an_interrupted_train_writes_a_checkpoint_and_resumes_bit_identically(task, uninterrupted, tmp_path,
                                                                             signal_name, status):
    import signal as signals

    folder, train, _ = task
    out = tmp_path / "run"
    code, _, err = _interrupt_after_progress(_train_command(train, out), getattr(signals, signal_name))
    assert code == status, err[-2000:]
    interrupted_at = load_checkpoint(out / "checkpoint.pt")[1]["step"]
    assert 10 <= interrupted_at < INTERRUPT_STEPS
    assert f"interrupted by {signal_name} after step {interrupted_at}; checkpoint written to" in err
    assert not (out / "metrics.csv").exists()  # it stopped inside the loop, before the outputs of a finished run

    resumed = subprocess.run(_train_command(train, out, "--no-progress", "--resume"), capture_output=True, text=True,
                             env=_environment(), cwd=ROOT, timeout=600)
    assert resumed.returncode == 0, resumed.stderr
    assert resumed.stdout.splitlines()[0] == f"resuming from step {interrupted_at} of {out / 'checkpoint.pt'}"

    reference, _ = load_checkpoint(uninterrupted / "checkpoint.pt")
    result, state = load_checkpoint(out / "checkpoint.pt")
    assert state["step"] == INTERRUPT_STEPS
    for name, value in reference.state_dict().items():
        assert torch.equal(result.state_dict()[name], value), name
    expected = pd.read_csv(uninterrupted / "metrics.csv").drop(columns="seconds")
    pd.testing.assert_frame_equal(pd.read_csv(out / "metrics.csv").drop(columns="seconds"), expected, check_exact=True)
    assert json.loads((out / "summary.json").read_text())["train"] == json.loads(
        (uninterrupted / "summary.json").read_text())["train"]


# -- issue 19: safe run directories, held-out data, the vocabulary hint, paths, a fast --help ---------------
def test_train_refuses_an_out_with_a_checkpoint_unless_told(task, tmp_path, capsys):
    folder, train, _ = task
    run = tmp_path / "kept"
    base = ["train", "--data", str(train), "--steps", "6", "--no-progress", "--out", str(run)]
    assert main(base) == 0
    trained = (run / "checkpoint.pt").read_bytes()
    capsys.readouterr()
    line = one_error_line(capsys, main(base[:4] + ["2"] + base[5:]))
    assert "already holds a trained checkpoint" in line and "--resume" in line and "--overwrite" in line
    assert (run / "checkpoint.pt").read_bytes() == trained  # nothing was touched
    assert main(base + ["--overwrite"]) == 0
    assert "contradict" in one_error_line(capsys, main(base + ["--overwrite", "--resume"]))


def test_a_resume_with_other_options_fails_before_printing(task, tmp_path, capsys):
    folder, train, _ = task
    run = tmp_path / "run"
    assert main(["train", "--data", str(train), "--steps", "4", "--no-progress", "--out", str(run)]) == 0
    capsys.readouterr()
    code = main(["train", "--data", str(train), "--steps", "8", "--hops", "3", "--resume", "--no-progress",
                 "--out", str(run)])
    captured = capsys.readouterr()
    assert code == 2 and captured.out == "", captured.out
    assert "n_hops = 2 there, 3 here" in captured.err and "--overwrite" in captured.err


def test_valid_fraction_patience_and_the_best_checkpoint(task, tmp_path, capsys):
    folder, train, _ = task
    run = tmp_path / "best"
    assert main(["train", "--data", str(train), "--valid-fraction", "0.2", "--patience", "50", "--steps", "20",
                 "--log-every", "5", "--no-progress", "--out", str(run)]) == 0
    out = capsys.readouterr().out
    summary = json.loads((run / "summary.json").read_text())
    best = summary["best"]
    assert (run / "best.pt").is_file() and best["checkpoint"] == str(run / "best.pt")
    metrics = pd.read_csv(run / "metrics.csv")
    assert best["step"] == int(metrics.loc[metrics["val_log_likelihood"].idxmax(), "step"])
    assert f"best checkpoint: {run / 'best.pt'} (step {best['step']}: highest held-out log-likelihood" in out
    assert summary["val"]["n"] == 30 and summary["train"]["n"] == 120
    assert "--patience needs" in one_error_line(capsys, main(["train", "--data", str(train), "--patience", "2",
                                                               "--out", str(tmp_path / "p")]))


def test_data_beyond_the_vocabulary_names_the_symbols_option(task, tmp_path, capsys):
    folder, train, _ = task
    run = tmp_path / "small"
    assert main(["train", "--data", str(train), "--steps", "2", "--no-progress", "--out", str(run)]) == 0
    big = tmp_path / "big.csv"
    assert main(["simulate", "-n", "5", "--symbols", "40", "--out", str(big)]) == 0
    capsys.readouterr()
    line = one_error_line(capsys, main(["evaluate", "--checkpoint", str(run / "checkpoint.pt"), "--data", str(big)]))
    assert "num_symbols" in line and "train --symbols" in line


@pytest.mark.parametrize("suffix", [".csv", ".jsonl"])
def test_paths_match_the_python_api(task, tmp_path, suffix):
    from pyro_multihop import Observations

    folder, train, test = task
    run = tmp_path / "run"
    assert main(["train", "--data", str(train), "--steps", "15", "--no-progress", "--out", str(run)]) == 0
    out = tmp_path / f"paths{suffix}"
    assert main(["paths", "--checkpoint", str(run / "checkpoint.pt"), "--data", str(test), "-k", "3",
                 "--samples", "2", "--chunk", "7", "--no-progress", "--out", str(out)]) == 0
    model, _ = load_checkpoint(run / "checkpoint.pt")
    obs = Observations.load(test)
    paths, log_probs = model.k_best_paths(obs, 3)
    entropy = model.path_entropy(obs)
    if suffix == ".csv":
        frame = pd.read_csv(out)
        assert len(frame) == len(obs) and frame["row"].tolist() == list(range(len(obs)))
        assert frame["entropy"].to_numpy() == pytest.approx(entropy.numpy(), abs=1e-6)
        for j in range(3):
            assert frame[f"path_{j + 1}_prob"].to_numpy() == pytest.approx(log_probs[:, j].exp().numpy(), abs=1e-6)
            for hop in range(2):
                positions = paths[:, j, hop]
                assert frame[f"path_{j + 1}_hop_{hop + 1}"].tolist() == positions.tolist()
                keys = obs.keys.gather(1, positions[:, None]).squeeze(1).tolist()
                values = obs.values.gather(1, positions[:, None]).squeeze(1).tolist()
                assert frame[f"path_{j + 1}_hop_{hop + 1}_attended"].tolist() == [f"{k}:{v}" for k, v in zip(keys, values)]
        assert frame["sample_2_hop_2"].between(0, obs.context_len - 1).all()
    else:
        records = [json.loads(line) for line in out.read_text().splitlines()]
        assert len(records) == len(obs)
        for row, record in enumerate(records):
            assert record["entropy"] == pytest.approx(float(entropy[row]), abs=1e-6)
            assert [p["positions"] for p in record["paths"]] == paths[row].tolist()[: len(record["paths"])]
            assert [p["probability"] for p in record["paths"]] == pytest.approx(log_probs[row].exp().tolist()[: len(record["paths"])], abs=1e-6)
            assert len(record["samples"]) == 2 and all(len(s) == 2 for s in record["samples"])


def test_help_imports_no_torch():
    """``pyro-multihop --help`` and every ``COMMAND --help`` under 1 s: parsing loads neither torch nor Pyro (timed
    in benchmarks/help_time.py). One fresh interpreter; what is loaded is read after each help in turn."""
    probe = ("import contextlib, io, json, sys\nfrom pyro_multihop.cli import build_parser, main\nbuild_parser()\n"
             "loaded = {}\n"
             f"for command in {[''] + COMMANDS!r}:\n"
             "    with contextlib.redirect_stdout(io.StringIO()) as text:\n"
             "        status = main(([command] if command else []) + ['--help'])\n"
             "    assert status == 0 and text.getvalue().startswith('usage: pyro-multihop'), command\n"
             "    loaded[command or '--help'] = sorted(m for m in ('torch', 'pyro', 'pandas', 'matplotlib') if m in sys.modules)\n"
             "print(json.dumps(loaded))")
    result = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, cwd=ROOT, timeout=120,
                            env=_environment())
    assert result.returncode == 0, result.stderr
    loaded = json.loads(result.stdout)
    assert set(loaded) == {"--help", *COMMANDS} and {"train", "babi", "qa"} <= set(loaded)
    assert loaded == {command: [] for command in loaded}


def test_babi_help_defaults_agree_with_the_code(capsys, monkeypatch):
    """The babi command shows (and uses) the defaults of the modules that own them, read when the parser is
    built: a changed owner changes the help. chained_babi's settings are command_defaults' (one object)."""
    from pyro_multihop.cli import build_parser
    from pyro_multihop.datasets.babi import DEFAULT_MEMORY
    from pyro_multihop.experiments import chained_babi, command_defaults

    assert chained_babi.BABI_SVI is command_defaults.BABI_SVI
    assert chained_babi.BABI_EM_ITERATIONS == command_defaults.BABI_EM_ITERATIONS

    assert main(["babi", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "task 1: 1, task 2: 2, task 3: 3" in text and "--hops" in text
    assert f"SVI steps or EM iterations (default: {chained_babi.BABI_SVI['num_steps']} / " \
           f"{chained_babi.BABI_EM_ITERATIONS})" in text
    assert f"SVI learning rate (default: {chained_babi.BABI_SVI['lr']})" in text
    assert f"statements kept before each question (default: {DEFAULT_MEMORY})" in text
    assert build_parser().parse_args(["babi", "--task", "1", "--out", "o"]).memory == DEFAULT_MEMORY
    monkeypatch.setattr(command_defaults, "BABI_SVI", dict(chained_babi.BABI_SVI, num_steps=123, lr=0.25))
    assert main(["babi", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 123 / " in text and "SVI learning rate (default: 0.25)" in text


def test_train_help_shows_the_registry_defaults(capsys):
    from pyro_multihop.em.em_runs import CHAINED_EM_MAX_ITERS
    from pyro_multihop.models.registry import COMMAND_HEADS, default_sigma2

    assert main(["train", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert f"--model {{{','.join(COMMAND_HEADS)}}}" in text
    assert f"(default: {default_sigma2('chained')} chained, {default_sigma2('tied')} tied)" in text
    assert f"; {CHAINED_EM_MAX_ITERS} EM iterations)" in text


def test_train_runs_the_defaults_its_help_shows(task, tmp_path, capsys, monkeypatch):
    """The help's defaults are what the command runs: a changed command default changes both."""
    from pyro_multihop.experiments import command_defaults

    folder, train, test = task
    monkeypatch.setitem(command_defaults.TRAIN_SIGMA2, "chained", 0.2)
    monkeypatch.setattr(command_defaults, "TRAIN_EM_ITERATIONS", 2)
    assert main(["train", "--help"]) == 0
    text = " ".join(capsys.readouterr().out.split())
    assert "(default: 0.2 chained, 0.3 tied)" in text and "; 2 EM iterations)" in text
    assert main(["train", "--data", str(train), "--steps", "1", "--no-progress", "--out", str(tmp_path / "svi")]) == 0
    assert load_checkpoint(tmp_path / "svi" / "checkpoint.pt")[0].sigma2 == 0.2
    assert main(["train", "--data", str(train), "--method", "em", "--tol", "0", "--out", str(tmp_path / "em")]) == 0
    summary = json.loads((tmp_path / "em" / "summary.json").read_text())
    assert summary["config"]["sigma2"] == 0.2 and summary["settings"]["max_iters"] == summary["settings"]["n_iter"] == 2


def test_help_time_benchmark_smoke(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "help_time.py"), "--repeats", "1", "--out", str(tmp_path)],
                   check=True, capture_output=True, timeout=120, env=_environment())
    assert "| False |" in (tmp_path / "help_time.md").read_text()  # torch not imported by --help


def test_train_starts_records_every_start_and_prints_why_a_run_is_stuck(task, tmp_path, capsys):
    """``train --starts 2``: summary.json records both starts, the best held-out one kept; a learning rate that
    moves nothing for the guard's warm-up (40 steps) is a stuck run, recorded and printed as a warning line."""
    folder, train, test = task
    run = tmp_path / "starts"
    assert main(["train", "--data", str(train), "--val", str(test), "--steps", "40", "--lr", "1e-9", "--starts", "2",
                 "--processes", "1", "--no-progress", "--out", str(run)]) == 0
    summary = json.loads((run / "summary.json").read_text())
    starts = summary["starts"]
    assert [record["start"] for record in starts] == [0, 1] and sum(record["kept"] for record in starts) == 1
    kept = next(record for record in starts if record["kept"])
    assert kept["val_log_likelihood"] == max(record["val_log_likelihood"] for record in starts)
    assert "training_stuck" in kept["diagnostics"]
    assert [record["kind"] for record in summary["diagnostics"]][0] == "training_stuck"
    captured = capsys.readouterr()
    assert f"note: 2 starts, kept start {kept['start']}" in captured.out
    stuck = summary["diagnostics"][0]
    assert f"warning: {stuck['message']} (try: " in captured.out and "TrainingStuckWarning" not in captured.err
    # One start (the default) writes no starts; EM refuses several.
    assert main(["train", "--data", str(train), "--steps", "2", "--no-progress", "--out", str(tmp_path / "one")]) == 0
    one = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert "starts" not in one and isinstance(one["diagnostics"], list)
    capsys.readouterr()
    code = main(["train", "--data", str(train), "--method", "em", "--starts", "2", "--out", str(tmp_path / "em")])
    assert "--starts 2: several starts are an SVI option" in one_error_line(capsys, code)


def test_starts_default_is_the_command_defaults_one(capsys, monkeypatch):
    """``--starts`` of train shows and uses command_defaults.STARTS, read when the parser is built; qa and babi
    (the facts head) leave it to the run (None) and show both of their defaults: COMPARISON_STARTS where the
    comparison is on, STARTS else, the composition's more starts (what run_qa picks is tests/experiments/test_qa_command.py's)."""
    from pyro_multihop.cli import build_parser
    from pyro_multihop.experiments import command_defaults
    from pyro_multihop.models.fact_composition import COMPOSITION_EXTRA_STARTS

    needed = {"train": ["--data", "d.csv", "--out", "o"], "babi": ["--task", "1", "--out", "o"],
              "qa": ["--train", "a.jsonl", "--test", "b.jsonl", "--hops", "1", "--out", "o"]}
    for value in (command_defaults.STARTS, 3):
        monkeypatch.setattr(command_defaults, "STARTS", value)
        monkeypatch.setattr(command_defaults, "COMPARISON_STARTS", value + 4)
        for command, argv in needed.items():
            assert build_parser().parse_args([command, *argv]).starts == (value if command == "train" else None)
            assert main([command, "--help"]) == 0
            text = " ".join(capsys.readouterr().out.split())
            shown = f"{value}, one plain fit" if command == "train" else \
                f"{value + 4} where the comparison is on (with and without it, from the equality weights at 1 and at " \
                f"0, with and without the word-order terms), else {value}; {COMPOSITION_EXTRA_STARTS} more where " \
                "the composition is on"
            assert f"(default: {shown}; docs/svi.md)" in text, command
