"""The deprecated aliases of the engine's moved and renamed names (pyro_multihop/engine/moved_names.py, and the
package's and the heads' names renamed with the engine's ``HopGates``): each old name warns, naming the new one, and
is the new object; a name that never existed is still an AttributeError."""

import importlib

import pytest

from pyro_multihop import engine

MOVED = [
    ("pyro_multihop.engine", "ChainPosterior", "pyro_multihop.engine", "LogChunkPosterior"),
    ("pyro_multihop.engine.log_space", "ChainPosterior", "pyro_multihop.engine.log_space", "LogChunkPosterior"),
    ("pyro_multihop.engine.hop_gates", "choose_route", "pyro_multihop.engine.routes", "choose_route"),
    ("pyro_multihop.engine.hop_gates", "ROUTES", "pyro_multihop.engine.routes", "ROUTES"),
    ("pyro_multihop.engine.hop_gates", "SYMBOL_ROUTE_RATIO", "pyro_multihop.engine.routes", "SYMBOL_ROUTE_RATIO"),
    ("pyro_multihop.engine.transitions", "PreparedChunk", "pyro_multihop.engine.routes", "PreparedChunk"),
    ("pyro_multihop.engine.transitions", "prepare", "pyro_multihop.engine.routes", "prepare"),
    ("pyro_multihop.engine.transitions", "dense_retries", "pyro_multihop.engine.routes", "dense_retries"),
    ("pyro_multihop.engine.transitions", "DENSE_RETRY_ELEMENTS", "pyro_multihop.engine.routes", "DENSE_RETRY_ELEMENTS"),
    ("pyro_multihop.engine.transitions", "bytes_per_row", "pyro_multihop.engine.budget", "bytes_per_row"),
    ("pyro_multihop.engine.transitions", "rows_per_chunk", "pyro_multihop.engine.budget", "rows_per_chunk"),
    ("pyro_multihop.engine.paths", "HopPosterior", "pyro_multihop.engine.hop_posterior", "HopPosterior"),
    ("pyro_multihop.engine.paths", "dense_chunks", "pyro_multihop.engine.budget", "dense_chunks"),
    # HopGates carries the emission too: renamed HopFactors, its module hop_factors (issue 32).
    ("pyro_multihop", "HopGates", "pyro_multihop", "HopFactors"),
    ("pyro_multihop.engine", "HopGates", "pyro_multihop.engine", "HopFactors"),
    ("pyro_multihop.engine.hop_gates", "HopGates", "pyro_multihop.engine.hop_factors", "HopFactors"),
    ("pyro_multihop.engine.hop_gates", "HopFactors", "pyro_multihop.engine.hop_factors", "HopFactors"),
    ("pyro_multihop.engine.hop_gates", "chain_from_scores", "pyro_multihop.engine.hop_factors", "chain_from_scores"),
    ("pyro_multihop.engine.hop_gates", "first_hop_log_probs", "pyro_multihop.engine.hop_factors", "first_hop_log_probs"),
    ("pyro_multihop.models", "embedding_hop_gates", "pyro_multihop.models.tied", "embedding_hop_factors"),
    ("pyro_multihop.models.tied", "embedding_hop_gates", "pyro_multihop.models.tied", "embedding_hop_factors"),
    ("pyro_multihop.models.tied", "plug_in_hop_gates", "pyro_multihop.models.tied", "plug_in_hop_factors"),
]


@pytest.mark.parametrize("old_module, old_name, new_module, new_name", MOVED, ids=lambda x: x.split(".")[-1])
def test_an_old_name_warns_and_is_the_new_object(old_module, old_name, new_module, new_name):
    module = importlib.import_module(old_module)
    with pytest.warns(DeprecationWarning, match=f"{old_module}.{old_name} is deprecated; use {new_module}.{new_name}"):
        got = getattr(module, old_name)
    assert got is getattr(importlib.import_module(new_module), new_name)
    assert old_name not in getattr(module, "__all__", ())


def test_the_old_names_import_from_the_package():
    with pytest.warns(DeprecationWarning, match="LogChunkPosterior"):
        from pyro_multihop.engine import ChainPosterior
    assert ChainPosterior is engine.LogChunkPosterior
    assert "LogChunkPosterior" in engine.__all__ and "HopPosterior" in engine.__all__


def test_the_renamed_factors_import_from_their_old_homes():
    with pytest.warns(DeprecationWarning, match="pyro_multihop.HopGates is deprecated; use pyro_multihop.HopFactors"):
        from pyro_multihop import HopGates
    assert HopGates is engine.HopFactors
    with pytest.warns(DeprecationWarning, match="HopFactors"):
        from pyro_multihop.engine.hop_gates import HopGates as old_path
    assert old_path is engine.HopFactors
    with pytest.warns(DeprecationWarning, match="embedding_hop_factors"):
        from pyro_multihop.models import embedding_hop_gates
    from pyro_multihop.models import embedding_hop_factors

    assert embedding_hop_gates is embedding_hop_factors
    assert "HopFactors" in engine.__all__ and "HopGates" not in engine.__all__


def test_an_unknown_name_is_an_attribute_error():
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        engine.transitions.no_such_name
    with pytest.raises(ImportError):
        from pyro_multihop.engine import no_such_name  # noqa: F401
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        engine.hop_gates.no_such_name
