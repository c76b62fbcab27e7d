"""The :class:`FactObservations` container: facts and a question, their validation, slicing, ``.pt`` files
and sharded reads.

A row is a list of ``N`` *facts*, each a tuple of ``F`` symbols (its *fields*: subject, relation, object,
say), a *question* of ``M`` symbols, and a target symbol. A batch of ``n`` rows is a
:class:`FactObservations` holding

- ``facts``          LongTensor ``(n, N, F)``, the symbol of field ``a`` of fact ``i``;
- ``question``       LongTensor ``(n, M)``, the question's tokens;
- ``target``         LongTensor ``(n,)``, the answer;
- ``fact_mask``      optional BoolTensor ``(n, N)``, False marks a padded fact (at any position);
- ``field_mask``     optional BoolTensor ``(n, N, F)``, False marks a padded field;
- ``question_mask``  optional BoolTensor ``(n, M)``, False marks a padded question token;
- ``supporting``     optional LongTensor ``(n, k)``, the indices of the facts that support the answer, in
  reasoning order, ``-1`` for padding (for evaluation only).

Every symbol-valued field (facts, question, target) shares one vocabulary, so a head can answer with any
symbol a fact holds (a copy). Symbols at padding are never read: any value (-1, say) is accepted and
stored as 0. The simulator :func:`~pyro_multihop.data.simulators.fact_chain_task` makes such rows.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Union

import torch

__all__ = ["FactObservations", "FILE_FORMAT"]

#: The ``"format"`` entry of a file written by :meth:`FactObservations.save`.
FILE_FORMAT = "pyro-multihop-facts"
_FILE_VERSION = 1
_TENSORS = ("facts", "question", "target", "fact_mask", "field_mask", "question_mask", "supporting")


def _symbols(name: str, value) -> torch.Tensor:
    tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    if tensor.dtype == torch.bool or tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        raise TypeError(f"{name} must hold integer symbols, got dtype {tensor.dtype}")
    return tensor.long()


def _bool_mask(name: str, value, shape) -> Optional[torch.Tensor]:
    if value is None:
        return None
    tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    if tensor.dtype != torch.bool:
        raise TypeError(f"{name} must be a bool tensor, got dtype {tensor.dtype}")
    if tuple(tensor.shape) != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {tuple(tensor.shape)}")
    return tensor


def _where(bad: torch.Tensor) -> tuple:
    return tuple(int(i) for i in bad.nonzero()[0])


class FactObservations:
    """A batch of fact-and-question observations (see the module docstring for fields and shapes).

    Validation happens on construction, before anything is computed: integer symbols and bool masks,
    matching shapes, at least one fact, field and question token (``N, F, M >= 1``), non-negative symbols
    wherever they are real, at least one real fact and one real question token per row, at least one
    real field per real fact, no real field on a padded fact, and supporting indices in ``[-1, N)`` that
    name real facts. Upper bounds on symbols depend on a head: :meth:`check_sizes`. ``n = 0`` rows is
    allowed (an empty shard).

    :param facts: ``(n, N, F)`` integer symbols.
    :param question: ``(n, M)`` integer symbols.
    :param target: ``(n,)`` integer symbols.
    :param fact_mask: optional ``(n, N)`` bool, False = padded fact.
    :param field_mask: optional ``(n, N, F)`` bool, False = padded field.
    :param question_mask: optional ``(n, M)`` bool, False = padded token.
    :param supporting: optional ``(n, k)`` integer fact indices, -1 = padding.
    """

    def __init__(self, facts, question, target, fact_mask=None, field_mask=None, question_mask=None, supporting=None):
        facts = _symbols("facts", facts)
        question = _symbols("question", question)
        target = _symbols("target", target)
        if facts.dim() != 3:
            raise ValueError(f"facts must have shape (n, N, F), got shape {tuple(facts.shape)}")
        n, N, F = facts.shape
        if N == 0 or F == 0:
            raise ValueError(f"facts must have at least one fact and one field (N, F >= 1), got shape {tuple(facts.shape)}")
        if question.dim() != 2 or question.shape[0] != n:
            raise ValueError(f"question must have shape ({n}, M) to match facts, got {tuple(question.shape)}")
        if question.shape[1] == 0:
            raise ValueError("question must have at least one token (M >= 1), got M = 0")
        if target.shape != (n,):
            raise ValueError(f"target must have shape ({n},) to match facts, got {tuple(target.shape)}")
        fact_mask = _bool_mask("fact_mask", fact_mask, (n, N))
        field_mask = _bool_mask("field_mask", field_mask, (n, N, F))
        question_mask = _bool_mask("question_mask", question_mask, question.shape)
        if fact_mask is not None and not fact_mask.any(-1).all():
            row = _where(~fact_mask.any(-1))[0]
            raise ValueError(f"fact_mask must keep at least one fact per row; row {row} is all padding")
        if question_mask is not None and not question_mask.any(-1).all():
            row = _where(~question_mask.any(-1))[0]
            raise ValueError(f"question_mask must keep at least one token per row; row {row} is all padding")
        if field_mask is not None:
            if fact_mask is not None and (field_mask & ~fact_mask.unsqueeze(-1)).any():
                row, fact, field = _where(field_mask & ~fact_mask.unsqueeze(-1))
                raise ValueError(f"field_mask marks field {field} of padded fact {fact} of row {row} real")
            real_fact = torch.ones(n, N, dtype=torch.bool) if fact_mask is None else fact_mask
            empty = real_fact & ~field_mask.any(-1)
            if empty.any():
                row, fact = _where(empty)
                raise ValueError(f"field_mask must keep at least one field of every real fact; fact {fact} of row {row} has none")
        real_fields = self._real_fields(fact_mask, field_mask, facts)
        for name, tensor, real in (("facts", facts, real_fields), ("question", question, question_mask), ("target", target, None)):
            negative = tensor < 0 if real is None else (tensor < 0) & real
            if negative.any():
                index = _where(negative)
                raise ValueError(f"{name} must be non-negative symbols, got {int(tensor[index])} at index {index}")
        if supporting is not None:
            supporting = _symbols("supporting", supporting)
            if supporting.dim() != 2 or supporting.shape[0] != n:
                raise ValueError(f"supporting must have shape ({n}, k) to match facts, got {tuple(supporting.shape)}")
            bad = (supporting < -1) | (supporting >= N)
            if not bad.any() and fact_mask is not None:
                bad = (supporting >= 0) & ~fact_mask.gather(1, supporting.clamp_min(0))
            if bad.any():
                row, column = _where(bad)
                raise ValueError(
                    f"supporting must name real facts in [0, {N}) or be -1 (padding); row {row} has {int(supporting[row, column])}"
                )
        # Padding symbols are never read: store them as 0.
        if real_fields is not None:
            facts = facts.masked_fill(~real_fields, 0)
        if question_mask is not None:
            question = question.masked_fill(~question_mask, 0)
        self.facts, self.question, self.target = facts, question, target
        self.fact_mask, self.field_mask, self.question_mask = fact_mask, field_mask, question_mask
        self.supporting = supporting

    @staticmethod
    def _real_fields(fact_mask, field_mask, facts) -> Optional[torch.Tensor]:
        if fact_mask is None and field_mask is None:
            return None
        real = torch.ones_like(facts, dtype=torch.bool) if field_mask is None else field_mask
        return real if fact_mask is None else real & fact_mask.unsqueeze(-1)

    @classmethod
    def _trusted(cls, **fields) -> "FactObservations":
        """A container from fields already validated (slices of a validated one): no checks, no copies."""
        obs = object.__new__(cls)
        for name in _TENSORS:
            setattr(obs, name, fields.get(name))
        return obs

    # -- sizes ------------------------------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.facts.shape[0]

    @property
    def num_facts(self) -> int:
        """``N``, facts per row (padding included)."""
        return self.facts.shape[1]

    @property
    def context_len(self) -> int:
        """``N`` (the engine's name for the number of positions)."""
        return self.facts.shape[1]

    @property
    def num_fields(self) -> int:
        """``F``, fields per fact."""
        return self.facts.shape[2]

    @property
    def question_len(self) -> int:
        """``M``, question tokens per row (padding included)."""
        return self.question.shape[1]

    @property
    def num_symbols(self) -> int:
        """Smallest vocabulary that holds every fact, question and target symbol (max symbol + 1; 0 when empty)."""
        if len(self) == 0:
            return 0
        return 1 + int(max(self.facts.max(), self.question.max(), self.target.max()))

    @property
    def device(self) -> torch.device:
        return self.facts.device

    @property
    def mask(self) -> Optional[torch.Tensor]:
        """``fact_mask`` (the engine's name for the real positions)."""
        return self.fact_mask

    def full_mask(self) -> torch.Tensor:
        """``(n, N)`` bool, True at real facts (all True without a ``fact_mask``)."""
        if self.fact_mask is None:
            return torch.ones(self.facts.shape[:2], dtype=torch.bool, device=self.device)
        return self.fact_mask

    def real_fields(self) -> torch.Tensor:
        """``(n, N, F)`` bool, True at the real fields of real facts."""
        real = self._real_fields(self.fact_mask, self.field_mask, self.facts)
        return torch.ones_like(self.facts, dtype=torch.bool) if real is None else real

    def real_tokens(self) -> torch.Tensor:
        """``(n, M)`` bool, True at real question tokens."""
        if self.question_mask is None:
            return torch.ones_like(self.question, dtype=torch.bool)
        return self.question_mask

    def check_sizes(self, num_symbols: int) -> None:
        """Raise ``ValueError`` naming the field if a symbol is ``>= num_symbols`` (padding is stored as 0)."""
        for name, tensor in (("facts", self.facts), ("question", self.question), ("target", self.target)):
            too_large = tensor >= num_symbols
            if too_large.any():
                index = _where(too_large)
                raise ValueError(f"{name} must be < num_symbols = {num_symbols}, got {int(tensor[index])} at index {index}")

    # -- rows and devices -------------------------------------------------------------------------------------
    def _map(self, function) -> "FactObservations":
        return self._trusted(**{name: None if getattr(self, name) is None else function(getattr(self, name)) for name in _TENSORS})

    def __getitem__(self, index) -> "FactObservations":
        """Rows by slice, int, LongTensor or bool mask; the result is trusted (not validated again)."""
        if isinstance(index, int):
            index = slice(index, index + 1 if index != -1 else None)
        if isinstance(index, torch.Tensor) and index.dtype != torch.bool:
            index = index.long()
        return self._map(lambda tensor: tensor[index])

    def to(self, device) -> "FactObservations":
        """A copy on ``device``."""
        return self._map(lambda tensor: tensor.to(device))

    def with_target(self, target: torch.Tensor) -> "FactObservations":
        """The same facts and questions with another ``(n,)`` target (as the collapsed distribution asks)."""
        fields = {name: getattr(self, name) for name in _TENSORS}
        fields["target"] = target
        return self._trusted(**fields)

    def __eq__(self, other) -> bool:
        if not isinstance(other, FactObservations):
            return NotImplemented
        for name in _TENSORS:
            mine, theirs = getattr(self, name), getattr(other, name)
            if (mine is None) != (theirs is None):
                return False
            if mine is not None and (mine.shape != theirs.shape or not torch.equal(mine.cpu(), theirs.cpu())):
                return False
        return True

    def __repr__(self) -> str:
        return f"FactObservations(n={len(self)}, N={self.num_facts}, F={self.num_fields}, M={self.question_len})"

    # -- files --------------------------------------------------------------------------------------------------
    def save(self, path: Union[str, os.PathLike]) -> None:
        """Write to ``path`` (``.pt``): a :func:`torch.save` dictionary ``{"format": FILE_FORMAT, "version": 1,
        "facts": ..., "question": ..., ...}`` of contiguous CPU tensors (None for an absent mask), which
        :meth:`load` reads memory-mapped."""
        path = Path(path)
        if path.suffix != ".pt":
            raise ValueError(f"path must end in .pt, got {str(path)!r}")
        payload = {"format": FILE_FORMAT, "version": _FILE_VERSION}
        for name in _TENSORS:
            tensor = getattr(self, name)
            payload[name] = None if tensor is None else tensor.detach().cpu().contiguous()
        torch.save(payload, path)

    @classmethod
    def load(cls, path: Union[str, os.PathLike], shard: Optional[tuple] = None) -> "FactObservations":
        """Read a file written by :meth:`save` and validate it.

        :param shard: optional ``(rank, world_size)``: only rows ``[n rank / world_size, n (rank + 1) /
            world_size)`` of the file's ``n`` (contiguous shards whose sizes differ by at most one; empty
            when ``n < world_size``). The file is memory-mapped, so only the pages of those rows are read.
        """
        path = Path(path)
        if path.suffix != ".pt":
            raise ValueError(f"path must end in .pt, got {str(path)!r}")
        if not path.is_file():
            raise ValueError(f"path {str(path)!r} does not exist")
        try:
            payload = torch.load(path, map_location="cpu", weights_only=True, mmap=True)
        except Exception as error:  # torch raises several types for foreign or damaged files
            raise ValueError(f"{str(path)!r} is not a readable fact-observations file: {error}") from None
        if not isinstance(payload, dict) or payload.get("format") != FILE_FORMAT:
            raise ValueError(f"{str(path)!r} is not a fact-observations file (format {FILE_FORMAT!r})")
        if payload.get("version") != _FILE_VERSION:
            raise ValueError(f"{str(path)!r} has version {payload.get('version')!r}, expected {_FILE_VERSION}")
        n = payload["facts"].shape[0]
        if n == 0:
            raise ValueError(f"data file {str(path)!r} holds no observations")
        rows = slice(0, n) if shard is None else _shard_rows(n, shard)
        fields = {name: None if payload.get(name) is None else payload[name][rows].clone() for name in _TENSORS}
        return cls(**fields)


def _shard_rows(n: int, shard) -> slice:
    """Rows ``[n rank / world_size, n (rank + 1) / world_size)`` of shard ``(rank, world_size)``."""
    valid = isinstance(shard, (tuple, list)) and len(shard) == 2
    valid = valid and all(isinstance(v, int) and not isinstance(v, bool) for v in shard)
    if not valid or shard[1] < 1 or not 0 <= shard[0] < shard[1]:
        raise ValueError(f"shard must be a pair of integers (rank, world_size) with 0 <= rank < world_size, got {shard!r}")
    rank, world_size = shard
    return slice(n * rank // world_size, n * (rank + 1) // world_size)
