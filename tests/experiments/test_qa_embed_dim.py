"""``pyro-multihop qa --embed-dim D``: the embedded facts head end to end at smoke size, its memory estimate (no stop
where the tables would be refused), and checkpoints of one kind refused by the other with a sentence saying which."""

import json
import random

import pytest
import torch

from pyro_multihop import FactAttention
from pyro_multihop.checkpoint import CheckpointError, load_parameters, read_checkpoint, save_checkpoint
from pyro_multihop.cli import main
from pyro_multihop.datasets.qa_jsonl import QARecord, QAVocabulary, read_qa_jsonl, write_qa_jsonl
from pyro_multihop.experiments import qa
from pyro_multihop.experiments.qa import load_qa_checkpoint, predict_qa


def chain_records(n, seed, people, cities):
    """Two hops: "where does the parent of X live?" over (child, parent, person), (person, lives, city)."""
    rng = random.Random(seed)
    records = []
    for _ in range(n):
        child, parent, other = rng.sample(people, 3)
        home, elsewhere = rng.sample(cities, 2)
        facts = [(child, "parent", parent), (parent, "lives", home), (other, "lives", elsewhere)]
        records.append(QARecord(tuple(facts), ("where", "parent", child), home, (0, 1)))
    return records


def test_qa_command_trains_an_embedded_head(tmp_path, capsys):
    people = [f"p{i}" for i in range(10)]
    train = write_qa_jsonl(chain_records(40, 0, people, [f"c{i}" for i in range(5)]), tmp_path / "train.jsonl")
    test = write_qa_jsonl(chain_records(8, 1, people, [f"c{i}" for i in range(5)]), tmp_path / "test.jsonl")
    out = tmp_path / "run"
    code = main(["qa", "--train", str(train), "--test", str(test), "--hops", "2", "--steps", "5", "--embed-dim", "4",
                 "--collapsed", "--out", str(out), "--no-progress"])
    assert code == 0
    results = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert results["n_test"] == 8
    head, vocabulary, state = load_qa_checkpoint(out / "checkpoint.pt")
    assert head.embed_dim == 4 and state["config"]["embed_dim"] == 4 and head.symbol_embedding.shape == (vocabulary.num_symbols, 4)
    assert not hasattr(head, "content_tables")
    # its learnt emission gives the training answers alone (the cities), so its output side is sized by them
    answers = sorted({record.answer for record in read_qa_jsonl(train)})
    assert [vocabulary.known[s - 1] for s in head.answer_symbols.tolist()] == answers
    assert head.output_embedding.shape == (len(answers), 4) and len(answers) < vocabulary.num_symbols
    lines = [json.loads(line) for line in (out / "predictions.jsonl").read_text().splitlines()]
    assert [line["answer"] for line in lines] == [p["answer"] for p in predict_qa(head, vocabulary.encode(read_qa_jsonl(test)))]


def test_qa_gives_an_embedding_row_to_the_symbols_of_embed_min_count_training_questions(tmp_path, capsys):
    """--embed-min-count K: the head's embedded_symbols are the symbols of at least K training questions, counted
    here from the records; the rest have zero rows. Without --embed-dim it is refused before anything runs."""
    people = [f"p{i}" for i in range(30)]  # 40 questions over 30 people: some in few questions, some in many
    records = chain_records(40, 0, people, [f"c{i}" for i in range(5)])
    train = write_qa_jsonl(records, tmp_path / "train.jsonl")
    test = write_qa_jsonl(chain_records(8, 1, people, [f"c{i}" for i in range(5)]), tmp_path / "test.jsonl")
    vocabulary = QAVocabulary.build(records)
    for min_count in (1, 6):
        out = tmp_path / f"run{min_count}"
        assert main(["qa", "--train", str(train), "--test", str(test), "--hops", "2", "--steps", "2", "--embed-dim",
                     "4", "--embed-min-count", str(min_count), "--collapsed", "--out", str(out), "--no-progress"]) == 0
        results = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        head = load_qa_checkpoint(out / "checkpoint.pt")[0]
        questions = {token: sum(token in {*sum(map(list, r.facts), []), *r.question, r.answer} for r in records)
                     for token in vocabulary.known}
        expected = {token for token, count in questions.items() if count >= min_count}
        owned = {vocabulary.known[s - 1] for s in head.embedded_symbols.nonzero().flatten().tolist() if s >= 1}
        assert owned == expected and 0 < len(expected) and results["embedded_symbols"] == len(expected)
        assert results["embed_min_count"] == min_count
        assert float(head.symbol_embedding.detach()[~head.embedded_symbols].abs().sum()) == 0
        if min_count == 6:
            assert len(expected) < len(vocabulary.known)  # rare people lose their rows
    code = main(["qa", "--train", str(train), "--test", str(test), "--hops", "2", "--embed-min-count", "2",
                 "--out", str(tmp_path / "tables"), "--no-progress"])
    assert code != 0 and "embed_min_count needs embed_dim" in capsys.readouterr().err
    assert not (tmp_path / "tables").exists()


def test_the_memory_estimate_of_an_embedded_head_is_linear_in_the_vocabulary():
    records = [QARecord(((f"e{i}", "r", f"e{i + 1}"),), ("q", f"e{i}"), f"e{i + 1}") for i in range(4000)]
    vocabulary = QAVocabulary.build(records)
    S = vocabulary.num_symbols
    tables = qa.head_memory_bytes(vocabulary, 2, 2)
    embedded = qa.head_memory_bytes(vocabulary, 2, 2, embed_dim=16)
    assert tables["largest"] == "content_tables" and embedded["largest"] in ("symbol_embedding", "output_embedding")
    # 2 S D, about 33 vectors of S (per-symbol terms, the comparison over all S answers) and the forms
    assert embedded["largest_bytes"] == S * 16 * 4 and embedded["parameters"] < 72 * S * 4
    available = (tables["training"] + embedded["training"]) // 2
    with pytest.raises(qa.HeadMemoryError, match="--embed-dim D"):  # the tables' stop names the way out
        qa.check_head_memory(vocabulary, 2, 2, available=available)
    assert qa.check_head_memory(vocabulary, 2, 2, available=available, embed_dim=16) == embedded
    with pytest.raises(qa.HeadMemoryError, match="symbol embeddings needs about .* embed_dim = 16"):
        qa.check_head_memory(vocabulary, 2, 2, available=embedded["training"] - 1, embed_dim=16)
    head = qa.facts_head(vocabulary, 2, 2, check_memory=False, embed_dim=16, seed=3)
    assert head.embed_dim == 16 and qa.facts_head(vocabulary, 2, 2, check_memory=False).embed_dim is None


@pytest.mark.parametrize("stored_dim,model_dim", [(4, None), (None, 4)], ids=["embedded-into-tables", "tables-into-embedded"])
def test_a_checkpoint_of_the_other_kind_is_refused_saying_which(tmp_path, stored_dim, model_dim):
    stored = FactAttention(2, 3, 12, max_question_len=3, embed_dim=stored_dim)
    model = FactAttention(2, 3, 12, max_question_len=3, embed_dim=model_dim)
    payload = read_checkpoint(save_checkpoint(tmp_path / "head.pt", stored))
    kinds = {None: r"a table head \(embed_dim=None", 4: r"an embedded head \(embed_dim=4"}
    with pytest.raises(CheckpointError, match=rf"holds the parameters of {kinds[stored_dim]}.*the model is {kinds[model_dim]}"
                                              rf".*build the model with embed_dim={stored_dim}"):
        load_parameters(model, payload)
    same = FactAttention(2, 3, 12, max_question_len=3, embed_dim=stored_dim)
    load_parameters(same, payload)
    for name, value in stored.state_dict().items():
        assert torch.equal(same.state_dict()[name], value), name


def test_embed_dim_alone_takes_the_measured_default():
    """``qa --embed-dim`` without a value: ``command_defaults.EMBED_DIM``; with one: that one; without the flag: the
    tables (None). The help names the default."""
    from pyro_multihop.cli import build_parser
    from pyro_multihop.experiments import command_defaults

    base = ["qa", "--train", "a.jsonl", "--test", "b.jsonl", "--hops", "2", "--out", "o"]
    parser = build_parser()
    assert parser.parse_args(base + ["--embed-dim"]).embed_dim == command_defaults.EMBED_DIM
    assert parser.parse_args(base[:1] + ["--embed-dim"] + base[1:]).embed_dim == command_defaults.EMBED_DIM
    assert parser.parse_args(base + ["--embed-dim", "7"]).embed_dim == 7
    assert parser.parse_args(base).embed_dim is None
    help_text = " ".join(parser._subparsers._group_actions[0].choices["qa"].format_help().split())
    assert f"--embed-dim alone: D = {command_defaults.EMBED_DIM}" in help_text
