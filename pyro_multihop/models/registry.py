"""The heads the package knows by name: one table for the checkpoints and the ``train`` command.

- :data:`HEAD_CLASSES` maps a class name (a checkpoint's ``model_class`` entry) to the head class;
  :func:`pyro_multihop.checkpoint.load_checkpoint` rebuilds heads through :func:`head_class`.
- :data:`COMMAND_HEADS` maps ``pyro-multihop train --model NAME`` to the class it fits, and :func:`build_head`
  constructs a new head from that command's settings (the gate variance, when the command gives none, is the
  class's own default: :func:`default_sigma2`).

Example::

    >>> from pyro_multihop.models.registry import build_head, default_sigma2, head_class
    >>> head = build_head("chained", n_hops=2, num_symbols=30, num_targets=30, embed_dim=8, seed=0)
    >>> type(head) is head_class("ChainedAttention"), head.sigma2 == default_sigma2("chained")
    (True, True)
"""

from __future__ import annotations

import inspect
from typing import Optional

from ..checks import renamed_keyword
from .chained import ChainedAttention
from .facts import FactAttention
from .tied import TiedEmbeddingAttention

__all__ = ["HEAD_CLASSES", "COMMAND_HEADS", "head_class", "build_head", "default_sigma2"]

#: Every head a checkpoint can hold: class name -> class.
HEAD_CLASSES = {cls.__name__: cls for cls in (ChainedAttention, TiedEmbeddingAttention, FactAttention)}

#: The heads ``pyro-multihop train --model NAME`` fits on data files: NAME -> class. (The structured-facts
#: head reads facts files; the ``qa`` and ``babi`` commands train it.)
COMMAND_HEADS = {"chained": ChainedAttention, "tied": TiedEmbeddingAttention}


def head_class(name: str) -> type:
    """The head class registered as ``name`` in :data:`HEAD_CLASSES`; ``KeyError`` naming the choices otherwise."""
    if name not in HEAD_CLASSES:
        raise KeyError(f"model_class must be one of {sorted(HEAD_CLASSES)}, got {name!r}")
    return HEAD_CLASSES[name]


def _command_class(model: str) -> type:
    if model not in COMMAND_HEADS:
        raise ValueError(f"model must be one of {sorted(COMMAND_HEADS)}, got {model!r}")
    return COMMAND_HEADS[model]


def default_sigma2(model: str) -> float:
    """The gate variance of a head of the command name ``model`` built without one: its constructor's default."""
    return inspect.signature(_command_class(model)).parameters["sigma2"].default


def build_head(model: str, *, n_hops: Optional[int] = None, num_symbols: int, num_targets: int, embed_dim: int,
               seed: int, sigma2: Optional[float] = None, hops: Optional[int] = None):
    """A new head of the command name ``model`` (:data:`COMMAND_HEADS`) from the ``train`` command's settings:
    ``n_hops`` L (required; ``hops=``, its old keyword, is deprecated), vocabulary sizes S and T, ``embed_dim``
    (the tied head's embedding dimension, unused by the chained head), ``seed`` of the initial values, ``sigma2``
    (None: :func:`default_sigma2`)."""
    n_hops = renamed_keyword("build_head", "n_hops", n_hops, "hops", hops)
    cls = _command_class(model)
    options = {"seed": seed, "sigma2": default_sigma2(model) if sigma2 is None else sigma2}
    if cls is TiedEmbeddingAttention:
        return cls(num_symbols, embed_dim, num_targets, n_hops=n_hops, **options)
    return cls(n_hops, num_symbols, num_targets, **options)
