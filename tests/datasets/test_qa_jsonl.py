"""The QA JSON Lines format: strict reading (errors name file, line and field), round trips, the facts-to-fields
rule, the vocabulary and its copy slots for tokens the training file never showed."""

import json

import pytest
import torch

from pyro_multihop.datasets import qa_jsonl
from pyro_multihop.datasets.qa_jsonl import QAFormatError, QARecord, QAVocabulary

LINES = [
    {"facts": [["mary", "moved", "bathroom"], ["mary", "got", "football"]], "question": ["where", "is", "the", "football"],
     "answer": "bathroom", "supporting": [1, 0]},
    {"facts": [["john", "went", "new york"]], "question": ["where", "is", "john"], "answer": "new york"},
    {"facts": [["ann"], ["ann", "likes", "tea", "a lot"], ["bob", "likes", "ann"]], "question": ["who"], "answer": "tea",
     "supporting": [2]},
]


def write_lines(path, lines):
    path.write_text("".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines))
    return path


def test_round_trip_write_then_read(tmp_path):
    path = write_lines(tmp_path / "train.jsonl", LINES)
    records = qa_jsonl.read_qa_jsonl(path)
    assert [qa_jsonl.record_to_json(record) for record in records] == LINES
    assert records[0].facts[1] == ("mary", "got", "football") and records[0].supporting == (1, 0)
    assert records[1].supporting is None and records[2].source == f"{path}:3"
    again = qa_jsonl.read_qa_jsonl(qa_jsonl.write_qa_jsonl(records, tmp_path / "copy.jsonl"))
    assert [(r.facts, r.question, r.answer, r.supporting) for r in again] == [
        (r.facts, r.question, r.answer, r.supporting) for r in records]


def test_blank_lines_are_skipped_and_line_numbers_kept(tmp_path):
    path = write_lines(tmp_path / "train.jsonl", [LINES[0], "", "   ", LINES[1]])
    records = qa_jsonl.read_qa_jsonl(path)
    assert [record.source for record in records] == [f"{path}:1", f"{path}:4"]


GOOD = json.dumps(LINES[1])


@pytest.mark.parametrize(
    "line, field",
    [
        ('{"facts": [["a"]], "question": ["q"], "answer": "a"', "not a JSON object"),
        ('[1, 2]', "expected a JSON object"),
        ('{"facts": [["a"]], "question": ["q"]}', "answer: missing"),
        ('{"question": ["q"], "answer": "a"}', "facts: missing"),
        ('{"facts": [["a"]], "question": ["q"], "answer": "a", "hint": 1}', "hint: unknown field"),
        ('{"facts": [], "question": ["q"], "answer": "a"}', "facts: expected a non-empty list"),
        ('{"facts": [["a"], []], "question": ["q"], "answer": "a"}', r"facts\[1\]: expected a non-empty list"),
        ('{"facts": [["a", 3]], "question": ["q"], "answer": "a"}', r"facts\[0\]\[1\]: expected a non-empty string, got 3"),
        ('{"facts": [["a", " "]], "question": ["q"], "answer": "a"}', r"facts\[0\]\[1\]: expected a non-empty string"),
        ('{"facts": [["a"]], "question": "q", "answer": "a"}', "question: expected a non-empty list"),
        ('{"facts": [["a"]], "question": ["q"], "answer": ["a"]}', "answer: expected a non-empty string"),
        ('{"facts": [["a"]], "question": ["q"], "answer": ""}', "answer: expected a non-empty string"),
        ('{"facts": [["a"]], "question": ["q"], "answer": "a", "supporting": [1]}', r"supporting\[0\]: expected a fact index from 0 to 0, got 1"),
        ('{"facts": [["a"]], "question": ["q"], "answer": "a", "supporting": [true]}', r"supporting\[0\]"),
        ('{"facts": [["a"]], "question": ["q"], "answer": "a", "supporting": []}', "supporting: expected a non-empty list"),
    ],
)
def test_a_malformed_line_names_the_file_the_line_and_the_field(tmp_path, line, field):
    path = write_lines(tmp_path / "data.jsonl", [GOOD, GOOD, line, GOOD])
    with pytest.raises(QAFormatError, match=field) as error:
        qa_jsonl.read_qa_jsonl(path)
    assert str(error.value).startswith(f"{path}:3: ")
    assert isinstance(error.value, ValueError)


def test_nothing_is_half_loaded_and_empty_files_are_errors(tmp_path):
    # The bad line is the last one: the reader still returns nothing.
    path = write_lines(tmp_path / "data.jsonl", [GOOD] * 5 + ['{"facts": 1, "question": ["q"], "answer": "a"}'])
    with pytest.raises(QAFormatError, match=":6: facts"):
        qa_jsonl.read_qa_jsonl(path)
    with pytest.raises(QAFormatError, match="no questions"):
        qa_jsonl.read_qa_jsonl(write_lines(tmp_path / "empty.jsonl", ["", ""]))
    with pytest.raises(FileNotFoundError):
        qa_jsonl.read_qa_jsonl(tmp_path / "missing.jsonl")


def test_facts_fill_fields_in_order_with_masks(tmp_path):
    records = qa_jsonl.read_qa_jsonl(write_lines(tmp_path / "train.jsonl", LINES))
    vocabulary = QAVocabulary.build(records)
    assert vocabulary.num_fields == 4  # the longest training fact
    data = vocabulary.encode(records)
    obs, name = data.obs, vocabulary.symbols
    assert obs.facts.shape == (3, 3, 4) and obs.question.shape == (3, 4)
    assert obs.fact_mask.tolist() == [[True, True, False], [True, False, False], [True, True, True]]
    assert obs.field_mask[2].tolist() == [[True, False, False, False], [True] * 4, [True, True, True, False]]
    assert [name[s] for s in obs.facts[2, 1].tolist()] == ["ann", "likes", "tea", "a lot"]
    assert [name[s] for s in obs.facts[1, 0, :3].tolist()] == ["john", "went", "new york"]
    assert [name[s] for s in obs.question[0].tolist()] == ["where", "is", "the", "football"]
    assert obs.question_mask.sum(-1).tolist() == [4, 3, 1]
    # The answer is a symbol of the same table: the phrase "new york" is one symbol, the token of the fact.
    assert obs.target[1] == obs.facts[1, 0, 2] and name[int(obs.target[1])] == "new york"
    assert obs.supporting.tolist() == [[1, 0], [-1, -1], [2, -1]]
    # Every symbol index maps back to the token: the symbol table is the sorted training tokens after <unk>.
    assert vocabulary.symbols[0] == "<unk>" and vocabulary.known == sorted(vocabulary.known)


def test_unseen_tokens_get_copy_slots_that_the_answer_can_name(tmp_path):
    train = qa_jsonl.read_qa_jsonl(write_lines(tmp_path / "train.jsonl", LINES))
    vocabulary = QAVocabulary.build(train, copy_slots=2)
    test_lines = [
        # "oslo" and "zoe" never occurred in training: slots 1 and 2, in order of first appearance.
        {"facts": [["zoe", "moved", "oslo"], ["zoe", "got", "football"]], "question": ["where", "is", "zoe"], "answer": "oslo"},
        # three unseen tokens but two slots: the third is <unk>; an answer found nowhere is <unk>.
        {"facts": [["p", "q", "r"]], "question": ["where"], "answer": "s"},
    ]
    test = vocabulary.encode(qa_jsonl.read_qa_jsonl(write_lines(tmp_path / "test.jsonl", test_lines)))
    known = vocabulary.num_known
    assert test.new_tokens == [("zoe", "oslo"), ("p", "q")]
    assert test.obs.facts[0, :, 0].tolist() == [known, known] and int(test.obs.facts[0, 0, 2]) == known + 1
    assert int(test.obs.target[0]) == known + 1 and test.answer_text(0, known + 1) == "oslo"
    assert test.obs.facts[1, 0, :3].tolist() == [known, known + 1, 0] and int(test.obs.target[1]) == 0
    assert test.answer_text(1, known) == "p" and test.answer_text(0, vocabulary.index("tea")) == "tea"
    # Accuracy compares texts, so predicting <unk> for an answer found nowhere is no hit.
    assert test.answer_accuracy(torch.tensor([known + 1, 0])) == 0.5
    assert vocabulary.num_symbols == known + 2


def test_a_fact_longer_than_the_fields_is_an_error_naming_it(tmp_path):
    vocabulary = QAVocabulary.build(qa_jsonl.read_qa_jsonl(write_lines(tmp_path / "train.jsonl", LINES)))
    path = write_lines(tmp_path / "test.jsonl", [{"facts": [["a"], ["a", "b", "c", "d", "e"]], "question": ["q"], "answer": "a"}])
    with pytest.raises(QAFormatError, match=rf"{path}:1: facts\[1\]: has 5 tokens, more than the 4 fields"):
        vocabulary.encode(qa_jsonl.read_qa_jsonl(path))


def test_vocabulary_round_trips_through_a_dictionary_and_rejects_bad_sizes(tmp_path):
    vocabulary = QAVocabulary.build(qa_jsonl.read_qa_jsonl(write_lines(tmp_path / "train.jsonl", LINES)))
    payload = json.loads(json.dumps(vocabulary.to_dict()))
    assert QAVocabulary.from_dict(payload) == vocabulary
    with pytest.raises(ValueError, match="num_fields"):
        QAVocabulary(["a"], 0, 1)
    with pytest.raises(ValueError, match="copy_slots"):
        QAVocabulary(["a"], 1, -1)
    with pytest.raises(ValueError, match="repeated"):
        QAVocabulary(["a", "a"], 1, 1)
    with pytest.raises(ValueError, match="num_fields is 2"):
        QAVocabulary.build([QARecord((("a", "b", "c"),), ("q",), "a", None, "x:1")], num_fields=2)


def test_supporting_matches_merges_repeats_and_keeps_order():
    paths = torch.tensor([[3, 6], [6, 3], [3, 3], [3, 6], [3, 3]])
    supporting = [(3, 6), (3, 6), (3,), (3, 6, 9), None]
    assert qa_jsonl.supporting_matches(paths, supporting).tolist() == [True, False, True, False, False]


def test_hop_fact_accuracy_counts_each_hop_against_its_supporting_fact(tmp_path):
    records = qa_jsonl.read_qa_jsonl(write_lines(tmp_path / "train.jsonl", LINES))
    data = QAVocabulary.build(records).encode(records)
    paths = torch.tensor([[1, 2], [0, 0], [2, 1]])
    # Row 0 has supporting (1, 0): hop 1 right, hop 2 wrong; row 1 is unannotated; row 2 has (2,): hop 1 right.
    assert data.hop_fact_accuracy(paths) == [1.0, 0.0]
    assert data.fact_accuracy(paths) == 0.0
    assert data.fact_accuracy(torch.tensor([[1, 0], [0, 0], [2, 2]])) == 1.0


def test_ids_are_read_and_written_and_a_bad_id_names_its_line(tmp_path):
    lines = [dict(LINES[0], id="q-1"), dict(LINES[1], id=7), LINES[2]]
    path = write_lines(tmp_path / "train.jsonl", lines)
    records = qa_jsonl.read_qa_jsonl(path)
    assert [record.id for record in records] == ["q-1", 7, None]
    assert [qa_jsonl.record_to_json(record) for record in records] == lines
    assert list(qa_jsonl.record_to_json(records[0]))[0] == "id"  # the id leads the line
    for bad in ("true", "1.5", "[1]", '""', "null"):
        path = write_lines(tmp_path / "bad.jsonl", [GOOD, f'{{"id": {bad}, "facts": [["a"]], "question": ["q"], "answer": "a"}}'])
        with pytest.raises(QAFormatError, match=rf"{path}:2: id: expected a non-empty string or an integer"):
            qa_jsonl.read_qa_jsonl(path)


def test_questions_without_answers_are_read_on_request_and_refused_where_answers_are_needed(tmp_path):
    path = write_lines(tmp_path / "ask.jsonl", [{"id": "a", "facts": [["ann", "lives in", "oslo"]], "question": ["where", "ann"]},
                                                LINES[1]])
    with pytest.raises(QAFormatError, match=rf"{path}:1: answer: missing \(every line needs facts, question and answer\)"):
        qa_jsonl.read_qa_jsonl(path)
    records = qa_jsonl.read_qa_jsonl(path, require_answer=False)
    assert records[0].answer is None and records[1].answer == "new york"
    assert qa_jsonl.record_to_json(records[0]) == {"id": "a", "facts": [["ann", "lives in", "oslo"]], "question": ["where", "ann"]}
    with pytest.raises(QAFormatError, match="facts: missing"):
        qa_jsonl.read_qa_jsonl(write_lines(tmp_path / "bad.jsonl", ['{"question": ["q"]}']), require_answer=False)
    with pytest.raises(QAFormatError, match=rf"{path}:1: answer: missing \(training needs"):
        QAVocabulary.build(records)
    vocabulary = QAVocabulary.build(qa_jsonl.read_qa_jsonl(write_lines(tmp_path / "train.jsonl", LINES)))
    data = vocabulary.encode(records)
    assert data.answered == [False, True] and int(data.obs.target[0]) == 0
    with pytest.raises(QAFormatError, match=rf"{path}:1: answer: missing \(answer accuracy needs"):
        data.answer_accuracy(torch.tensor([0, 0]))


def test_answers_that_no_fact_holds_are_counted_with_their_first_lines(tmp_path):
    inside = {"facts": [["ann", "lives in", "oslo"]], "question": ["where", "ann"], "answer": "oslo"}
    # "oslo lives" is no token: a token is a whole string; and a question token is not a fact.
    outside = [dict(inside, answer=answer) for answer in ("rome", "oslo lives", "ann lives in", "where")] * 2
    path = write_lines(tmp_path / "train.jsonl", [inside, *outside, {"facts": [["a"]], "question": ["q"], "answer": "a"}])
    records = qa_jsonl.read_qa_jsonl(path)
    assert qa_jsonl.answers_outside_facts(records) == [f"{path}:{line}" for line in range(2, 10)]
    message = qa_jsonl.answers_outside_facts_message(records, "training")
    assert message.startswith(f"8 of 10 training answers occur in no fact of their question ({path}:2, {path}:3, ")
    assert f"{path}:6, ...)" in message and "only the emission table can learn them" in message
    with pytest.warns(qa_jsonl.AnswerNotInFactsWarning, match="8 of 10 test answers") as caught:
        assert qa_jsonl.warn_answers_outside_facts(records, "test").startswith("8 of 10 test answers")
    assert caught[0].filename == __file__  # the warning points at the caller
    assert qa_jsonl.answers_outside_facts_message(records[:1], "training") is None
    unanswered = [QARecord((("a",),), ("q",), None, None, "x:1")]
    assert qa_jsonl.answers_outside_facts(unanswered) == []
