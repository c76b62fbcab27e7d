"""The memory budget (pyro_multihop/engine/budget.py): chunking never changes an answer, no intermediate grows with
the number of rows beyond the budget, and a bad budget is refused by name."""

import math

import oracle
import pytest
import torch
from factories import HEADS, ROUTES, random_head, random_obs
from torch.overrides import TorchFunctionMode

from pyro_multihop import engine


@HEADS
@ROUTES
def test_chunking_does_not_change_the_answers(kind, ratio, monkeypatch):
    monkeypatch.setattr(engine.routes, "SYMBOL_ROUTE_RATIO", ratio)
    head, obs = random_head(kind, 3, seed=40), random_obs(n=50, seed=41, masked=True)
    tiny = 1  # byte: one row per chunk
    assert torch.allclose(head.log_likelihood(obs, budget=tiny), head.log_likelihood(obs), rtol=1e-13)
    assert torch.allclose(head.hop_marginals(obs, budget=tiny), head.hop_marginals(obs), atol=1e-14)
    assert torch.allclose(head.predict_proba(obs, budget=tiny), head.predict_proba(obs), atol=1e-14)
    chunked, whole = head.map_paths(obs, budget=tiny), head.map_paths(obs)
    # Positions with the same (key, value) symbols make exactly tied paths, and a chunk of one row takes another
    # route than the whole batch (gathered logits against exponentiated tables), so a tie may break the other
    # way: every differing row must hold two paths of the same, largest, joint probability.
    differing = (chunked != whole).any(-1).nonzero().flatten().tolist()
    if differing:
        joints = oracle.brute_force(head, obs)["joints"]
        for row in differing:
            best = max(joints[row].values())
            for path in (chunked[row], whole[row]):
                assert joints[row][tuple(path.tolist())] == pytest.approx(best, rel=1e-12)
    with engine.memory_budget(tiny):
        assert torch.allclose(head.value_marginals(obs), head.value_marginals(obs, budget=2**30), atol=1e-14)


class _LargestTensor(TorchFunctionMode):
    """Records the sizes of the tensors torch functions return while active."""

    def __init__(self):
        super().__init__()
        self.sizes = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor):
                self.sizes.append(tensor.numel())
        return out


@pytest.mark.parametrize("query", ["log_likelihood", "hop_marginals", "predict_proba", "map_paths"])
@ROUTES
@pytest.mark.parametrize("sigma2, scale", [(0.6, 1.0), (1e-3, 2.0)], ids=["sigma2=0.6", "sigma2=1e-3"])
def test_no_intermediate_grows_with_n_beyond_the_budget(query, ratio, sigma2, scale, monkeypatch):
    """With a budget of 64 KiB, nothing but the query's output and tensors the size of one input field (the
    validation of the symbols) is larger than 64 KiB of float64 elements; with sigma2 = 1e-3 most rows are
    retried on their dense factors, in sub-chunks under the same budget."""
    monkeypatch.setattr(engine.routes, "SYMBOL_ROUTE_RATIO", ratio)
    head = random_head("chained", 3, seed=50, sigma2=sigma2, scale=scale)
    obs = random_obs(n=3000, seed=51, context=12)
    if sigma2 < 0.1:
        assert "dense" in {piece.route for piece in engine.forward_backward_chunks(head.hop_factors(), obs[:50])}
    budget = 64 * 1024
    with torch.no_grad(), _LargestTensor() as spy:
        out = getattr(head, query)(obs, budget=budget)
    output_size = out.numel()
    others = [size for size in spy.sizes if size != output_size]
    assert max(others) <= max(budget // 8, obs.keys.numel()), max(others)
    assert len(obs) * 12 * 12 > budget // 8  # an (n, N, N) tensor would have broken the bound


@pytest.mark.parametrize("budget, error", [(0, ValueError), (-5, ValueError), (math.inf, ValueError),
                                           ("1GB", TypeError), (True, TypeError)])
def test_a_bad_budget_is_refused_by_name(budget, error):
    head, obs = random_head("chained", 2), random_obs(n=7)
    with pytest.raises(error, match="budget"):
        head.log_likelihood(obs, budget=budget)
    with pytest.raises(error, match="budget"):
        engine.set_memory_budget(budget)
    assert engine.get_memory_budget() == engine.DEFAULT_MEMORY_BUDGET
