"""Observations: validation, indexing, devices and sizes; the re-exports of pyro_multihop.data."""

import pytest
import torch

from observation_samples import small_obs, task_with_padding
from pyro_multihop import Observations


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
    collapsed = CollapsedHopChain(head.hop_factors(), obs)
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


def test_pyro_multihop_data_exports_every_name_of_its_modules():
    """``pyro_multihop.data`` re-exports the names of its modules (those of the former data.py and
    fact_data.py), and the top-level names are the same objects."""
    import pyro_multihop
    import pyro_multihop.data as data
    from pyro_multihop.data import fact_observations, observations, readers, simulators

    former = {"Observations", "DataError", "SYMBOL_LIMIT", "read_columns", "chain_task", "transitive_task",
              "induction_task", "FactObservations", "FactChainVocabulary", "fact_chain_vocabulary",
              "fact_chain_task", "FILE_FORMAT"}
    assert former <= set(data.__all__)
    for module in (observations, readers, simulators, fact_observations):
        for name in module.__all__:
            if name in former:
                assert getattr(data, name) is getattr(module, name), name
    for name in ("Observations", "DataError", "chain_task", "transitive_task", "induction_task", "FactObservations",
                 "fact_chain_task", "fact_chain_vocabulary"):
        assert getattr(pyro_multihop, name) is getattr(data, name), name
