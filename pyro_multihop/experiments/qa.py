"""Multi-hop question answering from facts files: training, evaluation, outputs, and the ``pyro-multihop qa`` command.

::

    pyro-multihop qa --train train.jsonl --test test.jsonl --hops 2 --out runs/qa

reads two QA JSON Lines files (:mod:`pyro_multihop.datasets.qa_jsonl`; every line of both is checked
before anything is trained), builds the vocabulary from the training file, trains the structured-facts
head by :func:`~pyro_multihop.train.fit_svi` on question-answer pairs alone (supporting facts, if given, only
score), and writes into ``OUT`` (the command's options: :mod:`pyro_multihop.experiments.qa_command`):

- ``results.json``: ``answer_accuracy``, ``fact_accuracy`` (null when the test file has no ``supporting``),
  ``n_train``, ``n_test``, ``hops``, ``seconds`` (training, added up over resumed parts),
  ``log_likelihood`` (test, mean per question), ``hop_fact_accuracy``, how many training and test answers
  occur in no fact of their question (``train_answers_outside_facts``, ``test_answers_outside_facts``),
  ``comparison`` (whether the emission's comparison component was on: by default where some training answer
  occurs in no fact, with starts without it), ``register`` (a held-set register: where some training answers are
  lists), ``composition`` (the composition of two facts' dimension, or null: by default 2 where some training
  answers occur in no fact and are neither lists nor said per hop), with ``embed_dim`` ``embed_min_count`` and
  ``embedded_symbols`` (how many symbols own a row of the embedding), ``diagnostics`` (the fit's findings and the
  hop diagnostics on the test questions) and, with ``starts`` > 1, ``starts`` (every start's record, the kept one
  marked): :mod:`pyro_multihop.experiments.fit_findings`;
- ``predictions.jsonl``: one line per test question, in order (:func:`predict_qa`): its ``id``, ``question``,
  the most probable ``answer`` and ``answer_prob``, ``facts`` (the fact index of each hop of the most probable
  path given the facts and the question, *not* the answer: the path the model follows at test time) and
  ``fact_tokens`` (those facts' tokens), and the file's ``given_answer`` with ``correct``;
- ``hop_posteriors.png``: posterior hop marginals over the facts of the first test questions given their
  answers, supporting facts starred, the question's MAP path dotted
  (:func:`~pyro_multihop.plots.plot_fact_posteriors`);
- ``checkpoint.pt``: the head, its training state and the vocabulary (``extra["qa"]``), read back by
  :func:`load_qa_checkpoint`.

Before the head is allocated, :func:`check_head_memory` compares what training it needs (its ``S x S`` tables
four times over, a chunk of rows) with the memory available, and stops with one line if it does not fit; with
``embed_dim`` (``--embed-dim D``) the head holds symbol embeddings instead, ``O(S D)``, for large vocabularies.
Answers that occur in no fact of their question are reported (:mod:`~pyro_multihop.datasets.qa_jsonl`'s
:class:`~pyro_multihop.datasets.qa_jsonl.AnswerNotInFactsWarning`, or the ``log`` of :func:`run_qa`).
A trained model answers new questions through :mod:`pyro_multihop.experiments.qa_apply`.

bAbI goes through the same path: :func:`run_babi_facts` turns a task's stories into records
(:mod:`pyro_multihop.datasets.babi_facts`) and calls :func:`run_qa`.
"""

from __future__ import annotations

import functools
import json
import math
import os
import types
import warnings
from pathlib import Path
from typing import Callable, List, Optional, Sequence

import torch

from ..checks import renamed_keyword
from ..checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
from ..data import FactObservations
from ..engine import get_memory_budget
from ..datasets.babi import DEFAULT_MEMORY
from ..datasets.babi_facts import load_task_records
from ..datasets.qa_jsonl import (
    AnswerNotInFactsWarning,
    QAData,
    QARecord,
    QAVocabulary,
    answers_outside_facts,
    answers_outside_facts_message,
    write_jsonl,
)
from ..models.facts import PARAMETER_SHAPES, FactAttention, parameter_elements
from ..models.fact_composition import COMPOSITION_ALONE_STARTS, COMPOSITION_EXTRA_STARTS
from ..models.fact_hop_answers import PART_SHAPES
from ..models.fact_parameters import frame_symbols_of
from ..models.symbol_embedding import frequent_symbols
from ..plots import plot_fact_posteriors
from ..runs import CHECKPOINT_NAME, prepare_run_dir
from ..train import fit_svi
from . import command_defaults
from .fit_findings import hop_findings, recorded_fit, report_findings

__all__ = [
    "facts_head",
    "verdict_composition",
    "HeadMemoryError",
    "head_memory_bytes",
    "available_memory_bytes",
    "check_head_memory",
    "LengthGroupedFacts",
    "train_qa",
    "evaluate_qa",
    "predict_qa",
    "plot_fact_posteriors",
    "run_qa",
    "run_babi_facts",
    "load_qa_checkpoint",
    "qa_model",
    "record_id",
]

#: Length groups of ``fit_svi`` (rows cut to their own number of facts, rounded up to this many): exact.
GROUP_LENGTHS = 10


class HeadMemoryError(MemoryError, ValueError):
    """The head and its training would not fit in the memory available (raised before anything is allocated;
    a ``ValueError`` too, so that the command line prints its one line)."""


def available_memory_bytes() -> Optional[int]:
    """Bytes of memory available now: ``MemAvailable`` of ``/proc/meminfo`` where there is one, else the
    physical memory (``os.sysconf``); None where neither can be read."""
    try:
        with open("/proc/meminfo", encoding="ascii") as handle:
            for line in handle:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    try:
        return os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (AttributeError, ValueError, OSError):
        return None


def head_memory_bytes(vocabulary: QAVocabulary, n_hops: int, max_question_len: int, dtype=None,
                      embed_dim: Optional[int] = None, num_answers: Optional[int] = None,
                      num_parts: Optional[int] = None) -> dict:
    """What training the head of :func:`facts_head` needs, in bytes, before it is allocated:
    ``{"parameters", "training", "largest", "largest_bytes"}``. ``training`` = 4 x the parameters (their values,
    gradients and Adam's two moments) + 3 x the largest table of one hop (its padded copy and gradients while a
    chunk is scored) + the engine's memory budget (one chunk of rows). The ``S x S`` tables dominate:
    ``question_tables (L, F, S, S)``, ``content_tables (L - 1, F, F, S, S)``, ``emission_tables (F, S, S)``. With
    ``embed_dim=D`` there are none: the largest of one hop is an ``(S, D)`` embedding's gradient (``O(S D)``).
    ``num_parts``: an answer per hop of that many parts adds ``part_tables (L, 1 + 2 F, F, S, D)``."""
    size = torch.finfo(torch.get_default_dtype() if dtype is None else dtype).bits // 8
    elements = parameter_elements(n_hops, vocabulary.num_fields, vocabulary.num_symbols, max_question_len, embed_dim,
                                  num_answers)
    if num_parts is not None:
        F = vocabulary.num_fields
        elements["part_tables"] = n_hops * (1 + 2 * F) * F * vocabulary.num_symbols * num_parts
    largest = max(elements, key=elements.get)
    if embed_dim is None:
        per_hop = max(elements["question_tables"] // n_hops, elements["emission_tables"],
                      elements["content_tables"] // max(n_hops - 1, 1))
    else:
        per_hop = max(elements["symbol_embedding"], elements["content_bilinear"])
    parameters = sum(elements.values()) * size
    return {"parameters": parameters, "training": 4 * parameters + 3 * per_hop * size + get_memory_budget(),
            "largest": largest, "largest_bytes": elements[largest] * size}


def _gib(count: float) -> str:
    for unit, size in (("GiB", 2**30), ("MiB", 2**20)):
        if count >= size:
            return f"{count / size:.1f} {unit}"
    return f"{math.ceil(count / 2**10)} KiB"


def check_head_memory(vocabulary: QAVocabulary, n_hops: int, max_question_len: int, available: Optional[int] = None,
                      embed_dim: Optional[int] = None, num_answers: Optional[int] = None,
                      num_parts: Optional[int] = None) -> dict:
    """Raise :class:`HeadMemoryError` (one line: how much, and which ``S x S`` table) when training the head
    needs more than ``available`` bytes (default :func:`available_memory_bytes`); returns
    :func:`head_memory_bytes`. An embedded head (``embed_dim``) needs ``O(S D)``: it is refused only when even
    that does not fit."""
    need = head_memory_bytes(vocabulary, n_hops, max_question_len, embed_dim=embed_dim, num_answers=num_answers,
                             num_parts=num_parts)
    available = available_memory_bytes() if available is None else available
    if available is not None and need["training"] > available and embed_dim is not None:
        raise HeadMemoryError(
            f"training the facts head with symbol embeddings needs about {_gib(need['training'])} but "
            f"{_gib(available)} of memory is available (S = {vocabulary.num_symbols} symbols, embed_dim = {embed_dim}); "
            f"use a smaller --embed-dim or fewer distinct tokens")
    if available is not None and need["training"] > available:
        S, F, name = vocabulary.num_symbols, vocabulary.num_fields, need["largest"]
        raise HeadMemoryError(
            f"training the facts head needs about {_gib(need['training'])} but {_gib(available)} of memory is "
            f"available: its S x S tables grow as the square of the vocabulary (S = {S} symbols, F = {F} fields, "
            f"L = {n_hops} hops); {name} {({**PARAMETER_SHAPES, **PART_SHAPES})[name]} alone holds "
            f"{_gib(need['largest_bytes'])}, and "
            f"training keeps 4 copies (values, gradients, Adam's two moments); use --embed-dim D (symbol "
            f"embeddings, O(S D) memory), fewer distinct tokens (map rare ones to one token) or shorter facts")
    return need


#: What separates the parts of an answer said one part per hop (bAbI's list answers: ``"s,e"``).
ANSWER_PART_SEPARATOR = ","


def hop_answer_parts(records: Sequence[QARecord], vocabulary: QAVocabulary, n_hops: int) -> Optional[dict]:
    """``{answer symbol: L part numbers}`` where every training answer has ``n_hops`` > 1 non-empty parts
    (:data:`ANSWER_PART_SEPARATOR`), the parts numbered in sorted order; None otherwise (the answer is emitted from
    the last hop's fact). The rule reads the answers' form, no word: ``FactAttention``'s ``answer_parts``."""
    if n_hops < 2:
        return None
    split = {record.answer: record.answer.split(ANSWER_PART_SEPARATOR) for record in records}
    if not split or any(len(parts) != n_hops or not all(parts) for parts in split.values()):
        return None
    numbers = {part: number for number, part in enumerate(sorted({p for parts in split.values() for p in parts}))}
    return {vocabulary.index(answer): [numbers[part] for part in parts] for answer, parts in sorted(split.items())}


def comparison_note(starts: int) -> str:
    """The note ``qa`` and ``babi`` print where answers outside the facts turn the emission's comparison on: what
    its ``starts`` starts are (the default fits eight, :data:`command_defaults.COMPARISON_STARTS`)."""
    scheme = "with and without it, from the equality weights at 1 and at 0, with and without the word-order terms"
    default = command_defaults.COMPARISON_STARTS
    if starts == 1:
        said = f"1 start, the head's own, with it (--starts {default}: {scheme})"
    elif starts < default:
        said = f"{starts} starts, the first {starts} of the default {default} ({scheme}), the best held-out " \
               "log-likelihood kept"
    else:
        extra = f", {starts - default} more perturbed" if starts > default else ""
        said = f"{starts} starts, {scheme}{extra}, the best held-out log-likelihood kept"
    return f"note: the emission's comparison is on, since some training answers occur in no fact; {said} " \
           "(--no-comparison: off)"


def verdict_composition(composition: Optional[int], verdicts: bool) -> Optional[int]:
    """The composition's dimension :func:`run_qa` gives the head: ``composition`` where given (0: off, None),
    else :data:`~.command_defaults.COMPOSITION_DIM` where the training answers are ``verdicts`` (some occur in no
    fact, and they are neither lists nor said per hop: a yes / no may come from two facts together), else None.
    The rule reads no word; the held-out likelihood then chooses among starts with and without it."""
    if composition is None:
        return command_defaults.COMPOSITION_DIM if verdicts else None
    return composition or None


def list_register(records: Sequence[QARecord], vocabulary: QAVocabulary) -> Optional[dict]:
    """A held-set register (``FactAttention``'s ``register``) where some training answers are lists (two or more
    parts separated by :data:`ANSWER_PART_SEPARATOR`, every part a symbol of the vocabulary) and the answers are not
    said per hop: ``{"counts": 1 + the longest list, "lists": [[answer symbol, [part symbols]], ...]}``; None
    otherwise. The rule reads the answers' form, no word (bAbI task 8's "football,apple")."""
    lists = {}
    for record in records:
        parts = record.answer.split(ANSWER_PART_SEPARATOR)
        if len(parts) > 1 and len(set(parts)) == len(parts) and all(vocabulary.index(part) for part in parts):
            lists[record.answer] = [vocabulary.index(part) for part in parts]
    if not lists:
        return None
    return {"counts": 1 + max(len(parts) for parts in lists.values()),
            "lists": [[vocabulary.index(answer), parts] for answer, parts in sorted(lists.items())]}


def facts_head(vocabulary: QAVocabulary, n_hops: int, max_question_len: int, check_memory: bool = True,
               embed_dim: Optional[int] = None, seed: int = 0, comparison: bool = False, answer_symbols=None,
               embedded_symbols=None, frame_symbols=None, answer_parts=None, path_normalised: bool = False,
               register=None, composition: Optional[int] = None):
    """The structured-facts head (:class:`~pyro_multihop.models.facts.FactAttention`) sized for
    ``vocabulary``: ``n_hops`` hops over facts of ``vocabulary.num_fields`` fields, one table of
    ``vocabulary.num_symbols`` symbols, ``max_question_len`` question positions (a longer question shares
    the last). Its parameters start at zero (uniform attention); with ``embed_dim=D``, its ``S x S`` tables are
    symbol embeddings of ``D`` dimensions, drawn from ``seed``; ``comparison``: the emission's comparison
    component on; ``answer_symbols``: the symbols its learnt emission may give (``FactAttention``'s; :func:`run_qa`
    passes the training answers to an embedded head); ``embedded_symbols``: the symbols that own a row of its
    embedding (``FactAttention``'s; :func:`run_qa` passes those of ``embed_min_count`` training questions);
    ``frame_symbols``: a table head's frame symbols (``FactAttention``'s; :func:`run_qa` passes those that no
    training question or answer names); ``answer_parts``: an answer per hop (``FactAttention``'s; :func:`run_qa` passes
    :func:`hop_answer_parts`); ``path_normalised``: one softmax over whole hop paths (``FactAttention``'s);
    ``register``: a held-set register (``FactAttention``'s; :func:`run_qa` passes :func:`list_register`);
    ``composition``: a composition of two facts of that dimension (``FactAttention``'s). With ``check_memory``,
    :func:`check_head_memory` runs first."""
    if check_memory:
        num_parts = None if answer_parts is None else 1 + max(max(parts) for parts in answer_parts.values())
        check_head_memory(vocabulary, n_hops, max_question_len, embed_dim=embed_dim,
                          num_answers=None if answer_symbols is None else len(answer_symbols), num_parts=num_parts)
    return FactAttention(n_hops, vocabulary.num_fields, vocabulary.num_symbols, max_question_len=max_question_len,
                         embed_dim=embed_dim, seed=seed if embed_dim is not None else None, comparison=comparison,
                         answer_symbols=answer_symbols, embedded_symbols=embedded_symbols, frame_symbols=frame_symbols,
                         answer_parts=answer_parts, path_normalised=path_normalised, register=register,
                         composition=composition)


class LengthGroupedFacts(FactObservations):
    """:class:`~pyro_multihop.data.FactObservations` that :func:`~pyro_multihop.train.fit_svi` can group
    by length (``group_lengths``): each row's number of facts and a cut to the first ``width`` facts. The
    cut is exact for rows with at most ``width`` facts (padded facts get no attention), and saves most of
    the ``O(N^2)`` work where most rows hold far fewer facts than the longest (bAbI task 2: 15 of 50)."""

    @classmethod
    def of(cls, obs: FactObservations) -> "LengthGroupedFacts":
        return cls(obs.facts, obs.question, obs.target, obs.fact_mask, obs.field_mask, obs.question_mask, obs.supporting)

    def context_lengths(self) -> torch.Tensor:
        """``(n,)``: each row's last real fact + 1."""
        return self.full_mask().long().cumsum(-1).argmax(-1) + 1

    def truncate_context(self, width: int) -> "LengthGroupedFacts":
        """The first ``width`` facts of every row (the supporting facts are dropped: training never reads them)."""
        field_mask = None if self.field_mask is None else self.field_mask[:, :width]
        return LengthGroupedFacts(self.facts[:, :width], self.question, self.target, self.full_mask()[:, :width],
                                  field_mask, self.question_mask)


def train_qa(head, train: QAData, *, steps=None, lr=None, batch_size=None, valid_fraction=None, seed: int = 0,
             collapsed: bool = False, checkpoint=None, resume: bool = False, progress: bool = False,
             starts: int = 1, processes: Optional[int] = None):
    """Fit ``head`` to the training questions by SVI (:func:`~pyro_multihop.train.fit_svi`, the head's own
    defaults for what is left None); returns fit_svi's metrics. ``starts`` > 1: that many starts, the one with
    the best held-out log-likelihood kept (on ``valid_fraction`` of the questions, by default a tenth), fitted
    in up to ``processes`` processes at once."""
    return fit_svi(head, LengthGroupedFacts.of(train.obs), num_steps=steps, lr=lr, batch_size=batch_size,
                   val_fraction=valid_fraction, seed=seed, collapsed=collapsed, checkpoint=checkpoint, resume=resume,
                   progress=progress, group_lengths=GROUP_LENGTHS, starts=starts, processes=processes)


def record_id(data: QAData, row: int):
    """The ``id`` of row ``row``: its record's, else the row's place in ``data`` (from 0)."""
    record = data.records[row]
    return row if record.id is None else record.id


@torch.no_grad()
def predict_qa(head, data: QAData, budget: Optional[int] = None) -> List[dict]:
    """Per question, in order: ``{"id", "question": [tokens], "answer": text, "answer_prob": p, "facts": [fact
    index per hop], "fact_tokens": [[tokens of that fact] per hop]}``, plus ``"given_answer"`` and ``"correct"``
    where the record has an answer. ``facts`` is the MAP path given the question, not the answer
    (``map_paths(given_target=False)``): the path the model follows when it answers."""
    probs = head.predict_proba(data.obs, budget=budget)
    answer_prob, predicted = probs.max(-1)
    paths = head.map_paths(data.obs, given_target=False, budget=budget)
    lines = []
    for row, (symbol, p, path) in enumerate(zip(predicted.tolist(), answer_prob.tolist(), paths.tolist())):
        record = data.records[row]
        line = {"id": record_id(data, row), "question": list(record.question), "answer": data.answer_text(row, symbol),
                "answer_prob": float(p), "facts": path, "fact_tokens": [list(record.facts[fact]) for fact in path]}
        if record.answer is not None:
            line.update(given_answer=record.answer, correct=line["answer"] == record.answer)
        lines.append(line)
    return lines


@torch.no_grad()
def evaluate_qa(head, data: QAData, predictions: Optional[List[dict]] = None) -> dict:
    """``answer_accuracy`` (the predicted answer's text equals the answer), ``fact_accuracy`` (the
    question's MAP path visits the supporting facts in order; None without them), ``hop_fact_accuracy``
    (per hop, the share that attends that hop's supporting fact), ``n`` and the mean test ``log_likelihood``."""
    data.require_answers("evaluation")
    predictions = predict_qa(head, data) if predictions is None else predictions
    hits = [prediction["answer"] == record.answer for prediction, record in zip(predictions, data.records)]
    paths = torch.tensor([prediction["facts"] for prediction in predictions], dtype=torch.long)
    log_likelihood = float(head.log_likelihood(data.obs).mean())
    return {
        "answer_accuracy": sum(hits) / len(hits),
        "fact_accuracy": data.fact_accuracy(paths),
        "hop_fact_accuracy": data.hop_fact_accuracy(paths),
        "n": len(data),
        "log_likelihood": log_likelihood if math.isfinite(log_likelihood) else None,
    }


def _attach_vocabulary(checkpoint: Path, head, vocabulary: QAVocabulary, n_hops: int) -> float:
    """Add the vocabulary to the checkpoint fit_svi wrote, keeping its optimiser and training state; returns the
    training seconds it holds (fit_svi adds them up over resumed parts)."""
    payload = read_checkpoint(checkpoint)
    stored_optimizer = None if payload["optimizer"] is None else types.SimpleNamespace(state_dict=lambda: payload["optimizer"])
    extra = dict(payload["extra"])
    extra["qa"] = {"vocabulary": vocabulary.to_dict(), "hops": n_hops}
    save_checkpoint(checkpoint, head, stored_optimizer, step=payload["step"], extra=extra)
    return float((extra.get("svi") or {}).get("seconds", 0.0))


def load_qa_checkpoint(path):
    """``(head, vocabulary, state)`` of a checkpoint written by :func:`run_qa`."""
    return qa_model(*load_checkpoint(path), path)


def qa_model(head, state: dict, path) -> tuple:
    """``(head, vocabulary, state)`` of a checkpoint already loaded (:func:`~pyro_multihop.checkpoint.load_checkpoint`
    gave ``head, state``) from ``path``; ``ValueError`` when it holds no QA vocabulary."""
    qa = (state.get("extra") or {}).get("qa")
    if qa is None:
        raise ValueError(f"checkpoint {str(path)!r} holds a {type(head).__name__} without a QA vocabulary "
                         "(extra['qa']): not written by the qa or babi command")
    return head, QAVocabulary.from_dict(qa["vocabulary"]), state


def _json_number(value):
    return value if value is None or math.isfinite(value) else None


def _report(log: Optional[Callable[[str], None]], message: Optional[str]) -> None:
    """``message`` to ``log``, else as an :class:`AnswerNotInFactsWarning` (at run_qa's caller)."""
    if message is not None:
        if log is not None:
            log(f"warning: {message}")
        else:
            warnings.warn(message, AnswerNotInFactsWarning, stacklevel=3)


def run_qa(train_records: Sequence[QARecord], test_records: Sequence[QARecord], n_hops: Optional[int] = None,
           out=None, *, seed: int = 0,
           steps=None, lr=None, batch_size=None, valid_fraction=None, collapsed: bool = False, resume: bool = False,
           overwrite: bool = False, figure_rows: int = 3, progress: bool = False, extra: Optional[dict] = None,
           log: Optional[Callable[[str], None]] = None, hops: Optional[int] = None,
           embed_dim: Optional[int] = None, starts: Optional[int] = None, processes: Optional[int] = None,
           comparison: Optional[bool] = None, embed_min_count: Optional[int] = None,
           path_normalised: Optional[bool] = None, composition: Optional[int] = None) -> dict:
    """Train the structured-facts head on ``train_records``, evaluate on ``test_records``, write the outputs
    of the module docstring into ``out`` (refused if it holds a checkpoint, unless ``resume``/``overwrite``);
    returns the results.

    ``log``: where the run's notes go, one line each (the command prints them): the step it resumes from, the
    answers that occur in no fact of their question, the starts kept and each diagnostic
    (``warning: <message> (try: <hint>)``); without it, these are warnings
    (:class:`~pyro_multihop.datasets.qa_jsonl.AnswerNotInFactsWarning`, the fit's own, the hop diagnostics'
    :class:`~pyro_multihop.diagnostics.DiagnosticWarning` s). ``starts``, ``processes``: as :func:`train_qa`.
    The head is sized by the training questions (a longer test question shares the last question position)
    after :func:`check_head_memory`; ``embed_dim``: symbol embeddings of that dimension in place of its
    ``S x S`` tables (:func:`facts_head`), of which only the symbols of at least ``embed_min_count`` training
    questions own a row (default :data:`~.command_defaults.EMBED_MIN_COUNT`; ``results.json`` records
    ``embed_min_count`` and how many ``embedded_symbols``); ``comparison``: the emission's comparison component on
    (True), off (False) or, by default (None), on where some training answer occurs in no fact of its question:
    only a learnt part of the emission can give such an answer, and a yes / no / maybe answer needs the comparison;
    where every answer is in a fact (a knowledge base's entities) it stays off, and where every training answer has
    ``n_hops`` parts (:func:`hop_answer_parts`: then the answer is said per hop, ``results.json``'s
    ``answer_per_hop``). The rule reads no word. ``path_normalised``: one softmax over whole hop paths
    (``FactAttention``'s) on (True), off (False) or, by default (None), on where the answer is said per hop: its first
    hop must pick, among the facts that name the question's start, the one from which the later hops reach the
    answer, and a softmax per hop cannot see ahead (bAbI task 19: 86.5 to 100 % at 1k; on tasks 2 and 3, whose answer
    is the last hop's, it gave 91.7 and 78.9 against 96.6 and 98.4). ``starts`` by
    default: :data:`~.command_defaults.COMPARISON_STARTS` where the comparison is on (starts 1 and 3 are the
    emission without it, starts 2 and 3 the equality weights at 0, starts 4-7 the same four with the word-order
    terms held at 0: ``FactAttention.start_variant``, so the held-out log-likelihood chooses whether the comparison
    stays, where training starts and whether the word-order terms are used), else 1. ``composition``: ``D``, a
    composition of two facts in the emission (``FactAttention``'s; ``results.json``'s ``composition``), 0 off, or
    by default (None) :data:`~.command_defaults.COMPOSITION_DIM` where some training answers occur in no fact and are
    neither lists (the register's) nor said per hop (:func:`verdict_composition`), with
    :data:`~pyro_multihop.models.fact_composition.COMPOSITION_EXTRA_STARTS` more starts by default (starts 1-3 the
    composition alone from three draws of its vectors, the head's own starts without it after them). ``hops``: the
    old name of ``n_hops``, deprecated."""
    n_hops = renamed_keyword("run_qa", "n_hops", n_hops, "hops", hops)
    if composition is not None and (isinstance(composition, bool) or not isinstance(composition, int)
                                    or composition < 0):
        raise ValueError(f"composition must be a non-negative int (0: off) or None (from the data), got "
                         f"{composition!r}")
    if embed_min_count is not None and embed_dim is None:
        raise ValueError(f"embed_min_count needs embed_dim (a table head has no embedding), got {embed_min_count!r}")
    if out is None:
        raise TypeError("run_qa() missing required argument: 'out'")
    out = prepare_run_dir(out, resume=resume, overwrite=overwrite, resumable=True)
    checkpoint = out / CHECKPOINT_NAME
    vocabulary = QAVocabulary.build(train_records)
    longest_question = max(len(record.question) for record in train_records)
    train, test = vocabulary.encode(train_records), vocabulary.encode(test_records)
    # An embedded head's learnt emission gives the training answers alone: its cost grows with them, not with S
    # (a table can learn no other answer; any other comes from a copy).
    answers = torch.unique(train.obs.target).tolist() if embed_dim is not None else None
    embedded = None
    if embed_dim is not None:
        embed_min_count = command_defaults.EMBED_MIN_COUNT if embed_min_count is None else embed_min_count
        embedded = frequent_symbols(train.obs, vocabulary.num_symbols, embed_min_count)
    train_outside = answers_outside_facts(train_records)  # the sources of the answers no fact holds
    parts = hop_answer_parts(train_records, vocabulary, n_hops)  # said per hop: no last-hop emission to compare in
    chosen = comparison is None
    comparison = bool(train_outside) and parts is None if chosen else bool(comparison)
    register = list_register(train_records, vocabulary) if parts is None else None  # lists: what a person holds
    composition = verdict_composition(composition, bool(train_outside) and parts is None and register is None)
    if starts is None:
        starts = (command_defaults.COMPARISON_STARTS if comparison else command_defaults.STARTS) + \
            (COMPOSITION_EXTRA_STARTS if composition else 0)
    # the frame table's symbols (a table head): those no training question or answer names, read from the data
    frame = frame_symbols_of(train.obs, vocabulary.num_symbols) if embed_dim is None else None
    head = facts_head(vocabulary, n_hops, longest_question, embed_dim=embed_dim, seed=seed, comparison=comparison,
                      answer_symbols=answers, embedded_symbols=embedded, frame_symbols=frame, answer_parts=parts,
                      register=register, composition=composition,
                      path_normalised=parts is not None if path_normalised is None else bool(path_normalised))
    test.require_answers("evaluating the test questions")
    if parts is None:  # an answer said per hop is never in a fact: its note below says how it is learnt
        _report(log, answers_outside_facts_message(train_records, "training"))
        _report(log, answers_outside_facts_message(test_records, "test"))
    if chosen and comparison and log is not None:
        log(comparison_note(starts - (COMPOSITION_EXTRA_STARTS if head.uses_composition else 0)))
    if parts is not None and log is not None:
        log(f"note: every training answer has {n_hops} parts (separated by {ANSWER_PART_SEPARATOR!r}): the answer is "
            "said per hop, part l by the fact hop l attends" + (", and the hops are normalised over whole paths "
            "(--no-path-normalised: one softmax per hop)" if head.path_normalised else ""))
    if register is not None and log is not None:
        log(f"note: {len(register['lists'])} training answers are lists (separated by {ANSWER_PART_SEPARATOR!r}): the "
            "emission mixes in a held-set register (what the question's person holds: its count or its set)")
    if head.uses_composition and log is not None:
        count = min(starts - 1, COMPOSITION_ALONE_STARTS)  # the starts of the composition alone
        alone = "" if count == 0 else (f"; start 1 of the {starts} is" if count == 1 else
                                       f"; starts 1-{count} of the {starts} are") + " the composition alone" + \
            (", the head's own starts follow without it" if starts > count + 1 else "")
        log(f"note: the emission mixes in a composition of two facts ({head.composition_dim} dimensions): a yes / no "
            f"from what two facts state together{alone} (--composition 0: off)")
    if resume and checkpoint.exists() and log is not None:
        log(f"resuming from step {read_checkpoint(checkpoint)['step']} of {checkpoint}")
    fit = functools.partial(train_qa, head, train, steps=steps, lr=lr, batch_size=batch_size,
                            valid_fraction=valid_fraction, seed=seed, collapsed=collapsed, checkpoint=checkpoint,
                            resume=resume, progress=progress, starts=starts, processes=processes)
    findings = report_findings(recorded_fit(fit, log)[1], log, hop_findings(head, test))
    seconds = _attach_vocabulary(checkpoint, head, vocabulary, n_hops)
    predictions = predict_qa(head, test)
    scores = evaluate_qa(head, test, predictions)
    results = {
        "answer_accuracy": scores["answer_accuracy"],
        "fact_accuracy": scores["fact_accuracy"],
        "n_train": len(train),
        "n_test": len(test),
        "hops": n_hops,
        "seed": seed,
        "seconds": round(seconds, 2),
        "log_likelihood": _json_number(scores["log_likelihood"]),
        "hop_fact_accuracy": scores["hop_fact_accuracy"],
        "train_answers_outside_facts": len(train_outside),
        "test_answers_outside_facts": len(answers_outside_facts(test_records)),
        "comparison": head.comparison,
        "answer_per_hop": head.per_hop_answers,
        "path_normalised": head.path_normalised,
        "register": head.uses_register,
        "composition": head.composition_dim,
        **({} if embedded is None else {"embed_min_count": embed_min_count,
                                        "embedded_symbols": int(embedded.sum())}),
        **findings,
        **(extra or {}),
    }
    (out / "results.json").write_text(json.dumps(results, indent=2, allow_nan=False) + "\n")
    write_jsonl(predictions, out / "predictions.jsonl")
    rows = range(min(figure_rows, len(test)))
    figure = plot_fact_posteriors(head, test, rows, title=f"{type(head).__name__}, {n_hops} hops: posterior hop "
                                  "marginals over facts (given question and answer)")
    figure.savefig(out / "hop_posteriors.png", dpi=110, bbox_inches="tight")
    return results


def run_babi_facts(task: int, out, *, data_dir=None, train_dir=None, n_hops: Optional[int] = None,
                   memory: int = DEFAULT_MEMORY, max_train: Optional[int] = None, hops: Optional[int] = None,
                   **options) -> dict:
    """A bAbI task through the facts path: its stories as facts records
    (:func:`~pyro_multihop.datasets.babi_facts.load_task_records`), then :func:`run_qa` with ``n_hops`` (default:
    the most supporting facts of a training question, the task's number); the results add ``task``,
    ``memory`` and ``encoding = "facts"``. ``hops``: the old name of ``n_hops``, deprecated."""
    if hops is not None:
        n_hops = renamed_keyword("run_babi_facts", "n_hops", n_hops, "hops", hops)
    train, test = load_task_records(task, data_dir=data_dir, train_dir=train_dir, memory=memory, max_train=max_train)
    if n_hops is None:
        n_hops = max(1, max(len(record.supporting or ()) for record in train))
    return run_qa(train, test, n_hops, out, extra={"task": task, "memory": memory, "encoding": "facts"}, **options)
