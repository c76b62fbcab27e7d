"""``pyro-multihop qa --starts K`` and the diagnostics of a qa run: every start recorded in results.json with the
best held-out one kept, a run that did not get going printed and recorded, the findings as warnings without a log."""

import dataclasses
import json
import random

import pytest
import torch

from pyro_multihop.checkpoint import load_checkpoint
from pyro_multihop.cli import main
from pyro_multihop.datasets.qa_jsonl import QARecord, write_qa_jsonl
from pyro_multihop.diagnostics import FlatHopWarning
from pyro_multihop.experiments.qa import comparison_note, load_qa_checkpoint, run_qa


def home_records(n, seed, alias=False):
    """One hop: "where X?" over three (person, lives, city) facts, shuffled; supporting = X's fact. ``alias``: the
    question names X by another token (``ask-X``), so that no question token equals a fact's and the head's start,
    which matches equal symbols, attends every fact alike."""
    rng = random.Random(seed)
    people, cities = [f"p{i}" for i in range(8)], [f"c{i}" for i in range(5)]
    records = []
    for _ in range(n):
        chosen = rng.sample(people, 3)
        facts = [(person, "lives", rng.choice(cities)) for person in chosen]
        asked = rng.randrange(3)
        asked_token = f"ask-{chosen[asked]}" if alias else chosen[asked]
        records.append(QARecord(tuple(facts), ("where", asked_token), facts[asked][2], (asked,)))
    return records


@pytest.fixture()
def home_files(tmp_path):
    return (write_qa_jsonl(home_records(60, 0), tmp_path / "train.jsonl"),
            write_qa_jsonl(home_records(12, 1), tmp_path / "test.jsonl"))


def qa(home_files, out, *extra):
    train, test = home_files
    return main(["qa", "--train", str(train), "--test", str(test), "--hops", "1", "--steps", "40", "--out", str(out),
                 "--no-progress", *extra])


def test_qa_starts_records_every_start_and_keeps_the_best_held_out_one(home_files, tmp_path, capsys):
    out = tmp_path / "run"
    assert qa(home_files, out, "--starts", "2", "--processes", "1") == 0
    results = json.loads((out / "results.json").read_text())
    starts = results["starts"]
    assert [record["start"] for record in starts] == [0, 1] and starts[0]["seed"] == 0
    assert sum(record["kept"] for record in starts) == 1
    kept = next(record for record in starts if record["kept"])
    assert kept["val_log_likelihood"] == max(record["val_log_likelihood"] for record in starts)
    assert {"train_log_likelihood", "val_accuracy", "divergences", "diagnostics"} <= set(kept)
    assert isinstance(results["diagnostics"], list)
    err = capsys.readouterr().err
    assert f"pyro-multihop: note: 2 starts, kept start {kept['start']}" in err
    # The checkpoint holds the kept start's parameters.
    head, _, _ = load_qa_checkpoint(out / "checkpoint.pt")
    kept_head, _ = load_checkpoint(out / f"checkpoint.start{kept['start']}.pt")
    for (name, value), (_, kept_value) in zip(head.state_dict().items(), kept_head.state_dict().items()):
        assert torch.equal(value, kept_value), name


def test_a_qa_run_that_does_not_move_prints_and_records_why(tmp_path, capsys):
    out = tmp_path / "stuck"
    aliased = (write_qa_jsonl(home_records(60, 0, alias=True), tmp_path / "train.jsonl"),
               write_qa_jsonl(home_records(12, 1, alias=True), tmp_path / "test.jsonl"))
    assert qa(aliased, out, "--lr", "1e-9") == 0  # 40 steps (the guard's warm-up) that move nothing
    results = json.loads((out / "results.json").read_text())
    kinds = [record["kind"] for record in results["diagnostics"]]
    # The fit's finding first, then the hop diagnostics on the test questions (flat: the head stayed uniform).
    assert kinds == ["training_stuck", "flat_hop"] and "starts" not in results
    stuck = results["diagnostics"][0]
    assert "within 1% of its" in stuck["message"] and "--starts" in stuck["hint"]
    lines = [line for line in capsys.readouterr().err.splitlines() if line.startswith("pyro-multihop: warning: ")]
    assert len(lines) == 2
    for line, record in zip(lines, results["diagnostics"]):
        hint = record["hint"][len("try "):] if record["hint"].startswith("try ") else record["hint"]
        assert line == f"pyro-multihop: warning: {record['message']} (try: {hint})"


def test_run_qa_without_a_log_warns_its_findings(tmp_path):
    train, test = home_records(20, 0, alias=True), home_records(6, 1, alias=True)
    with pytest.warns(FlatHopWarning, match="hop 1's posterior is flat"):
        results = run_qa(train, test, 1, tmp_path / "api", steps=1)
    assert [record["kind"] for record in results["diagnostics"]] == ["flat_hop"]


@pytest.mark.parametrize("starts", [1, 3, 8])
def test_the_comparison_note_says_the_starts_that_are_fitted(tmp_path, capsys, starts):
    """Answers outside the facts turn the comparison on; the note names the starts the run fits, not the default's
    eight when fewer are asked (``--starts 1`` once printed "1 starts, with and without it, ..."). The composition,
    which such answers turn on too, is off here (its starts are test_qa_composition.py's)."""
    records = [dataclasses.replace(record, answer="yes") if index % 2 else record
               for index, record in enumerate(home_records(24, 2))]
    train = write_qa_jsonl(records, tmp_path / "train.jsonl")
    test = write_qa_jsonl(records[:4], tmp_path / "test.jsonl")
    assert main(["qa", "--train", str(train), "--test", str(test), "--hops", "1", "--steps", "1", "--starts",
                 str(starts), "--processes", "1", "--composition", "0", "--out", str(tmp_path / "run"),
                 "--no-progress"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "comparison is on" in line]
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["comparison"] and len(results.get("starts", [None])) == starts
    assert notes == [f"pyro-multihop: {comparison_note(starts)}"]
    said = notes[0]
    if starts == 1:
        assert "; 1 start, the head's own, with it (--starts 8: " in said
    elif starts < 8:
        assert f"; {starts} starts, the first {starts} of the default 8 (with and without it," in said
    else:
        assert "; 8 starts, with and without it, from the equality weights at 1 and at 0, with and without the " \
               "word-order terms, the best held-out log-likelihood kept (--no-comparison: off)" in said
