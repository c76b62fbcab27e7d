"""What a checkpoint of the structured-facts head (:class:`~pyro_multihop.models.facts.FactAttention`) written by
an earlier release means today, and why a checkpoint of the other kind cannot load.

:func:`~pyro_multihop.checkpoint.load_checkpoint` asks the head's class for these hooks:

- :func:`config_from_checkpoint`: the configuration as this release's constructor reads it (an argument added
  later whose default differs from how older checkpoints were trained);
- :func:`state_from_checkpoint`: the parameters as this release reads them (a parameter added later whose value
  0 gives the head an older checkpoint was trained as);
- :func:`checkpoint_mismatch`: why a state dict cannot load into a head (tables into an embedded head or back,
  or an emission from before its comparison component), with what to do.

Nothing loads half: a checkpoint either loads as the head it was trained as, or is refused with the reason.
"""

from __future__ import annotations

from typing import Optional

import torch

from .fact_comparison import COMPARISON_SHAPES, FLIP_START
from .fact_parameters import (ADJACENT_LOGITS, COPY_QUESTION_TERMS, FRAME_CONTENT, FRAME_SYMBOLS, LAST_FACT_KIND,
                              MENTION_SLOPES, QUESTION_PATTERN)
from .fact_variational import EMBEDDED_SYMBOLS

__all__ = ["config_from_checkpoint", "state_from_checkpoint", "checkpoint_mismatch"]


def config_from_checkpoint(config: dict) -> dict:
    """A checkpoint written before ``revisit`` existed was trained with revisits allowed: it loads with
    ``revisit=True``."""
    return config if "revisit" in config else {**config, "revisit": True}


def state_from_checkpoint(state_dict: dict) -> dict:
    """A checkpoint written before the copy had its question terms (:data:`~.fact_parameters.COPY_QUESTION_TERMS`)
    gets them at 0, the head it was trained as. Their shapes come from the state dict's own ``emission_mix``
    (``2 F + 1``) and ``copy_by_symbol`` (``S``). An embedded head's checkpoint written before
    ``embedded_symbols`` gets it all True: every symbol owned a row then. One written before the comparison's flip
    gets ``compare_flip_logits`` at 0 (and ``compare_flip`` at its start), the comparison it was trained with.
    One written before the hops' question pattern gets ``question_pattern`` at 0 (its shape from the state dict's
    ``question_position`` ``(L, P)`` and ``question_equality`` ``(L, F)``), one written before the neighbours'
    weights gets ``adjacent_logits`` at 0 (its shape from ``offset_slopes`` ``(L - 1,)``), and one written before
    the recency among mentions gets ``mention_slopes`` at 0 (its shape from ``age_slopes`` ``(L,)``). A table
    head's written before the frame table gets ``frame_content`` at 0 and no frame symbol (shapes from
    ``content_tables`` ``(L - 1, F, F, S, S)``), and one written before the last hop's fact kind
    ``last_fact_kind`` at 0 (``(S,)``)."""
    content = state_dict.get("content_tables")
    if isinstance(content, torch.Tensor) and content.dim() == 5 and FRAME_CONTENT not in state_dict:
        L1, S = content.shape[0], content.shape[-1]
        state_dict = {**state_dict, FRAME_CONTENT: content.new_zeros(L1, S, S),
                      FRAME_SYMBOLS: torch.zeros(S, dtype=torch.bool)}
    offset = state_dict.get("offset_slopes")
    if isinstance(offset, torch.Tensor) and offset.dim() == 1 and ADJACENT_LOGITS not in state_dict:
        state_dict = {**state_dict, ADJACENT_LOGITS: offset.new_zeros(offset.shape[0], 2)}
    age = state_dict.get("age_slopes")
    if isinstance(age, torch.Tensor) and age.dim() == 1 and MENTION_SLOPES not in state_dict:
        state_dict = {**state_dict, MENTION_SLOPES: torch.zeros_like(age)}
    if isinstance(content, torch.Tensor) and content.dim() == 5 and LAST_FACT_KIND not in state_dict:  # S even at L = 1
        state_dict = {**state_dict, LAST_FACT_KIND: content.new_zeros(content.shape[-1])}
    position, equality = state_dict.get("question_position"), state_dict.get("question_equality")
    if isinstance(position, torch.Tensor) and isinstance(equality, torch.Tensor) and position.dim() == 2 and \
            equality.dim() == 2 and QUESTION_PATTERN not in state_dict:
        (L, P), F = position.shape, equality.shape[1]
        state_dict = {**state_dict, QUESTION_PATTERN: position.new_zeros(L, P, F, P, F)}
    embedding = state_dict.get("symbol_embedding", state_dict.get("embedding_guide.loc"))
    if isinstance(embedding, torch.Tensor) and EMBEDDED_SYMBOLS not in state_dict:
        state_dict = {**state_dict, EMBEDDED_SYMBOLS: torch.ones(embedding.shape[0], dtype=torch.bool)}
    logits, by_symbol = state_dict.get("compare_logits"), state_dict.get("compare_by_symbol")
    if isinstance(logits, torch.Tensor) and isinstance(by_symbol, torch.Tensor) and \
            "compare_flip_logits" not in state_dict:  # flip weights 0: the comparison it was trained with
        state_dict = {**state_dict, "compare_flip_logits": torch.zeros_like(logits),
                      "compare_flip": torch.full_like(by_symbol, FLIP_START)}
    if "emission_mix" not in state_dict or "copy_by_symbol" not in state_dict or \
            any(name in state_dict for name in COPY_QUESTION_TERMS):
        return state_dict
    mix, by_symbol = state_dict["emission_mix"], state_dict["copy_by_symbol"]
    if not isinstance(mix, torch.Tensor) or not isinstance(by_symbol, torch.Tensor):
        return state_dict
    F = (mix.numel() - 1) // 2
    return {**state_dict, "copy_question_equality": by_symbol.new_zeros(F),
            "copy_by_question": by_symbol.new_zeros(by_symbol.numel(), F)}


def checkpoint_mismatch(head, config: dict, state_dict: dict) -> Optional[str]:
    """Why a checkpoint's parameters cannot load into ``head`` when one holds the tables and the other the symbol
    embeddings, or when it was written before the emission's comparison component (an ``emission_mix`` of ``2 F``
    entries, no ``compare_*`` parameters), read from the state dict's names, with what to do; None otherwise."""
    theirs = "symbol_embedding" in state_dict or "embedding_guide.loc" in state_dict
    if theirs == (head.embed_dim is not None) or not ("question_tables" in state_dict or theirs):
        if "emission_mix" in state_dict and not any(name in state_dict for name in COMPARISON_SHAPES):
            return ("the checkpoint was written before FactAttention's emission had its comparison component "
                    f"(emission_mix of 2 F = {2 * head.num_fields} entries, no {', '.join(COMPARISON_SHAPES)}): "
                    "its parameters do not fit this head; train a new run")
        return None
    stored = f"an embedded head (embed_dim={config.get('embed_dim')})" if theirs else "a table head (embed_dim=None)"
    build = f"embed_dim={config.get('embed_dim')} (pyro-multihop qa --embed-dim {config.get('embed_dim')})" \
        if theirs else "embed_dim=None (pyro-multihop qa without --embed-dim)"
    return (f"the checkpoint holds the parameters of {stored} but the model is {head.kind()}: the two kinds "
            f"share no S x S tables or embeddings; build the model with {build} to load it, or train a new run")
