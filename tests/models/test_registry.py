"""The registry of heads: class names for checkpoints, command names and the constructor for ``train``."""

import pytest

from pyro_multihop import ChainedAttention, FactAttention, TiedEmbeddingAttention
from pyro_multihop.checkpoint import model_class
from pyro_multihop.models.registry import COMMAND_HEADS, HEAD_CLASSES, build_head, default_sigma2, head_class


def test_every_head_is_registered_under_its_class_name_and_checkpoints_read_the_registry():
    assert HEAD_CLASSES == {"ChainedAttention": ChainedAttention, "TiedEmbeddingAttention": TiedEmbeddingAttention,
                            "FactAttention": FactAttention}
    for name, cls in HEAD_CLASSES.items():
        assert head_class(name) is cls and model_class(name) is cls
    with pytest.raises(KeyError, match="must be one of"):
        head_class("Nope")
    assert COMMAND_HEADS == {"chained": ChainedAttention, "tied": TiedEmbeddingAttention}


def test_default_sigma2_is_the_constructor_default():
    assert default_sigma2("chained") == ChainedAttention(1, 3, 3).sigma2 == 0.1
    assert default_sigma2("tied") == TiedEmbeddingAttention(3, 2, 3).sigma2 == 0.3
    with pytest.raises(ValueError, match="model must be one of"):
        default_sigma2("facts")


@pytest.mark.parametrize("model", ["chained", "tied"])
def test_build_head_from_the_command_settings(model):
    head = build_head(model, n_hops=3, num_symbols=12, num_targets=15, embed_dim=4, seed=1)
    assert type(head) is COMMAND_HEADS[model] and head.n_hops == 3 and head.sigma2 == default_sigma2(model)
    assert head.num_symbols == 12 and head.num_targets == 15
    if model == "tied":
        assert head.embed_dim == 4
    again = build_head(model, n_hops=3, num_symbols=12, num_targets=15, embed_dim=4, seed=1, sigma2=0.7)
    assert again.sigma2 == 0.7
    same = build_head(model, n_hops=3, num_symbols=12, num_targets=15, embed_dim=4, seed=1)
    for name, value in head.state_dict().items():
        assert (same.state_dict()[name] == value).all(), name  # the seed fixes the initial values
    with pytest.raises(ValueError, match="model must be one of"):
        build_head("nope", n_hops=1, num_symbols=3, num_targets=3, embed_dim=2, seed=0)


def test_the_old_hops_keyword_warns_and_builds_the_same_head():
    """``hops=`` (renamed ``n_hops``) is kept for one release: it warns, naming ``n_hops``."""
    with pytest.warns(DeprecationWarning, match=r"build_head\(hops=...\) is deprecated; use build_head\(n_hops=...\)"):
        old = build_head("chained", hops=3, num_symbols=12, num_targets=15, embed_dim=4, seed=1)
    new = build_head("chained", n_hops=3, num_symbols=12, num_targets=15, embed_dim=4, seed=1)
    assert old.n_hops == 3
    for name, value in new.state_dict().items():
        assert (old.state_dict()[name] == value).all(), name
    with pytest.raises(TypeError, match="missing required argument: 'n_hops'"):
        build_head("chained", num_symbols=12, num_targets=15, embed_dim=4, seed=1)
