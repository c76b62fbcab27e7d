"""The max-product of the symbol route (pyro_multihop/engine/transitions.py) against its definition."""

import pytest
import torch

from pyro_multihop.engine import transitions


@pytest.mark.parametrize("rows", [3, 400], ids=["broadcast", "looped"])
def test_max_times_is_the_max_product(rows, monkeypatch):
    g = torch.Generator().manual_seed(0)
    message = torch.rand(rows, 7, generator=g, dtype=torch.float64)
    message[0, 2:] = 0.0  # zeros, as at absent symbols
    table = torch.rand(7, 5, generator=g, dtype=torch.float64)
    expected = torch.tensor([[max(float(message[c, v] * table[v, k]) for v in range(7)) for k in range(5)]
                             for c in range(rows)], dtype=torch.float64)
    monkeypatch.setattr(transitions, "MAX_TIMES_LOOP_ELEMENTS", 1000)  # 3 rows broadcast, 400 rows loop
    assert torch.equal(transitions.max_times(message, table), expected)
