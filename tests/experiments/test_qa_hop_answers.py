"""An answer per hop through the qa layer (experiments/qa.py's ``hop_answer_parts``, ``run_qa``): the rule that
turns answers of ``L`` parts into ``FactAttention``'s ``answer_parts``, learning on a simulated route-finding task
whose generating structure answers every question (accuracy 1.0), and bAbI task 19 relabelled."""

import dataclasses
import json
import random

import pytest
import torch

from pyro_multihop.datasets import babi, babi_facts
from pyro_multihop.datasets.qa_jsonl import QARecord, QAVocabulary
from pyro_multihop.experiments.qa import hop_answer_parts, load_qa_checkpoint, run_qa
from pyro_multihop.experiments.qa_apply import path_records
from tests.datasets.test_babi_facts import relabelled_copy

OPPOSITE = {0: 1, 1: 0, 2: 3, 3: 2}


def route_records(n, seed, places=8):
    """Stories of ``the A is dD of the B`` facts (A lies dD of B), a two-step route from a source to a destination
    and two facts that name neither the source nor the middle; the answer is the way out of each room,
    ``uK,uK'``. The source is in one fact, so the route is determined by the question: a model of the
    generating structure answers every question."""
    rng = random.Random(seed)
    records = []
    for _ in range(n):
        source, middle, destination, *others = rng.sample(range(places), places)
        facts, steps = [], []
        for start, end in ((source, middle), (middle, destination)):
            direction = rng.randrange(4)  # end lies `direction` of start: from start, go `direction`
            if rng.random() < 0.5:
                facts.append(("the", f"p{end}", "is", f"d{direction}", "of", "the", f"p{start}"))
            else:
                facts.append(("the", f"p{start}", "is", f"d{OPPOSITE[direction]}", "of", "the", f"p{end}"))
            steps.append(direction)
        for _ in range(2):
            a, b = rng.sample(others, 2)
            facts.append(("the", f"p{a}", "is", f"d{rng.randrange(4)}", "of", "the", f"p{b}"))
        order = list(range(len(facts)))
        rng.shuffle(order)
        shuffled = tuple(facts[k] for k in order)
        supporting = (order.index(0), order.index(1))
        records.append(QARecord(shuffled, ("how", "from", f"p{source}", "to", f"p{destination}"),
                                ",".join(f"u{step}" for step in steps), supporting))
    return records


def test_hop_answer_parts_numbers_the_parts_of_every_answer():
    records = route_records(40, seed=1)
    vocabulary = QAVocabulary.build(records)
    parts = hop_answer_parts(records, vocabulary, 2)
    names = sorted({part for record in records for part in record.answer.split(",")})
    assert len(parts) == len({record.answer for record in records})
    for record in records:
        assert parts[vocabulary.index(record.answer)] == [names.index(p) for p in record.answer.split(",")]
    assert hop_answer_parts(records, vocabulary, 3) is None  # two parts, three hops: emitted at the last hop
    assert hop_answer_parts(records, vocabulary, 1) is None
    mixed = records[:5] + [dataclasses.replace(records[5], answer="u1")]
    assert hop_answer_parts(mixed, QAVocabulary.build(mixed), 2) is None  # one answer of one part


def test_a_route_is_learnt_as_the_generating_structure_answers_it(tmp_path):
    """The generating structure answers every test question (its route is the only one from the source); the
    fit reaches it on questions it never saw, one part from each hop's fact read from the side it enters."""
    results = run_qa(route_records(300, seed=2), route_records(200, seed=3), 2, tmp_path / "run", steps=300)
    assert results["answer_per_hop"] is True and results["comparison"] is False and results["path_normalised"] is True
    assert results["answer_accuracy"] >= 0.95 and results["fact_accuracy"] >= 0.95
    lines = [json.loads(line) for line in (tmp_path / "run" / "predictions.jsonl").read_text().splitlines()]
    assert all(len(line["answer"].split(",")) == 2 for line in lines)


def _renamed_parts(text, mapping):
    return ",".join(" ".join(mapping[word] for word in part.split()) for part in text.split(","))


def test_task_19_relabelled_gives_the_same_predictions(tmp_path):
    """bAbI's path finding with every word relabelled (the answers' letters too): the same answers, renamed, and
    the same paths, as the head starts at one value whatever the symbols and numbers the parts in sorted order."""
    relabelled_dir = tmp_path / "en"
    mapping = relabelled_copy([19], relabelled_dir)
    outcomes = []
    for k, data_dir in enumerate((babi.DEFAULT_DATA_DIR, relabelled_dir)):
        train, test = babi_facts.load_task_records(19, data_dir=data_dir, max_train=200)
        results = run_qa(train, test[:200], 2, tmp_path / f"run{k}", steps=80)
        lines = [json.loads(line) for line in (tmp_path / f"run{k}" / "predictions.jsonl").read_text().splitlines()]
        outcomes.append((results, lines))
    (results, lines), (results_r, lines_r) = outcomes
    assert results["answer_per_hop"] and results_r["answer_per_hop"]
    same = [_renamed_parts(a["answer"], mapping) == b["answer"] and a["facts"] == b["facts"]
            for a, b in zip(lines, lines_r)]
    assert sum(same) >= 0.99 * len(same)
    assert abs(results["answer_accuracy"] - results_r["answer_accuracy"]) <= 0.01
    assert results["answer_accuracy"] > 0.3  # it learnt something (chance: 1 in 12)


@pytest.mark.parametrize("answer, symbol", [("s,e", "s,e"), ("Football,apple.", "football,apple"),
                                            ("nothing", "nothing"), ("New York", "new york")])
def test_a_list_answer_keeps_its_parts(answer, symbol):
    assert babi_facts.answer_symbol(answer) == symbol


def test_the_babi_command_says_task_19_per_hop_and_its_checkpoint_evaluates(tmp_path, capsys):
    """``babi --task 19``: the answer per hop and the path-normalised chain by default, ``--no-path-normalised``
    turns the latter off; ``evaluate`` on the run's checkpoint gives the run's scores."""
    from pyro_multihop.cli import main
    from pyro_multihop.datasets.qa_jsonl import write_qa_jsonl

    common = ["babi", "--task", "19", "--max-train", "100", "--steps", "30", "--no-progress"]
    assert main(common + ["--out", str(tmp_path / "on")]) == 0
    err = capsys.readouterr().err
    assert "the answer is said per hop" in err and "occur in no fact" not in err  # no word of the emission table
    assert main(common + ["--no-path-normalised", "--out", str(tmp_path / "off")]) == 0
    on, off = (json.loads((tmp_path / name / "results.json").read_text()) for name in ("on", "off"))
    assert on["answer_per_hop"] and off["answer_per_hop"] and on["comparison"] is False
    assert on["path_normalised"] is True and off["path_normalised"] is False
    assert on["log_likelihood"] != off["log_likelihood"]
    test = write_qa_jsonl(babi_facts.load_task_records(19, max_train=100)[1], tmp_path / "test.jsonl")
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(tmp_path / "on" / "checkpoint.pt"), "--data", str(test)]) == 0
    scores = json.loads(capsys.readouterr().out)
    assert scores["answer_accuracy"] == on["answer_accuracy"] and scores["fact_accuracy"] == on["fact_accuracy"]
    # a trained model on new questions: the question-only paths and those given the answer, k best and sampled
    model = load_qa_checkpoint(tmp_path / "on" / "checkpoint.pt")
    records = babi_facts.load_task_records(19, max_train=100)[1][:3]
    for entry, record in zip(path_records(model, records, k=2, num_samples=4), records):
        assert entry["given_answer"] == record.answer and len(entry["question_only"]["k_best"]) == 2
        assert sum(sample["count"] for sample in entry["given_answer_paths"]["samples"]) == 4


def test_the_memory_estimate_counts_the_parts_tables():
    """``head_memory_bytes(num_parts=D)`` adds the parameters the head allocates for its parts (counted from the
    head, not from the formula), and a machine too small for them is told so before anything is allocated."""
    from pyro_multihop.experiments.qa import HeadMemoryError, check_head_memory, facts_head, head_memory_bytes

    records = route_records(20, seed=4)
    vocabulary = QAVocabulary.build(records)
    parts = hop_answer_parts(records, vocabulary, 2)
    head = facts_head(vocabulary, 2, 5, answer_parts=parts)
    plain, with_parts = head_memory_bytes(vocabulary, 2, 5), head_memory_bytes(vocabulary, 2, 5, num_parts=4)
    size = torch.finfo(torch.get_default_dtype()).bits // 8
    assert with_parts["parameters"] - plain["parameters"] == head.part_tables.numel() * size
    with pytest.raises(HeadMemoryError, match="part_tables"):
        check_head_memory(vocabulary, 2, 5, available=with_parts["training"] - 1, num_parts=10**5)
