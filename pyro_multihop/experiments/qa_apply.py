"""A trained ``qa`` model applied to questions: answers, hop paths, scores and figures, from records or files.

The model is what :func:`~pyro_multihop.experiments.qa.load_qa_checkpoint` returns, ``(head, vocabulary,
state)``. Questions are :class:`~pyro_multihop.datasets.qa_jsonl.QARecord` s, dictionaries in the facts format
(``facts``, ``question``, optional ``answer``, ``supporting`` and ``id``; checked as a file's lines are), or a
facts file. Tokens the training file never showed get the copy slots, as in training; a question longer than
the training ones shares the last question position.

- :func:`predict_records`: per question its ``id`` (the record's, else its place from 0), ``question``, the most
  probable ``answer`` and ``answer_prob``, and for each hop the fact of the MAP path given the question alone
  (``facts``: indices, ``fact_tokens``: their tokens); ``given_answer`` and ``correct`` where there is an answer.
- :func:`path_records`: per question the ``k`` most probable hop paths given the question alone, their
  entropy and (with ``num_samples``) drawn paths; where the question has an answer, the same given it.
- :func:`evaluate_records`: the scores of the ``qa`` run's ``results.json`` (answers needed).
- :func:`inspect_records`: the hop-marginal figure (:func:`~pyro_multihop.plots.plot_fact_posteriors`), given
  the answer where there is one, else the question alone.

The ``*_file`` functions do the same from a checkpoint and a facts file, and write JSON Lines
(:func:`~pyro_multihop.datasets.qa_jsonl.write_jsonl`) whose every line names the id, the question, the answer and
each hop's fact. The commands ``pyro-multihop evaluate``, ``predict``, ``paths`` and ``inspect`` on a facts file
call the ``*_records`` functions (:mod:`pyro_multihop.experiments.apply_commands`). Example::

    >>> from pyro_multihop.datasets.qa_jsonl import QAVocabulary, QARecord
    >>> from pyro_multihop.experiments.qa import facts_head
    >>> train = [QARecord((("ann", "in", "oslo"),), ("where", "ann"), "oslo")]
    >>> vocabulary = QAVocabulary.build(train)
    >>> model = (facts_head(vocabulary, 1, 2), vocabulary)
    >>> line = predict_records(model, [{"id": "q1", "facts": [["eve", "in", "lima"]], "question": ["where", "eve"]}])[0]
    >>> line["id"], line["question"], line["fact_tokens"]
    ('q1', ['where', 'eve'], [['eve', 'in', 'lima']])
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Union

import torch

from ..datasets.qa_jsonl import (QAData, QAFormatError, QARecord, answers_outside_facts, parse_record, read_qa_jsonl,
                                  write_jsonl)
from .. import engine
from ..plots import plot_fact_posteriors
from .qa import evaluate_qa, load_qa_checkpoint, predict_qa

__all__ = [
    "as_records",
    "encode_records",
    "predict_records",
    "path_records",
    "evaluate_records",
    "inspect_records",
    "question_only_marginals",
    "question_only_samples",
    "predict_file",
    "paths_file",
    "evaluate_file",
    "inspect_file",
]

RecordLike = Union[QARecord, dict]


def _head_and_vocabulary(model):
    """``(head, vocabulary)`` of ``(head, vocabulary[, state])`` (what load_qa_checkpoint returns)."""
    if not isinstance(model, (tuple, list)) or len(model) < 2:
        raise TypeError(f"model must be (head, vocabulary, state) as load_qa_checkpoint returns, got {type(model).__name__}")
    return model[0], model[1]


def as_records(items: Iterable[RecordLike], source: str = "records") -> List[QARecord]:
    """:class:`QARecord` s from records or dictionaries in the facts format (``answer`` optional), each
    dictionary checked as a file's line is; an error names ``source[i]`` and the field."""
    records = []
    for index, item in enumerate(items):
        records.append(item if isinstance(item, QARecord) else parse_record(item, f"{source}[{index}]", require_answer=False))
    if not records:
        raise QAFormatError(f"{source}: no questions")
    return records


def encode_records(model, items: Iterable[RecordLike]) -> QAData:
    """The records (:func:`as_records`) encoded with the model's vocabulary."""
    _, vocabulary = _head_and_vocabulary(model)
    return vocabulary.encode(as_records(items))


def predict_records(model, items: Iterable[RecordLike], *, budget: Optional[int] = None) -> List[dict]:
    """One line per question (module docstring): :func:`~pyro_multihop.experiments.qa.predict_qa` on the
    encoded records."""
    head, _ = _head_and_vocabulary(model)
    return predict_qa(head, encode_records(model, items), budget=budget)


def question_only_marginals(head, obs, budget: Optional[int] = None) -> torch.Tensor:
    """``(L, n, N)``: ``p(z_l = i | facts, question)``, the hop marginals before the answer is seen (the engine's
    :func:`~pyro_multihop.engine.hop_marginals` of the prior chain, in chunks under the memory budget), on the
    CPU."""
    return engine.hop_marginals(head.hop_factors(), obs, budget, given_target=False).cpu()


def question_only_samples(head, obs, num_samples: int, seed: int = 0, budget: Optional[int] = None) -> torch.Tensor:
    """``(num_samples, n, L)`` hop paths drawn from the prior chain (the question alone) by the engine's
    :func:`~pyro_multihop.engine.sample_paths`, with a private generator seeded with ``seed``; on the CPU."""
    factors = head.hop_factors()
    generator = torch.Generator(device=factors.device).manual_seed(int(seed))
    return engine.sample_paths(factors, obs, num_samples, generator, budget, given_target=False).cpu()


def _path_entry(record: QARecord, path: Sequence[int], **values) -> dict:
    return {**values, "facts": list(path), "fact_tokens": [list(record.facts[fact]) for fact in path]}


def _paths_of(record: QARecord, paths, log_probs, entropy: float, samples=None) -> dict:
    """``{"entropy", "k_best": [{"prob", "facts", "fact_tokens"}], "samples": [{"count", ...}]}`` of one row."""
    best = [_path_entry(record, path, prob=float(torch.tensor(log_prob).exp()))
            for path, log_prob in zip(paths.tolist(), log_probs.tolist()) if log_prob > float("-inf")]
    entry = {"entropy": float(entropy), "k_best": best}
    if samples is not None:
        counts = Counter(map(tuple, samples.tolist()))
        entry["samples"] = [_path_entry(record, path, count=count) for path, count in counts.most_common()]
    return entry


@torch.no_grad()
def path_records(model, items: Iterable[RecordLike], *, k: int = 5, num_samples: int = 0, seed: int = 0,
                 budget: Optional[int] = None) -> List[dict]:
    """Per question, the :func:`predict_records` line without its ``facts``, plus ``"question_only"``: the
    ``k`` most probable hop paths given the facts and the question (``k_best``: ``prob``, ``facts``,
    ``fact_tokens``, best first), the ``entropy`` of that path distribution (nats) and, with ``num_samples``,
    drawn paths with their ``count``; and, where the question has an answer, ``"given_answer"``: the same
    given the answer too (the posterior). Paths of probability zero are left out (fewer than ``k``
    facts^hops)."""
    head, _ = _head_and_vocabulary(model)
    data = encode_records(model, items)
    obs = data.obs
    lines = [{key: value for key, value in line.items() if key not in ("facts", "fact_tokens")}
             for line in predict_qa(head, data, budget=budget)]
    prior = head.k_best_paths(obs, k, given_target=False, budget=budget)
    prior_entropy = head.path_entropy(obs, given_target=False, budget=budget)
    prior_samples = question_only_samples(head, obs, num_samples, seed, budget) if num_samples else None
    answered = [row for row, has in enumerate(data.answered) if has]
    given = {}
    if answered:
        index = torch.tensor(answered)
        subset = obs[index]
        paths, log_probs = head.k_best_paths(subset, k, budget=budget)
        entropy = head.path_entropy(subset, budget=budget)
        samples = head.sample_paths(subset, num_samples, seed=seed, budget=budget) if num_samples else None
        for place, row in enumerate(answered):
            given[row] = _paths_of(data.records[row], paths[place], log_probs[place], entropy[place],
                                   None if samples is None else samples[:, place])
    for row, line in enumerate(lines):
        record = data.records[row]
        line["question_only"] = _paths_of(record, prior[0][row], prior[1][row], prior_entropy[row],
                                          None if prior_samples is None else prior_samples[:, row])
        if row in given:
            line["given_answer_paths"] = given[row]
    return lines


def evaluate_records(model, items: Iterable[RecordLike], *, budget: Optional[int] = None) -> dict:
    """The scores of :func:`~pyro_multihop.experiments.qa.evaluate_qa` (``answer_accuracy``, ``fact_accuracy``,
    ``hop_fact_accuracy``, ``n``, ``log_likelihood``: on a test file, those of the ``qa`` run's
    ``results.json``), plus ``answers_outside_facts``; every question needs its answer."""
    head, _ = _head_and_vocabulary(model)
    data = encode_records(model, items)
    data.require_answers("evaluation")
    scores = evaluate_qa(head, data, predict_qa(head, data, budget=budget))
    scores["answers_outside_facts"] = len(answers_outside_facts(data.records))
    return scores


def inspect_records(model, items: Iterable[RecordLike], rows: Sequence[int] = (0, 1, 2), *, title: Optional[str] = None,
                    budget: Optional[int] = None):
    """The hop-marginal figure of some questions (:func:`~pyro_multihop.plots.plot_fact_posteriors`): given
    the answer where the question has one, given the question alone where not; rows past the end are dropped."""
    head, _ = _head_and_vocabulary(model)
    data = encode_records(model, items)
    rows = [int(row) for row in rows if 0 <= int(row) < len(data)] or [0]
    answered = [place for place, row in enumerate(rows) if data.answered[row]]
    if len(answered) == len(rows):
        return plot_fact_posteriors(head, data, rows, title=title, budget=budget)
    subset = data.obs[torch.tensor(rows)]
    marginals = question_only_marginals(head, subset, budget)
    if answered:
        with torch.no_grad():
            given = head.posterior(subset[torch.tensor(answered)], budget=budget).hop_marginals
        marginals[:, answered] = given.to(marginals.dtype).cpu()
    conditioned = "question alone (no answer given)" if not answered else \
        "question and answer (the question alone where no answer is given)"
    return plot_fact_posteriors(head, data, rows, title=title, marginals=marginals, given=conditioned, budget=budget)


# -- from a checkpoint and a facts file --------------------------------------------------------------------
def predict_file(checkpoint, questions, out=None) -> List[dict]:
    """:func:`predict_records` of a facts file (answers optional); written to ``out`` as JSON Lines if given."""
    lines = predict_records(load_qa_checkpoint(checkpoint), read_qa_jsonl(questions, require_answer=False))
    if out is not None:
        write_jsonl(lines, out)
    return lines


def paths_file(checkpoint, questions, out=None, *, k: int = 5, num_samples: int = 0, seed: int = 0) -> List[dict]:
    """:func:`path_records` of a facts file (answers optional); written to ``out`` as JSON Lines if given."""
    lines = path_records(load_qa_checkpoint(checkpoint), read_qa_jsonl(questions, require_answer=False), k=k,
                         num_samples=num_samples, seed=seed)
    if out is not None:
        write_jsonl(lines, out)
    return lines


def evaluate_file(checkpoint, facts) -> dict:
    """:func:`evaluate_records` of a facts file (every line with its answer)."""
    return evaluate_records(load_qa_checkpoint(checkpoint), read_qa_jsonl(facts))


def inspect_file(checkpoint, questions, out: Union[str, Path], rows: Sequence[int] = (0, 1, 2), title=None) -> Path:
    """:func:`inspect_records` of a facts file, saved as ``out`` (a PNG); returns the path."""
    figure = inspect_records(load_qa_checkpoint(checkpoint), read_qa_jsonl(questions, require_answer=False), rows,
                             title=title)
    figure.savefig(out, dpi=110, bbox_inches="tight")
    return Path(out)
