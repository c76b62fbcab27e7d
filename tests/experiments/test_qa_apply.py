"""A trained ``qa`` model applied to new questions (pyro_multihop.experiments.qa_apply), on the issue's kinship
setting at smoke size: 3 hops, test people never seen in training, questions without answers, with ids, longer
than the training ones; the same through the commands evaluate, predict, paths and inspect on facts files
(pyro_multihop.experiments.apply_commands); plus the run's memory check, resume note and seconds, and the
answers-outside-facts notes."""

import json
import math
import random
import types

import oracle
import pytest
import torch

from pyro_multihop.cli import main
from pyro_multihop.datasets.qa_jsonl import AnswerNotInFactsWarning, QAFormatError, QARecord, read_qa_jsonl, write_qa_jsonl
from pyro_multihop.experiments import qa, qa_apply
from pyro_multihop.experiments.fit_findings import diagnostic_line
from pyro_multihop.train import svi_run

CITIES = [f"c{i}" for i in range(5)]


def kinship(n, seed, people, lo=5, hi=8, extra=()):
    """"where lives the grandparent of X?": facts (X parent Y), (Y parent Z), (Z lives C) among distractors about
    other people, shuffled; supporting = those three facts in order; ``extra`` tokens go before X."""
    rng = random.Random(seed)
    records = []
    for index in range(n):
        x, y, z = rng.sample(people, 3)
        home = rng.choice(CITIES)
        facts = [(x, "parent", y), (y, "parent", z), (z, "lives", home)]
        others = [p for p in people if p not in (x, y, z)]
        size = rng.randint(lo, hi)
        while len(facts) < size:
            a, b = rng.sample(others, 2)
            facts.append((a, "parent", b) if rng.random() < 0.5 else (a, "lives", rng.choice(CITIES)))
        order = list(range(len(facts)))
        rng.shuffle(order)
        records.append(QARecord(tuple(facts[i] for i in order), ("where", "lives", "grandparent", *extra, x), home,
                                tuple(order.index(i) for i in range(3)), id=f"q{index}"))
    return records


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A qa run of the command (3 hops) and its files: train, test (unseen people), results.json, and the model
    loaded back."""
    folder = tmp_path_factory.mktemp("kinship")
    train = write_qa_jsonl(kinship(60, 0, [f"p{i}" for i in range(20)]), folder / "train.jsonl")
    test = write_qa_jsonl(kinship(20, 1, [f"n{i}" for i in range(20)]), folder / "test.jsonl")
    assert main(["qa", "--train", str(train), "--test", str(test), "--hops", "3", "--steps", "60", "--collapsed",
                 "--out", str(folder / "run"), "--no-progress"]) == 0
    results = json.loads((folder / "run" / "results.json").read_text())
    return {"folder": folder, "train": train, "test": test, "results": results,
            "checkpoint": folder / "run" / "checkpoint.pt", "model": qa.load_qa_checkpoint(folder / "run" / "checkpoint.pt")}


def test_evaluate_on_the_test_file_gives_the_runs_results(run):
    scores = qa_apply.evaluate_file(run["checkpoint"], run["test"])
    results = run["results"]
    assert results["answer_accuracy"] == 1.0 and results["fact_accuracy"] == 1.0  # unseen people, all right
    for key in ("answer_accuracy", "fact_accuracy", "hop_fact_accuracy"):
        assert scores[key] == results[key]
    assert math.isclose(scores["log_likelihood"], results["log_likelihood"], rel_tol=1e-6)
    assert scores["n"] == results["n_test"] and scores["answers_outside_facts"] == 0
    unanswered = [{"facts": [["a", "lives", "c1"]], "question": ["where", "a"]}]
    with pytest.raises(QAFormatError, match=r"records\[0\]: answer: missing \(evaluation needs"):
        qa_apply.evaluate_records(run["model"], unanswered)


def test_the_frame_symbols_are_the_words_no_training_question_or_answer_names(run):
    """The checkpoint's table head carries its frame symbols (``frame_content``'s), read from the training file's
    words: those of a fact that no question or answer names (the relation word "parent", not the cities, which are
    answered, nor the people that some question asks about)."""
    head, vocabulary, _ = run["model"]
    records = read_qa_jsonl(run["train"])
    named = {word for record in records for word in (*record.question, record.answer)}
    frame = {word for word, is_frame in zip(vocabulary.symbols, head.frame_symbols.tolist()) if is_frame}
    facts = {word for record in records for fact in record.facts for word in fact}
    assert frame == facts - named and "parent" in frame and not frame & set(CITIES)


def test_questions_without_answers_with_ids_and_longer_are_answered(run, tmp_path):
    """No answer, ids of both kinds, unseen people and cities, and a question two tokens longer than any training
    question: each line names the id, the question, the answer and each hop's fact, and the answers are right."""
    head, vocabulary, _ = run["model"]
    asked = kinship(6, 2, [f"m{i}" for i in range(20)], extra=("please", "now"))
    lines = []
    for index, record in enumerate(asked):
        line = {"id": index if index % 2 else f"ask-{index}", "facts": [list(f) for f in record.facts],
                "question": list(record.question)}
        lines.append(line)
    assert max(len(line["question"]) for line in lines) == 2 + max(len(r.question) for r in read_qa_jsonl(run["train"]))
    questions = tmp_path / "ask.jsonl"
    questions.write_text("".join(json.dumps(line) + "\n" for line in lines))
    out = tmp_path / "predictions.jsonl"
    predictions = qa_apply.predict_file(run["checkpoint"], questions, out)
    assert [json.loads(text) for text in out.read_text().splitlines()] == predictions
    for line, record, prediction in zip(lines, asked, predictions):
        assert set(prediction) == {"id", "question", "answer", "answer_prob", "facts", "fact_tokens"}
        assert prediction["id"] == line["id"] and prediction["question"] == line["question"]
        assert prediction["answer"] == record.answer and 0 < prediction["answer_prob"] <= 1
        assert prediction["fact_tokens"] == [line["facts"][fact] for fact in prediction["facts"]]
        assert prediction["facts"] == list(record.supporting)  # the path follows the kinship chain
    # From dictionaries with or without answers: the same answers (the answer never enters a prediction).
    answered = [dict(line, answer=record.answer) for line, record in zip(lines, asked)]
    again = qa_apply.predict_records(run["model"], answered)
    assert [p["answer"] for p in again] == [p["answer"] for p in predictions] and all(p["correct"] for p in again)
    with pytest.raises(QAFormatError, match=r"records\[1\]: id: expected a non-empty string or an integer, got 1.5"):
        qa_apply.predict_records(run["model"], [lines[0], dict(lines[1], id=1.5)])


def test_paths_give_the_question_only_and_the_answer_given_paths(run, tmp_path):
    head, _, _ = run["model"]
    records = read_qa_jsonl(run["test"])[:4]
    asked = [QARecord(r.facts, r.question, None if row % 2 else r.answer, r.supporting, id=r.id)
             for row, r in enumerate(records)]
    lines = qa_apply.path_records(run["model"], asked, k=3, num_samples=50, seed=1)
    data = run["model"][1].encode(asked)
    prior_paths, prior_log_probs = head.k_best_paths(data.obs, 3, given_target=False)
    entropy = head.path_entropy(data.obs, given_target=False)
    for row, (line, record) in enumerate(zip(lines, asked)):
        assert line["id"] == record.id and line["question"] == list(record.question) and "answer" in line
        prior = line["question_only"]
        assert [entry["facts"] for entry in prior["k_best"]] == prior_paths[row].tolist()
        assert [entry["prob"] for entry in prior["k_best"]] == pytest.approx(prior_log_probs[row].exp().tolist())
        assert prior["k_best"][0]["fact_tokens"] == [list(record.facts[fact]) for fact in prior["k_best"][0]["facts"]]
        assert prior["entropy"] == pytest.approx(float(entropy[row]))
        assert sum(entry["count"] for entry in prior["samples"]) == 50
        if record.answer is None:
            assert "given_answer_paths" not in line and "given_answer" not in line
        else:
            given = line["given_answer_paths"]
            assert given["k_best"][0]["facts"] == list(record.supporting)
            assert given["k_best"][0]["prob"] >= prior["k_best"][0]["prob"] - 1e-6  # the answer sharpens the path
    out = qa_apply.paths_file(run["checkpoint"], run["test"], run["folder"] / "paths.jsonl", k=2)
    assert len((run["folder"] / "paths.jsonl").read_text().splitlines()) == len(out) == 20


def question_only_paths(head, obs):
    """Per row ``path -> p(path | facts, question)``, every path of the head's dense chain enumerated."""
    with torch.no_grad():
        chain = head.hop_chain(obs)
    zero = torch.zeros_like(chain.init)
    return [oracle.path_posterior(oracle.chain_log_joints(chain.init, chain.trans, zero, row)) for row in range(len(obs))]


def test_question_only_marginals_and_samples_follow_the_prior_chain(run):
    head, vocabulary, _ = run["model"]
    obs = vocabulary.encode(read_qa_jsonl(run["test"])[:3]).obs
    exact = question_only_paths(head, obs)
    marginals = qa_apply.question_only_marginals(head, obs, budget=1)
    for row, table in enumerate(exact):
        for hop in range(3):
            expected = torch.zeros(obs.context_len, dtype=marginals.dtype)
            for path, p in table.items():
                expected[path[hop]] += p
            assert torch.allclose(marginals[hop, row], expected, atol=1e-5)
    draws = qa_apply.question_only_samples(head, obs, 4000, seed=0, budget=1)
    assert torch.equal(draws, qa_apply.question_only_samples(head, obs, 4000, seed=0, budget=1))  # seeded
    _, dof, p_value = oracle.chi_square_test(oracle.path_counts(draws), exact)
    assert dof > 0 and p_value > 1e-3


def test_inspect_draws_given_the_answer_or_the_question_alone(run, tmp_path):
    path = qa_apply.inspect_file(run["checkpoint"], run["test"], tmp_path / "inspect.png", rows=[0, 1])
    assert path.read_bytes()[:4] == b"\x89PNG"
    records = [QARecord(r.facts, r.question, None, r.supporting) for r in read_qa_jsonl(run["test"])[:2]]
    figure = qa_apply.inspect_records(run["model"], records, rows=[0, 1, 5])
    assert "question alone" in figure.get_suptitle()
    assert len([axis for axis in figure.axes if axis.get_label() != "<colorbar>"]) == 2  # row 5 is past the end
    # One question with its answer, one without: each drawn given what it has.
    head, vocabulary, _ = run["model"]
    mixed = [read_qa_jsonl(run["test"])[0], records[1]]
    figure = qa_apply.inspect_records(run["model"], mixed, rows=[0, 1])
    assert "the question alone where no answer is given" in figure.get_suptitle()
    obs = vocabulary.encode(mixed).obs
    expected = [head.posterior(obs[:1]).hop_marginals[:, 0], qa_apply.question_only_marginals(head, obs[1:])[:, 0]]
    for panel, marginals in zip(figure.axes[:2], expected):
        drawn = [int(label.get_text().split(":")[0].lstrip("*")) for label in panel.get_yticklabels()]
        assert torch.allclose(torch.as_tensor(panel.images[0].get_array()).double(),
                              marginals[:, drawn].t().double(), atol=1e-6)


def test_a_vocabulary_too_large_stops_before_the_head_is_allocated(run, tmp_path, monkeypatch, capsys):
    vocabulary = run["model"][1]
    need = qa.head_memory_bytes(vocabulary, 3, 5)
    S = vocabulary.num_symbols
    assert need["largest"] == "content_tables" and need["largest_bytes"] == 2 * 9 * S * S * 4
    assert need["training"] > 4 * need["parameters"]
    with pytest.raises(qa.HeadMemoryError, match=rf"S x S tables .*\(S = {S} symbols.*content_tables \(L - 1, F, F, S, S\) "
                                                 rf"alone holds {math.ceil(need['largest_bytes'] / 1024)} KiB"):
        qa.check_head_memory(vocabulary, 3, 5, available=need["training"] - 1)
    assert qa.check_head_memory(vocabulary, 3, 5, available=need["training"]) == need
    assert qa.available_memory_bytes() > 0
    monkeypatch.setattr(qa, "available_memory_bytes", lambda: 2**20)
    out = tmp_path / "small"
    code = main(["qa", "--train", str(run["train"]), "--test", str(run["test"]), "--hops", "3", "--steps", "1",
                 "--out", str(out), "--no-progress"])
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "needs about" in lines[0] and "1.0 MiB of memory is available" in lines[0]
    assert not (out / "checkpoint.pt").exists()


def test_resume_says_its_step_and_seconds_add_up(run, tmp_path, capsys, monkeypatch):
    argv = ["qa", "--train", str(run["train"]), "--test", str(run["test"]), "--hops", "3", "--out",
            str(tmp_path / "run"), "--no-progress", "--collapsed"]
    assert main(argv + ["--steps", "8"]) == 0
    first = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert main(argv + ["--steps", "9", "--resume"]) == 0
    captured = capsys.readouterr()
    assert "resuming from step 8 of" in captured.err
    second = json.loads(captured.out.strip().splitlines()[-1])
    # 9 steps in all: the first part's 8 are counted in, not just the resumed step.
    assert second["seconds"] >= first["seconds"] > 0
    assert qa.load_qa_checkpoint(tmp_path / "run" / "checkpoint.pt")[2]["step"] == 9
    # A third part on a stopped clock takes no time: its seconds are exactly those of the first two parts.
    monkeypatch.setattr(svi_run, "time", types.SimpleNamespace(perf_counter=lambda: 1000.0))
    assert main(argv + ["--steps", "10", "--resume"]) == 0
    captured = capsys.readouterr()
    assert "resuming from step 9 of" in captured.err
    third = json.loads(captured.out.strip().splitlines()[-1])
    assert third["seconds"] == second["seconds"] > 0
    assert qa.load_qa_checkpoint(tmp_path / "run" / "checkpoint.pt")[2]["step"] == 10


def test_answers_outside_facts_are_warned_in_python_and_noted_by_the_command(tmp_path, capsys):
    records = kinship(6, 3, [f"p{i}" for i in range(12)])
    outside = [QARecord(r.facts, r.question, "nowhere" if row < 2 else r.answer, r.supporting)
               for row, r in enumerate(records)]
    with pytest.warns(AnswerNotInFactsWarning, match="2 of 6 training answers occur in no fact") as caught:
        results = qa.run_qa(outside, records, 1, tmp_path / "python", steps=1)
    assert caught[0].filename == __file__
    assert results["train_answers_outside_facts"] == 2 and results["test_answers_outside_facts"] == 0
    train = write_qa_jsonl(outside, tmp_path / "train.jsonl")
    test = write_qa_jsonl(outside[:3], tmp_path / "test.jsonl")
    assert main(["qa", "--train", str(train), "--test", str(test), "--hops", "1", "--steps", "1", "--out",
                 str(tmp_path / "command"), "--no-progress"]) == 0
    notes = capsys.readouterr().err.strip().splitlines()
    # Answers outside the facts turn the emission's comparison and composition on, with starts without them: then
    # their notes, the note of the kept start and the run's diagnostics (here the hops of a one-step fit, still flat), one line each.
    results = json.loads((tmp_path / "command" / "results.json").read_text())
    own = ["the emission without its comparison component", "the equality weights at 0",
           "the equality weights at 0 and the emission without its comparison component"]
    held = "the word-order terms held at 0"
    without = "the emission without its composition"  # such answers turn the composition on too
    assert results["comparison"] and results["composition"] == 2
    assert [start["start_from"] for start in results["starts"]] == \
        ["the head's own start", "the composition alone"] + \
        [f"the composition alone and its symbol vectors from draw {draw}" for draw in (1, 2)] + [without] + \
        [f"{without} and {said}" for said in own + [held] + [f"{held} and {said}" for said in own]]
    assert notes[:2] == [f"pyro-multihop: warning: 2 of 6 training answers occur in no fact of their question "
                         f"({train}:1, {train}:2): only the emission table can learn them (a copy cannot produce them)",
                         f"pyro-multihop: warning: 2 of 3 test answers occur in no fact of their question ({test}:1, "
                         f"{test}:2): a copy cannot produce them, only the learnt emission table, and only answers "
                         "seen in training"]
    assert notes[2] == ("pyro-multihop: note: the emission's comparison is on, since some training answers occur "
                        "in no fact; 8 starts, with and without it, from the equality weights at 1 and at 0, with "
                        "and without the word-order terms, the best held-out log-likelihood kept (--no-comparison: "
                        "off)")
    assert notes[3].startswith("pyro-multihop: note: the emission mixes in a composition of two facts")
    assert notes[4].startswith("pyro-multihop: note: 12 starts, kept start ")
    assert notes[5:] == [f"pyro-multihop: {diagnostic_line(record)}" for record in results["diagnostics"]]


# -- the commands evaluate, predict, paths and inspect on facts files ---------------------------------------
def unseen_questions(path, answered=()):
    """A facts file of 6 questions about people training never showed, each two tokens longer than any training
    question, with ids of both kinds, and answers only on the rows in ``answered``; returns ``(records, lines)``."""
    records = kinship(6, 2, [f"m{i}" for i in range(20)], extra=("please", "now"))
    lines = []
    for index, record in enumerate(records):
        line = {"id": index if index % 2 else f"ask-{index}", "facts": [list(f) for f in record.facts],
                "question": list(record.question)}
        lines.append(dict(line, answer=record.answer) if index in answered else line)
    path.write_text("".join(json.dumps(line) + "\n" for line in lines))
    return records, lines


def jsonl(path):
    return [json.loads(text) for text in path.read_text().splitlines()]


def test_evaluate_command_on_the_test_file_gives_the_runs_results(run, capsys):
    capsys.readouterr()
    out = run["folder"] / "evaluate.json"
    assert main(["evaluate", "--checkpoint", str(run["checkpoint"]), "--data", str(run["test"]), "--out", str(out)]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed == json.loads(out.read_text())
    results = run["results"]
    assert results["answer_accuracy"] == 1.0
    for key in ("answer_accuracy", "fact_accuracy", "hop_fact_accuracy"):
        assert printed[key] == results[key], key
    assert math.isclose(printed["log_likelihood"], results["log_likelihood"], rel_tol=1e-6)
    assert printed["n"] == results["n_test"] == 20 and printed["model"] == "FactAttention"
    assert printed["answers_outside_facts"] == results["test_answers_outside_facts"] == 0


def test_predict_and_paths_commands_answer_questions_without_answers(run, tmp_path, capsys):
    """No answers, ids, unseen people and cities, questions two tokens longer than training's: every output line
    carries its id, the predicted answer (right) and each hop's fact; the same as the Python API."""
    questions = tmp_path / "ask.jsonl"
    records, lines = unseen_questions(questions)
    assert max(len(line["question"]) for line in lines) == 2 + max(len(r.question) for r in read_qa_jsonl(run["train"]))
    capsys.readouterr()
    out = tmp_path / "answers.jsonl"
    assert main(["predict", "--checkpoint", str(run["checkpoint"]), "--data", str(questions), "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote predictions for 6 questions to {out}"
    predictions = jsonl(out)
    assert predictions == qa_apply.predict_records(run["model"], lines)
    for line, record, prediction in zip(lines, records, predictions):
        assert set(prediction) == {"id", "question", "answer", "answer_prob", "facts", "fact_tokens"}
        assert prediction["id"] == line["id"] and prediction["question"] == line["question"]
        assert prediction["answer"] == record.answer and prediction["facts"] == list(record.supporting)
        assert prediction["fact_tokens"] == [line["facts"][fact] for fact in prediction["facts"]]

    paths = tmp_path / "paths.jsonl"
    assert main(["paths", "--checkpoint", str(run["checkpoint"]), "--data", str(questions), "--out", str(paths),
                 "-k", "2", "--samples", "20", "--seed", "3"]) == 0
    assert capsys.readouterr().out.strip() == f"wrote the 2 best paths of 6 questions to {paths} (given the question alone)"
    found = jsonl(paths)
    assert found == qa_apply.path_records(run["model"], lines, k=2, num_samples=20, seed=3)
    for line, record, entry in zip(lines, records, found):
        assert entry["id"] == line["id"] and entry["answer"] == record.answer and "given_answer_paths" not in entry
        best = entry["question_only"]["k_best"]
        assert len(best) == 2 and best[0]["facts"] == list(record.supporting)
        assert best[0]["fact_tokens"] == [line["facts"][fact] for fact in best[0]["facts"]]
        assert entry["question_only"]["entropy"] >= 0
        assert sum(sample["count"] for sample in entry["question_only"]["samples"]) == 20


def test_paths_command_gives_the_answer_given_paths_where_there_is_an_answer(run, tmp_path, capsys):
    questions = tmp_path / "mixed.jsonl"
    records, lines = unseen_questions(questions, answered=(0, 3))
    paths = tmp_path / "paths.jsonl"
    assert main(["paths", "--checkpoint", str(run["checkpoint"]), "--data", str(questions), "--out", str(paths)]) == 0
    assert capsys.readouterr().out.strip().endswith("(given the question alone, and given the answer for the 2 with one)")
    found = jsonl(paths)
    assert found == qa_apply.path_records(run["model"], lines, k=3)
    for row, (record, entry) in enumerate(zip(records, found)):
        assert [p["facts"] for p in entry["question_only"]["k_best"]][0] == list(record.supporting)
        if row in (0, 3):
            given = entry["given_answer_paths"]
            assert given["k_best"][0]["facts"] == list(record.supporting) and entry["given_answer"] == record.answer
            assert given["k_best"][0]["prob"] >= entry["question_only"]["k_best"][0]["prob"] - 1e-6
        else:
            assert "given_answer_paths" not in entry and "given_answer" not in entry


def test_inspect_command_draws_the_hop_marginals_over_facts(run, tmp_path, capsys):
    out = tmp_path / "figures"
    assert main(["inspect", "--checkpoint", str(run["checkpoint"]), "--data", str(run["test"]), "--rows", "0", "1",
                 "--out", str(out)]) == 0
    assert capsys.readouterr().out.strip() == f"wrote {out / 'hop_marginals.png'}"
    assert (out / "hop_marginals.png").read_bytes()[:4] == b"\x89PNG"


def test_facts_commands_refuse_what_does_not_fit_in_one_line(run, tmp_path, capsys):
    from pyro_multihop import transitive_task
    from pyro_multihop.checkpoint import save_checkpoint

    checkpoint, test = str(run["checkpoint"]), str(run["test"])
    table = tmp_path / "table.csv"
    transitive_task(5, seed=0).save(table)
    questions = tmp_path / "ask.jsonl"
    unseen_questions(questions, answered=(0,))
    bad = tmp_path / "bad.jsonl"
    bad.write_text(run["test"].read_text().splitlines()[0] + '\n{"facts": [["a", "b"]], "question": "where"}\n')
    long_fact = tmp_path / "long.jsonl"
    long_fact.write_text(json.dumps({"facts": [["a", "b", "c", "d"]], "question": ["where", "a"]}) + "\n")
    bare = tmp_path / "bare.pt"
    save_checkpoint(bare, run["model"][0])  # the head without its vocabulary
    cases = [
        (["evaluate", "--checkpoint", checkpoint, "--data", str(table)], "qa checkpoint (the structured-facts head, written "
         "by qa or babi): it takes a facts .jsonl file"),
        (["predict", "--checkpoint", checkpoint, "--data", str(table), "--out", str(tmp_path / "p.csv")], "facts .jsonl"),
        (["evaluate", "--checkpoint", checkpoint, "--data", str(questions)], f"{questions}:2: answer: missing (evaluation"),
        (["evaluate", "--checkpoint", checkpoint, "--data", str(bad)], f"{bad}:2: question: expected a non-empty list"),
        (["predict", "--checkpoint", checkpoint, "--data", str(long_fact), "--out", str(tmp_path / "p.jsonl")],
         f"{long_fact}:1: facts[0]: has 4 tokens, more than the 3 fields"),
        (["predict", "--checkpoint", checkpoint, "--data", str(questions), "--out", str(tmp_path / "p.csv")],
         "must end in .jsonl"),
        (["paths", "--checkpoint", checkpoint, "--data", str(questions), "--out", str(tmp_path / "p.csv")], "must end in .jsonl"),
        (["paths", "--checkpoint", checkpoint, "--data", str(tmp_path / "none.jsonl"), "--out", str(tmp_path / "p.jsonl")],
         "does not exist"),
        (["inspect", "--checkpoint", checkpoint, "--out", str(tmp_path / "f")], "give --data FILE.jsonl"),
        (["inspect", "--checkpoint", checkpoint, "--data", test, "--rows", "20", "--out", str(tmp_path / "f")],
         "--rows must be below the 20 questions"),
        (["evaluate", "--checkpoint", str(bare), "--data", test], "holds a FactAttention without a QA vocabulary"),
    ]
    capsys.readouterr()
    for argv, fragment in cases:
        code = main(argv)
        captured = capsys.readouterr()
        lines = captured.err.strip().splitlines()
        assert code == 2 and len(lines) == 1 and fragment in lines[0] and "Traceback" not in captured.err, (argv, lines)
    assert not (tmp_path / "p.jsonl").exists() and not (tmp_path / "p.csv").exists()


def test_evaluate_command_counts_answers_outside_facts(run, tmp_path, capsys):
    records = read_qa_jsonl(run["test"])
    outside = [QARecord(r.facts, r.question, "nowhere" if row == 1 else r.answer, r.supporting, id=r.id)
               for row, r in enumerate(records)]
    path = write_qa_jsonl(outside, tmp_path / "outside.jsonl")
    capsys.readouterr()
    assert main(["evaluate", "--checkpoint", str(run["checkpoint"]), "--data", str(path)]) == 0
    captured = capsys.readouterr()
    assert captured.err.strip().splitlines() == [
        f"pyro-multihop: warning: 1 of 20 test answers occur in no fact of their question ({path}:2): a copy cannot "
        "produce them, only the learnt emission table, and only answers seen in training"]
    scores = json.loads(captured.out)
    assert scores["answers_outside_facts"] == 1 and scores["answer_accuracy"] == 19 / 20
