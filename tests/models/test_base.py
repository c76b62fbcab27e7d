"""What every head shares (pyro_multihop/models/base.py): ``hop_gates()``, the old name of ``hop_factors()``."""

import factories
import pytest
import torch

from pyro_multihop import engine


@pytest.mark.parametrize("kind", ["chained", "tied", "facts"])
def test_hop_gates_warns_and_hands_the_engine_the_same_factors(kind):
    """Renamed ``hop_factors`` (the factors carry the emission too); kept for one release, arguments passed on
    (the tied head's ``embeddings``)."""
    if kind == "facts":
        head = factories.random_fact_head(2, 3, 6, 4, seed=0)
        obs = factories.random_fact_observations(3, 4, 3, 3, 6, seed=10)
    else:
        head, obs = factories.random_head(kind, 2, seed=3), factories.random_obs(masked=True)
    args = (2 * head.guide.loc.detach(),) if kind == "tied" else ()  # other distances than the means'
    with pytest.warns(DeprecationWarning, match=r"hop_gates\(\) is deprecated; use hop_factors\(\)"):
        old = head.hop_gates(*args)
    new = head.hop_factors(*args)
    assert isinstance(old, engine.HopFactors)
    assert torch.equal(engine.log_likelihood(old, obs), engine.log_likelihood(new, obs))
    if args:  # the embeddings were passed on: not the plug-in table's likelihood
        assert not torch.allclose(engine.log_likelihood(old, obs), engine.log_likelihood(head.hop_factors(), obs))
