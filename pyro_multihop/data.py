"""Observations of chained-attention tasks: the container, its validation and IO, and task simulators.

An observation is ``(context_keys, context_values, query, target)``: a context of ``N`` positions, each a
``(key_symbol, value_symbol)`` pair, a query symbol, and a target label. A batch of ``n`` observations is an
:class:`Observations` holding

- ``keys``   LongTensor ``(n, N)``, key symbol of each context position,
- ``values`` LongTensor ``(n, N)``, value symbol of each context position,
- ``query``  LongTensor ``(n,)``, the query symbol,
- ``target`` LongTensor ``(n,)``, the emitted target,
- ``mask``   optional BoolTensor ``(n, N)``, False marks padding (variable-length contexts); the
  symbols at padding positions are ignored (any value, -1 say, is accepted) and stored as 0.

Example::

    >>> from pyro_multihop.data import transitive_task
    >>> obs = transitive_task(100, num_symbols=30, pairs=5, seed=0)
    >>> obs.keys.shape, len(obs[:10])
    (torch.Size([100, 10]), 10)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Optional, Union

import numpy as np
import pandas as pd
import torch

__all__ = [
    "DataError",
    "Observations",
    "chain_task",
    "transitive_task",
    "induction_task",
]

_SYMBOL_FIELDS = ("keys", "values", "query", "target")


def _as_long(name: str, value) -> torch.Tensor:
    tensor = value if isinstance(value, torch.Tensor) else torch.as_tensor(value)
    if tensor.dtype == torch.bool or tensor.dtype.is_floating_point or tensor.dtype.is_complex:
        raise TypeError(f"{name} must hold integer symbols, got dtype {tensor.dtype}")
    return tensor.long()


def _first_bad(tensor: torch.Tensor, bad: torch.Tensor) -> str:
    index = tuple(int(i) for i in bad.nonzero()[0])
    return f"{tensor[index].item()} at index {index if len(index) > 1 else index[0]}"


class Observations:
    """A batch of chained-attention observations (see the module docstring for fields and shapes).

    Validation happens on construction: integer dtypes, matching shapes, non-negative symbols, a boolean
    mask with at least one real position per row. Upper bounds on symbols depend on a model and are
    checked by :meth:`check_sizes` (models call it before computing).

    :param keys: ``(n, N)`` integer key symbols.
    :param values: ``(n, N)`` integer value symbols.
    :param query: ``(n,)`` integer query symbols.
    :param target: ``(n,)`` integer targets.
    :param mask: optional ``(n, N)`` bool, False = padding position.
    """

    def __init__(self, keys, values, query, target, mask=None):
        keys = _as_long("keys", keys)
        values = _as_long("values", values)
        query = _as_long("query", query)
        target = _as_long("target", target)
        if keys.dim() != 2:
            raise ValueError(f"keys must have shape (n, N), got shape {tuple(keys.shape)}")
        n, N = keys.shape
        if N == 0:
            raise ValueError("keys must have at least one context position (N >= 1), got N = 0")
        if values.shape != keys.shape:
            raise ValueError(f"values must have the shape of keys {tuple(keys.shape)}, got {tuple(values.shape)}")
        for name, tensor in (("query", query), ("target", target)):
            if tensor.shape != (n,):
                raise ValueError(f"{name} must have shape ({n},) to match keys, got {tuple(tensor.shape)}")
        if mask is not None:
            mask = mask if isinstance(mask, torch.Tensor) else torch.as_tensor(mask)
            if mask.dtype != torch.bool:
                raise TypeError(f"mask must be a bool tensor, got dtype {mask.dtype}")
            if mask.shape != keys.shape:
                raise ValueError(f"mask must have the shape of keys {tuple(keys.shape)}, got {tuple(mask.shape)}")
            empty_rows = ~mask.any(-1)
            if empty_rows.any():
                row = int(empty_rows.nonzero()[0])
                raise ValueError(f"mask must keep at least one position per row; row {row} is all padding")
            mask = mask.to(keys.device)
            # Padding symbols are never read; store them as 0 so that any padding value (-1, say) is fine.
            keys = keys.masked_fill(~mask, 0)
            values = values.masked_fill(~mask, 0)
        for name, tensor in zip(_SYMBOL_FIELDS, (keys, values, query, target)):
            negative = tensor < 0
            if negative.any():
                raise ValueError(f"{name} must be non-negative symbols, got {_first_bad(tensor, negative)}")
        self.keys = keys
        self.values = values
        self.query = query
        self.target = target
        self.mask = mask

    # -- container protocol -------------------------------------------------------------------------
    def __len__(self) -> int:
        return self.keys.shape[0]

    @property
    def context_len(self) -> int:
        """``N``, the number of context positions (padding included)."""
        return self.keys.shape[1]

    @property
    def device(self) -> torch.device:
        return self.keys.device

    def __getitem__(self, index) -> "Observations":
        if isinstance(index, int):
            index = slice(index, index + 1 if index != -1 else None)
        if isinstance(index, torch.Tensor) and index.dtype != torch.bool:
            index = index.long()
        return Observations(
            self.keys[index],
            self.values[index],
            self.query[index],
            self.target[index],
            None if self.mask is None else self.mask[index],
        )

    def to(self, device) -> "Observations":
        """Return a copy on ``device``."""
        return Observations(
            self.keys.to(device),
            self.values.to(device),
            self.query.to(device),
            self.target.to(device),
            None if self.mask is None else self.mask.to(device),
        )

    def context_lengths(self) -> torch.Tensor:
        """``(n,)`` LongTensor: each row's last real position + 1 (``N`` for a row without padding)."""
        if self.mask is None:
            return torch.full((len(self),), self.context_len, dtype=torch.long, device=self.device)
        return self.mask.long().cumsum(-1).argmax(-1) + 1

    def truncate_context(self, width: int) -> "Observations":
        """The first ``width`` context positions of every row: the same observations for rows whose
        :meth:`context_lengths` are at most ``width`` (padding is never attended)."""
        mask = None if self.mask is None else self.mask[:, :width]
        return Observations(self.keys[:, :width], self.values[:, :width], self.query, self.target, mask)

    def full_mask(self) -> torch.Tensor:
        """The mask as a ``(n, N)`` bool tensor, all True when there is no padding."""
        if self.mask is None:
            return torch.ones_like(self.keys, dtype=torch.bool)
        return self.mask

    def __eq__(self, other) -> bool:
        if not isinstance(other, Observations):
            return NotImplemented
        same = all(
            getattr(self, name).shape == getattr(other, name).shape
            and torch.equal(getattr(self, name).cpu(), getattr(other, name).cpu())
            for name in _SYMBOL_FIELDS
        )
        return same and torch.equal(self.full_mask().cpu(), other.full_mask().cpu())

    def __repr__(self) -> str:
        padded = "" if self.mask is None else f", padded positions={int((~self.mask).sum())}"
        return f"Observations(n={len(self)}, N={self.context_len}{padded})"

    # -- sizes ----------------------------------------------------------------------------------------
    @property
    def num_symbols(self) -> int:
        """Smallest symbol-vocabulary size that holds every key, value and query (max symbol + 1)."""
        if len(self) == 0:
            return 0
        return 1 + int(max(self.keys.max(), self.values.max(), self.query.max()))

    @property
    def num_targets(self) -> int:
        """Smallest target-vocabulary size that holds every target (max target + 1)."""
        return 0 if len(self) == 0 else 1 + int(self.target.max())

    def check_sizes(self, num_symbols: int, num_targets: Optional[int] = None) -> None:
        """Raise ``ValueError`` naming the field if a symbol is ``>= num_symbols`` or a target ``>= num_targets``.

        """
        for name, tensor, bound in (
            ("keys", self.keys, num_symbols),
            ("values", self.values, num_symbols),
            ("query", self.query, num_symbols),
            ("target", self.target, num_targets),
        ):
            if bound is None:
                continue
            too_large = tensor >= bound
            if too_large.any():
                size = "num_targets" if name == "target" else "num_symbols"
                raise ValueError(
                    f"{name} must be < {size} = {bound}, got {_first_bad(tensor, too_large)}"
                )

    # -- pandas and files ---------------------------------------------------------------------------
    def to_dataframe(self) -> pd.DataFrame:
        """One row per observation: ``query, target, key_0..key_{N-1}, value_0..``, and ``mask_*`` if padded."""
        columns = {"query": self.query.cpu().numpy(), "target": self.target.cpu().numpy()}
        keys, values = self.keys.cpu().numpy(), self.values.cpu().numpy()
        for i in range(self.context_len):
            columns[f"key_{i}"] = keys[:, i]
        for i in range(self.context_len):
            columns[f"value_{i}"] = values[:, i]
        if self.mask is not None:
            mask = self.mask.cpu().numpy()
            for i in range(self.context_len):
                columns[f"mask_{i}"] = mask[:, i]
        return pd.DataFrame(columns)

    @classmethod
    def from_dataframe(cls, frame: pd.DataFrame) -> "Observations":
        """Inverse of :meth:`to_dataframe`.

        Raises ``ValueError`` naming a missing column, and :class:`DataError` (a ``ValueError``) naming the
        row (position from 0) and column of the first bad cell: an empty cell, a non-integer number or text
        in a symbol column, a negative symbol, or a mask cell that is not True/False. Integer-valued floats
        (``3.0``) are accepted as symbols."""
        if not isinstance(frame, pd.DataFrame):
            raise TypeError(f"frame must be a pandas DataFrame, got {type(frame).__name__}")
        for name in ("query", "target", "key_0", "value_0"):
            if name not in frame.columns:
                raise ValueError(f"data must have a column {name!r}; columns are {list(frame.columns)}")
        N = sum(1 for c in frame.columns if c.startswith("key_"))
        expected = [f"key_{i}" for i in range(N)] + [f"value_{i}" for i in range(N)]
        missing = [c for c in expected if c not in frame.columns]
        if missing:
            raise ValueError(f"data must have columns key_0..key_{N - 1} and value_0..value_{N - 1}; missing {missing}")
        has_mask = any(c.startswith("mask_") for c in frame.columns)

        def column_block(prefix: str, read) -> torch.Tensor:
            return torch.stack([read(frame, f"{prefix}_{i}") for i in range(N)], dim=1)

        return cls(
            keys=column_block("key", _symbol_column),
            values=column_block("value", _symbol_column),
            query=_symbol_column(frame, "query"),
            target=_symbol_column(frame, "target", what="an integer target"),
            mask=column_block("mask", _mask_column) if has_mask else None,
        )

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Write to ``path``: CSV for ``.csv``, Parquet (needs pyarrow) for ``.parquet``."""
        path = Path(path)
        frame = self.to_dataframe()
        if path.suffix == ".csv":
            frame.to_csv(path, index=False)
        elif path.suffix == ".parquet":
            frame.to_parquet(path, index=False)
        else:
            raise ValueError(f"path must end in .csv or .parquet, got {str(path)!r}")

    @classmethod
    def load(cls, path: Union[str, os.PathLike], shard: Optional[tuple] = None) -> "Observations":
        """Read a file written by :meth:`save`.

        :param shard: optional ``(rank, world_size)``: read only rows ``[n rank / world_size,
            n (rank + 1) / world_size)`` of the file's ``n`` (contiguous shards whose sizes differ by at most
            one; empty when ``n < world_size``). Parquet reads only the row groups that hold them, CSV
            counts the rows in chunks and then parses only them, so no process holds the whole file.
        """
        frame = read_frame(path, shard)
        if len(frame) == 0 and shard is not None:
            return cls._empty(frame)
        return cls.from_dataframe(frame)

    @classmethod
    def _empty(cls, frame: pd.DataFrame) -> "Observations":
        """No observations, with the context length and padding of ``frame``'s columns."""
        for name in ("query", "target", "key_0", "value_0"):
            if name not in frame.columns:
                raise ValueError(f"data must have a column {name!r}; columns are {list(frame.columns)}")
        N = sum(1 for c in frame.columns if c.startswith("key_"))
        empty = torch.zeros(0, N, dtype=torch.long)
        mask = torch.zeros(0, N, dtype=torch.bool) if any(c.startswith("mask_") for c in frame.columns) else None
        return cls(empty, empty, empty[:, 0], empty[:, 0], mask)


_CSV_CHUNK_ROWS = 1 << 16


def read_frame(path: Union[str, os.PathLike], shard: Optional[tuple] = None) -> pd.DataFrame:
    """The rows of a ``.csv`` or ``.parquet`` data file as a DataFrame, or only shard ``(rank, world_size)``
    of them (see :meth:`Observations.load`). Raises ``ValueError`` for a missing or empty file or a bad
    ``shard``."""
    path = Path(path)
    if path.suffix not in (".csv", ".parquet"):
        raise ValueError(f"path must end in .csv or .parquet, got {str(path)!r}")
    if not path.is_file():
        raise ValueError(f"path {str(path)!r} does not exist")
    if shard is None:
        frame = pd.read_csv(path) if path.suffix == ".csv" else pd.read_parquet(path)
        if len(frame) == 0:
            raise ValueError(f"data file {str(path)!r} holds no observations")
        return frame
    rank, world_size = _check_shard(shard)
    frame = _read_csv_rows(path, rank, world_size) if path.suffix == ".csv" else _read_parquet_rows(path, rank, world_size)
    return frame


def _check_shard(shard) -> tuple:
    if not isinstance(shard, (tuple, list)) or len(shard) != 2:
        raise ValueError(f"shard must be a pair (rank, world_size), got {shard!r}")
    rank, world_size = shard
    for value in shard:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ValueError(f"shard must hold two integers (rank, world_size), got {shard!r}")
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"shard must have world_size >= 1 and 0 <= rank < world_size, got {shard!r}")
    return rank, world_size


def _shard_range(n: int, rank: int, world_size: int, path: Path) -> tuple:
    if n == 0:
        raise ValueError(f"data file {str(path)!r} holds no observations")
    return n * rank // world_size, n * (rank + 1) // world_size


def _read_csv_rows(path: Path, rank: int, world_size: int) -> pd.DataFrame:
    """Rows of this shard: one chunked pass counts the rows (one column parsed), a second parses only them."""
    n = sum(len(chunk) for chunk in pd.read_csv(path, usecols=[0], chunksize=_CSV_CHUNK_ROWS))
    start, stop = _shard_range(n, rank, world_size, path)
    header = pd.read_csv(path, nrows=0)
    if stop == start:
        return header
    frame = pd.read_csv(path, skiprows=range(1, start + 1), nrows=stop - start)
    return frame.set_axis(range(start, stop))


def _read_parquet_rows(path: Path, rank: int, world_size: int) -> pd.DataFrame:
    """Rows of this shard, reading only the row groups that hold them."""
    import pyarrow.parquet as pq

    source = pq.ParquetFile(path)
    start, stop = _shard_range(source.metadata.num_rows, rank, world_size, path)
    groups, first_row, offset = [], None, 0
    for group in range(source.num_row_groups):
        rows = source.metadata.row_group(group).num_rows
        if offset < stop and offset + rows > start:
            groups.append(group)
            first_row = offset if first_row is None else first_row
        offset += rows
    if not groups:
        return source.schema_arrow.empty_table().to_pandas()
    table = source.read_row_groups(groups).slice(start - first_row, stop - start)
    return table.to_pandas().set_axis(range(start, stop))


class DataError(ValueError):
    """A bad cell of a data frame or file: ``row`` (position from 0, as in ``predict``'s ``row`` column) and
    ``column`` name it; the message reads ``data column 'key_3' row 17: expected an integer symbol, got 2.5``."""

    def __init__(self, column: str, row: int, problem: str):
        super().__init__(f"data column {column!r} row {row}: {problem}")
        self.column = column
        self.row = row


def _symbol_column(frame: pd.DataFrame, name: str, what: str = "an integer symbol") -> torch.Tensor:
    """Column ``name`` as a LongTensor; a ``DataError`` names the first empty, non-integer or negative cell."""
    column = frame[name]
    if pd.api.types.is_bool_dtype(column.dtype):
        raise DataError(name, 0, f"expected {what}, got {_cell_text(column.iloc[0])}")
    if pd.api.types.is_integer_dtype(column.dtype):
        values = column.to_numpy(dtype="int64")
    else:
        # A float column (an empty cell or a 2.5 makes pandas read the whole column as float) or text.
        numbers = pd.to_numeric(column, errors="coerce")
        empty = column.isna() | column.map(lambda cell: isinstance(cell, str) and not cell.strip())
        bad = empty | numbers.isna() | (numbers % 1 != 0)
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0])
            if empty.iloc[row]:
                raise DataError(name, row, f"expected {what}, got an empty cell")
            raise DataError(name, row, f"expected {what}, got {_cell_text(column.iloc[row])}")
        values = numbers.to_numpy().astype("int64")
    negative = values < 0
    if negative.any():
        row = int(negative.nonzero()[0][0])
        raise DataError(name, row, f"expected a non-negative {what.removeprefix('an ')}, got {values[row]}")
    return torch.from_numpy(values.copy())


def _cell_text(cell) -> str:
    """A cell as the user wrote it: ``2.5``, ``'abc'``, ``True`` (numpy scalars as Python numbers)."""
    return repr(cell.item() if isinstance(cell, np.generic) else cell)


def _mask_column(frame: pd.DataFrame, name: str) -> torch.Tensor:
    """Mask column ``name`` as a BoolTensor; a ``DataError`` names the first cell that is not True or False."""
    column = frame[name]
    if not pd.api.types.is_bool_dtype(column.dtype):
        bad = ~column.map(lambda cell: isinstance(cell, (bool, np.bool_)))
        if bad.any():
            row = int(bad.to_numpy().nonzero()[0][0])
            got = "an empty cell" if pd.isna(column.iloc[row]) else _cell_text(column.iloc[row])
            raise DataError(name, row, f"expected True or False, got {got}")
    return torch.from_numpy(column.to_numpy(dtype=bool).copy())


# -- task simulators --------------------------------------------------------------------------------
def _generator(seed: Optional[int]) -> torch.Generator:
    generator = torch.Generator()
    if seed is None:
        generator.seed()
    else:
        generator.manual_seed(int(seed))
    return generator


def _check_task_sizes(n: int, num_symbols: int, pairs: int, hops: int) -> None:
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"n must be a positive integer, got {n!r}")
    if not isinstance(hops, int) or hops < 1:
        raise ValueError(f"hops must be a positive integer, got {hops!r}")
    if not isinstance(pairs, int) or pairs < 1:
        raise ValueError(f"pairs must be a positive integer, got {pairs!r}")
    if not isinstance(num_symbols, int) or num_symbols < pairs:
        raise ValueError(f"num_symbols must be an integer >= pairs = {pairs}, got {num_symbols!r}")


def chain_task(n: int, hops: int, num_symbols: int = 30, pairs: int = 5, seed: Optional[int] = 0) -> Observations:
    """An L-hop lookup chain from ``x0`` to ``xL``, one lookup a hop; ``hops = 2`` is :func:`transitive_task`.

    Each row draws ``hops + 1`` role sets ``x_0..x_L``, each ``pairs`` distinct symbols out of
    ``num_symbols`` (independently across roles, so a symbol can play two roles and collide). The
    context has ``hops`` blocks of ``pairs`` positions; block ``l`` holds the pairs
    ``(key x_{l-1}[j], value x_l[j])``, blocks after the first in shuffled order. The query is
    ``x_0[i]`` and the target ``x_L[i]`` for a random chain ``i``: the identity lookup repeated ``hops``
    times finds it, up to collisions between roles. Targets live in the symbol vocabulary.

    :returns: Observations with ``N = hops * pairs``.
    """
    _check_task_sizes(n, num_symbols, pairs, hops)
    generator = _generator(seed)
    roles = torch.rand(n, hops + 1, num_symbols, generator=generator).argsort(-1)[..., :pairs]  # (n, L+1, P)
    keys, values = [], []
    for hop in range(hops):
        order = torch.arange(pairs).expand(n, pairs)
        if hop > 0:
            order = torch.rand(n, pairs, generator=generator).argsort(-1)
        keys.append(roles[:, hop].gather(1, order))
        values.append(roles[:, hop + 1].gather(1, order))
    chain = torch.randint(pairs, (n, 1), generator=generator)
    return Observations(
        keys=torch.cat(keys, 1),
        values=torch.cat(values, 1),
        query=roles[:, 0].gather(1, chain).squeeze(1),
        target=roles[:, hops].gather(1, chain).squeeze(1),
    )


def transitive_task(n: int, num_symbols: int = 30, pairs: int = 5, seed: Optional[int] = 0) -> Observations:
    """The transitive lookup ``a -> b -> c``: keys ``[a, perm(b)]``, values ``[b, c]``, query ``a_i``,
    target the ``c`` paired with ``b_i``. Needs two hops; see :func:`chain_task` for the details."""
    return chain_task(n, hops=2, num_symbols=num_symbols, pairs=pairs, seed=seed)


def induction_task(n: int, num_symbols: int = 30, seq_len: int = 8, seed: Optional[int] = 0) -> Observations:
    """The induction (copy) task: continue a sequence after an earlier occurrence of the current token.

    Each row is a sequence ``s_0..s_{seq_len}`` of distinct tokens. Position ``t`` of the context holds
    ``(key s_t, value s_{t+1})``, the token and its successor, as a previous-token head would present
    them. The query is ``s_j`` for a random ``j`` and the target is ``s_{j+1}``, the token that followed
    it: one hop with the identity key table copies it (the induction-head circuit).

    :returns: Observations with ``N = seq_len``.
    """
    _check_task_sizes(n, num_symbols, seq_len + 1, 1)
    generator = _generator(seed)
    sequence = torch.rand(n, num_symbols, generator=generator).argsort(-1)[:, : seq_len + 1]
    position = torch.randint(seq_len, (n, 1), generator=generator)
    return Observations(
        keys=sequence[:, :-1],
        values=sequence[:, 1:],
        query=sequence[:, :-1].gather(1, position).squeeze(1),
        target=sequence[:, 1:].gather(1, position).squeeze(1),
    )
