"""fit_svi's arguments (pyro_multihop.train.fit): empty data, wrong types, and a seeded run that is
reproducible and leaves the global random state alone."""

import pytest
import torch

from pyro_multihop import ChainedAttention, transitive_task
from pyro_multihop.train import fit_svi
from svi_test_heads import small_head


def test_empty_data_raises():
    empty = transitive_task(10, seed=0)[torch.zeros(0, dtype=torch.long)]
    assert len(empty) == 0
    with pytest.raises(ValueError, match="at least one observation"):
        fit_svi(small_head(), empty, progress=False)
    with pytest.raises(ValueError, match="val"):
        fit_svi(small_head(), transitive_task(10, seed=0), val=empty, progress=False)


def test_bad_types_raise():
    with pytest.raises(TypeError, match="Observations"):
        fit_svi(small_head(), [1, 2, 3], progress=False)
    with pytest.raises(TypeError, match="model"):
        fit_svi(object(), transitive_task(10, seed=0), progress=False)
    with pytest.raises(ValueError, match="num_symbols"):
        fit_svi(ChainedAttention(2, 5, 30), transitive_task(10, seed=0), progress=False)


def test_seeded_run_is_reproducible_and_leaves_global_rng_alone():
    obs = transitive_task(80, seed=0)
    state = torch.get_rng_state()
    heads = [small_head(seed=0) for _ in range(3)]
    for head, seed in zip(heads, (5, 5, 6)):
        fit_svi(head, obs, num_steps=15, batch_size=16, seed=seed, progress=False)
    assert torch.equal(torch.get_rng_state(), state)
    assert torch.equal(heads[0].key_tables, heads[1].key_tables)
    assert not torch.equal(heads[0].key_tables, heads[2].key_tables)  # other mini-batches
