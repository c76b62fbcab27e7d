"""The strict readers: pandas and file round trips, errors that name the cell, sharded reads."""

import pandas as pd
import pytest
import torch

from observation_samples import small_obs, task_with_padding
from pyro_multihop import Observations, transitive_task
from pyro_multihop.data import DataError


@pytest.mark.parametrize("masked", [False, True])
def test_dataframe_round_trip_is_exact(masked):
    obs = small_obs(masked)
    frame = obs.to_dataframe()
    assert list(frame.columns[:4]) == ["query", "target", "key_0", "key_1"]
    assert any(c.startswith("mask_") for c in frame.columns) == masked
    assert Observations.from_dataframe(frame) == obs


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
@pytest.mark.parametrize("masked", [False, True])
def test_file_round_trip_is_exact(tmp_path, suffix, masked):
    obs = task_with_padding(masked)
    path = tmp_path / f"data{suffix}"
    obs.save(path)
    assert Observations.load(path) == obs


def test_file_errors_are_clear(tmp_path):
    with pytest.raises(ValueError, match="must end in .csv or .parquet"):
        small_obs().save(tmp_path / "data.txt")
    with pytest.raises(ValueError, match="does not exist"):
        Observations.load(tmp_path / "missing.csv")
    (tmp_path / "empty.csv").write_text("query,target,key_0,value_0\n")
    with pytest.raises(DataError, match="holds no observations"):
        Observations.load(tmp_path / "empty.csv")
    (tmp_path / "nokeys.csv").write_text("query,target\n1,2\n")
    with pytest.raises(ValueError, match="must have a column 'key_0'"):
        Observations.load(tmp_path / "nokeys.csv")
    (tmp_path / "floats.csv").write_text("query,target,key_0,value_0\n1.5,2,0,1\n")
    with pytest.raises(DataError, match="data column 'query' row 0: expected an integer symbol, got 1.5 \\(line 2 of"):
        Observations.load(tmp_path / "floats.csv")


def _csv_with_cell(tmp_path, column, row, text):
    """The CSV of a small task with the cell (row, column) replaced by ``text``, as a user's editor would."""
    frame = transitive_task(6, num_symbols=12, pairs=2, seed=0).to_dataframe().astype(str)
    frame.loc[row, column] = text
    path = tmp_path / "edited.csv"
    frame.to_csv(path, index=False)
    return path


@pytest.mark.parametrize(
    "column, row, text, problem",
    [
        ("key_1", 2, "2.5", "expected an integer symbol, got 2.5"),
        ("value_0", 1, "seven", "expected an integer symbol, got 'seven'"),
        ("query", 3, "", "expected an integer symbol, got an empty cell"),
        ("key_0", 0, "", "expected an integer symbol, got an empty cell"),
        ("target", 2, "x", "expected an integer target, got 'x'"),
        ("value_1", 3, "-4", "expected a non-negative integer symbol, got -4"),
    ],
    ids=["float", "text", "empty-query", "empty-key", "text-target", "negative"],
)
def test_a_bad_cell_names_its_row_and_column(tmp_path, column, row, text, problem):
    path = _csv_with_cell(tmp_path, column, row, text)
    with pytest.raises(DataError) as caught:
        Observations.load(path)
    assert str(caught.value) == f"data file {str(path)!r}: data column {column!r} row {row}: {problem} (line {row + 2} of the file)"
    assert (caught.value.row, caught.value.column, caught.value.line, caught.value.path) == (row, column, row + 2, path)
    assert isinstance(caught.value, ValueError)


def test_integer_valued_floats_are_symbols_and_mask_cells_must_be_booleans():
    obs = small_obs(masked=True)
    frame = obs.to_dataframe()
    assert Observations.from_dataframe(frame.astype({"key_0": float, "target": float})) == obs
    frame = frame.astype({"mask_1": object})
    frame.loc[1, "mask_1"] = "maybe"
    with pytest.raises(DataError, match="data column 'mask_1' row 1: expected True or False, got 'maybe'"):
        Observations.from_dataframe(frame)


def test_from_dataframe_rejects_unpaired_and_unknown_columns():
    frame = pd.DataFrame({"query": [0], "target": [0], "key_0": [1], "key_1": [2], "value_0": [3]})
    with pytest.raises(DataError, match="data column 'key_1': the column has no 'value_1'"):
        Observations.from_dataframe(frame)
    frame = small_obs().to_dataframe().assign(note=["a", "b"])
    with pytest.raises(DataError, match="data column 'note': unknown column"):
        Observations.from_dataframe(frame)
    assert Observations.from_dataframe(frame, extra_columns=["note"]) == small_obs()


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
@pytest.mark.parametrize("masked", [False, True])
def test_shards_partition_the_file_in_order(tmp_path, suffix, masked):
    obs = task_with_padding(masked)
    path = tmp_path / f"data{suffix}"
    if suffix == ".parquet":
        obs.to_dataframe().to_parquet(path, index=False, row_group_size=8)  # 7 row groups
    else:
        obs.save(path)
    for world_size in (1, 2, 3, 7, 64):
        shards = [Observations.load(path, shard=(rank, world_size)) for rank in range(world_size)]
        sizes = [len(s) for s in shards]
        assert sum(sizes) == 50 and max(sizes) - min(sizes) <= 1, sizes
        assert all(s.context_len == obs.context_len and (s.mask is not None) == masked for s in shards)
        start = 0
        for part, size in zip(shards, sizes):
            assert part == obs[start : start + size]  # contiguous, in file order; empty past 50 rows
            start += size


def test_a_shard_reads_only_its_rows(tmp_path, monkeypatch):
    import pyarrow.parquet as pq

    obs = transitive_task(50, seed=3)
    obs.to_dataframe().to_parquet(tmp_path / "data.parquet", index=False, row_group_size=8)
    obs.save(tmp_path / "data.csv")
    read_groups, parsed_rows = [], []
    original_groups, original_csv = pq.ParquetFile.read_row_groups, pd.read_csv

    def spy_groups(self, groups, *args, **kwargs):
        read_groups.append(list(groups))
        return original_groups(self, groups, *args, **kwargs)

    def spy_csv(*args, **kwargs):
        frame = original_csv(*args, **kwargs)
        if "chunksize" not in kwargs:  # the counting pass parses one column, in chunks
            parsed_rows.append(len(frame))
        return frame

    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", spy_groups)
    monkeypatch.setattr(pd, "read_csv", spy_csv)
    assert Observations.load(tmp_path / "data.parquet", shard=(1, 3)) == obs[16:33]
    assert read_groups == [[2, 3, 4]]  # rows 16..32 lie in groups 2 (16-23), 3 (24-31) and 4 (32-39)
    assert Observations.load(tmp_path / "data.csv", shard=(1, 3)) == obs[16:33]
    assert max(parsed_rows) == 17


@pytest.mark.parametrize("shard", [(2, 2), (-1, 2), (0, 0), (0,), "0/2", (0.0, 2), (True, 2)], ids=str)
def test_bad_shards_are_named(tmp_path, shard):
    transitive_task(10, seed=0).save(tmp_path / "data.csv")
    with pytest.raises(ValueError, match="shard"):
        Observations.load(tmp_path / "data.csv", shard=shard)


@pytest.mark.parametrize("suffix", [".csv", ".parquet"])
def test_a_sharded_read_names_the_row_and_line_of_the_file(tmp_path, suffix):
    frame = transitive_task(40, seed=0).to_dataframe()
    frame.loc[35, "value_2"] = -4
    path = tmp_path / f"data{suffix}"
    frame.to_csv(path, index=False) if suffix == ".csv" else frame.to_parquet(path, index=False, row_group_size=8)
    assert len(Observations.load(path, shard=(0, 2))) == 20  # rows 0..19 are fine
    with pytest.raises(DataError) as caught:
        Observations.load(path, shard=(1, 2))
    line = " (line 37 of the file)" if suffix == ".csv" else ""
    assert str(caught.value) == (f"data file {str(path)!r}: data column 'value_2' row 35: expected a non-negative "
                                 f"integer symbol, got -4{line}")


def test_missing_target_extra_columns_and_read_columns(tmp_path):
    from pyro_multihop.data import read_columns

    obs = small_obs()
    frame = obs.to_dataframe().drop(columns="target").assign(note=["a", "b"])
    frame.to_csv(tmp_path / "data.csv", index=False)
    assert read_columns(tmp_path / "data.csv")[-1] == "note"
    with pytest.raises(DataError, match="data column 'note': unknown column"):
        Observations.load(tmp_path / "data.csv", allow_missing_target=True)
    with pytest.raises(DataError, match="data must have a column 'target'"):
        Observations.load(tmp_path / "data.csv", extra_columns=["note"])
    loaded = Observations.load(tmp_path / "data.csv", extra_columns=["note"], allow_missing_target=True)
    assert torch.equal(loaded.keys, obs.keys) and loaded.target.tolist() == [0, 0]


def test_parquet_is_written_with_page_checksums(tmp_path):
    pq = pytest.importorskip("pyarrow.parquet")
    small_obs().save(tmp_path / "data.parquet")
    data = bytearray((tmp_path / "data.parquet").read_bytes())
    key_0 = pq.ParquetFile(tmp_path / "data.parquet").metadata.row_group(0).column(2)
    assert key_0.path_in_schema == "key_0" and key_0.has_dictionary_page
    data[key_0.data_page_offset - 8] ^= 1  # the low byte of the dictionary's last value, 3, of key_0
    (tmp_path / "data.parquet").write_bytes(bytes(data))
    unchecked = pq.read_table(tmp_path / "data.parquet", page_checksum_verification=False)
    assert unchecked.column("key_0").to_pylist() == [0, 2]  # a valid value: only the checksum tells
    with pytest.raises(DataError, match="the Parquet file is damaged or not Parquet"):
        Observations.load(tmp_path / "data.parquet")
