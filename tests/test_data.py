"""Observations: validation, indexing, pandas and file round trips, and the task simulators."""

import pandas as pd
import pytest
import torch

from pyro_multihop import Observations, chain_task, induction_task, transitive_task
from pyro_multihop.data import DataError


def small_obs(masked=False):
    mask = torch.tensor([[True, True, False], [True, False, True]]) if masked else None
    return Observations(
        keys=torch.tensor([[0, 1, 2], [3, 4, 5]]),
        values=torch.tensor([[6, 7, 8], [9, 10, 11]]),
        query=torch.tensor([1, 3]),
        target=torch.tensor([2, 0]),
        mask=mask,
    )


def test_fields_shapes_and_len():
    obs = small_obs()
    assert len(obs) == 2 and obs.context_len == 3
    assert obs.keys.dtype == torch.long and obs.num_symbols == 12 and obs.num_targets == 3
    assert "n=2" in repr(obs)


def test_lists_and_int32_are_accepted_as_long():
    obs = Observations([[1, 2]], torch.tensor([[3, 4]], dtype=torch.int32), [0], [1])
    assert obs.values.dtype == torch.long


@pytest.mark.parametrize("field", ["keys", "values", "query", "target"])
def test_float_symbols_are_a_type_error(field):
    fields = {"keys": [[1, 2]], "values": [[3, 4]], "query": [0], "target": [1]}
    fields[field] = torch.tensor(fields[field], dtype=torch.float32)
    with pytest.raises(TypeError, match=f"{field} must hold integer symbols, got dtype torch.float32"):
        Observations(**fields)


@pytest.mark.parametrize("field", ["keys", "values", "query", "target"])
def test_negative_symbols_are_rejected(field):
    fields = {"keys": [[1, 2]], "values": [[3, 4]], "query": [0], "target": [1]}
    fields[field] = [[1, -5]] if field in ("keys", "values") else [-5]
    with pytest.raises(ValueError, match=f"{field} must be non-negative symbols, got -5"):
        Observations(**fields)


def test_shape_mismatches_name_the_field():
    with pytest.raises(ValueError, match=r"keys must have shape \(n, N\)"):
        Observations([1, 2], [1, 2], [0], [0])
    with pytest.raises(ValueError, match="values must have the shape of keys"):
        Observations([[1, 2]], [[1, 2, 3]], [0], [0])
    with pytest.raises(ValueError, match=r"query must have shape \(1,\)"):
        Observations([[1, 2]], [[1, 2]], [0, 1], [0])
    with pytest.raises(ValueError, match=r"target must have shape \(1,\)"):
        Observations([[1, 2]], [[1, 2]], [0], [[0]])
    with pytest.raises(ValueError, match="N >= 1"):
        Observations(torch.zeros(2, 0, dtype=torch.long), torch.zeros(2, 0, dtype=torch.long), [0, 0], [0, 0])


def test_mask_validation():
    with pytest.raises(TypeError, match="mask must be a bool tensor"):
        Observations([[1, 2]], [[1, 2]], [0], [0], mask=[[1, 0]])
    with pytest.raises(ValueError, match="mask must have the shape of keys"):
        Observations([[1, 2]], [[1, 2]], [0], [0], mask=torch.tensor([[True]]))
    with pytest.raises(ValueError, match="row 1 is all padding"):
        Observations([[1, 2], [1, 2]], [[1, 2], [1, 2]], [0, 0], [0, 0], mask=torch.tensor([[True, False], [False, False]]))


def test_padding_symbols_may_be_negative_and_are_stored_as_zero():
    obs = Observations([[1, -1]], [[2, -1]], [0], [0], mask=torch.tensor([[True, False]]))
    assert obs.keys.tolist() == [[1, 0]] and obs.values.tolist() == [[2, 0]]


def test_check_sizes_names_field_and_value():
    obs = small_obs()
    obs.check_sizes(12, 3)
    with pytest.raises(ValueError, match=r"values must be < num_symbols = 11, got 11 at index \(1, 2\)"):
        obs.check_sizes(11, 3)
    with pytest.raises(ValueError, match="target must be < num_targets = 2, got 2 at index 0"):
        obs.check_sizes(12, 2)


@pytest.mark.parametrize("masked", [False, True])
def test_indexing_and_slicing_return_observations(masked):
    obs = small_obs(masked)
    for part in (obs[:1], obs[torch.tensor([1])], obs[torch.tensor([False, True])], obs[1], obs[[1]]):
        assert isinstance(part, Observations) and len(part) == 1
    assert obs[1] == obs[torch.tensor([1])]
    assert obs[-1] == obs[1:]
    assert obs[torch.tensor([1, 0])].query.tolist() == [3, 1]
    assert len(obs[0:0]) == 0
    assert (obs[1].mask is None) == (not masked)


def test_to_device_keeps_data():
    obs = small_obs(True)
    assert obs.to("cpu") == obs and obs.to(torch.device("cpu")).device.type == "cpu"


@pytest.mark.parametrize("masked", [False, True])
def test_dataframe_round_trip_is_exact(masked):
    obs = small_obs(masked)
    frame = obs.to_dataframe()
    assert list(frame.columns[:4]) == ["query", "target", "key_0", "key_1"]
    assert any(c.startswith("mask_") for c in frame.columns) == masked
    assert Observations.from_dataframe(frame) == obs


def task_with_padding(masked: bool) -> Observations:
    """50 rows of the transitive task, with about 30% of the positions padding if ``masked``."""
    obs = transitive_task(50, seed=3)
    if not masked:
        return obs
    mask = torch.rand(50, obs.context_len, generator=torch.Generator().manual_seed(0)) > 0.3
    mask[:, 0] = True
    return Observations(obs.keys, obs.values, obs.query, obs.target, mask)


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


def test_transitive_task_structure():
    obs = transitive_task(300, num_symbols=30, pairs=5, seed=0)
    assert obs.keys.shape == (300, 10) and obs.num_symbols <= 30
    a, b = obs.keys[:, :5], obs.values[:, :5]
    b_keys, c = obs.keys[:, 5:], obs.values[:, 5:]
    for row in range(300):
        i = a[row].tolist().index(int(obs.query[row]))
        j = b_keys[row].tolist().index(int(b[row, i]))
        assert int(c[row, j]) == int(obs.target[row])
        assert sorted(b_keys[row].tolist()) == sorted(b[row].tolist())
        assert len(set(a[row].tolist())) == 5


def test_simulators_are_seeded():
    assert transitive_task(20, seed=4) == transitive_task(20, seed=4)
    assert not transitive_task(20, seed=4) == transitive_task(20, seed=5)
    assert induction_task(20, seed=1) == induction_task(20, seed=1)


def test_chain_task_follows_the_chain_for_every_hop_count():
    for hops in (1, 3, 4):
        obs = chain_task(50, hops=hops, num_symbols=40, pairs=3, seed=hops)
        assert obs.context_len == 3 * hops
        for row in range(50):
            symbol = int(obs.query[row])
            for hop in range(hops):
                block = slice(3 * hop, 3 * hop + 3)
                position = obs.keys[row, block].tolist().index(symbol)
                symbol = int(obs.values[row, block][position])
            assert symbol == int(obs.target[row])


def test_induction_task_copies_the_successor():
    obs = induction_task(100, num_symbols=20, seq_len=6, seed=2)
    assert obs.keys.shape == (100, 6)
    assert torch.equal(obs.keys[:, 1:], obs.values[:, :-1])
    position = (obs.keys == obs.query[:, None]).long().argmax(-1)
    assert torch.equal(obs.values.gather(1, position[:, None]).squeeze(1), obs.target)


@pytest.mark.parametrize(
    "call, message",
    [
        (lambda: transitive_task(0), "n must be a positive integer"),
        (lambda: transitive_task(10, num_symbols=3, pairs=5), "num_symbols must be an integer >= pairs"),
        (lambda: chain_task(10, hops=0), "hops must be a positive integer"),
        (lambda: induction_task(10, num_symbols=5, seq_len=8), "num_symbols must be an integer >= pairs"),
    ],
)
def test_simulator_arguments_are_checked(call, message):
    with pytest.raises(ValueError, match=message):
        call()


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


def test_slices_copies_chunks_and_the_plate_do_not_validate_again(monkeypatch):
    """Observations validate once: slices, ``to``, the engine's chunks, the collapsed distribution and the
    plate go through ``Observations.trusted`` (no checks, no host synchronisations)."""
    import pyro
    from pyro import poutine

    from pyro_multihop import ChainedAttention
    from pyro_multihop.distributions import CollapsedHopChain

    obs = task_with_padding(masked=True)
    head = ChainedAttention(2, 30, 30, sigma2=0.1, seed=0)
    expected = head.log_likelihood(obs)

    def refuse(self, *args, **kwargs):
        raise AssertionError("validated again")

    monkeypatch.setattr(Observations, "__init__", refuse)
    assert obs[3:7].keys.shape == (4, obs.context_len) and obs[torch.tensor([1, 0])].query.tolist() == obs.query[[1, 0]].tolist()
    assert obs.to("cpu").mask is not None and len(obs[2]) == 1
    assert torch.allclose(head.log_likelihood(obs, budget=1 << 12), expected)  # many chunks of obs[rows]
    collapsed = CollapsedHopChain(head.hop_gates(), obs)
    assert torch.allclose(collapsed.log_prob(obs.target), expected)
    shifted = (obs.target + 1) % 30
    assert collapsed.log_prob(shifted).shape == (len(obs),)
    with pyro.plate_stack("check", ()):
        trace = poutine.trace(head.collapsed_model).get_trace(obs, subsample_size=7)
    assert trace.nodes["target"]["value"].shape == (7,)


def test_trusted_takes_tensors_as_given():
    obs = small_obs(masked=True)
    again = Observations.trusted(obs.keys, obs.values, obs.query, obs.target, obs.mask)
    assert again == obs and again.keys is obs.keys


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
