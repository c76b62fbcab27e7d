"""The SVI loss (pyro_multihop.train.svi_loss): mini-batch scaling to the full data, and length groups (exact,
scaled, and only on data that can be cut), with their benchmark at smoke size."""

import subprocess
import sys
from pathlib import Path

import pyro
import pytest
import torch

from pyro_multihop import ChainedAttention, transitive_task
from pyro_multihop.train import fit_svi
from pyro_multihop.train.svi_loss import SviLoss
from svi_test_heads import GaussianMean, Points, exact_loss, small_head

ROOT = Path(__file__).resolve().parents[2]


def test_minibatch_loss_is_scaled_to_the_full_data():
    # 40 copies of one observation: every mini-batch has the full-data loss per observation exactly.
    one = transitive_task(1, seed=3)
    copies = one[torch.zeros(40, dtype=torch.long)]
    head = small_head()
    before = exact_loss(head, copies)
    seen = []

    class Spy(ChainedAttention):
        def model(self, obs, subsample_size=None):
            seen.append(subsample_size)
            return super().model(obs, subsample_size=subsample_size)

    spy = Spy(2, 30, 30, seed=0)
    metrics = fit_svi(spy, copies, num_steps=1, batch_size=8, progress=False)
    assert 8 in seen
    assert metrics["loss"].iloc[0] == pytest.approx(before, rel=1e-6)
    with pyro.get_param_store().scope():
        estimate = float(SviLoss(head, copies, 8, jit=False).train(0).detach())
    assert estimate == pytest.approx(before, rel=1e-6)


def padded_task(n=60, seed=0):
    """The transitive task with 10 extra positions: distractors on half of the rows, padding on the others."""
    from pyro_multihop import Observations

    base = transitive_task(n, seed=seed)
    generator = torch.Generator().manual_seed(seed)
    extra = torch.randint(0, 30, (n, 10), generator=generator)
    mask = torch.ones(n, 20, dtype=torch.bool)
    mask[: n // 2, 10:] = False
    return Observations(torch.cat([base.keys, extra], 1), torch.cat([base.values, extra.flip(1)], 1), base.query,
                        base.target, mask)


@pytest.mark.parametrize("collapsed", [False, True], ids=["enumerated", "collapsed"])
def test_length_groups_are_exact(collapsed):
    obs = padded_task()
    assert obs.context_lengths().tolist() == [10] * 30 + [20] * 30
    plain, grouped = small_head(seed=0), small_head(seed=0)
    a = fit_svi(plain, obs, num_steps=8, log_every=4, collapsed=collapsed, progress=False)
    b = fit_svi(grouped, obs, num_steps=8, log_every=4, collapsed=collapsed, group_lengths=5, progress=False)
    assert b["loss"].tolist() == pytest.approx(a["loss"].tolist(), rel=1e-5)
    assert torch.allclose(plain.key_tables, grouped.key_tables, atol=2e-4)  # float32 Adam steps


def test_length_groups_scale_a_mini_batch_to_the_whole_data():
    obs = padded_task()
    head = small_head()
    exact = float(SviLoss(head, obs, None, jit=False).full(0))
    with torch.random.fork_rng():
        torch.manual_seed(0)
        estimates = [float(SviLoss(head, obs, 12, jit=False, group_lengths=10).train(0).detach()) for _ in range(300)]
    assert sum(estimates) / len(estimates) == pytest.approx(exact, rel=0.03)
    assert float(SviLoss(head, obs, None, jit=False, group_lengths=10).full(0)) == pytest.approx(exact, rel=1e-6)


def test_length_groups_need_data_that_can_be_cut():
    with pytest.raises(TypeError, match="context_lengths"):
        fit_svi(GaussianMean(), Points(torch.randn(10)), num_steps=1, group_lengths=5, progress=False)
    with pytest.raises(ValueError, match="jit"):
        fit_svi(small_head(), padded_task(), num_steps=1, group_lengths=5, jit=True, progress=False)


def test_length_groups_benchmark_smoke(tmp_path):
    subprocess.run([sys.executable, str(ROOT / "benchmarks" / "length_groups.py"), "--smoke", "--tasks", "1",
                    "--steps", "1", "--out", str(tmp_path)], check=True, capture_output=True, timeout=300)
    table = (tmp_path / "length_groups.md").read_text()
    assert "| 1 | 20 |" in table and "enumerated" in table and "collapsed" in table
