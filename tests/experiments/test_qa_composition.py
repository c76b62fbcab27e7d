"""``pyro-multihop qa --composition D``: the composition of two facts in the emission through the command, recorded
in results.json, with the composition alone as start 1; on by default where the answers are verdicts (in no fact,
neither lists nor said per hop), off with 0; refused beside an answer per hop."""

import dataclasses
import json
import random

import pytest

from pyro_multihop.cli import main
from pyro_multihop.datasets.qa_jsonl import QARecord, write_qa_jsonl
from pyro_multihop.experiments import command_defaults
from pyro_multihop.experiments.qa import run_qa
from pyro_multihop.models import fact_composition


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
            "state together; start 1 of the 2 is the composition alone (--composition 0: off)") in notes


def test_the_composition_is_on_where_answers_are_verdicts_and_off_with_zero(tmp_path, capsys):
    """Without ``--composition``: on (:data:`COMPOSITION_DIM`) where some training answers are in no fact, with
    :data:`COMPOSITION_EXTRA_STARTS` more starts than the comparison's (the composition alone from three draws of its
    vectors, the head's own start without it), and the note says so; ``--composition 0`` off, the comparison's
    starts alone."""
    train = write_qa_jsonl(size_records(40, 0), tmp_path / "train.jsonl")
    extra = fact_composition.COMPOSITION_EXTRA_STARTS
    for flag, composition, starts in (([], command_defaults.COMPOSITION_DIM, command_defaults.COMPARISON_STARTS + extra),
                                      (["--composition", "0"], None, command_defaults.COMPARISON_STARTS)):
        out = tmp_path / f"run{len(flag)}"
        assert main(["qa", "--train", str(train), "--test", str(train), "--hops", "1", "--steps", "1",
                     "--processes", "1", "--out", str(out), "--no-progress", *flag]) == 0
        results = json.loads((out / "results.json").read_text())
        assert (results["composition"], len(results["starts"])) == (composition, starts), flag
        if composition:
            assert [start["start_from"] for start in results["starts"][1:5]] == [
                "the composition alone", "the composition alone and its symbol vectors from draw 1",
                "the composition alone and its symbol vectors from draw 2", "the emission without its composition"]
            assert (f"; starts 1-3 of the {starts} are the composition alone, the head's own starts follow without "
                    "it (--composition 0: off)") in capsys.readouterr().err


@pytest.mark.filterwarnings("ignore::pyro_multihop.datasets.qa_jsonl.AnswerNotInFactsWarning")
@pytest.mark.parametrize("answers", ["in a fact", "lists"])
def test_the_composition_stays_off_where_answers_are_in_facts_or_lists(tmp_path, answers):
    """Answers that a fact holds (a copy gives them) or lists (the held-set register's) are no verdicts: no
    composition by default."""
    records = size_records(12, 2)
    if answers == "in a fact":
        records = [dataclasses.replace(record, answer=record.facts[0][0]) for record in records]
    else:
        records = [dataclasses.replace(record, answer=f"{record.facts[0][0]},{record.facts[1][2]}")
                   for record in records]
    assert run_qa(records, records, 1, tmp_path / "run", steps=1, starts=1)["composition"] is None
    with pytest.raises(ValueError, match="composition must be a non-negative int"):
        run_qa(records, records, 1, tmp_path / "bad", steps=1, composition=-1)
    assert not (tmp_path / "bad").exists()


def test_qa_composition_beside_an_answer_per_hop_is_refused(tmp_path, capsys):
    records = [QARecord((("a", "n", "b"), ("b", "e", "c")), ("a", "c"), "s,w") for _ in range(4)]
    train = write_qa_jsonl(records, tmp_path / "train.jsonl")
    assert main(["qa", "--train", str(train), "--test", str(train), "--hops", "2", "--steps", "1", "--composition",
                 "2", "--out", str(tmp_path / "run"), "--no-progress"]) != 0
    assert "error: composition and answer_parts cannot both be given" in capsys.readouterr().err
    assert not (tmp_path / "run" / "results.json").exists()
