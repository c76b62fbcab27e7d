"""``pyro-multihop qa`` end to end at smoke size: the outputs, predictions equal to the Python API's answers and
question-only MAP paths, the vocabulary in the checkpoint, the run-directory check, one-line errors."""

import json
import math
import random

import pytest
import torch

from pyro_multihop.checkpoint import load_checkpoint
from pyro_multihop.cli import main
from pyro_multihop.datasets.babi_facts import load_task_records
from pyro_multihop.datasets.qa_jsonl import QARecord, QAVocabulary, read_qa_jsonl, write_qa_jsonl
from pyro_multihop.experiments.command_defaults import COMPARISON_STARTS
from pyro_multihop.experiments.qa import load_qa_checkpoint, predict_qa

STEPS = "40"


def family_records(n, seed, people, cities):
    """Two hops: "where does the parent of X live?" over facts (child, parent, person) and (person, lives, city),
    shuffled among distractors; supporting = [X's parent fact, the parent's home fact]."""
    rng = random.Random(seed)
    records = []
    for _ in range(n):
        child, parent, other = rng.sample(people, 3)
        home, elsewhere = rng.sample(cities, 2)
        facts = [(child, "parent", parent), (parent, "lives", home), (other, "lives", elsewhere),
                 (other, "parent", child)]
        order = list(range(len(facts)))
        rng.shuffle(order)
        shuffled = [facts[i] for i in order]
        supporting = (order.index(0), order.index(1))
        records.append(QARecord(tuple(shuffled), ("where", "lives", "parent", "of", child), home, supporting))
    return records


@pytest.fixture()
def family_files(tmp_path):
    people = [f"p{i}" for i in range(12)]
    train = family_records(80, 0, people, [f"c{i}" for i in range(6)])
    # The test cities never occur in training: the answer can only be copied from a fact.
    test = family_records(12, 1, people, [f"new{i}" for i in range(4)])
    return write_qa_jsonl(train, tmp_path / "train.jsonl"), write_qa_jsonl(test, tmp_path / "test.jsonl")


def test_qa_command_writes_results_predictions_figure_and_checkpoint(family_files, tmp_path, capsys):
    train_path, test_path = family_files
    out = tmp_path / "run"
    code = main(["qa", "--train", str(train_path), "--test", str(test_path), "--hops", "2", "--steps", STEPS,
                 "--out", str(out), "--no-progress"])
    assert code == 0
    text = (out / "results.json").read_text()
    results = json.loads(text, parse_constant=lambda name: pytest.fail(f"results.json holds {name}"))
    assert {"answer_accuracy", "fact_accuracy", "n_train", "n_test", "hops", "seconds"} <= set(results)
    assert results["n_train"] == 80 and results["n_test"] == 12 and results["hops"] == 2
    assert 0 <= results["answer_accuracy"] <= 1 and 0 <= results["fact_accuracy"] <= 1
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1]) == results
    assert (out / "hop_posteriors.png").stat().st_size > 10_000

    # predictions.jsonl: one line per test question, equal to the Python API on the checkpoint's head.
    lines = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    head, vocabulary, _ = load_qa_checkpoint(out / "checkpoint.pt")
    assert vocabulary == QAVocabulary.build(read_qa_jsonl(train_path))
    test = vocabulary.encode(read_qa_jsonl(test_path))
    assert len(lines) == len(test)
    with torch.no_grad():
        probs = head.predict_proba(test.obs)
        paths = head.map_paths(test.obs, given_target=False)
    for row, line in enumerate(lines):
        assert set(line) == {"id", "question", "answer", "answer_prob", "facts", "fact_tokens", "given_answer", "correct"}
        record = test.records[row]
        assert line["id"] == row and line["question"] == list(record.question)  # no id in the file: the row
        assert line["answer"] == test.answer_text(row, int(probs[row].argmax()))
        assert math.isclose(line["answer_prob"], float(probs[row].max()), rel_tol=1e-6)
        assert line["facts"] == paths[row].tolist()
        assert line["fact_tokens"] == [list(record.facts[fact]) for fact in line["facts"]]
        assert line["given_answer"] == record.answer and line["correct"] == (line["answer"] == record.answer)
    assert lines == predict_qa(head, test)
    hits = sum(line["answer"] == record.answer for line, record in zip(lines, test.records))
    assert results["answer_accuracy"] == hits / len(lines)


def test_qa_command_without_supporting_gives_null_fact_accuracy(tmp_path):
    records = [QARecord((("a", "is", "x"), ("b", "is", "y")), ("what", name), answer)
               for name, answer in (("a", "x"), ("b", "y"))] * 4
    write_qa_jsonl(records, tmp_path / "train.jsonl")
    out = tmp_path / "run"
    assert main(["qa", "--train", str(tmp_path / "train.jsonl"), "--test", str(tmp_path / "train.jsonl"), "--hops",
                 "1", "--steps", "3", "--out", str(out), "--no-progress"]) == 0
    results = json.loads((out / "results.json").read_text())
    assert results["fact_accuracy"] is None and results["hops"] == 1 and results["hop_fact_accuracy"] is None
    # A finished run resumes to the same head and results; --overwrite trains again from the start.
    argv = ["qa", "--train", str(tmp_path / "train.jsonl"), "--test", str(tmp_path / "train.jsonl"), "--hops", "1",
            "--steps", "3", "--out", str(out), "--no-progress"]
    assert main(argv + ["--resume"]) == 0
    resumed = json.loads((out / "results.json").read_text())
    assert {k: v for k, v in resumed.items() if k != "seconds"} == {k: v for k, v in results.items() if k != "seconds"}
    assert main(argv + ["--overwrite"]) == 0
    assert load_qa_checkpoint(out / "checkpoint.pt")[2]["step"] == 3


def test_qa_command_errors_are_one_line_and_nothing_is_trained(family_files, tmp_path, capsys):
    train_path, test_path = family_files
    bad = tmp_path / "bad.jsonl"
    bad.write_text(train_path.read_text() + '{"facts": [["a"]], "question": ["q"], "answer": 7}\n')
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "checkpoint.pt").write_bytes(b"trained")
    cases = [
        (["--train", str(bad), "--test", str(test_path), "--out", str(tmp_path / "o")], f"{bad}:81: answer:"),
        (["--train", str(train_path), "--test", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "o")], "none.jsonl"),
        (["--train", str(train_path), "--test", str(test_path), "--out", str(taken)], "--overwrite"),
        (["--train", str(train_path), "--test", str(test_path), "--out", str(tmp_path / "o"), "--valid-fraction", "1.5"],
         "--valid-fraction"),
    ]
    for argv, fragment in cases:
        code = main(["qa", "--hops", "2", "--steps", "1", "--no-progress", *argv])
        lines = capsys.readouterr().err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and fragment in lines[0], (argv, lines)
    assert not (tmp_path / "o" / "checkpoint.pt").exists()
    assert (taken / "checkpoint.pt").read_bytes() == b"trained"


def test_babi_command_runs_the_facts_head_by_default(tmp_path, capsys):
    out = tmp_path / "babi"
    code = main(["babi", "--task", "1", "--max-train", "200", "--steps", "30", "--out", str(out), "--no-progress"])
    assert code == 0
    results = json.loads((out / "results.json").read_text())
    # The default hops are the task's supporting facts (1), and the run went through the facts path.
    assert results["encoding"] == "facts" and results["hops"] == 1 and results["task"] == 1
    assert results["n_train"] == 200 and results["n_test"] == 1000
    assert results["answer_accuracy"] > 0.5 and results["fact_accuracy"] > 0.5
    assert len((out / "predictions.jsonl").read_text().splitlines()) == 1000
    head, vocabulary, state = load_qa_checkpoint(out / "checkpoint.pt")
    assert type(head).__name__ == "FactAttention" and vocabulary.num_fields == 6
    # Its checkpoint is a qa checkpoint: evaluate on the test questions as a facts file gives the run's scores.
    test = write_qa_jsonl(load_task_records(1, max_train=200)[1], tmp_path / "babi_test.jsonl")
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(out / "checkpoint.pt"), "--data", str(test)]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["n"] == 1000 and scores["model"] == "FactAttention"
    for key in ("answer_accuracy", "fact_accuracy", "hop_fact_accuracy"):
        assert scores[key] == results[key], key
    assert math.isclose(scores["log_likelihood"], results["log_likelihood"], rel_tol=1e-6)
    capsys.readouterr()
    code = main(["babi", "--task", "1", "--method", "em", "--out", str(tmp_path / "em")])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "--encoding positions" in lines[0]


def test_qa_comparison_flag_turns_the_emission_comparison_on(family_files, tmp_path):
    """Every answer of these files is in a fact of its question: by default the comparison stays off (one start);
    --comparison turns it on (with starts without it), --no-comparison keeps it off."""
    train_path, test_path = family_files
    for flag, expected in (([], False), (["--comparison"], True), (["--no-comparison"], False)):
        out = tmp_path / f"run{len(flag)}{flag[0] if flag else ''}"
        assert main(["qa", "--train", str(train_path), "--test", str(test_path), "--hops", "2", "--steps", "1",
                     "--out", str(out), "--no-progress", *flag]) == 0
        head = load_checkpoint(out / "checkpoint.pt")[0]
        results = json.loads((out / "results.json").read_text())
        assert head.comparison is expected and results["comparison"] is expected
        assert len(results.get("starts", [None])) == (COMPARISON_STARTS if expected else 1)
        kept = next((start for start in results.get("starts", []) if start["kept"]), {"start_from": ""})
        weighs = expected and "without its comparison" not in kept["start_from"]
        assert (float(head.emission_mix.detach().softmax(-1)[-1]) > 0) is weighs
