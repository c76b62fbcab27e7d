"""The one recursion (pyro_multihop/engine/recursion.py): the messages a step threads, and the sum-product forward
and backward passes over a transition operator against explicit matrix products."""

import torch

from pyro_multihop.engine import PositionTransitions
from pyro_multihop.engine.recursion import backward_messages, forward_messages, recurse, underflow_floor


def test_recurse_threads_each_message_through_the_step_in_the_given_order():
    calls = []

    def step(message, hop):
        calls.append(hop)
        return message * 10 + hop, -hop

    messages, kept = recurse(torch.tensor([1.0]), [2, 0, 1], step)
    assert calls == [2, 0, 1]
    assert [float(m) for m in messages] == [1.0, 12.0, 120.0, 1201.0]
    assert kept == [-2, 0, -1]


def random_transitions(c=3, N=4, hops=3, seed=0):
    generator = torch.Generator().manual_seed(seed)
    matrices = torch.rand(hops - 1, c, N, N, generator=generator, dtype=torch.float64)
    matrices = matrices / matrices.sum(-1, keepdim=True)  # row-stochastic
    init = torch.rand(c, N, generator=generator, dtype=torch.float64)
    emission = torch.rand(c, N, generator=generator, dtype=torch.float64)
    ok = torch.ones(c, dtype=torch.bool)
    return PositionTransitions(list(matrices.unbind(0)), None, ok), matrices, init / init.sum(-1, keepdim=True), emission


def test_forward_messages_are_the_prior_marginals():
    transitions, matrices, init, _ = random_transitions()
    alphas = forward_messages(transitions, init, 3)
    expected = [init]
    for matrix in matrices:
        expected.append(torch.einsum("ci,cij->cj", expected[-1], matrix))
    assert len(alphas) == 3
    for got, want in zip(alphas, expected):
        assert torch.allclose(got, want, rtol=1e-14, atol=0)
        assert torch.allclose(got.sum(-1), torch.ones(3, dtype=torch.float64))


def test_backward_messages_are_rescaled_products_and_give_the_likelihood():
    """Each beta is ``P beta_next`` divided by its row maximum (the scale kept); at every hop, ``alpha . beta``
    times the scales divided out so far is the likelihood ``init P_1 P_2 emission``."""
    transitions, matrices, init, emission = random_transitions(seed=1)
    betas, scales = backward_messages(transitions, emission, 3)
    assert torch.equal(betas[-1], emission) and len(scales) == 2
    unscaled = [emission]
    for matrix in reversed(matrices):
        unscaled.insert(0, torch.einsum("cij,cj->ci", matrix, unscaled[0]))
    likelihood = (init * unscaled[0]).sum(-1)
    alphas = forward_messages(transitions, init, 3)
    for hop in range(2):
        assert torch.allclose(betas[hop].amax(-1), torch.ones(3, dtype=torch.float64))
        divided_out = torch.stack(scales[hop:]).prod(0)
        assert torch.allclose(betas[hop] * divided_out.unsqueeze(-1), unscaled[hop], rtol=1e-13, atol=0)
        assert torch.allclose((alphas[hop] * betas[hop]).sum(-1) * divided_out, likelihood, rtol=1e-13, atol=0)


def test_the_underflow_floor_is_the_smallest_normal_over_the_precision():
    for dtype in (torch.float32, torch.float64):
        info = torch.finfo(dtype)
        assert underflow_floor(dtype) == info.tiny / info.eps
        assert underflow_floor(dtype) * info.eps == info.tiny  # a sum there still has eps precision above tiny
