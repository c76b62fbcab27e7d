"""The :class:`Observations` container of chained-attention tasks: fields, validation, slicing and sizes.

An observation is ``(context_keys, context_values, query, target)``: a context of ``N`` positions, each a
``(key_symbol, value_symbol)`` pair, a query symbol, and a target label. A batch of ``n`` observations is an
:class:`Observations` holding

- ``keys``   LongTensor ``(n, N)``, key symbol of each context position,
- ``values`` LongTensor ``(n, N)``, value symbol of each context position,
- ``query``  LongTensor ``(n,)``, the query symbol,
- ``target`` LongTensor ``(n,)``, the emitted target,
- ``mask``   optional BoolTensor ``(n, N)``, False marks padding (variable-length contexts); the
  symbols at padding positions are ignored (any value, -1 say, is accepted) and stored as 0.

Reading files and frames strictly is :mod:`pyro_multihop.data.readers` (``Observations.load`` and
``Observations.from_dataframe`` call it); the task simulators are :mod:`pyro_multihop.data.simulators`.

Example::

    >>> from pyro_multihop.data import transitive_task
    >>> obs = transitive_task(100, num_symbols=30, pairs=5, seed=0)
    >>> obs.keys.shape, len(obs[:10])
    (torch.Size([100, 10]), 10)
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Iterable, Optional, Union

import pandas as pd
import torch

__all__ = ["Observations"]

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

    @classmethod
    def trusted(cls, keys, values, query, target, mask=None) -> "Observations":
        """Observations from tensors already validated, without checks or host synchronisations.

        For slices and chunks of validated observations (the plate, the engine's chunks, a target
        replaced by a distribution's value): ``keys``/``values`` LongTensor ``(n, N)`` with 0 at padding,
        ``query``/``target`` LongTensor ``(n,)``, ``mask`` None or BoolTensor ``(n, N)`` with a real position
        per row, all on one device and non-negative. Anything else gives wrong results, not an error:
        build observations from user input with the constructor or :meth:`load`.
        """
        obs = object.__new__(cls)
        obs.keys, obs.values, obs.query, obs.target, obs.mask = keys, values, query, target, mask
        return obs

    def __getitem__(self, index) -> "Observations":
        if isinstance(index, int):
            index = slice(index, index + 1 if index != -1 else None)
        if isinstance(index, torch.Tensor) and index.dtype != torch.bool:
            index = index.long()
        return Observations.trusted(
            self.keys[index],
            self.values[index],
            self.query[index],
            self.target[index],
            None if self.mask is None else self.mask[index],
        )

    def to(self, device) -> "Observations":
        """Return a copy on ``device``."""
        return Observations.trusted(
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
    def from_dataframe(
        cls, frame: pd.DataFrame, *, extra_columns: Iterable[str] = (), allow_missing_target: bool = False
    ) -> "Observations":
        """Inverse of :meth:`to_dataframe`, read as strictly as a file (docs/data.md lists what it refuses).

        :param extra_columns: names of further columns the frame may hold; they are not read. Any other
            column that is not ``query``, ``target``, ``key_i``, ``value_i`` or ``mask_i`` is an error.
        :param allow_missing_target: without a ``target`` column every target is 0 (for predictions).
        :raises DataError: (a ``ValueError``) naming the column, the row (position from 0) and the cell:
            a missing, unpaired, duplicated or unknown column; an empty cell, a number that is not a
            non-negative integer below ``2**31``, or text in a symbol column (``3.0`` is the symbol 3); a
            mask cell that is not True/False; a row that is all padding.
        """
        from .readers import observations_from_frame  # the readers build Observations: imported on use

        return observations_from_frame(frame, extra_columns=extra_columns, allow_missing_target=allow_missing_target)

    def save(self, path: Union[str, os.PathLike]) -> None:
        """Write to ``path``: CSV for ``.csv``, Parquet (needs pyarrow; with page checksums) for ``.parquet``."""
        path = Path(path)
        frame = self.to_dataframe()
        if path.suffix == ".csv":
            frame.to_csv(path, index=False)
        elif path.suffix == ".parquet":
            frame.to_parquet(path, index=False, write_page_checksum=True)
        else:
            raise ValueError(f"path must end in .csv or .parquet, got {str(path)!r}")

    @classmethod
    def load(
        cls,
        path: Union[str, os.PathLike],
        shard: Optional[tuple] = None,
        *,
        extra_columns: Iterable[str] = (),
        allow_missing_target: bool = False,
    ) -> "Observations":
        """Read a ``.csv`` or ``.parquet`` file written by :meth:`save`, strictly: every row as written, or a
        :class:`~pyro_multihop.data.readers.DataError` naming the file, the row and line, the column and the
        text (docs/data.md).

        :param shard: optional ``(rank, world_size)``: read only rows ``[n rank / world_size,
            n (rank + 1) / world_size)`` of the file's ``n`` (contiguous shards whose sizes differ by at most
            one; empty when ``n < world_size``). Parquet reads only the row groups that hold them, CSV
            counts the rows in chunks and then parses only them, so no process holds the whole file.
            Errors name the row and line of the file, not of the shard.
        :param extra_columns: names of further columns the file may hold; they are not read.
        :param allow_missing_target: without a ``target`` column every target is 0 (for predictions; check
            ``"target" in read_columns(path)`` to tell).
        :raises DataError: (a ``ValueError``) as :meth:`from_dataframe`, and for a row with more or fewer
            fields than the header, a blank line, bytes that are not UTF-8, a damaged Parquet file.
        """
        from .readers import read_observations  # the readers build Observations: imported on use

        return read_observations(path, shard, extra_columns=extra_columns, allow_missing_target=allow_missing_target)
