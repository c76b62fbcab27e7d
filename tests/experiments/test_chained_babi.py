"""``pyro-multihop babi`` at smoke size: results.json, the hop-posterior figure, EM, one-line errors, a refused
run folder, progress, the vocabulary in the checkpoint and words in ``inspect``."""

import json

import torch

from pyro_multihop.cli import main
from pyro_multihop.datasets import babi


def test_babi_command_trains_evaluates_and_draws(tmp_path, capsys):
    out = tmp_path / "run"
    code = main(["babi", "--encoding", "positions", "--task", "1", "--hops", "1", "--steps", "80", "--max-train", "300",
                 "--out", str(out)])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert {"answer_accuracy", "fact_accuracy", "n_test", "task", "hops"} <= set(results)
    assert results["task"] == 1 and results["hops"] == 1 and results["n_test"] == 1000
    # Task 1 needs one hop and recency: 80 steps on 300 questions answer 0.96 of the test questions.
    assert results["answer_accuracy"] > 0.9 and results["fact_accuracy"] > 0.9
    # An SVI run records the fit's diagnostics (records of kind, message, hint); one start: no "starts".
    assert all(set(d) == {"kind", "message", "hint"} for d in results["diagnostics"]) and "starts" not in results
    assert (out / "hop_posteriors.png").stat().st_size > 10_000
    captured = capsys.readouterr()
    assert json.loads(captured.out.strip().splitlines()[-1]) == results
    assert "svi: 80/80 (100%)" in captured.err  # progress, as lines off a terminal

    # The checkpoint keeps the vocabulary; inspect names the run and labels with words.
    from pyro_multihop.checkpoint import load_checkpoint
    from pyro_multihop.em.em_runs import training_method

    model, state = load_checkpoint(out / "checkpoint.pt")
    vocabulary = state["extra"]["vocabulary"]
    train, _ = babi.load_task(1, max_train=300)
    assert vocabulary == {"symbols": train.encoder.symbols, "targets": train.encoder.answers}
    assert training_method(state) == "bAbI task 1, SVI"
    assert main(["inspect", "--checkpoint", str(out / "checkpoint.pt"), "--out", str(out / "figures")]) == 0
    assert (out / "figures" / "key_tables.png").is_file()

    # A second run into the same folder is refused, the trained checkpoint untouched.
    trained = (out / "checkpoint.pt").read_bytes()
    capsys.readouterr()
    assert main(["babi", "--task", "1", "--steps", "2", "--max-train", "50", "--out", str(out)]) == 2
    line = capsys.readouterr().err.strip()
    assert "already holds a trained checkpoint" in line and "--overwrite" in line and "--resume" not in line
    assert (out / "checkpoint.pt").read_bytes() == trained


def test_hops_default_to_the_supporting_facts_and_the_figure_has_a_colour_bar_and_title():
    from pyro_multihop.experiments.chained_babi import babi_head, default_hops, plot_hop_posteriors

    assert [default_hops(babi.load_task(task, max_train=200)[0]) for task in (1, 2, 3)] == [1, 2, 3]
    train, test = babi.load_task(1, max_train=50)
    figure = plot_hop_posteriors(babi_head(train, 1), test, [0, 1], title="task 1")
    assert figure._suptitle.get_text() == "task 1"
    colour_bar = figure.axes[-1]
    assert len(figure.axes) == 3 and "posterior probability" in colour_bar.get_ylabel()


def test_babi_command_em_fits_the_content_only_gate(tmp_path):
    out = tmp_path / "em"
    code = main(["babi", "--encoding", "positions", "--task", "1", "--hops", "1", "--method", "em", "--steps", "3", "--max-train", "100",
                 "--data-dir", str(babi.DEFAULT_DATA_DIR), "--out", str(out)])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    assert results["method"] == "em" and results["positional"] is False and 0 <= results["answer_accuracy"] <= 1


def test_babi_command_errors_are_one_line(tmp_path, capsys):
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "qa1_x_train.txt").write_text("1 Mary moved.\n2 Where is Mary? \tbathroom\n")
    (bad / "qa1_x_test.txt").write_text("1 Mary moved.\n2 Where is Mary? \tbathroom\t1\n")
    cases = [
        (["babi", "--task", "1", "--data-dir", str(tmp_path / "none"), "--out", str(tmp_path / "o")], "is not a directory"),
        (["babi", "--task", "2", "--data-dir", str(bad), "--out", str(tmp_path / "o")], "qa2_"),
        (["babi", "--task", "1", "--data-dir", str(bad), "--out", str(tmp_path / "o")], "qa1_x_train.txt:2:"),
        (["babi", "--task", "0", "--out", str(tmp_path / "o")], "task"),
        (["babi", "--task", "1", "--steps", "0", "--out", str(tmp_path / "o")], "--steps"),
        (["babi", "--task", "1", "--starts", "0", "--out", str(tmp_path / "o")], "--starts"),
        (["babi", "--encoding", "positions", "--method", "em", "--starts", "2", "--task", "1", "--out",
          str(tmp_path / "o")], "starts = 2 (--starts): several starts are an SVI option; EM fits one start"),
    ]
    for argv, fragment in cases:
        code = main(argv)
        lines = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and fragment in lines[0], (argv, lines)


def test_babi_benchmark_smoke(tmp_path):
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    subprocess.run(
        [sys.executable, str(root / "benchmarks" / "babi.py"), "--smoke", "--encoding", "positions", "--tasks", "1",
         "--hops", "1", "2", "--out", str(tmp_path)],
        check=True,
        capture_output=True,
    )
    table = (tmp_path / "babi.md").read_text()
    assert "| 1 | 1k | 1 |" in table and "| 1 | 1k | 2 |" in table
    assert (tmp_path / "babi_runs" / "task1_L2" / "checkpoint.pt").is_file()


def test_the_figure_of_a_long_story_draws_every_hops_map_statement_and_the_supporting_ones():
    """Task 3's stories run past the panel's 14 statements: the drawn ones must hold each hop's most probable
    statement and the supporting statements, for rows that are not the first (each row its own marginals)."""
    from pyro_multihop.experiments.chained_babi import babi_head, plot_hop_posteriors

    train, test = babi.load_task(3, max_train=50)
    head = babi_head(train, 3)
    long_rows = [row for row in range(len(test)) if len(test.contexts[row]) > 30][1:3]
    figure = plot_hop_posteriors(head, test, long_rows, max_statements=14)
    with torch.no_grad():
        marginals = head.hop_marginals(test.obs[torch.tensor(long_rows)])
    for column, (axis, row) in enumerate(zip(figure.axes, long_rows)):
        drawn = {int(label.get_text().lstrip("* ").split(":")[0]) for label in axis.get_yticklabels()}
        per_statement = test.statement_marginals(marginals, row, column)  # (M, L)
        ids = [story_id for story_id, _ in test.contexts[row]]
        assert {ids[i] for i in per_statement.argmax(0).tolist()} <= drawn
        assert set(test.supporting[row]) <= drawn
        assert len(drawn) < len(ids) and "statements shown" in axis.get_title()
