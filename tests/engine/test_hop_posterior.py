"""Every row's posterior (pyro_multihop/engine/hop_posterior.py): its MAP read reuses the chunks its
forward-backward pass kept."""

import oracle
import pytest
from factories import ROUTES, random_head, random_obs

from pyro_multihop import engine


@ROUTES
@pytest.mark.parametrize("budget, prepares", [(None, 0), (2**12, "some"), (1, "all")],
                         ids=["all-kept", "first-kept", "none-kept"])
def test_the_lazy_posterior_reads_map_paths_from_its_own_chunks(budget, prepares, ratio, monkeypatch):
    """The posterior keeps its first chunks' prepared transitions within the budget and the MAP read reuses them
    (no second preparation of a chunk on its route), and recomputes the rest; every path is a most probable one,
    underflowing rows (sigma2 = 1e-3, retried on their dense factors) included."""
    from pyro_multihop.engine import paths as engine_paths

    monkeypatch.setattr(engine.routes, "SYMBOL_ROUTE_RATIO", ratio)
    head = random_head("chained", 3, seed=120, sigma2=1e-3, scale=2.0)
    obs = random_obs(n=40, seed=121, masked=True)
    calls = []
    prepare = engine_paths.prepare
    monkeypatch.setattr(engine_paths, "prepare",
                        lambda *args: (args[2] != "dense" and calls.append(len(args[1]))) or prepare(*args))
    posterior = head.posterior(obs, budget=budget)
    paths = posterior.map_paths
    oracle.assert_map_paths_are_most_probable(paths, oracle.exact_path_posterior(head, obs), 1e-9)
    prepared_rows = sum(calls)
    if prepares == 0:
        assert prepared_rows == 0
    elif prepares == "all":
        assert prepared_rows == len(obs)
    else:
        assert 0 < prepared_rows < len(obs)
