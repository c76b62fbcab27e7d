"""A checkpoint applied to data files without the command line: evaluate, predict, inspect, the path table."""

import json

import pandas as pd
import pytest
import torch

from pyro_multihop import ChainedAttention, transitive_task
from pyro_multihop.checkpoint import save_checkpoint
from pyro_multihop.experiments.apply_checkpoint import (
    evaluate_file,
    inspect_checkpoint,
    predict_file,
    write_path_file,
)
from pyro_multihop.experiments.command_files import CommandError


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    folder = tmp_path_factory.mktemp("apply")
    head = ChainedAttention(2, 30, 30, sigma2=0.1, seed=0)
    save_checkpoint(folder / "head.pt", head, vocabulary=[f"w{s}" for s in range(30)])
    obs = transitive_task(12, seed=3)
    obs.save(folder / "test.csv")
    return folder, head, obs


def test_evaluate_file_is_the_head_evaluated_on_the_file(trained):
    folder, head, obs = trained
    result = evaluate_file(folder / "head.pt", folder / "test.csv")
    expected = head.evaluate(obs)
    assert result["model"] == "ChainedAttention" and result["n"] == 12
    assert result["log_likelihood"] == pytest.approx(expected["log_likelihood"], rel=1e-6)
    assert result["checkpoint"] == str(folder / "head.pt") and json.loads(json.dumps(result)) == result


def test_predict_file_writes_probabilities_and_map_paths(trained, tmp_path):
    folder, head, obs = trained
    assert predict_file(folder / "head.pt", folder / "test.csv", tmp_path / "p.csv") == 12
    frame = pd.read_csv(tmp_path / "p.csv")
    probs = head.predict_proba(obs).detach()
    assert torch.allclose(torch.tensor(frame[[f"prob_{t}" for t in range(30)]].to_numpy()), probs.double(), atol=1e-6)
    assert frame[["map_hop_1", "map_hop_2"]].to_numpy().tolist() == head.map_paths(obs).tolist()
    with pytest.raises(CommandError, match="must end in .csv"):
        predict_file(folder / "head.pt", folder / "test.csv", tmp_path / "p.json")


def test_inspect_checkpoint_draws_the_parameters_and_checks_rows(trained, tmp_path):
    folder, _, _ = trained
    written = inspect_checkpoint(folder / "head.pt", tmp_path / "f", folder / "test.csv", rows=[0, 11])
    assert [p.name for p in written] == ["key_tables.png", "emission.png", "hop_marginals.png"]
    assert all(p.is_file() for p in written)
    with pytest.raises(CommandError, match="--rows must be below the 12 observations"):
        inspect_checkpoint(folder / "head.pt", tmp_path / "g", folder / "test.csv", rows=[12])
    assert not (tmp_path / "g").exists()


def test_write_path_file_names_the_attended_words(trained, tmp_path):
    folder, _, _ = trained
    assert write_path_file(folder / "head.pt", folder / "test.csv", tmp_path / "paths.jsonl", k=2) == 12
    record = json.loads((tmp_path / "paths.jsonl").read_text().splitlines()[0])
    assert record["query"].startswith("w") and all(a.startswith("w") for a in record["paths"][0]["attended"])
    with pytest.raises(CommandError, match="must end in .csv or .jsonl"):
        write_path_file(folder / "head.pt", folder / "test.csv", tmp_path / "paths.txt")
