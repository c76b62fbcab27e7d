"""The traced loss (jit=True, pyro_multihop.train.jit_fields): the same fit as the interpreted loss, on any data
type built from its tensor attributes, and a clear error for one that is not."""

import pytest
import torch

from pyro_multihop import transitive_task
from pyro_multihop.train import fit_svi
from svi_test_heads import GaussianMean, Points, small_head


def test_jit_matches_the_interpreted_loss():
    obs = transitive_task(60, seed=0)
    plain, traced = small_head(seed=0), small_head(seed=0)
    a = fit_svi(plain, obs, num_steps=6, log_every=3, progress=False)
    b = fit_svi(traced, obs, num_steps=6, log_every=3, progress=False, jit=True)
    assert torch.allclose(plain.key_tables, traced.key_tables, atol=1e-5)
    assert a["loss"].tolist() == pytest.approx(b["loss"].tolist(), rel=1e-5)


@pytest.mark.parametrize("jit", [False, True], ids=["interpreted", "jit"])
def test_any_data_type_the_head_accepts_is_fitted(jit):
    points = Points(3.0 + torch.randn(200, generator=torch.Generator().manual_seed(0)))
    head = GaussianMean()
    metrics = fit_svi(head, points, num_steps=150, lr=0.1, log_every=50, jit=jit, collapsed=True, progress=False)
    assert float(head.mu.detach()) == pytest.approx(float(points.x.mean()), abs=0.05)
    assert metrics["loss"].iloc[-1] < metrics["loss"].iloc[0]
    with pytest.raises(TypeError, match="obs must be Points"):
        fit_svi(GaussianMean(), transitive_task(5, seed=0), num_steps=1, progress=False)


def test_jit_names_a_data_type_it_cannot_rebuild():
    class Opaque(Points):
        def __init__(self, values):  # the constructor argument is not an attribute of that name
            super().__init__(values)

        def __getitem__(self, index):
            return Opaque(self.x[index])

        def to(self, device):
            return Opaque(self.x.to(device))

    with pytest.raises(TypeError, match="Opaque.values"):
        fit_svi(GaussianMean(), Opaque(torch.randn(10)), num_steps=1, jit=True, progress=False)
