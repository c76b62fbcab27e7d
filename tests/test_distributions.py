"""TableCategorical and GateCategorical against the plain Categorical they stand for."""

import pyro.distributions as dist
import pytest
import torch

from pyro_multihop.distributions import GateCategorical, TableCategorical


def table_and_index():
    generator = torch.Generator().manual_seed(0)
    log_table = torch.randn(5, 4, generator=generator, dtype=torch.float64).log_softmax(-1)
    index = torch.randint(5, (3, 6), generator=generator)
    return log_table, index


def test_log_prob_equals_categorical_of_the_table_rows():
    log_table, index = table_and_index()
    table = TableCategorical(log_table, index)
    plain = dist.Categorical(logits=log_table[index])
    value = torch.randint(4, (6,), generator=torch.Generator().manual_seed(1))
    assert table.batch_shape == plain.batch_shape == (3, 6)
    assert torch.allclose(table.log_prob(value), plain.log_prob(value), atol=1e-15)
    support = table.enumerate_support(expand=False)
    assert support.shape == (4, 1, 1)
    assert torch.allclose(table.log_prob(support), plain.log_prob(plain.enumerate_support(expand=False)), atol=1e-15)
    assert table.enumerate_support().shape == (4, 3, 6)


def test_expand_and_sample():
    log_table, index = table_and_index()
    expanded = TableCategorical(log_table, index[:1]).expand((3, 6))
    assert expanded.batch_shape == (3, 6)
    torch.manual_seed(0)
    draws = TableCategorical(log_table, torch.zeros(20000, dtype=torch.long)).sample()
    frequencies = torch.bincount(draws, minlength=4).double() / 20000
    assert torch.allclose(frequencies, log_table[0].exp(), atol=0.015)


def test_support_validation_rejects_out_of_range_values():
    log_table, index = table_and_index()
    table = TableCategorical(log_table, index, validate_args=True)
    try:
        table.log_prob(torch.full((6,), 4))
    except ValueError as error:
        assert "support" in str(error) or "integer_interval" in str(error)
    else:
        raise AssertionError("a value outside the support was accepted")


# -- GateCategorical ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("length", [5, 20], ids=lambda n: f"N={n}")
def test_gate_categorical_equals_categorical_for_values_and_enumerated_support(length):
    generator = torch.Generator().manual_seed(length)
    logits = 3 * torch.randn(4, 6, length, generator=generator, dtype=torch.float64)
    gate, plain = GateCategorical(logits), dist.Categorical(logits=logits)
    assert gate.batch_shape == plain.batch_shape == (4, 6)
    assert torch.allclose(gate.logits, plain.logits, atol=1e-13)
    value = torch.randint(length, (4, 6), generator=generator)
    assert torch.allclose(gate.log_prob(value), plain.log_prob(value), atol=1e-13)
    # Pyro's fast path for an enumerated support (a transposed view) gives the same numbers.
    support = gate.enumerate_support(expand=False)
    assert torch.allclose(gate.log_prob(support), plain.log_prob(plain.enumerate_support(expand=False)), atol=1e-13)
    expanded = GateCategorical(logits[:1]).expand((4, 6))
    assert expanded.batch_shape == (4, 6) and isinstance(expanded, GateCategorical)
    assert torch.allclose(expanded.log_prob(value), dist.Categorical(logits=logits[:1]).expand((4, 6)).log_prob(value),
                          atol=1e-13)
