"""bAbI stories as facts of fields: the generic rule that turns statements into :class:`~.qa_jsonl.QARecord` s.

**The rule** (docs/qa.md). For each question of a bAbI file (:func:`~.babi.read_babi`):

- the facts are the story's statements before the question, the last ``memory`` of them (50, MemN2N's
  memory size), oldest first;
- a statement's tokens (:func:`~.babi.tokenize`: whitespace-separated, lowercased, punctuation stripped)
  are its fields, in their order: token ``k`` fills field ``k`` (the :mod:`~.qa_jsonl` rule for a fact);
- the question's tokens are the question; the answer is its tokens joined by one space, one symbol (a
  multi-word answer is one phrase symbol; a list answer's parts joined by one comma, ``"s,e"``);
- the supporting statements become indices into the facts, in the annotated order.

Every token of every statement is kept: nothing is chosen by a word list, by where a word stands, or by
whether it occurs in a question or an answer. So a word that only the stories use (an inflected form: the
place is *Küche* in the answer and *Küchen* in the story) keeps its field, and the head's learned emission
table can map it to the answer's form; a multi-word name keeps all its words, each in its own field, in
every fact that mentions it. What a field means is left to the head, which learns which field pairs matter
(field equality, content tables, copying); a language with another word order gives other field pairs,
not another rule.

Example::

    >>> from pyro_multihop.datasets import babi, babi_facts
    >>> questions = babi.read_babi(babi.task_files(babi.DEFAULT_DATA_DIR, 2, "test"))
    >>> record = babi_facts.babi_records(questions[:1])[0]
    >>> record.facts[:2], record.question, record.answer, record.supporting
    ((('mary', 'got', 'the', 'milk', 'there'), ('john', 'moved', 'to', 'the', 'bedroom')), ('where', 'is', 'the', 'milk'), 'hallway', (0, 3))
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

from .babi import DEFAULT_MEMORY, BabiQuestion, read_task, tokenize
from .qa_jsonl import PathLike, QARecord

__all__ = ["babi_records", "answer_symbol", "load_task_records"]


def answer_symbol(answer: str) -> str:
    """A bAbI answer as one symbol: its tokens (:func:`~.babi.tokenize`) joined by one space, the parts of a list
    answer (the format's commas: ``"s,e"``, ``"football,apple"``) kept apart by one comma (``ANSWER_PART_SEPARATOR``
    of :mod:`~pyro_multihop.experiments.qa`'s answer parts)."""
    parts = [" ".join(tokenize(part)) for part in answer.split(",")]
    return ",".join(parts) if all(parts) else (" ".join(tokenize(answer)) or answer.strip())


def babi_records(questions: Sequence[BabiQuestion], memory: int = DEFAULT_MEMORY) -> List[QARecord]:
    """The facts records of bAbI questions (module docstring).

    A question whose supporting statement fell outside the memory keeps ``supporting = None`` (it is not
    scored for supporting facts); none does on the shipped files with ``memory = 50``.
    """
    if isinstance(memory, bool) or not isinstance(memory, int) or memory < 1:
        raise ValueError(f"memory must be a positive integer, got {memory!r}")
    records = []
    for question in questions:
        kept = question.statements[-memory:]
        if not kept:
            raise ValueError(f"question {question.source} has no statement before it (empty context)")
        index_of = {story_id: index for index, (story_id, _) in enumerate(kept)}
        supporting: Optional[Tuple[int, ...]] = None
        if all(fact in index_of for fact in question.supporting):
            supporting = tuple(index_of[fact] for fact in question.supporting)
        facts = tuple(tuple(tokens) for _, tokens in kept)
        records.append(QARecord(facts, tuple(question.question), answer_symbol(question.answer), supporting, question.source))
    return records


def load_task_records(task: int, data_dir: Optional[PathLike] = None, train_dir: Optional[PathLike] = None,
                      memory: int = DEFAULT_MEMORY, max_train: Optional[int] = None) -> Tuple[List[QARecord], List[QARecord]]:
    """``(train, test)`` facts records of one bAbI task, read by :func:`~.babi.read_task` (``data_dir``,
    ``train_dir``, ``max_train``; default the shipped en 1k files)."""
    train, test = read_task(task, data_dir, train_dir, max_train)
    return babi_records(train, memory), babi_records(test, memory)
