"""Multi-hop question answering in JSON Lines: the format, a strict streaming reader, the vocabulary.

**The format** (docs/qa.md). One line is one question, a JSON object::

    {"facts": [["mary", "moved", "bathroom"], ["mary", "got", "football"]],
     "question": ["where", "is", "the", "football"],
     "answer": "bathroom",
     "supporting": [1, 0]}

- ``facts``: the context, oldest first, at least one fact; a fact is a list of 1 to ``F`` tokens;
- ``question``: at least one token;
- ``answer``: one token; it may be a phrase (``"new york"``): the whole string is one symbol. Required for
  training and evaluation; a file of questions to answer may leave it out (``require_answer=False``);
- ``supporting`` (optional): indices into ``facts`` in the order the reasoning uses them (for scoring only);
- ``id`` (optional): a string or an integer naming the question, carried into every output line.

A token is any non-empty string (spaces included: ``"new york"`` is one token of a fact). No other key is
allowed. Blank lines are skipped.

**Facts to fields.** A fact of ``k`` tokens fills fields ``0 .. k-1`` in its order; fields ``k .. F-1``
are padding (``field_mask`` False). ``F`` is the longest fact of the training file. So a triple
``(subject, relation, object)`` puts the subject in field 0, the relation in field 1, the object in field 2;
what a field means is the user's choice, and the head learns which field pairs matter.

**Symbols.** One table for fact tokens, question tokens and answers, built from the training file
(:class:`QAVocabulary`): symbol 0 is the reserved unknown symbol ``<unk>``, then the training tokens and
answers in sorted order, then ``copy_slots`` *copy slots*. The target of a question is its answer's
symbol, in the same table, so the head's copy emission (answer with the symbol of an attended field) and
its learned emission table share one space.

**Tokens the training file never showed.** In each question of a later file, the unseen tokens of its
facts and question get the copy slots, one per distinct token, in order of first appearance (facts oldest
first, then the question). Inside a question a slot behaves like any symbol (field equality, copying), so
the model can answer with a token it never saw: the copy emission puts mass on the slot, and
:meth:`QAData.answer_text` turns the slot back into the question's token. An unseen answer that occurs in
the facts gets its slot as the target; one that occurs nowhere gets ``<unk>`` (no model can produce it).
Unseen tokens beyond ``copy_slots`` in one question become ``<unk>``. The learned tables never train the
slot rows, so only equality and copying use them.

**Errors.** A malformed line raises :class:`QAFormatError` (a ``ValueError``) naming the file, the line and
the field (``train.jsonl:7: facts[2][0]: expected a non-empty string, got 3``); :func:`read_qa_jsonl`
reads the whole file before returning, so a bad line stops the load before anything is trained.

**Answers no fact holds.** An answer that is no token of any fact of its question can only come from the
learnt emission table (a copy cannot produce it): :func:`answers_outside_facts` lists such lines and
:func:`warn_answers_outside_facts` reports them with :class:`AnswerNotInFactsWarning`.

Example::

    >>> import json, os, tempfile
    >>> from pyro_multihop.datasets.qa_jsonl import QAVocabulary, read_qa_jsonl
    >>> path = os.path.join(tempfile.mkdtemp(), "train.jsonl")
    >>> line = {"facts": [["mary", "moved", "bathroom"]], "question": ["where", "is", "mary"], "answer": "bathroom"}
    >>> _ = open(path, "w").write(json.dumps(line) + "\\n")
    >>> records = read_qa_jsonl(path)
    >>> vocabulary = QAVocabulary.build(records, copy_slots=2)
    >>> vocabulary.symbols, vocabulary.num_fields
    (['<unk>', 'bathroom', 'is', 'mary', 'moved', 'where', '<copy 1>', '<copy 2>'], 3)
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import torch

from ..data import FactObservations
from .babi import fact_matches

__all__ = [
    "write_jsonl",
    "QAFormatError",
    "AnswerNotInFactsWarning",
    "QARecord",
    "QAVocabulary",
    "QAData",
    "iter_qa_jsonl",
    "read_qa_jsonl",
    "write_qa_jsonl",
    "record_to_json",
    "supporting_matches",
    "answers_outside_facts",
    "answers_outside_facts_message",
    "warn_answers_outside_facts",
    "UNKNOWN",
]

UNKNOWN = "<unk>"
FORMAT = "pyro-multihop-qa-vocabulary"
KEYS = ("id", "facts", "question", "answer", "supporting")
#: Lines named in a report of answers that no fact holds (the rest are counted).
FIRST_LINES = 5
PathLike = Union[str, os.PathLike]


class QAFormatError(ValueError):
    """A line of a QA JSON Lines file that does not follow the format: names the file, line and field."""


class AnswerNotInFactsWarning(UserWarning):
    """Answers that are no token of any fact of their question: only the learnt emission table can give them
    (in training, only that table learns them; at test time a copy cannot produce them)."""


@dataclass(frozen=True)
class QARecord:
    """One question with its facts.

    :ivar facts: ``(fact, ...)``, each fact a tuple of 1 or more tokens, oldest first.
    :ivar question: the question's tokens. :ivar answer: the answer (one symbol, possibly a phrase), or None
        for a question to answer. :ivar supporting: fact indices in reasoning order, or None.
    :ivar source: ``"file:line"``. :ivar id: the line's ``id`` (a string or an integer), or None.
    """

    facts: Tuple[Tuple[str, ...], ...]
    question: Tuple[str, ...]
    answer: Optional[str]
    supporting: Optional[Tuple[int, ...]] = None
    source: str = ""
    id: Optional[Union[str, int]] = None


def _describe(value) -> str:
    text = json.dumps(value, ensure_ascii=False) if not isinstance(value, str) else repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def _tokens(value, name: str, where: str) -> Tuple[str, ...]:
    if not isinstance(value, list) or not value:
        raise QAFormatError(f"{where}: {name}: expected a non-empty list of strings, got {_describe(value)}")
    for index, token in enumerate(value):
        if not isinstance(token, str) or not token.strip():
            raise QAFormatError(f"{where}: {name}[{index}]: expected a non-empty string, got {_describe(token)}")
    return tuple(value)


def parse_record(payload, where: str, require_answer: bool = True) -> QARecord:
    """Validate one decoded JSON line (``where`` = ``"file:line"``) into a :class:`QARecord`; without
    ``require_answer`` the ``answer`` key may be absent (a question to answer: ``answer`` None)."""
    if not isinstance(payload, dict):
        raise QAFormatError(f"{where}: expected a JSON object with keys facts, question, answer, got {_describe(payload)}")
    unknown = sorted(set(payload) - set(KEYS))
    if unknown:
        raise QAFormatError(f"{where}: {unknown[0]}: unknown field (allowed: {', '.join(KEYS)})")
    for name in ("facts", "question", "answer") if require_answer else ("facts", "question"):
        if name not in payload:
            needed = "facts, question and answer" if require_answer else "facts and question"
            raise QAFormatError(f"{where}: {name}: missing (every line needs {needed})")
    record_id = payload.get("id")
    if "id" in payload and (isinstance(record_id, bool) or not isinstance(record_id, (str, int))
                            or (isinstance(record_id, str) and not record_id.strip())):
        raise QAFormatError(f"{where}: id: expected a non-empty string or an integer, got {_describe(record_id)}")
    facts = payload["facts"]
    if not isinstance(facts, list) or not facts:
        raise QAFormatError(f"{where}: facts: expected a non-empty list of facts (lists of tokens), got {_describe(facts)}")
    facts = tuple(_tokens(fact, f"facts[{index}]", where) for index, fact in enumerate(facts))
    question = _tokens(payload["question"], "question", where)
    answer = payload.get("answer")
    if "answer" in payload and (not isinstance(answer, str) or not answer.strip()):
        raise QAFormatError(f"{where}: answer: expected a non-empty string, got {_describe(answer)}")
    supporting = payload.get("supporting")
    if supporting is not None:
        if not isinstance(supporting, list) or not supporting:
            raise QAFormatError(f"{where}: supporting: expected a non-empty list of fact indices, got {_describe(supporting)}")
        for index, fact in enumerate(supporting):
            if isinstance(fact, bool) or not isinstance(fact, int) or not 0 <= fact < len(facts):
                raise QAFormatError(
                    f"{where}: supporting[{index}]: expected a fact index from 0 to {len(facts) - 1}, got {_describe(fact)}"
                )
        supporting = tuple(supporting)
    return QARecord(facts, question, answer, supporting, where, record_id)


def iter_qa_jsonl(path: PathLike, require_answer: bool = True) -> Iterator[QARecord]:
    """Stream the records of a QA JSON Lines file, validating each line as it is read (without
    ``require_answer``, lines may leave ``answer`` out: questions to answer).

    :raises QAFormatError: at the first malformed line (file, line and field named).
    :raises FileNotFoundError: if ``path`` does not exist.
    """
    path = Path(path)
    with open(path, encoding="utf-8") as handle:
        for line_number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_number}"
            try:
                payload = json.loads(line)
            except json.JSONDecodeError as error:
                raise QAFormatError(f"{where}: not a JSON object: {error.msg} (column {error.colno})") from None
            yield parse_record(payload, where, require_answer)


def read_qa_jsonl(path: PathLike, require_answer: bool = True) -> List[QARecord]:
    """Every record of a QA JSON Lines file; the whole file is checked before anything is returned (without
    ``require_answer``, lines may leave ``answer`` out).

    :raises QAFormatError: naming the file, line and field of the first malformed line, or a file without records.
    """
    records = list(iter_qa_jsonl(path, require_answer))
    if not records:
        raise QAFormatError(f"{path}: no questions (a QA JSON Lines file holds one JSON object a line)")
    return records


def record_to_json(record: QARecord) -> dict:
    """The JSON object of one record (the inverse of :func:`parse_record`)."""
    payload = {} if record.id is None else {"id": record.id}
    payload.update({"facts": [list(fact) for fact in record.facts], "question": list(record.question)})
    if record.answer is not None:
        payload["answer"] = record.answer
    if record.supporting is not None:
        payload["supporting"] = list(record.supporting)
    return payload


def write_jsonl(lines: Iterable[dict], path: PathLike) -> Path:
    """Write JSON objects one a line (UTF-8, no ``NaN``), creating the folder; returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as handle:
        for line in lines:
            handle.write(json.dumps(line, ensure_ascii=False, allow_nan=False) + "\n")
    return path


def write_qa_jsonl(records: Iterable[QARecord], path: PathLike) -> Path:
    """Write records as QA JSON Lines (UTF-8, one object a line); returns the path."""
    return write_jsonl(map(record_to_json, records), path)


def answers_outside_facts(records: Iterable[QARecord]) -> List[str]:
    """The sources (``"file:line"``) of the records whose answer is no token of any of their facts, in order
    (records without an answer are skipped)."""
    return [record.source for record in records
            if record.answer is not None and all(record.answer not in fact for fact in record.facts)]


def answers_outside_facts_message(records: Sequence[QARecord], role: str) -> Optional[str]:
    """One line on the answers of ``records`` that no fact of their question holds (``role``: ``"training"``
    or ``"test"``, which says what follows from it), or None when every answer occurs in a fact."""
    lines = answers_outside_facts(records)
    if not lines:
        return None
    answered = sum(record.answer is not None for record in records)
    first = ", ".join(lines[:FIRST_LINES]) + (", ..." if len(lines) > FIRST_LINES else "")
    why = ("only the emission table can learn them (a copy cannot produce them)" if role == "training" else
           "a copy cannot produce them, only the learnt emission table, and only answers seen in training")
    return f"{len(lines)} of {answered} {role} answers occur in no fact of their question ({first}): {why}"


def warn_answers_outside_facts(records: Sequence[QARecord], role: str, stacklevel: int = 2) -> Optional[str]:
    """Warn (:class:`AnswerNotInFactsWarning`, at ``stacklevel`` as :func:`warnings.warn` counts it from this
    function: 2 is its caller) with :func:`answers_outside_facts_message`; returns that line."""
    message = answers_outside_facts_message(records, role)
    if message is not None:
        warnings.warn(message, AnswerNotInFactsWarning, stacklevel=stacklevel)
    return message


#: ``(n,)`` bool: does each hop path ``(n, L)`` of fact indices visit the supporting facts, in order (repeats
#: merged; unannotated rows False)? The bAbI reader's rule, :func:`~pyro_multihop.datasets.babi.fact_matches`.
supporting_matches = fact_matches


class QAVocabulary:
    """The symbol table of a QA data set (module docstring): ``<unk>``, the training symbols, copy slots.

    :param symbols: the training tokens and answers (without ``<unk>`` and the slots), in symbol order.
    :param int num_fields: ``F``, fields per fact.
    :param int copy_slots: symbols reserved for tokens the training data never showed.
    """

    def __init__(self, symbols: Sequence[str], num_fields: int, copy_slots: int):
        for name, value, least in (("num_fields", num_fields, 1), ("copy_slots", copy_slots, 0)):
            if isinstance(value, bool) or not isinstance(value, int) or value < least:
                raise ValueError(f"{name} must be an integer >= {least}, got {value!r}")
        symbols = list(symbols)
        bad = next((s for s in symbols if not isinstance(s, str) or not s.strip()), None)
        if bad is not None or len(set(symbols)) != len(symbols):
            raise ValueError(f"symbols must be distinct non-empty strings, got {bad!r}" if bad is not None
                             else "symbols must be distinct non-empty strings, got a repeated one")
        self.known = symbols
        self.num_fields = num_fields
        self.copy_slots = copy_slots
        self._index: Dict[str, int] = {symbol: index + 1 for index, symbol in enumerate(symbols)}

    @classmethod
    def build(cls, records: Iterable[QARecord], num_fields: Optional[int] = None, copy_slots: Optional[int] = None):
        """The vocabulary of training records: every token and answer, ``F`` = the longest fact.

        :param num_fields: ``F`` (default: the longest training fact); a longer training fact is an error.
        :param copy_slots: default: the most distinct tokens of one training question (facts and question),
            so a later question can be entirely new.
        """
        symbols, longest, widest, count = set(), 0, 0, 0
        for record in records:
            count += 1
            if record.answer is None:
                raise QAFormatError(f"{record.source}: answer: missing (training needs the answer of every question)")
            tokens = {token for fact in record.facts for token in fact} | set(record.question)
            symbols |= tokens
            symbols.add(record.answer)
            widest = max(widest, len(tokens))
            longest = max(longest, max(len(fact) for fact in record.facts))
            if num_fields is not None and longest > num_fields:
                raise ValueError(f"num_fields is {num_fields}, but {record.source} has a fact of {longest} tokens")
        if count == 0:
            raise ValueError("records must hold at least one question to build a vocabulary from, got 0")
        return cls(sorted(symbols), longest if num_fields is None else num_fields, widest if copy_slots is None else copy_slots)

    # -- sizes and names ------------------------------------------------------------------------------------
    @property
    def num_known(self) -> int:
        """Symbols with a trained meaning: ``<unk>`` and the training symbols (the slots follow them)."""
        return 1 + len(self.known)

    @property
    def num_symbols(self) -> int:
        """All symbols: ``<unk>``, the training symbols, the copy slots."""
        return self.num_known + self.copy_slots

    @property
    def symbols(self) -> List[str]:
        """Names of every symbol, in order (slots are named ``<copy k>``)."""
        return [UNKNOWN] + self.known + [f"<copy {slot + 1}>" for slot in range(self.copy_slots)]

    def index(self, token: str) -> int:
        """The symbol of a training token, else 0 (``<unk>``; copy slots are given per question by :meth:`encode`)."""
        return self._index.get(token, 0)

    def to_dict(self) -> dict:
        """A plain dictionary (for a checkpoint's ``extra``); :meth:`from_dict` reads it back."""
        return {"format": FORMAT, "version": 1, "symbols": list(self.known), "num_fields": self.num_fields,
                "copy_slots": self.copy_slots}

    @classmethod
    def from_dict(cls, payload: dict) -> "QAVocabulary":
        if not isinstance(payload, dict) or payload.get("format") != FORMAT:
            raise ValueError(f"payload must be a dictionary written by QAVocabulary.to_dict, got {type(payload).__name__}")
        return cls(payload["symbols"], int(payload["num_fields"]), int(payload["copy_slots"]))

    def __eq__(self, other) -> bool:
        return isinstance(other, QAVocabulary) and self.to_dict() == other.to_dict()

    def __repr__(self) -> str:
        return f"QAVocabulary({len(self.known)} training symbols, num_fields={self.num_fields}, copy_slots={self.copy_slots})"

    # -- encoding ------------------------------------------------------------------------------------------
    def encode(self, records: Sequence[QARecord]) -> "QAData":
        """Encode records (training or later ones) into :class:`~pyro_multihop.data.FactObservations`.

        Shapes: facts ``(n, N, F)`` with ``N`` the most facts of a record; question ``(n, M)`` with ``M`` the
        longest question of the records (longer than the training ones is fine: the head reads it); target
        ``(n,)`` (0, ``<unk>``, where a record has no answer: :attr:`QAData.answered` says which);
        supporting ``(n, k)`` padded with -1 (None if no record has it).

        :raises QAFormatError: a fact longer than ``num_fields`` (file, line and field named).
        """
        records = list(records)
        if not records:
            raise ValueError("records must hold at least one question, got 0")
        for record in records:
            for index, fact in enumerate(record.facts):
                if len(fact) > self.num_fields:
                    raise QAFormatError(f"{record.source}: facts[{index}]: has {len(fact)} tokens, more than the "
                                        f"{self.num_fields} fields of the vocabulary (the longest training fact)")
        width = max(len(record.facts) for record in records)
        length = max(len(record.question) for record in records)
        most = max((len(record.supporting) for record in records if record.supporting is not None), default=0)
        blank_fact = [0] * self.num_fields
        facts, field_lengths, questions, targets, supporting, new_tokens = [], [], [], [], [], []
        for record in records:
            slots: Dict[str, int] = {}

            def symbol(token: str) -> int:
                index = self._index.get(token)
                if index is not None:
                    return index
                if token not in slots and len(slots) < self.copy_slots:
                    slots[token] = self.num_known + len(slots)
                return slots.get(token, 0)

            rows = [[symbol(token) for token in fact] + [0] * (self.num_fields - len(fact)) for fact in record.facts]
            facts.append(rows + [blank_fact] * (width - len(rows)))
            field_lengths.append([len(fact) for fact in record.facts] + [0] * (width - len(rows)))
            questions.append([symbol(token) for token in record.question] + [0] * (length - len(record.question)))
            targets.append(0 if record.answer is None else self._index.get(record.answer, slots.get(record.answer, 0)))
            support = list(record.supporting or ())
            supporting.append(support + [-1] * (most - len(support)))
            new_tokens.append(tuple(slots))
        facts = torch.tensor(facts, dtype=torch.long)
        field_mask = torch.arange(self.num_fields) < torch.tensor(field_lengths).unsqueeze(-1)  # (n, N, F)
        fact_mask = field_mask[..., 0]
        question = torch.tensor(questions, dtype=torch.long)
        question_mask = torch.arange(length) < torch.tensor([len(r.question) for r in records]).unsqueeze(-1)
        target = torch.tensor(targets, dtype=torch.long)
        supporting = torch.tensor(supporting, dtype=torch.long) if most else None
        obs = FactObservations(facts, question, target, fact_mask=fact_mask, field_mask=field_mask,
                               question_mask=question_mask, supporting=supporting)
        return QAData(obs, records, self, new_tokens)


@dataclass
class QAData:
    """Encoded QA records.

    :ivar obs: the :class:`~pyro_multihop.data.FactObservations`.
    :ivar records: the :class:`QARecord` s, row by row. :ivar vocabulary: the :class:`QAVocabulary` used.
    :ivar new_tokens: per row, the tokens given copy slots, in slot order.
    """

    obs: FactObservations
    records: List[QARecord]
    vocabulary: QAVocabulary = field(repr=False)
    new_tokens: List[Tuple[str, ...]] = field(repr=False)

    def __len__(self) -> int:
        return len(self.records)

    def answer_text(self, row: int, symbol: int) -> str:
        """The text of ``symbol`` as an answer to row ``row``: a copy slot is that row's token."""
        symbol = int(symbol)
        slot = symbol - self.vocabulary.num_known
        if 0 <= slot < len(self.new_tokens[row]):
            return self.new_tokens[row][slot]
        return self.vocabulary.symbols[symbol]

    @property
    def answered(self) -> List[bool]:
        """Per row: does its record have an answer (the target is real)?"""
        return [record.answer is not None for record in self.records]

    def require_answers(self, why: str) -> None:
        """Raise :class:`QAFormatError` naming the first record without an answer (``why``: what needs them)."""
        missing = next((record for record in self.records if record.answer is None), None)
        if missing is not None:
            raise QAFormatError(f"{missing.source}: answer: missing ({why} needs the answer of every question)")

    def answer_accuracy(self, predicted: torch.Tensor) -> float:
        """Share of rows whose predicted symbol's text (:meth:`answer_text`) equals the answer."""
        self.require_answers("answer accuracy")
        hits = [self.answer_text(row, symbol) == record.answer for row, (symbol, record)
                in enumerate(zip(predicted.tolist(), self.records))]
        return sum(hits) / len(hits)

    @property
    def has_supporting(self) -> bool:
        return any(record.supporting is not None for record in self.records)

    def fact_accuracy(self, paths: torch.Tensor) -> Optional[float]:
        """Share of annotated rows whose hop path ``(n, L)`` visits their supporting facts in order
        (:func:`supporting_matches`); None when no row is annotated."""
        annotated = [row for row, record in enumerate(self.records) if record.supporting is not None]
        if not annotated:
            return None
        matches = supporting_matches(paths[annotated], [self.records[row].supporting for row in annotated])
        return float(matches.double().mean())

    def hop_fact_accuracy(self, paths: torch.Tensor) -> Optional[List[float]]:
        """Per hop ``l``: the share of rows with an ``l``-th supporting fact whose hop path ``(n, L)`` attends it
        at hop ``l`` (where a run goes off its facts); None when no row is annotated."""
        if not self.has_supporting:
            return None
        shares = []
        for hop in range(paths.shape[1]):
            rows = [row for row, record in enumerate(self.records) if record.supporting is not None and len(record.supporting) > hop]
            hits = [int(paths[row, hop]) == self.records[row].supporting[hop] for row in rows]
            shares.append(sum(hits) / len(hits) if hits else None)
        return shares
