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


def test_the_max_over_each_symbols_positions_is_the_scatter_max():
    """The symbol route's scatter-max (``index_reduce_`` over a flat index) against a loop over the positions."""
    g = torch.Generator().manual_seed(1)
    c, N, S = 6, 9, 4
    symbols = torch.randint(S, (c, N), generator=g)
    message = torch.rand(c, N, generator=g, dtype=torch.float64)
    message[0] = 0.0
    flat = (symbols + S * torch.arange(c).unsqueeze(-1)).flatten()
    expected = torch.zeros(c, S, dtype=torch.float64)
    for row in range(c):
        for i in range(N):
            expected[row, symbols[row, i]] = max(expected[row, symbols[row, i]], message[row, i])
    assert torch.equal(transitions._max_by_symbol(flat, message, S), expected)


def test_the_scatter_max_warns_nothing_in_a_fresh_process():
    """``index_reduce_`` is in beta and says so once per process; a user's run must not see it (checked in a fresh
    interpreter, where the warning has not been given yet, with warnings as errors)."""
    import subprocess
    import sys

    code = ("import torch\nfrom pyro_multihop.engine import transitions\n"
            "flat = torch.arange(4)\n"
            "print(transitions._max_by_symbol(flat, torch.ones(2, 2), 2).tolist())\n")
    result = subprocess.run([sys.executable, "-W", "error", "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[[1.0, 1.0], [1.0, 1.0]]"
