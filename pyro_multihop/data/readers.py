"""Strict readers of observation files and frames: CSV and Parquet into :class:`Observations`, or a :class:`DataError`.

A data file holds one observation a row, in the columns ``query, target, key_0..key_{N-1}, value_0..`` and,
for padded contexts, ``mask_0..`` (:meth:`Observations.to_dataframe` writes them). Every cell is read as
written or refused with a one-line :class:`DataError` that names the file, the column, the row (and the line
of a CSV file) and the cell; docs/data.md lists what is refused. A sharded read (``shard=(rank,
world_size)``) parses only its rows. :meth:`Observations.load` and :meth:`Observations.from_dataframe` call
:func:`read_observations` and :func:`observations_from_frame`.
"""

from __future__ import annotations

import csv
import itertools
import math
import os
import re
import warnings
from pathlib import Path
from typing import Iterable, Optional, Union

import numpy as np
import pandas as pd
import torch

from .observations import Observations

__all__ = ["DataError", "SYMBOL_LIMIT", "read_columns", "read_observations", "observations_from_frame"]

#: Symbols and targets index tables: a value of ``2**31`` or more cannot be one and is refused as damaged.
SYMBOL_LIMIT = 2**31

_CSV_CHUNK_ROWS = 1 << 16
#: pandas options of every CSV read: no index guessed from a longer row, blank lines kept (and refused),
#: only an empty cell is missing (``NA`` or ``None`` stay text, quoted in the error).
_CSV_OPTIONS = {"index_col": False, "skip_blank_lines": False, "keep_default_na": False, "na_values": [""],
                "encoding": "utf-8"}
_INTEGER_TEXT = re.compile(r"\s*([+-]?)([0-9]+)(?:\.0*)?\s*")
_NUMBER_TEXT = re.compile(r"[+-]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_KNOWN_COLUMN = re.compile(r"(key|value|mask)_(0|[1-9][0-9]*)")


class DataError(ValueError):
    """A data file or frame that does not hold observations as written; a ``ValueError``.

    Attributes ``path`` (None for a frame), ``column``, ``row`` (position from 0 in the file, as in
    ``predict``'s ``row`` column, also for a shard) and ``line`` (of a CSV file, from 1) name the place, each
    None where it does not apply. The message reads ``data file 'x.csv': data column 'key_3' row 17:
    expected an integer symbol, got 2.5 (line 19 of the file)``. Readers of other formats may subclass it
    and set ``FIELD`` and ``RECORD`` (the words for a column and a row).
    """

    FIELD = "data column"
    RECORD = "row"

    def __init__(self, problem: str, *, path=None, column: Optional[str] = None, row: Optional[int] = None,
                 line: Optional[int] = None):
        self.problem, self.path, self.column, self.row, self.line = problem, path, column, row, line
        place = f"data file {str(path)!r}: " if path is not None else ""
        if column is not None:
            place += f"{self.FIELD} {column!r}" + (f" {self.RECORD} {row}" if row is not None else "") + ": "
        elif row is not None:
            place += f"data {self.RECORD} {row}: "
        suffix = f" (line {line} of the file)" if line is not None else ""
        super().__init__(f"{place}{problem}{suffix}")


def read_columns(path: Union[str, os.PathLike]) -> list:
    """The column names of a ``.csv`` (its header line, as written) or ``.parquet`` data file, in order."""
    path = _data_path(path)
    if path.suffix == ".parquet":
        return list(_parquet_file(path).schema_arrow.names)
    with open(path, "rb") as stream:
        first = stream.readline()
    if not first.strip():
        raise DataError("expected a header line (query,target,key_0,...,value_0,...), got an empty first line",
                        path=path, line=1)
    try:
        text = first.decode("utf-8-sig")
    except UnicodeDecodeError as error:
        raise _not_utf8(path, 1, first, error) from None
    return next(csv.reader([text.rstrip("\r\n")]))


def read_observations(
    path: Union[str, os.PathLike],
    shard: Optional[tuple] = None,
    *,
    extra_columns: Iterable[str] = (),
    allow_missing_target: bool = False,
) -> Observations:
    """The observations of a ``.csv`` or ``.parquet`` file (or of rows ``shard = (rank, world_size)`` of it),
    read strictly; :meth:`Observations.load` documents the arguments and the errors."""
    path = _data_path(path)
    shard = None if shard is None else _check_shard(shard)
    names = read_columns(path)
    layout = _Layout.of(names, extra_columns, allow_missing_target, path)
    if path.suffix == ".csv":
        cells = _CsvCells(_read_csv_rows(path, shard, names), path, names)
    else:
        cells = _Cells(_read_parquet_rows(path, shard), path, file_rows=True)
    if len(cells.frame) == 0 and shard is None:
        raise DataError("the file holds no observations", path=path)
    return _observations(cells, layout)


def observations_from_frame(
    frame: pd.DataFrame, *, extra_columns: Iterable[str] = (), allow_missing_target: bool = False
) -> Observations:
    """The observations of a frame laid out as a data file, read as strictly as one;
    :meth:`Observations.from_dataframe` documents the arguments and the errors."""
    if not isinstance(frame, pd.DataFrame):
        raise TypeError(f"frame must be a pandas DataFrame, got {type(frame).__name__}")
    layout = _Layout.of(list(frame.columns), extra_columns, allow_missing_target, None)
    return _observations(_Cells(frame), layout)


def _data_path(path) -> Path:
    path = Path(path)
    if path.suffix not in (".csv", ".parquet"):
        raise ValueError(f"path must end in .csv or .parquet, got {str(path)!r}")
    if not path.is_file():
        raise ValueError(f"path {str(path)!r} does not exist")
    return path


class _Layout:
    """The column set of a data file or frame: ``N`` key/value pairs, a mask or not, a target or not."""

    def __init__(self, N: int, has_mask: bool, has_target: bool):
        self.N, self.has_mask, self.has_target = N, has_mask, has_target

    @classmethod
    def of(cls, names: list, extra_columns: Iterable[str], allow_missing_target: bool, path) -> "_Layout":
        if isinstance(extra_columns, str):
            raise TypeError(f"extra_columns must be a list of column names, got {extra_columns!r}")
        extra = set(extra_columns)
        seen = {}
        for position, name in enumerate(names, start=1):
            if name in seen:
                raise DataError(f"the column appears twice (columns {seen[name]} and {position}, from 1)",
                                path=path, column=name)
            seen[name] = position
        indices = {"key": set(), "value": set(), "mask": set()}
        for name in names:
            match = _KNOWN_COLUMN.fullmatch(name) if isinstance(name, str) else None
            if match:
                indices[match.group(1)].add(int(match.group(2)))
            elif name not in ("query", "target") and name not in extra:
                hint = " (name further columns in extra_columns)"
                if name in ("", "Unnamed: 0"):
                    hint = (" (an index that pandas' to_csv wrote: write with index=False, or name it in extra_columns)"
                            if name == names[0] else " (a trailing comma on the header line?)")
                raise DataError(f"unknown column; columns are query, target, key_i, value_i and, for padded "
                                f"contexts, mask_i for i = 0..N-1{hint}", path=path, column=name)
        keys = indices["key"]
        for kind in ("value", "mask"):
            orphans = sorted(indices[kind] - keys)
            if orphans:
                raise DataError(f"the column has no 'key_{orphans[0]}'", path=path, column=f"{kind}_{orphans[0]}")
        for name in ["query", "key_0"] + ([] if allow_missing_target else ["target"]):
            if name not in seen:
                raise DataError(f"data must have a column {name!r}; columns are {list(names)}", path=path)
        for kind in ("value", "mask") if indices["mask"] else ("value",):
            lonely = sorted(keys - indices[kind])
            if lonely:
                also = " (mask columns come for every position or for none)" if kind == "mask" else ""
                raise DataError(f"the column has no {kind + '_' + str(lonely[0])!r}{also}", path=path,
                                column=f"key_{lonely[0]}")
        N = len(keys)
        if max(keys) != N - 1:
            gap = min(set(range(N)) - keys)
            raise DataError(f"key columns must be key_0..key_{max(keys)} without gaps; key_{gap} and value_{gap} "
                            "are missing", path=path)
        return cls(N, bool(indices["mask"]), "target" in seen)


class _Cells:
    """The cells of a frame and where they came from, so that an error names the place and the cell."""

    def __init__(self, frame: pd.DataFrame, path=None, file_rows: bool = False):
        self.frame, self.path, self.file_rows = frame, path, file_rows

    def error(self, column: Optional[str], position: int, problem: str) -> DataError:
        row = int(self.frame.index[position]) if self.file_rows else position
        return DataError(problem, path=self.path, column=column, row=row, line=self.line(row))

    def line(self, row: int) -> Optional[int]:
        return None

    def row_problem(self, position: int) -> Optional[str]:
        return None

    def cell(self, column: str, position: int) -> tuple:
        """``(shown, integer)``: the cell as a message shows it, and its integer value if it is one."""
        value = self.frame[column].iloc[position]
        if value is None or value is pd.NA or value is pd.NaT or (isinstance(value, float) and math.isnan(value)):
            return f"a missing value ({value})", None
        if isinstance(value, np.generic):
            value = value.item()
        if isinstance(value, str):
            return _shown_text(value), _integer_text(value)
        integer = None
        if isinstance(value, int) and not isinstance(value, bool):
            integer = value
        elif isinstance(value, float) and math.isfinite(value) and value.is_integer():
            integer = int(value)
        return repr(value), integer


class _CsvCells(_Cells):
    """Cells of rows of a CSV file: shown as the file writes them, read back from their line."""

    def __init__(self, frame: pd.DataFrame, path: Path, header: list):
        super().__init__(frame, path, file_rows=True)
        self.header = header

    def line(self, row: int) -> int:
        return row + 2

    def fields(self, position: int) -> list:
        return _csv_fields(self.path, self.line(int(self.frame.index[position])))

    def row_problem(self, position: int) -> Optional[str]:
        fields = self.fields(position)
        if not fields:
            return "expected a row of the header's columns, got a blank line"
        if len(fields) != len(self.header):
            return f"the row has {len(fields)} fields, the header has {len(self.header)}"
        return None

    def cell(self, column: str, position: int) -> tuple:
        text = self.fields(position)[self.header.index(column)]
        return _shown_text(text), _integer_text(text)


def _shown_text(text: str) -> str:
    """Text of a cell as a message shows it: a number bare as written (``1e20``), other text quoted."""
    if text == "":
        return "an empty cell"
    return text if _NUMBER_TEXT.fullmatch(text) else repr(text)


def _integer_text(text: str) -> Optional[int]:
    """The integer that ``text`` writes (``07``, ``+7``, ``3.0``, ``-4``; ASCII digits only), else None."""
    match = _INTEGER_TEXT.fullmatch(text)
    return None if match is None else int(match.group(1) + match.group(2))


def _csv_fields(path: Path, line: int) -> list:
    """The fields of line ``line`` (from 1) of a CSV file, as written."""
    with open(path, encoding="utf-8-sig", newline="") as stream:
        text = next(itertools.islice(stream, line - 1, None), "")
    return next(csv.reader([text.rstrip("\r\n")]), [])


def _not_utf8(path: Path, line: int, raw: bytes, error: UnicodeDecodeError) -> DataError:
    return DataError(f"expected UTF-8 text, got the byte {raw[error.start]:#04x} at position {error.start} of the "
                     "line", path=path, row=line - 2 if line > 1 else None, line=line)


def _first_bad_line(path: Path, width: int) -> DataError:
    """The first line of a CSV file that is not UTF-8 or does not have ``width`` fields (the error paths of the
    reader, which pandas reports without a line or at all)."""
    with open(path, "rb") as stream:
        for line, raw in enumerate(stream, start=1):
            try:
                text = raw.decode("utf-8-sig" if line == 1 else "utf-8")
            except UnicodeDecodeError as error:
                return _not_utf8(path, line, raw, error)
            fields = next(csv.reader([text.rstrip("\r\n")]), [])
            if line > 1 and len(fields) != width:
                return _width_error(path, line, len(fields), width)
    return DataError("cannot read the file as CSV", path=path)


def _width_error(path: Path, line: int, fields: int, width: int) -> DataError:
    extra = " (an extra trailing field?)" if fields == width + 1 else ""
    return DataError(f"the row has {fields} fields, the header has {width}{extra}", path=path, row=line - 2, line=line)


def _read_csv(path: Path, width: int, count_rows: bool = False, **options):
    """``pd.read_csv`` with the strict options (or the number of rows, counted in chunks of one parsed column),
    its errors turned into :class:`DataError` naming the line."""
    try:
        with warnings.catch_warnings():
            # index_col=False: pandas warns (and drops the extra field) when every data row is longer
            warnings.simplefilter("error", pd.errors.ParserWarning)
            if count_rows:
                chunks = pd.read_csv(path, usecols=[0], chunksize=_CSV_CHUNK_ROWS, **_CSV_OPTIONS)
                return sum(len(chunk) for chunk in chunks)
            return pd.read_csv(path, **_CSV_OPTIONS, **options)
    except (UnicodeDecodeError, pd.errors.ParserWarning):
        raise _first_bad_line(path, width) from None
    except pd.errors.ParserError as error:
        found = re.search(r"Expected (\d+) fields in line (\d+), saw (\d+)", str(error))
        if found is None:
            raise DataError(f"cannot read the file as CSV: {str(error).strip().splitlines()[0]}", path=path) from None
        raise _width_error(path, int(found.group(2)), int(found.group(3)), width) from None


def _read_csv_rows(path: Path, shard: Optional[tuple], header: list) -> pd.DataFrame:
    """The rows of a CSV file (or of ``shard``), indexed by their row in the file, columns named as written.

    A shard's rows: one chunked pass counts the rows (one column parsed), a second parses only them."""
    width, start, options = len(header), 0, {}
    if shard is not None:
        n = _read_csv(path, width, count_rows=True)
        start, stop = _shard_range(n, *shard, path)
        options = {"skiprows": range(1, start + 1), "nrows": stop - start}
    frame = _read_csv(path, width, **options)
    frame.columns = header  # pandas renames a duplicate or empty name; the layout refused duplicates
    return frame.set_axis(range(start, start + len(frame)))


def _parquet_file(path: Path):
    import pyarrow.parquet as pq

    try:
        source = pq.ParquetFile(path, page_checksum_verification=True)
        source.schema_arrow  # noqa: B018 - a damaged schema raises here, not later
        return source
    except Exception as error:  # ArrowInvalid (a ValueError), OSError, ArrowNotImplementedError, ...
        raise _damaged(path, error) from None


def _damaged(path: Path, error: Exception) -> DataError:
    text = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
    return DataError(f"the Parquet file is damaged or not Parquet ({text})", path=path)


def _read_parquet_rows(path: Path, shard: Optional[tuple]) -> pd.DataFrame:
    """The rows of a Parquet file (or of ``shard``, reading only the row groups that hold them), indexed by
    their row in the file; page checksums are verified where the file has them."""
    source = _parquet_file(path)
    try:
        frame = _parquet_frame(source, shard, path)
    except DataError:
        raise
    except Exception as error:  # pyarrow and pandas raise many types for a damaged footer or pandas metadata
        raise _damaged(path, error) from None
    if list(frame.columns) != list(source.schema_arrow.names):
        raise _damaged(path, ValueError("its pandas metadata does not match its columns"))
    return frame


def _parquet_frame(source, shard: Optional[tuple], path: Path) -> pd.DataFrame:
    if shard is None:
        return source.read().to_pandas().set_axis(range(source.metadata.num_rows))
    start, stop = _shard_range(source.metadata.num_rows, *shard, path)
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
        raise DataError("the file holds no observations", path=path)
    return n * rank // world_size, n * (rank + 1) // world_size


def _observations(cells: _Cells, layout: _Layout) -> Observations:
    """The observations of ``cells`` laid out as ``layout``; a :class:`DataError` names the first bad cell."""
    N, n = layout.N, len(cells.frame)

    def block(prefix: str, read) -> np.ndarray:
        return np.stack([read(cells, f"{prefix}_{i}") for i in range(N)], axis=1) if n else np.zeros((0, N))

    keys = block("key", _symbol_column)
    values = block("value", _symbol_column)
    query = _symbol_column(cells, "query")
    target = _symbol_column(cells, "target", "an integer target") if layout.has_target else np.zeros(n, np.int64)
    mask = None
    if layout.has_mask:
        mask = block("mask", _mask_column).astype(bool)
        empty = ~mask.any(axis=1)
        if empty.any():
            raise cells.error(None, int(empty.nonzero()[0][0]), "every position is padding (all mask_i False)")
    return Observations(
        torch.from_numpy(keys.astype(np.int64)),
        torch.from_numpy(values.astype(np.int64)),
        torch.from_numpy(query),
        torch.from_numpy(target),
        None if mask is None else torch.from_numpy(mask),
    )


def _symbol_column(cells: _Cells, name: str, what: str = "an integer symbol") -> np.ndarray:
    """Column ``name`` as int64, every cell a non-negative integer below :data:`SYMBOL_LIMIT`, checked before
    any cast; a :class:`DataError` names the first cell that is not one, as written."""
    column = cells.frame[name]
    dtype = column.dtype
    if pd.api.types.is_bool_dtype(dtype):
        bad = np.ones(len(column), dtype=bool)
    elif pd.api.types.is_integer_dtype(dtype) or pd.api.types.is_float_dtype(dtype):
        numbers = column.to_numpy(dtype="float64", na_value=np.nan) if column.hasnans else column.to_numpy()
        with np.errstate(invalid="ignore"):
            bad = (numbers < 0) | (numbers >= SYMBOL_LIMIT)
            if numbers.dtype.kind == "f":
                bad |= ~np.isfinite(numbers) | (numbers % 1 != 0)
    elif dtype == object or pd.api.types.is_string_dtype(dtype):
        parsed = [_integer_text(cell) if isinstance(cell, str) else _object_integer(cell) for cell in column.tolist()]
        bad = np.array([value is None or not 0 <= value < SYMBOL_LIMIT for value in parsed], dtype=bool)
        numbers = np.array([0 if value is None else value for value in parsed], dtype=object)
    else:  # datetime64, timedelta64, categories, ...: numbers that do not write a symbol
        raise cells.error(name, 0, f"expected {what}, got {cells.cell(name, 0)[0]} (a {dtype} column)")
    if bad.any():
        position = int(bad.nonzero()[0][0])
        problem = cells.row_problem(position)
        if problem is not None:
            raise cells.error(None, position, problem)
        shown, integer = cells.cell(name, position)
        if integer is not None and integer < 0:
            problem = f"expected a non-negative {what.removeprefix('an ')}, got {shown}"
        elif integer is not None and integer >= SYMBOL_LIMIT:
            problem = f"expected {what} below 2**31 = {SYMBOL_LIMIT}, got {shown}"
        else:
            problem = f"expected {what}, got {shown}"
        raise cells.error(name, position, problem)
    return numbers.astype(np.int64)


def _object_integer(cell) -> Optional[int]:
    if isinstance(cell, np.generic):
        cell = cell.item()
    if isinstance(cell, int) and not isinstance(cell, bool):
        return cell
    if isinstance(cell, float) and math.isfinite(cell) and cell.is_integer():
        return int(cell)
    return None


def _mask_cell(cell) -> Optional[bool]:
    """A mask cell as a bool: True/False, or the text ``True``/``true``/``TRUE`` and likewise False; else None."""
    if isinstance(cell, (bool, np.bool_)):
        return bool(cell)
    if isinstance(cell, str):
        return {"true": True, "false": False}.get(cell.strip().lower())
    return None


def _mask_column(cells: _Cells, name: str) -> np.ndarray:
    """Mask column ``name`` as bool; a :class:`DataError` names the first cell that is not True or False."""
    column = cells.frame[name]
    if pd.api.types.is_bool_dtype(column.dtype) and not column.hasnans:
        return column.to_numpy(dtype=bool)
    parsed = [_mask_cell(cell) for cell in column.tolist()]
    bad = np.array([value is None for value in parsed], dtype=bool)
    if not bad.any():
        return np.array(parsed, dtype=bool)
    position = int(bad.nonzero()[0][0])
    problem = cells.row_problem(position)
    if problem is not None:
        raise cells.error(None, position, problem)
    raise cells.error(name, position, f"expected True or False, got {cells.cell(name, position)[0]}")
