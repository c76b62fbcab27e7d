"""Mutation kinds of data, checkpoint and bAbI files, as careless users and damaged disks make them.

Each kind is a function ``kind(source, pick) -> Case``: ``source`` is what a valid file holds, ``pick(n)`` an
integer in ``range(n)`` chosen by the caller (hypothesis draws them), and the case holds the mutated file's
bytes and what a strict reader must do with them:

- ``Case.expect`` a tuple of strings: a named error whose one-line message contains every one of them
  (the file, the row and line, the column, the offending text as written);
- ``Case.expect`` ``None``: an exact round trip, the source as written (a harmless variant: a byte-order mark,
  CRLF line ends, ``07``, ``3.0``).

The kinds that a reader cannot detect (a CSV cut inside its last number) are not here: the tests check the
documented behaviour for them separately.
"""

from __future__ import annotations

import io
import re
from dataclasses import dataclass
from typing import Callable, Optional, Tuple

import pandas as pd

Pick = Callable[[int], int]


@dataclass
class Case:
    kind: str
    content: bytes
    expect: Optional[Tuple[str, ...]]
    or_exact: bool = False  # an exact round trip is fine too (a flipped bit in a part the reader ignores)


def with_mask(obs):
    """``obs`` with an explicit mask (all True where it had none), so that the file has mask columns."""
    return type(obs)(obs.keys, obs.values, obs.query, obs.target, obs.full_mask())


# -- CSV -----------------------------------------------------------------------------------------------------------
def csv_rows(obs) -> Tuple[list, list]:
    """``(header, rows)`` of the CSV text that ``obs.save`` writes, as lists of field strings."""
    lines = obs.to_dataframe().to_csv(index=False).splitlines()
    return lines[0].split(","), [line.split(",") for line in lines[1:]]


def csv_text(header, rows, end="\n") -> bytes:
    return (end.join([",".join(header)] + [",".join(row) for row in rows]) + end).encode("utf-8")


def cell_place(header, rows, pick, symbols_only=True):
    """A random ``(row, column index)``; a symbol column unless ``symbols_only`` is False."""
    columns = [i for i, name in enumerate(header) if not (symbols_only and name.startswith("mask_"))]
    return pick(len(rows)), columns[pick(len(columns))]


BAD_SYMBOL_TEXTS = {
    # text written in a symbol cell -> fragment the message must quote
    "2.5": "got 2.5",
    "seven": "got 'seven'",
    "": "got an empty cell",
    "-4": "expected a non-negative integer",
    "1e20": "got 1e20",
    "18446744073709551616": "got 18446744073709551616",
    "85899345939": "got 85899345939",
    "\u00b2": "got '\u00b2'",
    "\u0663": "got '\u0663'",
    "NA": "got 'NA'",
    "<NA>": "got '<NA>'",
    "None": "got 'None'",
    "True": "got 'True'",
}


def csv_bad_cell(obs, pick: Pick) -> Case:
    header, rows = csv_rows(obs)
    row, column = cell_place(header, rows, pick)
    text = list(BAD_SYMBOL_TEXTS)[pick(len(BAD_SYMBOL_TEXTS))]
    rows[row][column] = text
    return Case(f"cell {text!r}", csv_text(header, rows),
                (f"data column {header[column]!r} row {row}: ", BAD_SYMBOL_TEXTS[text], f"(line {row + 2} of the file)"))


def csv_bad_mask_cell(obs, pick: Pick) -> Case:
    header, rows = csv_rows(with_mask(obs))
    row = pick(len(rows))
    column = [i for i, name in enumerate(header) if name.startswith("mask_")][pick(obs.context_len)]
    text = ["yes", "1", "", "maybe"][pick(4)]
    rows[row][column] = text
    shown = "an empty cell" if text == "" else text if text == "1" else repr(text)
    return Case(f"mask cell {text!r}", csv_text(header, rows),
                (f"data column {header[column]!r} row {row}: expected True or False, got {shown}",
                 f"(line {row + 2} of the file)"))


def csv_harmless_cell(obs, pick: Pick) -> Case:
    header, rows = csv_rows(obs)
    row, column = cell_place(header, rows, pick)
    value = rows[row][column]
    rows[row][column] = [f"0{value}", f"{value}.0", f"+{value}", f" {value}", f"{value}."][pick(5)]
    return Case(f"harmless cell {rows[row][column]!r}", csv_text(header, rows), None)


def csv_harmless_layout(obs, pick: Pick) -> Case:
    header, rows = csv_rows(obs)
    content = csv_text(header, rows)
    variant = pick(3)
    if variant == 0:
        return Case("byte-order mark", b"\xef\xbb\xbf" + content, None)
    if variant == 1:
        return Case("CRLF line ends", csv_text(header, rows, end="\r\n"), None)
    return Case("no final newline", content[:-1], None)


def csv_shifted(obs, pick: Pick) -> Case:
    header, rows = csv_rows(obs)
    rows = [row + [str(pick(10))] for row in rows]
    width = len(header)
    return Case("shifted columns", csv_text(header, rows),
                ("data row 0: ", f"the row has {width + 1} fields, the header has {width}", "(line 2 of the file)"))


def csv_ragged_row(obs, pick: Pick) -> Case:
    header, rows = csv_rows(obs)
    row = pick(len(rows))
    longer = pick(2) == 1
    rows[row] = rows[row] + ["7"] if longer else rows[row][:-1]
    fields = len(header) + (1 if longer else -1)
    return Case("extra field" if longer else "missing field", csv_text(header, rows),
                (f"data row {row}: ", f"the row has {fields} fields, the header has {len(header)}",
                 f"(line {row + 2} of the file)"))


def csv_blank_line(obs, pick: Pick) -> Case:
    header, rows = csv_rows(obs)
    row = pick(len(rows))
    text = csv_text(header, rows[:row]) + b"\n" + csv_text(header, rows[row:])[len(",".join(header)) + 1:]
    return Case("blank line", text, (f"data row {row}: ", "blank line", f"(line {row + 2} of the file)"))


def csv_not_utf8(obs, pick: Pick) -> Case:
    header, rows = csv_rows(obs)
    row, column = cell_place(header, rows, pick, symbols_only=False)
    rows[row][column] = rows[row][column] + "\udcff"  # written as the lone byte 0xff below
    content = csv_text_bytes(header, rows)
    return Case("non-UTF-8 byte", content,
                (f"data row {row}: expected UTF-8 text, got the byte 0xff", f"(line {row + 2} of the file)"))


def csv_text_bytes(header, rows) -> bytes:
    text = "\n".join([",".join(header)] + [",".join(row) for row in rows]) + "\n"
    return text.encode("utf-8", errors="surrogateescape")


def csv_cut_inside_a_line(obs, pick: Pick) -> Case:
    """The file cut inside a row before that row's last field: the row is short (never undetectable)."""
    header, rows = csv_rows(obs)
    row = pick(len(rows))
    line = ",".join(rows[row])
    last_comma = line.rindex(",") if "," in line else 0
    keep = pick(last_comma) if last_comma else 0
    content = csv_text(header, rows[:row])[:-1] + b"\n" + line[:keep].encode()
    if keep == 0:  # a cut right after a newline leaves a valid shorter file; cut one byte into the row instead
        content += line[:1].encode()
    fields = line[: max(keep, 1)].count(",") + 1
    return Case("cut inside a row", content,
                (f"data row {row}: ", f"the row has {fields} fields, the header has {len(header)}",
                 f"(line {row + 2} of the file)"))


def _rename(header, rows, old, new):
    return [new if name == old else name for name in header], rows


def csv_column_set(obs, pick: Pick) -> Case:
    """A column deleted, renamed, duplicated, orphaned or unknown; partial masks."""
    masked = obs.mask is not None or pick(2) == 1
    source = with_mask(obs) if masked else obs
    header, rows = csv_rows(source)
    N = obs.context_len
    i = pick(N)
    variant = pick(8)

    def drop(name):
        position = header.index(name)
        return [h for h in header if h != name], [row[:position] + row[position + 1:] for row in rows]

    def add(name, values):
        return header + [name], [row + [value] for row, value in zip(rows, values)]

    if variant == 0:
        new_header, new_rows = drop(f"key_{i}")
        expect = (f"data column 'value_{i}': the column has no 'key_{i}'",)
    elif variant == 1:
        new_header, new_rows = _rename(header, rows, f"key_{i}", f"Key_{i}")
        expect = (f"data column 'Key_{i}': unknown column",)
    elif variant == 2:
        name = ["query", "target", f"value_{i}", f"key_{i}"][pick(4)]
        new_header, new_rows = add(name, [str(pick(5)) for _ in rows])
        expect = (f"data column {name!r}: the column appears twice",)
    elif variant == 3:
        new_header, new_rows = add(f"value_{N}", ["1"] * len(rows))
        expect = (f"data column 'value_{N}': the column has no 'key_{N}'",)
    elif variant == 4:
        new_header, new_rows = add("note", ["x"] * len(rows))
        expect = ("data column 'note': unknown column",)
    elif variant == 5:
        new_header = [""] + header
        new_rows = [[str(r)] + row for r, row in enumerate(rows)]
        expect = ("data column '': unknown column", "index=False")
    elif variant == 6 and masked:
        new_header, new_rows = drop(f"mask_{i}")
        expect = (f"data column 'key_{i}': the column has no 'mask_{i}'",) if N > 1 else None
    elif variant == 6 or variant == 7 and not masked:
        new_header, new_rows = add(f"mask_{i}", ["True"] * len(rows))
        expect = None if N == 1 else (f"the column has no 'mask_", "mask columns come for every position or for none")
    else:
        new_header, new_rows = add(f"mask_{N}", ["True"] * len(rows))
        expect = (f"data column 'mask_{N}': the column has no 'key_{N}'",)
    return Case(f"column set {variant}", csv_text(new_header, new_rows), expect)


CSV_KINDS = [csv_bad_cell, csv_bad_mask_cell, csv_harmless_cell, csv_harmless_layout, csv_shifted, csv_ragged_row,
             csv_blank_line, csv_not_utf8, csv_cut_inside_a_line, csv_column_set]


# -- Parquet -------------------------------------------------------------------------------------------------------
def parquet_bytes(frame: pd.DataFrame) -> bytes:
    stream = io.BytesIO()
    frame.to_parquet(stream, index=False, write_page_checksum=True)
    return stream.getvalue()


def parquet_cell(obs, pick: Pick) -> Case:
    """A symbol column of another type, or with a bad value."""
    frame = obs.to_dataframe()
    names = [c for c in frame.columns if not c.startswith("mask_")]
    name, row = names[pick(len(names))], pick(len(frame))
    variant = pick(10)
    column = frame[name]
    if variant == 0:
        frame[name] = column.astype(float)
        frame.loc[row, name] = 2.5
        expect = (f"data column {name!r} row {row}: ", "got 2.5")
    elif variant == 1:
        frame[name] = column.astype(float)
        frame.loc[row, name] = float("nan")
        expect = (f"data column {name!r} row {row}: ", "got a missing value (nan)")
    elif variant == 2:
        frame[name] = column.astype("Int64")
        frame.loc[row, name] = pd.NA
        expect = (f"data column {name!r} row {row}: ", "got a missing value (<NA>)")
    elif variant == 3:
        frame.loc[row, name] = 85899345939
        expect = (f"data column {name!r} row {row}: ", "below 2**31", "got 85899345939")
    elif variant == 4:
        frame.loc[row, name] = -3
        expect = (f"data column {name!r} row {row}: ", "non-negative", "got -3")
    elif variant == 5:
        frame[name] = pd.to_datetime(column, unit="us")
        expect = (f"data column {name!r} row 0: ", "(a datetime64")
    elif variant == 6:
        frame[name] = pd.to_timedelta(column, unit="s")
        expect = (f"data column {name!r} row 0: ", "(a timedelta64")
    elif variant == 7:
        frame[name] = column.astype(str)
        frame.loc[row, name] = "seven"
        expect = (f"data column {name!r} row {row}: ", "got 'seven'")
    elif variant == 8:
        frame[name] = column.astype(float)
        frame.loc[row, name] = 1e20
        expect = (f"data column {name!r} row {row}: ", "got 1e+20")
    else:
        frame[name] = column.astype(["float64", "int32", "uint8", "uint64"][pick(4)])  # harmless
        expect = None
    return Case(f"parquet cell {variant}", parquet_bytes(frame), expect)


def parquet_column_set(obs, pick: Pick) -> Case:
    import pyarrow as pa
    import pyarrow.parquet as pq

    table = pa.Table.from_pandas(obs.to_dataframe(), preserve_index=False)
    N, i = obs.context_len, pick(obs.context_len)
    variant = pick(4)
    if variant == 0:
        table = table.drop_columns([f"key_{i}"])
        expect = (f"data column 'value_{i}': the column has no 'key_{i}'",)
    elif variant == 1:
        table = table.rename_columns([f"Key_{i}" if n == f"key_{i}" else n for n in table.column_names])
        expect = (f"data column 'Key_{i}': unknown column",)
    elif variant == 2:
        name = ["query", "target", f"value_{i}"][pick(3)]
        table = table.append_column(name, pa.array([pick(5)] * table.num_rows, pa.int64()))
        expect = (f"data column {name!r}: the column appears twice",)
    else:
        table = table.append_column(f"value_{N}", pa.array([1] * table.num_rows, pa.int64()))
        expect = (f"data column 'value_{N}': the column has no 'key_{N}'",)
    stream = io.BytesIO()
    pq.write_table(table.replace_schema_metadata(None), stream, write_page_checksum=True)
    return Case(f"parquet columns {variant}", stream.getvalue(), expect)


def parquet_damage(obs, pick: Pick) -> Case:
    """A bit flipped or the file cut: a named error, or (a flip in a statistic the reader ignores) the data
    exactly; page checksums catch flips in the data pages."""
    return damaged(parquet_bytes(obs.to_dataframe()), pick)


def damaged(content: bytes, pick: Pick) -> Case:
    """``content`` with one bit flipped (a named error or, where nothing reads that bit, the same data) or cut
    short (a named error)."""
    content = bytearray(content)
    if pick(2):
        position = pick(len(content))
        content[position] ^= 1 << pick(8)
        return Case(f"bit flip at {position}", bytes(content), ("",), or_exact=True)
    cut = pick(len(content))
    return Case(f"cut at {cut}", bytes(content[:cut]), ("",))


PARQUET_KINDS = [parquet_cell, parquet_column_set, parquet_damage]


# -- bAbI ----------------------------------------------------------------------------------------------------------
def babi_lines(story: str) -> list:
    return story.splitlines(keepends=True)


def babi_question_without_tabs(story: str, pick: Pick) -> Case:
    lines = babi_lines(story)
    questions = [i for i, line in enumerate(lines) if "\t" in line]
    line = questions[pick(len(questions))]
    lines[line] = lines[line].replace("\t", " " * (1 + pick(4)))
    return Case("question tabs as spaces", "".join(lines).encode(), (f":{line + 1}: a question needs tabs",))


def babi_bad_supporting_id(story: str, pick: Pick) -> Case:
    lines = babi_lines(story)
    questions = [i for i, line in enumerate(lines) if "\t" in line]
    line = questions[pick(len(questions))]
    bad = ["\u00b2", "\u0661", "1x", "x", ""][pick(5)]
    head, _, _ = lines[line].rpartition("\t")
    lines[line] = f"{head}\t{bad}\n"
    return Case(f"supporting id {bad!r}", "".join(lines).encode(),
                (f":{line + 1}: supporting fact IDs must be integers, got {bad!r}",))


def babi_cut(story: str, pick: Pick) -> Case:
    """The file cut inside a line (a cut right after a newline leaves a valid, shorter file)."""
    content = story.encode()
    newlines = {i + 1 for i, byte in enumerate(content) if byte == ord("\n")}
    cut = pick(len(content) - 1) + 1
    while cut in newlines:
        cut -= 1
    line = content[:cut].count(b"\n") + 1
    return Case(f"cut at {cut}", content[:cut], (f":{line}: ",))


def babi_not_utf8(story: str, pick: Pick) -> Case:
    lines = babi_lines(story)
    line = pick(len(lines))
    raw = [text.encode() for text in lines]
    raw[line] = raw[line][:-1] + b"\xe9\n"
    return Case("non-UTF-8 byte", b"".join(raw), (f":{line + 1}: expected UTF-8 text, got the byte 0xe9",))


def babi_harmless(story: str, pick: Pick) -> Case:
    if pick(2):
        return Case("byte-order mark", b"\xef\xbb\xbf" + story.encode(), None)
    return Case("CRLF line ends", story.replace("\n", "\r\n").encode(), None)


BABI_KINDS = [babi_question_without_tabs, babi_bad_supporting_id, babi_cut, babi_not_utf8, babi_harmless]


def one_line(message: str) -> str:
    """``message`` with the file name made generic (for readable assertion failures)."""
    return re.sub(r"'[^']*/", "'.../", message)


# -- checkpoints ---------------------------------------------------------------------------------------------------
def checkpoint_bytes(payload: dict) -> bytes:
    import torch

    stream = io.BytesIO()
    torch.save(payload, stream)
    return stream.getvalue()


def checkpoint_entry(payload: dict, pick: Pick) -> Case:
    """An entry or a parameter of the wrong type, dtype, shape or value, in a file written without a digest
    (with one, every such edit is refused as damage)."""
    import torch

    payload = {**payload, "state_dict": {k: v.clone() for k, v in payload["state_dict"].items()}}
    del payload["sha256"]
    state = payload["state_dict"]
    name = sorted(state)[pick(len(state))]
    tensor = state[name]
    variant = pick(10)
    if variant == 0:
        payload["state_dict"] = list(state.items())
        expect = ("entry 'state_dict' must be a dictionary of tensors, got a list",)
    elif variant == 1:
        state[name] = tensor.long() if tensor.is_floating_point() else tensor.double()
        expect = (f"parameter {name!r} must have dtype {tensor.dtype} like the model's, got {state[name].dtype}",)
    elif variant in (2, 3):
        index = tuple(pick(size) for size in tensor.shape)
        value = [float("nan"), float("inf"), float("-inf")][pick(3)]
        state[name] = tensor.clone().index_put_(tuple(torch.tensor([i]) for i in index), torch.tensor(value, dtype=tensor.dtype))
        expect = (f"parameter {name!r} must be finite, got {value} at index {index}",)
    elif variant == 4:
        state[name] = tensor.reshape(-1)[:-1] if tensor.numel() > 1 else tensor.reshape(1, -1)
        expect = (f"parameter {name!r} must have shape {tuple(tensor.shape)}, got {tuple(state[name].shape)}",)
    elif variant == 5:
        del state[name]
        expect = (f"parameter {name!r} of ", "is missing")
    elif variant == 6:
        state[name + "_unconstrained"] = state.pop(name)
        expect = (f"parameter '{name}_unconstrained' has the name it had before", "rename every entry")
    elif variant == 7:
        payload[["config", "step", "optimizer", "extra"][pick(4)]] = ["not", "valid"]
        expect = ("must be a", "got a list")
    elif variant == 8:
        payload["vocabulary"] = ["a", "b", "a"] if pick(2) else ["a", 7]
        expect = ("entry 'vocabulary' must hold",)
    else:
        state[name] = tensor.tolist()
        expect = (f"parameter {name!r} must be a tensor, got a list",)
    return Case(f"checkpoint entry {variant}", checkpoint_bytes(payload), expect)


def checkpoint_damage(payload: dict, pick: Pick) -> Case:
    """A bit flipped or the file cut: a named error, or (a flip in a part nobody reads) the checkpoint exactly."""
    return damaged(checkpoint_bytes(payload), pick)


CHECKPOINT_KINDS = [checkpoint_entry, checkpoint_damage]
