"""What every head shares (pyro_multihop/models/base.py): ``hop_gates()``, the old name of ``hop_factors()``, and
the head contract that no head disables a method of."""

import ast
import inspect
import textwrap

import factories
import pytest
import torch

from pyro_multihop import engine
from pyro_multihop.models import HopAttentionHead, KeyValueAttentionHead


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


HEADS = {"chained": lambda: factories.random_head("chained", 2, seed=3),
         "tied": lambda: factories.random_head("tied", 2, seed=3),
         "facts": lambda: factories.random_fact_head(2, 3, 6, 4, seed=0)}


def only_raises(function) -> bool:
    """Whether ``function``'s body, past its docstring, is a single ``raise``: a method that disables itself."""
    source = textwrap.dedent(inspect.getsource(function))
    body = ast.parse(source).body[0].body
    if body and isinstance(body[0], ast.Expr) and isinstance(getattr(body[0], "value", None), ast.Constant):
        body = body[1:]
    return len(body) == 1 and isinstance(body[0], ast.Raise)


def test_only_raises_flags_a_disabled_method():
    class Disabled:
        def query(self):
            """Not supported."""
            raise TypeError("not supported")

        def fine(self):
            return 1

    assert only_raises(Disabled.query) and not only_raises(Disabled.fine)


@pytest.mark.parametrize("kind", sorted(HEADS))
def test_no_head_disables_an_inherited_method(kind):
    """The contract (``HopAttentionHead``, and ``KeyValueAttentionHead`` for heads over key/value symbols) is what
    each head implements: no public method of a head is one that only raises (``TypeError("not supported")``, or an
    abstract ``NotImplementedError`` left unimplemented)."""
    head = HEADS[kind]()
    for cls in type(head).__mro__:
        if cls.__module__.startswith("pyro_multihop"):
            for name, member in vars(cls).items():
                resolved = inspect.getattr_static(head, name)
                if name.startswith("_") or not inspect.isfunction(resolved) or resolved is not member:
                    continue
                assert not only_raises(resolved), f"{type(head).__name__}.{name} only raises"


def test_the_facts_head_has_no_key_value_queries_and_no_emission_table():
    """``FactAttention`` is a ``HopAttentionHead`` but not a ``KeyValueAttentionHead``: a fact holds ``F`` symbols, not
    one value, so it has no ``value_marginals``, no context ``sample``r and no ``(S, T)`` table to fake; its factors
    state their sizes, dtype and device themselves."""
    head = HEADS["facts"]()
    assert isinstance(head, HopAttentionHead) and not isinstance(head, KeyValueAttentionHead)
    for name in ("value_marginals", "sample", "log_emission"):
        assert not hasattr(head, name)
    factors = head.hop_factors()
    assert factors.log_emission is None and not factors.reads_symbols
    assert (factors.num_symbols, factors.num_targets) == (head.num_symbols, head.num_targets)
    assert factors.dtype == head.age_slopes.dtype and factors.device == head.age_slopes.device
    obs = factories.random_fact_observations(3, 4, 3, 3, 6, seed=10)
    probs = head.predict_proba(obs)
    assert probs.shape == (3, head.num_targets) and torch.allclose(probs.sum(-1), torch.ones(3, dtype=probs.dtype))
    with pytest.raises(ValueError, match="value_marginals needs factors that read value symbols"):
        engine.value_marginals(factors, obs)
