"""The gate primitives against the plain torch operations they replace."""

import math
import pytest
import torch

from pyro_multihop.gate_ops import SHORT_ROW, exp, flat_gather, log_normalize, logsumexp, table_gather
from pyro_multihop.engine.log_space import MASKED_LOGIT


@pytest.mark.parametrize("length", [1, 3, SHORT_ROW - 1, SHORT_ROW, 40], ids=lambda n: f"N={n}")
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_log_normalize_equals_log_softmax_and_its_gradient(length, dtype):
    generator = torch.Generator().manual_seed(length)
    logits = (10 * torch.randn(4, 7, length, generator=generator)).to(dtype)
    logits[0, 0, 0] = MASKED_LOGIT  # padding: probability 0, no NaN
    logits.requires_grad_(True)
    weights = torch.randn(4, 7, length, generator=generator).to(dtype)
    actual = log_normalize(logits)
    expected = logits.log_softmax(-1)
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    assert torch.allclose(actual, expected, atol=tolerance, rtol=tolerance)
    (actual_grad,) = torch.autograd.grad((actual * weights).sum(), logits)
    (expected_grad,) = torch.autograd.grad((expected * weights).sum(), logits)
    assert torch.isfinite(actual_grad).all()
    assert torch.allclose(actual_grad, expected_grad, atol=tolerance, rtol=tolerance)


def test_table_gather_equals_advanced_indexing_with_broadcast_and_repeats():
    generator = torch.Generator().manual_seed(0)
    table = torch.randn(5, 7, generator=generator, dtype=torch.float64, requires_grad=True)
    rows = torch.randint(5, (6, 4), generator=generator)  # (n, N): repeated indices accumulate
    cols = torch.randint(7, (3, 6, 1), generator=generator)  # (E, n, 1): broadcasts against rows
    weights = torch.randn(3, 6, 4, generator=generator, dtype=torch.float64)
    actual = table_gather(table, rows, cols)
    expected = table[rows, cols]
    assert actual.shape == (3, 6, 4)
    assert torch.equal(actual, expected)
    (actual_grad,) = torch.autograd.grad((actual * weights).sum(), table)
    (expected_grad,) = torch.autograd.grad((expected * weights).sum(), table)
    assert torch.allclose(actual_grad, expected_grad, atol=1e-14)
    assert (expected_grad != 0).sum() > 5  # the check covers many cells, not an all-zero gradient


def test_table_gather_passes_gradcheck():
    generator = torch.Generator().manual_seed(1)
    table = torch.randn(3, 4, generator=generator, dtype=torch.float64, requires_grad=True)
    rows = torch.randint(3, (2, 5), generator=generator)
    cols = torch.randint(4, (2, 1), generator=generator)
    assert torch.autograd.gradcheck(lambda t: table_gather(t, rows, cols), (table,))


def test_table_gather_without_gradient_is_a_plain_gather():
    table = torch.arange(12.0).reshape(3, 4)
    rows, cols = torch.tensor([[2, 0]]), torch.tensor([[3], [1]])
    assert torch.equal(table_gather(table, rows, cols), table[rows, cols])
    with torch.no_grad():
        assert torch.equal(table_gather(table.clone().requires_grad_(True), rows, cols), table[rows, cols])


@pytest.mark.parametrize("index_dtype", [torch.int64, torch.int32], ids=str)
def test_flat_gather_equals_flat_indexing_and_its_gradient(index_dtype):
    """Both index dtypes (int32 goes through index_select / index_add_): values and the accumulated gradient
    of repeated indices against plain indexing of the flattened table."""
    generator = torch.Generator().manual_seed(2)
    table = torch.randn(3, 4, 5, generator=generator, dtype=torch.float64, requires_grad=True)
    index = torch.randint(60, (6, 2, 7), generator=generator)
    weights = torch.randn(6, 2, 7, generator=generator, dtype=torch.float64)
    actual = flat_gather(table, index.to(index_dtype))
    expected = table.reshape(-1)[index]
    assert actual.shape == index.shape and torch.equal(actual, expected)
    (actual_grad,) = torch.autograd.grad((actual * weights).sum(), table)
    (expected_grad,) = torch.autograd.grad((expected * weights).sum(), table)
    assert torch.allclose(actual_grad, expected_grad, atol=1e-14)
    assert (expected_grad != 0).sum() > 20
    with torch.no_grad():
        assert torch.equal(flat_gather(table, index.to(index_dtype)), expected)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
def test_exp_through_exp2_is_exp_within_its_bound_and_zero_below_range(dtype):
    """``gate_ops.exp`` against ``math.exp`` in float64 (the exact value of each input): relative error at most
    ``(|x| + 2) eps``, so absolute error below ``eps`` for ``x <= 0``; underflow, padding and ``-inf`` give 0, and
    the gradient is the value."""
    eps = torch.finfo(dtype).eps
    x = torch.cat([torch.linspace(-80, 0, 2001, dtype=torch.float64), torch.tensor([-1e3, MASKED_LOGIT, -math.inf],
                                                                                 dtype=torch.float64)]).to(dtype)
    x.requires_grad_(True)
    got = exp(x)
    want = torch.tensor([math.exp(v) if v > -745 else 0.0 for v in x.detach().double().tolist()], dtype=torch.float64)
    finite = want > 0
    relative = (got.detach().double()[finite] - want[finite]).abs() / want[finite]
    assert (relative <= (x.detach().double()[finite].abs() + 2) * eps).all()
    assert (got.detach()[-3:] == 0).all()
    (grad,) = torch.autograd.grad(got.sum(), x)
    assert torch.allclose(grad, got.detach(), rtol=4 * eps, atol=0)
    out = torch.empty_like(x.detach())
    assert exp(x.detach(), out=out) is out and torch.equal(out, got.detach())


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64], ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
def test_logsumexp_equals_torch_logsumexp_and_its_gradient(dtype, keepdim):
    generator = torch.Generator().manual_seed(3)
    x = (300 * torch.randn(5, 6, 7, generator=generator)).to(dtype)  # sharp: most terms far below the maximum
    x[0, :3, 2] = MASKED_LOGIT  # padding beside real entries
    x[1, 0, :] = -math.inf  # a slice of -inf along the last dim
    x[2, :, 3] = -math.inf  # one along the middle dim
    tolerance = 1e-12 if dtype == torch.float64 else 1e-5
    for dim in (-1, -2):
        leaf = x.clone().requires_grad_(True)
        got, want = logsumexp(leaf, dim, keepdim), torch.logsumexp(leaf, dim, keepdim)
        assert got.shape == want.shape
        assert torch.equal(torch.isinf(got), torch.isinf(want))
        finite = torch.isfinite(want)
        assert torch.allclose(got[finite], want[finite], rtol=tolerance, atol=0)
        weights = torch.randn(want.shape, generator=generator).to(dtype)
        (got_grad,) = torch.autograd.grad((torch.where(finite, got, 0) * weights).sum(), leaf)
        leaf_again = x.clone().requires_grad_(True)
        want_again = torch.logsumexp(leaf_again, dim, keepdim)
        (want_grad,) = torch.autograd.grad((torch.where(finite, want_again, 0) * weights).sum(), leaf_again)
        assert torch.allclose(got_grad, want_grad, rtol=tolerance, atol=tolerance, equal_nan=True)
