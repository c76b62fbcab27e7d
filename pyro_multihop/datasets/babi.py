"""The bAbI question-answering tasks (Weston et al. 2015) as :class:`~pyro_multihop.data.Observations`.

File format (the official release ``tasks_1-20_v1-2``): a story is a run of numbered lines starting at 1;
a statement is ``ID text``; a question is ``ID question?<TAB>answer<TAB>supporting fact IDs``, the IDs
pointing to earlier statements of the same story, in the order the reasoning uses them::

    1 Mary moved to the bathroom.
    2 John went to the hallway.
    3 Where is Mary? \tbathroom\t1

**From a question to an observation.** The context is the story's statements before the question, the
last ``memory`` of them (50 by default, the memory size of MemN2N, Sukhbaatar et al. 2015); older
statements are dropped. Each statement becomes two positions, by a rule that knows no word of bAbI:

- words are the statement's whitespace-separated tokens, lowercased, punctuation stripped;
- a word is *salient* if it occurs in some question or answer of the training file (the words the task
  asks about and answers with; learnt from the data, never listed); a statement's *head* is its first
  word and its *tail* its last salient word (its last word if none is salient);
- position ``2 s`` (forward): key = value = the compound symbol ``head tail``;
  position ``2 s + 1`` (reverse): key = tail, value = head.

So a hop can go from a tail to the statement's head (reverse), and from a head to the statements that pair
it with some tail (forward: the learnt key table says which compounds a query symbol matches); the compound
value carries on both words of the statement attended.

The query symbol is the whole question (one symbol per distinct question text), the target the answer.
Symbols are numbered in sorted order of their text, with ``<unk>`` (0) for a symbol or answer that the
training file never showed. So ``N = 2 * min(statements, memory)``, variable lengths handled by the mask.

Supporting facts are kept, for evaluation only, as the statements' story ids and as context positions.
Nothing here is used to train: models see ``(keys, values, query, target)`` alone.

Example::

    >>> from pyro_multihop.datasets import babi
    >>> train, test = babi.load_task(1)                 # the shipped en 1k files of task 1
    >>> train.obs.keys.shape, len(test)
    (torch.Size([1000, 20]), 1000)
"""

from __future__ import annotations

import os
import re
import string
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, List, Optional, Sequence, Tuple, Union

import torch

from ..data import Observations

__all__ = [
    "BabiFormatError",
    "BabiQuestion",
    "BabiEncoder",
    "BabiData",
    "DEFAULT_DATA_DIR",
    "DEFAULT_MEMORY",
    "read_babi",
    "task_files",
    "load_task",
    "read_task",
    "tokenize",
    "fact_matches",
]

#: The en 1k files of tasks 1, 2, 3, 10, 11-16 and 19, shipped inside the package (``datasets/babi_data/en``), so
#: that they load from an installed wheel too.
DEFAULT_DATA_DIR = Path(__file__).resolve().parent / "babi_data" / "en"
#: Statements kept before a question (MemN2N's memory size).
DEFAULT_MEMORY = 50
UNKNOWN = "<unk>"

_PUNCTUATION = str.maketrans("", "", string.punctuation)
PathLike = Union[str, os.PathLike]


class BabiFormatError(ValueError):
    """A bAbI file that does not follow the format; the message names the file and line."""


def tokenize(text: str) -> Tuple[str, ...]:
    """Lowercased whitespace tokens with ASCII punctuation stripped (empty tokens dropped)."""
    tokens = (token.translate(_PUNCTUATION).lower() for token in text.split())
    return tuple(token for token in tokens if token)


@dataclass(frozen=True)
class BabiQuestion:
    """One question with its story so far.

    :ivar statements: ``((story id, tokens), ...)``, every statement of the story before the question.
    :ivar question: tokens of the question. :ivar answer: the answer text.
    :ivar supporting: story ids of the supporting statements, in the order the reasoning uses them.
    :ivar source: ``"file:line"`` of the question.
    """

    statements: Tuple[Tuple[int, Tuple[str, ...]], ...]
    question: Tuple[str, ...]
    answer: str
    supporting: Tuple[int, ...]
    source: str


def read_babi(path: PathLike) -> List[BabiQuestion]:
    """Parse one bAbI file into its questions, strictly (docs/data.md lists what it refuses).

    A line is ``ID text``, with ``ID`` in ASCII digits. As the format says, a question is a line with tab-separated
    fields (``question<TAB>answer<TAB>supporting IDs``); every other line is a statement, ``?`` included (a
    translated release has statements ending in ``?.``). The one exception is a line that still has a question's
    three fields with its tabs turned into spaces (``text? answer ID ...``): that is an error, not a statement.
    Every line ends with a newline (a file cut short loses it).

    :raises BabiFormatError: (a ``ValueError``) naming the file and line of the first malformed line and
        quoting it: not UTF-8, a bad or out-of-order ID, a question without tabs, a supporting ID that is not
        an integer or names no earlier statement, a last line without its newline.
    :raises FileNotFoundError: if ``path`` does not exist.
    """
    path = Path(path)
    questions: List[BabiQuestion] = []
    statements: List[Tuple[int, Tuple[str, ...]]] = []
    seen_ids: set = set()
    previous_id = 0
    with open(path, "rb") as handle:
        for line_number, raw in enumerate(handle, start=1):
            where = f"{path}:{line_number}"
            line = _decoded(raw, where, line_number)
            if not line.endswith("\n"):
                raise BabiFormatError(f"{where}: the last line ends without a newline (is the file cut short?): {line!r}")
            line = line.rstrip("\n").rstrip("\r")
            if not line.strip():
                continue
            number, _, rest = line.partition(" ")
            if not _ID.fullmatch(number) or not rest.strip():
                raise BabiFormatError(f"{where}: expected 'ID text' with a positive integer ID, got {line!r}")
            line_id = int(number)
            if line_id == 1:
                statements, seen_ids = [], set()
            elif line_id != previous_id + 1:
                raise BabiFormatError(
                    f"{where}: line ID {line_id} does not follow {previous_id} (a story counts up from 1)"
                )
            previous_id = line_id
            if "\t" not in rest:
                if _UNTABBED_QUESTION.fullmatch(rest):  # a question whose tabs became spaces
                    raise BabiFormatError(
                        f"{where}: a question needs tabs, 'ID question?<TAB>answer<TAB>supporting IDs', got {line!r}"
                    )
                tokens = tokenize(rest)
                if not tokens:
                    raise BabiFormatError(f"{where}: statement {line_id} has no words: {line!r}")
                statements.append((line_id, tokens))
                seen_ids.add(line_id)
                continue
            fields = rest.split("\t")
            if len(fields) != 3:
                raise BabiFormatError(
                    f"{where}: a question line needs 'question<TAB>answer<TAB>supporting IDs', "
                    f"got {len(fields)} tab-separated fields: {line!r}"
                )
            question, answer, support = (field.strip() for field in fields)
            if not tokenize(question) or not answer:
                raise BabiFormatError(f"{where}: empty question or answer: {line!r}")
            support_ids = support.split()
            if not support_ids or not all(_ID.fullmatch(token) for token in support_ids):
                raise BabiFormatError(f"{where}: supporting fact IDs must be integers, got {support!r} in {line!r}")
            supporting = tuple(int(token) for token in support_ids)
            missing = [fact for fact in supporting if fact not in seen_ids]
            if missing:
                raise BabiFormatError(
                    f"{where}: supporting fact IDs {missing} name no earlier statement of this story: {line!r}"
                )
            questions.append(BabiQuestion(tuple(statements), tokenize(question), answer, supporting, where))
    if not questions:
        raise BabiFormatError(f"{path}: no question lines (a bAbI file holds stories with questions)")
    return questions


_ID = re.compile(r"[1-9][0-9]*")
#: A line without tabs that still has a question's three fields (``text? answer ID [ID ...]``, tabs turned into
#: spaces): an error, not a statement. Any other ``?`` outside a tab-separated line is text.
_UNTABBED_QUESTION = re.compile(r".*\?\s+\S+(\s+[1-9][0-9]*)+\s*")


def _decoded(raw: bytes, where: str, line_number: int) -> str:
    """Line ``raw`` as UTF-8 text (a byte-order mark dropped from the first line); a :class:`BabiFormatError`
    names the first byte that is not."""
    try:
        return raw.decode("utf-8-sig" if line_number == 1 else "utf-8")
    except UnicodeDecodeError as error:
        raise BabiFormatError(
            f"{where}: expected UTF-8 text, got the byte {raw[error.start]:#04x} at position {error.start}: {raw!r}"
        ) from None


def task_files(data_dir: PathLike, task: int, split: str) -> Path:
    """The ``qa{task}_*_{split}.txt`` file of a directory laid out like the official release.

    ``data_dir`` is a language directory (``en``, ``en-10k``, ...) holding the ``qa*`` files; a release
    root holding ``en/`` is accepted too.
    """
    if split not in ("train", "test"):
        raise ValueError(f"split must be 'train' or 'test', got {split!r}")
    if isinstance(task, bool) or not isinstance(task, int) or not 1 <= task <= 20:
        raise ValueError(f"task must be an integer from 1 to 20, got {task!r}")
    directory = Path(data_dir)
    if not directory.is_dir():
        raise FileNotFoundError(f"data_dir {str(directory)!r} is not a directory")
    for candidate in (directory, directory / "en"):
        matches = sorted(candidate.glob(f"qa{task}_*_{split}.txt"))
        if len(matches) == 1:
            return matches[0]
        if len(matches) > 1:
            raise ValueError(f"data_dir {str(candidate)!r} holds several task-{task} {split} files: {matches}")
    raise FileNotFoundError(f"no file qa{task}_*_{split}.txt in data_dir {str(directory)!r} (nor in its en/)")


def _salient_words(questions: Iterable[BabiQuestion]) -> set:
    words = set()
    for question in questions:
        words.update(question.question)
        words.update(tokenize(question.answer))
    return words


def _sentence_symbols(tokens: Sequence[str], salient: set) -> Tuple[str, str]:
    """``(head, tail)``: the first word and the last salient word (else the last word)."""
    tail = next((token for token in reversed(tokens) if token in salient), tokens[-1])
    return tokens[0], tail


@dataclass
class BabiData:
    """Encoded bAbI questions.

    :ivar obs: :class:`Observations`, ``keys``/``values`` ``(n, N)``, ``query``/``target`` ``(n,)``, ``mask``.
    :ivar position_statement: ``(n, N)`` LongTensor, the story id of each position's statement (0 = padding).
    :ivar supporting: per question, the story ids of its supporting statements, in reasoning order.
    :ivar supporting_positions: per question, one tuple per supporting statement: its positions in the
        context (``()`` where the statement fell outside the memory).
    :ivar questions: the raw :class:`BabiQuestion` s; :ivar contexts: per question, ``(story id, text)`` of
        the statements in its context, in order.
    :ivar encoder: the :class:`BabiEncoder` that produced them.
    """

    obs: Observations
    position_statement: torch.Tensor
    supporting: List[Tuple[int, ...]]
    supporting_positions: List[Tuple[Tuple[int, ...], ...]]
    questions: List[BabiQuestion]
    contexts: List[List[Tuple[int, str]]]
    encoder: "BabiEncoder" = field(repr=False)

    def __len__(self) -> int:
        return len(self.obs)

    def path_statements(self, paths: torch.Tensor) -> torch.Tensor:
        """``(n, L)`` story ids of the statements a batch of hop paths ``(n, L)`` lands on."""
        return self.position_statement.gather(1, paths)

    def fact_accuracy(self, paths: torch.Tensor) -> float:
        """Share of questions whose hop path lands on the supporting facts in order (see :func:`fact_matches`)."""
        return float(fact_matches(self.path_statements(paths), self.supporting).double().mean())

    def statement_marginals(self, hop_marginals: torch.Tensor, row: int, column: Optional[int] = None) -> torch.Tensor:
        """``(M, L)`` posterior mass of each of row ``row``'s ``M`` context statements at each hop (the
        statement's two positions summed), rows in story order. ``hop_marginals`` ``(L, n, N)`` holds row ``row``
        in its column ``column`` (default ``row``: the marginals of every row)."""
        ids = torch.tensor([story_id for story_id, _ in self.contexts[row]])
        owner = (self.position_statement[row].unsqueeze(0) == ids.unsqueeze(1)).to(hop_marginals.dtype)  # (M, N)
        return owner @ hop_marginals[:, row if column is None else column].t()


def fact_matches(path_statements: torch.Tensor, supporting: Sequence[Optional[Sequence[int]]]) -> torch.Tensor:
    """``(n,)`` bool: does a hop path land on the annotated supporting facts, in order?

    A path of ``L`` hops visits statements ``s_1..s_L``; consecutive repeats are merged (a hop that stays on
    the statement the previous hop attended adds no fact), and the result must equal the ``k`` annotated
    facts exactly, in the annotated order. So ``L < k`` never matches; ``L > k`` matches only if the extra
    hops stay on a fact just visited. Rows without an annotation (None) are False.
    """
    matches = []
    for row, facts in enumerate(supporting):
        visited: List[int] = []
        for statement in path_statements[row].tolist():
            if not visited or visited[-1] != statement:
                visited.append(statement)
        matches.append(facts is not None and visited == list(facts))
    return torch.tensor(matches, dtype=torch.bool)


class BabiEncoder:
    """Vocabulary and encoding rule (module docstring), fitted on the training questions only.

    :param train: the training questions (:func:`read_babi`).
    :param int memory: statements kept before each question (the most recent ones).
    :param str reverse_value: the value of a statement's reverse position: ``"head"`` (the default) or
        ``"rest"``, the compound of the statement's words other than its tail (an ablation, docs/babi.md).
    """

    def __init__(self, train: Sequence[BabiQuestion], memory: int = DEFAULT_MEMORY, reverse_value: str = "head"):
        if isinstance(memory, bool) or not isinstance(memory, int) or memory < 1:
            raise ValueError(f"memory must be a positive integer, got {memory!r}")
        if reverse_value not in ("head", "rest"):
            raise ValueError(f"reverse_value must be 'head' or 'rest', got {reverse_value!r}")
        self.reverse_value = reverse_value
        if len(train) == 0:
            raise ValueError("train must hold at least one question, got 0")
        self.memory = memory
        self.salient = frozenset(_salient_words(train))
        symbols, answers = set(), set()
        for question in train:
            for _, tokens in question.statements[-memory:]:
                for key, value in self.positions(tokens):
                    symbols.update((key, value))
            symbols.add(self.query_symbol(question))
            answers.add(question.answer)
        self.symbols: List[str] = [UNKNOWN] + sorted(symbols)
        self.answers: List[str] = [UNKNOWN] + sorted(answers)
        self._symbol_index = {symbol: index for index, symbol in enumerate(self.symbols)}
        self._answer_index = {answer: index for index, answer in enumerate(self.answers)}

    @property
    def num_symbols(self) -> int:
        return len(self.symbols)

    @property
    def num_targets(self) -> int:
        return len(self.answers)

    @staticmethod
    def query_symbol(question: BabiQuestion) -> str:
        return "? " + " ".join(question.question)

    def positions(self, tokens: Sequence[str]) -> List[Tuple[str, str]]:
        """The ``(key, value)`` symbols of a statement's two positions (forward, reverse)."""
        head, tail = _sentence_symbols(tokens, self.salient)
        pair = f"{head} {tail}"
        if self.reverse_value == "rest":
            index = len(tokens) - 1 - tokens[::-1].index(tail)
            return [(pair, pair), (tail, " ".join(tokens[:index] + tokens[index + 1 :]) or head)]
        return [(pair, pair), (tail, head)]

    def _symbol(self, text: str) -> int:
        return self._symbol_index.get(text, 0)

    def encode(self, questions: Sequence[BabiQuestion]) -> BabiData:
        """Encode questions (training or test) with this vocabulary; see the module docstring."""
        if len(questions) == 0:
            raise ValueError("questions must hold at least one question, got 0")
        width = 2 * max(min(len(question.statements), self.memory) for question in questions)
        n = len(questions)
        keys = torch.zeros(n, width, dtype=torch.long)
        values = torch.zeros(n, width, dtype=torch.long)
        mask = torch.zeros(n, width, dtype=torch.bool)
        position_statement = torch.zeros(n, width, dtype=torch.long)
        query = torch.zeros(n, dtype=torch.long)
        target = torch.zeros(n, dtype=torch.long)
        supporting_positions, contexts = [], []
        for row, question in enumerate(questions):
            kept = question.statements[-self.memory :]
            position_of = {}
            for slot, (story_id, tokens) in enumerate(kept):
                for offset, (key, value) in enumerate(self.positions(tokens)):
                    keys[row, 2 * slot + offset] = self._symbol(key)
                    values[row, 2 * slot + offset] = self._symbol(value)
                position_of[story_id] = (2 * slot, 2 * slot + 1)
                position_statement[row, 2 * slot : 2 * slot + 2] = story_id
            mask[row, : 2 * len(kept)] = True
            query[row] = self._symbol(self.query_symbol(question))
            target[row] = self._answer_index.get(question.answer, 0)
            supporting_positions.append(tuple(position_of.get(fact, ()) for fact in question.supporting))
            contexts.append([(story_id, " ".join(tokens)) for story_id, tokens in kept])
        if not mask.any(-1).all():
            row = int((~mask.any(-1)).nonzero()[0])
            raise ValueError(f"question {questions[row].source} has no statement before it (empty context)")
        return BabiData(
            Observations(keys, values, query, target, mask),
            position_statement,
            [question.supporting for question in questions],
            supporting_positions,
            list(questions),
            contexts,
            self,
        )


def read_task(
    task: int,
    data_dir: Optional[PathLike] = None,
    train_dir: Optional[PathLike] = None,
    max_train: Optional[int] = None,
) -> Tuple[List[BabiQuestion], List[BabiQuestion]]:
    """Read ``(train, test)`` questions of one task (:func:`read_babi`), without encoding them.

    :param data_dir: directory of the test file (and of the training file unless ``train_dir``), laid out
        like the official release; default the shipped en 1k files (:data:`DEFAULT_DATA_DIR`).
    :param train_dir: directory of the training file, e.g. ``.../en-10k`` (its test files equal ``en``'s).
    :param max_train: keep only the first ``max_train`` training questions.
    """
    data_dir = DEFAULT_DATA_DIR if data_dir is None else Path(data_dir)
    train_questions = read_babi(task_files(train_dir or data_dir, task, "train"))
    if max_train is not None:
        if isinstance(max_train, bool) or not isinstance(max_train, int) or max_train < 1:
            raise ValueError(f"max_train must be a positive integer, got {max_train!r}")
        train_questions = train_questions[:max_train]
    return train_questions, read_babi(task_files(data_dir, task, "test"))


def load_task(
    task: int,
    data_dir: Optional[PathLike] = None,
    train_dir: Optional[PathLike] = None,
    memory: int = DEFAULT_MEMORY,
    max_train: Optional[int] = None,
    reverse_value: str = "head",
) -> Tuple[BabiData, BabiData]:
    """Read (:func:`read_task`: ``data_dir``, ``train_dir``, ``max_train``), encode and return ``(train, test)``
    of one task.

    :param reverse_value: see :class:`BabiEncoder`.
    """
    train_questions, test_questions = read_task(task, data_dir, train_dir, max_train)
    encoder = BabiEncoder(train_questions, memory=memory, reverse_value=reverse_value)
    return encoder.encode(train_questions), encoder.encode(test_questions)
