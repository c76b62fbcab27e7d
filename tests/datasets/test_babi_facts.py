"""bAbI statements as facts of fields: the generic rule (every token kept, in order), supporting facts as fact
indices, and invariance under relabelling every word, of the encoding on the nine first-filed tasks (of the ten
shipped) and of training on two of them."""

import random
import re
import string

import pytest
import torch

from pyro_multihop.datasets import babi, babi_facts
from pyro_multihop.datasets.qa_jsonl import QAVocabulary

TASKS = [1, 2, 3, 11, 12, 13, 14, 15, 16]

STORY = "".join(f"{line}\n" for line in [
    "1 Mary moved to the bathroom.", "2 John went to the hallway.", "3 Where is Mary? \tbathroom\t1",
    "4 Daniel went back to the hallway.", "5 Sandra moved to the garden.", "6 Where is Daniel? \thallway\t4",
    "7 Sandra went to New York.", "8 Where is Sandra? \tNew York\t7",
])


def test_every_token_is_a_field_in_order_and_supporting_facts_are_indices(tmp_path):
    path = tmp_path / "qa1_x_train.txt"
    path.write_text(STORY)
    records = babi_facts.babi_records(babi.read_babi(path))
    assert records[1].facts == (("mary", "moved", "to", "the", "bathroom"), ("john", "went", "to", "the", "hallway"),
                                ("daniel", "went", "back", "to", "the", "hallway"), ("sandra", "moved", "to", "the", "garden"))
    assert records[1].question == ("where", "is", "daniel") and records[1].answer == "hallway"
    assert [record.supporting for record in records] == [(0,), (2,), (4,)]
    # A multi-word answer is one symbol, the phrase; its words stay fields of the statement.
    assert records[2].answer == "new york" and records[2].facts[4] == ("sandra", "went", "to", "new", "york")
    # The memory keeps the last statements; a supporting fact outside it leaves the question unannotated.
    short = babi_facts.babi_records(babi.read_babi(path), memory=1)
    assert [len(r.facts) for r in short] == [1, 1, 1] and [r.supporting for r in short] == [None, None, (0,)]
    with pytest.raises(ValueError, match="memory"):
        babi_facts.babi_records(babi.read_babi(path), memory=0)


def relabelling(paths, seed=0):
    """A bijection from every word of the files (case folded) to a random 9-letter string."""
    words = set()
    for path in paths:
        words.update(word.lower() for word in re.findall(r"[A-Za-z]+", path.read_text()))
    rng = random.Random(seed)
    images = set()
    while len(images) < len(words):
        images.add("".join(rng.choice(string.ascii_lowercase) for _ in range(9)))
    return dict(zip(sorted(words), rng.sample(sorted(images), len(images))))


def relabelled_copy(tasks, destination):
    paths = [babi.task_files(babi.DEFAULT_DATA_DIR, task, split) for task in tasks for split in ("train", "test")]
    mapping = relabelling(paths)
    destination.mkdir()
    for path in paths:
        text = re.sub(r"[A-Za-z]+", lambda match: mapping[match.group(0).lower()], path.read_text())
        (destination / path.name).write_text(text)
    return mapping


def rename(text, mapping):
    return " ".join(mapping[word] for word in text.split())


def test_relabelling_every_word_gives_the_same_encoding_on_the_nine_tasks(tmp_path):
    relabelled_dir = tmp_path / "en"
    mapping = relabelled_copy(TASKS, relabelled_dir)
    for task in TASKS:
        train, test = babi_facts.load_task_records(task, max_train=300)
        train_r, test_r = babi_facts.load_task_records(task, data_dir=relabelled_dir, max_train=300)
        test, test_r = test[:300], test_r[:300]
        vocabulary, vocabulary_r = QAVocabulary.build(train), QAVocabulary.build(train_r)
        assert (vocabulary.num_fields, vocabulary.num_symbols) == (vocabulary_r.num_fields, vocabulary_r.num_symbols)
        # One renaming of the symbols maps every encoded tensor onto the relabelled one.
        renamed = [vocabulary_r.index(rename(symbol, mapping)) for symbol in vocabulary.known]
        permutation = torch.arange(vocabulary.num_symbols)
        permutation[1 : vocabulary.num_known] = torch.tensor(renamed)
        assert sorted(renamed) == list(range(1, vocabulary.num_known))
        for records, records_r in ((train, train_r), (test, test_r)):
            data, data_r = vocabulary.encode(records), vocabulary_r.encode(records_r)
            for name in ("facts", "question", "target"):
                assert torch.equal(getattr(data_r.obs, name), permutation[getattr(data.obs, name)]), (task, name)
            for name in ("fact_mask", "field_mask", "question_mask", "supporting"):
                assert torch.equal(getattr(data_r.obs, name), getattr(data.obs, name)), (task, name)
            assert [rename(r.answer, mapping) for r in records] == [r.answer for r in records_r]


@pytest.mark.parametrize("task", [1, 13])
def test_relabelling_every_word_gives_the_same_predictions_after_training(tmp_path, task):
    from pyro_multihop.experiments.qa import evaluate_qa, facts_head, predict_qa, train_qa

    relabelled_dir = tmp_path / "en"
    mapping = relabelled_copy([task], relabelled_dir)
    outcomes = []
    for data_dir in (babi.DEFAULT_DATA_DIR, relabelled_dir):
        train, test = babi_facts.load_task_records(task, data_dir=data_dir, max_train=150)
        vocabulary = QAVocabulary.build(train)
        train_data, test_data = vocabulary.encode(train), vocabulary.encode(test[:300])
        head = facts_head(vocabulary, babi_facts_hops(task), max_question_len=8)
        train_qa(head, train_data, steps=25)
        outcomes.append((predict_qa(head, test_data), evaluate_qa(head, test_data)))
    (predictions, scores), (predictions_r, scores_r) = outcomes
    # The head starts at zero and every term is a symbol table or an equality, so training commutes with
    # renaming the symbols: the same answers (renamed) and the same hop paths, up to float rounding.
    same = [rename(p["answer"], mapping) == p_r["answer"] and p["facts"] == p_r["facts"]
            for p, p_r in zip(predictions, predictions_r)]
    assert sum(same) >= 0.99 * len(same)
    assert abs(scores["answer_accuracy"] - scores_r["answer_accuracy"]) <= 0.01
    assert abs(scores["fact_accuracy"] - scores_r["fact_accuracy"]) <= 0.01
    assert scores["answer_accuracy"] > 0.5  # it learnt something (chance is 1/6)


def babi_facts_hops(task):
    return {1: 1, 13: 2}[task]


def inflected_copy(task, destination, suffix="ssa"):
    """Task ``task`` as a language that inflects nouns and names people with two words: every statement's last
    word (bAbI's place) takes a case ending that answers never carry, and every name is two words, in the
    story and in the questions. The library's rule sees only tokens; this test alone knows bAbI's layout."""
    destination.mkdir()
    for split in ("train", "test"):
        path = babi.task_files(babi.DEFAULT_DATA_DIR, task, split)
        lines = []
        for line in path.read_text().splitlines():
            number, text = line.split(" ", 1)
            if "\t" in text:  # a question keeps the answer's base form
                text = re.sub(r"^Where is (\w+)\?", lambda m: f"Where is {m.group(1)} {m.group(1)[::-1].lower()}?", text)
            else:
                words = text.rstrip(".").split(" ")
                words[0] = f"{words[0]} {words[0][::-1].lower()}"
                words[-1] += suffix
                text = " ".join(words) + "."
            lines.append(f"{number} {text}")
        (destination / path.name).write_text("\n".join(lines) + "\n")


def test_an_inflecting_language_with_two_word_names_learns_as_english_does(tmp_path):
    """The answer's form never occurs in the story, so only the emission tables can produce it; with the head's
    defaults (no weight decay on those tables) task 1 is learnt as well as in English. With a decay of 3e-2 or
    even 3e-3 on them it is not (about 0.19, measured; docs/babi.md)."""
    from pyro_multihop.experiments.qa import LengthGroupedFacts, evaluate_qa, facts_head
    from pyro_multihop.train import fit_svi

    inflected_dir = tmp_path / "en"
    inflected_copy(1, inflected_dir)
    scores = []
    for data_dir in (babi.DEFAULT_DATA_DIR, inflected_dir):
        train, test = babi_facts.load_task_records(1, data_dir=data_dir, max_train=200)
        vocabulary = QAVocabulary.build(train)
        train_data, test_data = vocabulary.encode(train), vocabulary.encode(test[:300])
        head = facts_head(vocabulary, 1, max_question_len=8)
        fit_svi(head, LengthGroupedFacts.of(train_data.obs), num_steps=100, progress=False, group_lengths=10)
        scores.append(evaluate_qa(head, test_data))
    english, inflected = scores
    assert english["answer_accuracy"] >= 0.9
    assert inflected["answer_accuracy"] >= english["answer_accuracy"] - 0.05
    assert inflected["fact_accuracy"] >= english["fact_accuracy"] - 0.05
