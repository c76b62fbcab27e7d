"""FactObservations: validation, slicing, files and sharded reads; the deprecated pyro_multihop.fact_data."""

import pytest
import torch

from pyro_multihop import FactObservations, fact_chain_task


def _fields(n=2, N=3, F=2, M=2):
    g = torch.Generator().manual_seed(0)
    return {
        "facts": torch.randint(5, (n, N, F), generator=g),
        "question": torch.randint(5, (n, M), generator=g),
        "target": torch.randint(5, (n,), generator=g),
    }


def test_sizes_and_padding_stored_as_zero():
    fields = _fields()
    fact_mask = torch.tensor([[True, False, True], [True, True, True]])
    field_mask = fact_mask.unsqueeze(-1).expand(2, 3, 2).clone()
    field_mask[1, 2, 1] = False
    question_mask = torch.tensor([[True, False], [True, True]])
    fields["facts"][0, 1] = -1
    fields["facts"][1, 2, 1] = -1
    fields["question"][0, 1] = -1
    obs = FactObservations(**fields, fact_mask=fact_mask, field_mask=field_mask, question_mask=question_mask,
                           supporting=torch.tensor([[2, -1], [0, 1]]))
    assert (len(obs), obs.num_facts, obs.context_len, obs.num_fields, obs.question_len) == (2, 3, 3, 2, 2)
    assert int(obs.facts[0, 1].abs().sum()) == 0 and int(obs.facts[1, 2, 1]) == 0 and int(obs.question[0, 1]) == 0
    assert obs.mask is obs.fact_mask and torch.equal(obs.full_mask(), fact_mask)
    assert obs.num_symbols == 1 + max(int(obs.facts.max()), int(obs.question.max()), int(obs.target.max()))
    assert not bool(obs.real_fields()[0, 1].any()) and not bool(obs.real_fields()[1, 2, 1])
    obs.check_sizes(obs.num_symbols)
    with pytest.raises(ValueError, match=f"must be < num_symbols = {obs.num_symbols - 1}"):
        obs.check_sizes(obs.num_symbols - 1)


def test_rows_devices_and_equality():
    obs = fact_chain_task(10, seed=0)
    assert obs[2:5] == FactObservations(obs.facts[2:5], obs.question[2:5], obs.target[2:5], supporting=obs.supporting[2:5])
    assert len(obs[torch.tensor([0, 3])]) == 2 and len(obs[obs.target > 0]) == int((obs.target > 0).sum())
    assert len(obs[0]) == 1 and obs.to("cpu") == obs and obs.device == torch.device("cpu")
    assert not obs[:3] == obs[3:6]
    swapped = obs.with_target(torch.zeros(10, dtype=torch.long))
    assert int(swapped.target.sum()) == 0 and swapped.facts is obs.facts


@pytest.mark.parametrize(
    "change, error, message",
    [
        ({"facts": torch.zeros(2, 3, dtype=torch.long)}, ValueError, r"facts must have shape \(n, N, F\)"),
        ({"facts": torch.zeros(2, 3, 2)}, TypeError, "facts must hold integer symbols"),
        ({"facts": torch.zeros(2, 0, 2, dtype=torch.long)}, ValueError, "at least one fact and one field"),
        ({"question": torch.zeros(3, 2, dtype=torch.long)}, ValueError, r"question must have shape \(2, M\)"),
        ({"question": torch.zeros(2, 0, dtype=torch.long)}, ValueError, "at least one token"),
        ({"target": torch.zeros(3, dtype=torch.long)}, ValueError, r"target must have shape \(2,\)"),
        ({"target": torch.tensor([0, -2])}, ValueError, "target must be non-negative symbols, got -2"),
        ({"fact_mask": torch.ones(2, 3)}, TypeError, "fact_mask must be a bool tensor"),
        ({"fact_mask": torch.ones(2, 4, dtype=torch.bool)}, ValueError, r"fact_mask must have shape \(2, 3\)"),
        ({"fact_mask": torch.tensor([[True] * 3, [False] * 3])}, ValueError, "row 1 is all padding"),
        ({"question_mask": torch.tensor([[False] * 2, [True] * 2])}, ValueError, "question_mask must keep.*row 0"),
        ({"field_mask": torch.ones(2, 3, 2, dtype=torch.bool), "fact_mask": torch.tensor([[True, False, True]] * 2)},
         ValueError, "field_mask marks field 0 of padded fact 1 of row 0 real"),
        ({"field_mask": torch.zeros(2, 3, 2, dtype=torch.bool)}, ValueError, "fact 0 of row 0 has none"),
        ({"supporting": torch.tensor([[0, 3], [1, -1]])}, ValueError, "supporting must name real facts.*row 0 has 3"),
        ({"supporting": torch.tensor([[0, 1], [1, -1]]), "fact_mask": torch.tensor([[True, False, True]] * 2)},
         ValueError, "row 0 has 1"),
        ({"supporting": torch.tensor([0, 1])}, ValueError, r"supporting must have shape \(2, k\)"),
    ],
    ids=lambda x: x if isinstance(x, str) else None,
)
def test_bad_input(change, error, message):
    fields = _fields()
    fields.update(change)
    with pytest.raises(error, match=message):
        FactObservations(**fields)


def test_negative_symbols_are_named_unless_padding():
    fields = _fields()
    fields["facts"][1, 2, 0] = -3
    with pytest.raises(ValueError, match=r"facts must be non-negative symbols, got -3 at index \(1, 2, 0\)"):
        FactObservations(**fields)
    fact_mask = torch.tensor([[True] * 3, [True, True, False]])
    FactObservations(**fields, fact_mask=fact_mask)  # a padded fact may hold anything


def test_files_and_shards(tmp_path):
    obs = fact_chain_task(11, seed=3)
    path = tmp_path / "facts.pt"
    obs.save(path)
    assert FactObservations.load(path) == obs
    shards = [FactObservations.load(path, shard=(rank, 3)) for rank in range(3)]
    assert [len(s) for s in shards] == [3, 4, 4]
    assert shards[1] == obs[3:7]
    assert len(FactObservations.load(path, shard=(0, 20))) == 0  # more ranks than rows: an empty shard
    for shard in [(3, 3), (0, 0), "0/2", (0.0, 2)]:
        with pytest.raises(ValueError, match="shard must be a pair"):
            FactObservations.load(path, shard=shard)
    with pytest.raises(ValueError, match="must end in .pt"):
        obs.save(tmp_path / "facts.csv")
    with pytest.raises(ValueError, match="does not exist"):
        FactObservations.load(tmp_path / "missing.pt")
    torch.save({"format": "other"}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="not a fact-observations file"):
        FactObservations.load(tmp_path / "other.pt")
    (tmp_path / "junk.pt").write_text("not a file torch wrote")
    with pytest.raises(ValueError, match="not a readable fact-observations file"):
        FactObservations.load(tmp_path / "junk.pt")


def test_masked_files_round_trip(tmp_path):
    fields = _fields()
    fact_mask = torch.tensor([[True, False, True], [True, True, True]])
    obs = FactObservations(**fields, fact_mask=fact_mask, field_mask=fact_mask.unsqueeze(-1).expand(2, 3, 2),
                           question_mask=torch.tensor([[True, False], [True, True]]))
    obs.save(tmp_path / "masked.pt")
    assert FactObservations.load(tmp_path / "masked.pt") == obs


@pytest.mark.parametrize("name", ["FactObservations", "FILE_FORMAT", "FactChainVocabulary", "fact_chain_vocabulary",
                                  "fact_chain_task"])
def test_the_old_module_path_warns_and_gives_the_moved_name(name):
    import pyro_multihop.data
    import pyro_multihop.fact_data

    with pytest.warns(DeprecationWarning, match=f"import {name} from pyro_multihop.data"):
        moved = getattr(pyro_multihop.fact_data, name)
    assert moved is getattr(pyro_multihop.data, name)
    with pytest.raises(AttributeError, match="no attribute 'fact_chain_truth'"):
        pyro_multihop.fact_data.fact_chain_truth  # noqa: B018 - never in fact_data
