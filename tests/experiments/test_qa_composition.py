"""``pyro-multihop qa --composition D``: the composition of two facts in the emission through the command, recorded
in results.json, with the composition alone as start 1; refused beside an answer per hop."""

import json
import random

from pyro_multihop.cli import main
from pyro_multihop.datasets.qa_jsonl import QARecord, write_qa_jsonl


def size_records(n, seed):
    """Two facts chain A, C and B by size ("a above c" / "c below a" say the same), the question asks whether A is
    above B; the answer "yes" or "no" is in no fact."""
    rng = random.Random(seed)
    records = []
    for _ in range(n):
        a, c, b = rng.sample([f"e{i}" for i in range(12)], 3)
        a_above = rng.random() < 0.5

        def stated(x, y, x_above):
            return (x, "above" if x_above else "below", y) if rng.random() < 0.5 else \
                (y, "below" if x_above else "above", x)

        facts = [stated(a, c, a_above), stated(c, b, a_above)]
        rng.shuffle(facts)
        asked = rng.choice(["higher", "lower"])
        records.append(QARecord(tuple(facts), (a, asked, b), "yes" if a_above == (asked == "higher") else "no",
                                None))
    return records


def test_qa_composition_is_recorded_with_the_composition_alone_as_start_one(tmp_path, capsys):
    train = write_qa_jsonl(size_records(40, 0), tmp_path / "train.jsonl")
    test = write_qa_jsonl(size_records(8, 1), tmp_path / "test.jsonl")
    assert main(["qa", "--train", str(train), "--test", str(test), "--hops", "1", "--steps", "2", "--starts", "2",
                 "--processes", "1", "--composition", "2", "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    results = json.loads((tmp_path / "run" / "results.json").read_text())
    assert results["composition"] == 2
    assert [start["start_from"] for start in results["starts"]] == ["the head's own start", "the composition alone"]
    notes = capsys.readouterr().err
    assert ("note: the emission mixes in a composition of two facts (2 dimensions): a yes / no from what two facts "
            "state together; start 1 of the 2 is the composition alone") in notes
    assert main(["qa", "--train", str(train), "--test", str(test), "--hops", "1", "--steps", "1",
                 "--out", str(tmp_path / "plain"), "--no-progress"]) == 0
    assert json.loads((tmp_path / "plain" / "results.json").read_text())["composition"] is None


def test_qa_composition_beside_an_answer_per_hop_is_refused(tmp_path, capsys):
    records = [QARecord((("a", "n", "b"), ("b", "e", "c")), ("a", "c"), "s,w") for _ in range(4)]
    train = write_qa_jsonl(records, tmp_path / "train.jsonl")
    assert main(["qa", "--train", str(train), "--test", str(train), "--hops", "2", "--steps", "1", "--composition",
                 "2", "--out", str(tmp_path / "run"), "--no-progress"]) != 0
    assert "error: composition and answer_parts cannot both be given" in capsys.readouterr().err
    assert not (tmp_path / "run" / "results.json").exists()
