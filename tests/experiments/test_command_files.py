"""The commands' files: one-line errors for devices, data files and data beyond a checkpoint's vocabulary; words
of a checkpoint; JSON written."""

import json
from pathlib import Path

import pytest
import torch

from pyro_multihop import ChainedAttention, transitive_task
from pyro_multihop.experiments.command_files import (
    CommandError,
    check_fits,
    checkpoint_words,
    load_context,
    load_data,
    torch_device,
    write_json,
)


def test_devices():
    assert torch_device("cpu") == torch.device("cpu")
    with pytest.raises(CommandError, match="--device must be a torch device"):
        torch_device("warp-drive")
    if not torch.cuda.is_available():
        with pytest.raises(CommandError, match="CUDA is not available"):
            torch_device("cuda")


def test_data_files(tmp_path):
    with pytest.raises(CommandError, match="does not exist"):
        load_data(tmp_path / "none.csv")
    with pytest.raises(CommandError, match="does not exist"):
        load_context(tmp_path / "none.csv")
    obs = transitive_task(6, seed=0)
    obs.save(tmp_path / "t.csv")
    assert len(load_data(tmp_path / "t.csv")) == 6 and load_context(tmp_path / "t.csv")[1] is True
    assert len(load_data(tmp_path / "t.csv", shard=(1, 2))) == 3


def test_data_beyond_the_vocabulary_names_the_symbols_option():
    head = ChainedAttention(2, 10, 10)
    check_fits(head, transitive_task(4, num_symbols=10, pairs=2, seed=0), Path("fits.csv"))
    with pytest.raises(CommandError, match="'big.csv' does not fit.*train --symbols S"):
        check_fits(head, transitive_task(4, num_symbols=30, seed=0), Path("big.csv"))


def test_checkpoint_words_and_json(tmp_path):
    assert checkpoint_words({"extra": {}, "vocabulary": ["a", "b"]}) == {"symbols": ["a", "b"], "targets": None}
    babi = {"symbols": ["x"], "targets": ["y"]}
    assert checkpoint_words({"extra": {"vocabulary": babi}, "vocabulary": None}) == babi
    assert checkpoint_words({"extra": {}}) is None
    write_json(tmp_path / "a" / "b.json", {"path": tmp_path, "pair": (1, 2)})
    assert json.loads((tmp_path / "a" / "b.json").read_text()) == {"path": str(tmp_path), "pair": [1, 2]}
