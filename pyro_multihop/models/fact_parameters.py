"""The structured-facts head's parameters (:class:`~pyro_multihop.models.facts.FactAttention`): their shapes in terms
of ``L`` hops, ``F`` fields, ``S`` symbols, ``P`` question positions, ``D`` embedding dimensions and ``A`` answers,
their counts before anything is allocated, and the checks of the values a user hands the constructor."""

from __future__ import annotations

from typing import Optional

import torch

from ..checks import check_symbol_mask
from ..engine.log_space import MASKED_LOGIT
from . import fact_comparison as comparison
from . import symbol_embedding as embedded

__all__ = ["EQUALITY_WEIGHTS", "EQUALITY_START", "ORDER_BY_SYMBOL", "PARAMETER_SHAPES", "COPY_QUESTION_TERMS",
           "QUESTION_PATTERN", "WORD_ORDER_TERMS", "ADJACENT_LOGITS", "MENTION_SLOPES", "LAST_FACT_KIND", "FRAME_CONTENT",
           "FRAME_SYMBOLS", "FRAME_DECAY", "COPY_DECAY", "HELD_COPY_DECAY", "TABLE_STEPS", "EMBEDDED_STEPS",
           "frame_symbols_of", "frame_symbols_mask", "frame_pairs", "parameter_shapes", "parameter_elements",
           "shape_of", "answer_symbols_tensor", "mix_logits", "initial_value"]

#: The weights of the equality terms (a question token or a previous fact's field equal to a candidate's field).
EQUALITY_WEIGHTS = ("question_equality", "field_equality")

#: The order terms by the previous fact's symbols: how a verb or a time word moves the next hop (bAbI task 2:
#: "before a drop, after a pick-up"). Their decay in the table head's ``svi_defaults``, 3e-3, is a tenth of the
#: symbol tables': at 3e-2 they stayed small beside the shared order terms (docs/facts.md).
ORDER_BY_SYMBOL = ("age_by_symbol", "offset_by_symbol", "direction_by_symbol", "nearest_by_symbol")

#: Where every equality weight starts: the head starts out preferring the facts that share a symbol with the
#: question, and from hop 2 on with the previous fact. At 0 the chain is a saddle: while hop 2 ignores hop 1's
#: fact, hop 1 gets no gradient, and while hop 1 attends uniformly, the link between them gets none, so a
#: later hop learns to find its fact alone and the earlier ones stay idle (a simulated knowledge base, 2 hops,
#: 3,000 entities: held-out paths 0.09 from 0, 1.0 from this start). 1, by measurement: 0.5 leaves bAbI task 3's
#: first hop idle, 3 pulls a hop to facts of the same form (bAbI task 15: 0 paths); docs/facts.md, "Where
#: training starts".
EQUALITY_START = 1.0

#: Shape of every parameter, in terms of ``L`` hops, ``F`` fields, ``S`` symbols and ``P`` question positions.
PARAMETER_SHAPES = {
    "question_choice": "(L, S)",
    "question_position": "(L, P)",
    "question_equality": "(L, F)",
    "question_tables": "(L, F, S, S)",
    "question_pattern": "(L, P, F, P, F)",
    "field_equality": "(L - 1, F, F)",
    "content_tables": "(L - 1, F, F, S, S)",
    "frame_content": "(L - 1, S, S)",
    "age_slopes": "(L,)",
    "mention_slopes": "(L,)",
    "last_fact_kind": "(S,)",
    "age_by_symbol": "(L - 1, F, S)",
    "offset_slopes": "(L - 1,)",
    "offset_by_symbol": "(L - 1, F, S)",
    "direction_logits": "(L - 1,)",
    "direction_by_symbol": "(L - 1, F, S)",
    "adjacent_logits": "(L - 1, 2)",
    "nearest_weights": "(L - 1, 2, F)",
    "nearest_by_symbol": "(L - 1, 2, F, S)",
    "emission_tables": "(F, S, A)",
    "emission_mix": "(2 F + 1,)",
    "copy_by_symbol": "(S,)",
    **comparison.COMPARISON_SHAPES,
    "copy_question_equality": "(F,)",
    "copy_by_question": "(S, F)",
}

#: The copy's question terms, added after checkpoints were first written: a checkpoint without them loads with
#: them at 0, where the head is exactly the one it was trained as (:meth:`FactAttention.state_from_checkpoint`).
COPY_QUESTION_TERMS = ("copy_question_equality", "copy_by_question")

#: The hop's question pattern (which question positions equal which of a candidate's fields, in pairs), added
#: after checkpoints were first written: a checkpoint without it loads with it at 0, the head it was trained as.
QUESTION_PATTERN = "question_pattern"

#: The weights of the facts right before and right after the previous hop's (``(L - 1, 2)``), added after
#: checkpoints were first written: a checkpoint without them loads with them at 0, the head it was trained as.
ADJACENT_LOGITS = "adjacent_logits"

#: The slope of a hop's recency among the facts that name its chosen question token (``(L,)``), added after
#: checkpoints were first written: a checkpoint without it loads with it at 0, the head it was trained as.
MENTION_SLOPES = "mention_slopes"

#: The last hop's weights on its candidate's frame symbols (``(S,)``: the kind of fact the answer is read from),
#: added after checkpoints were first written: a checkpoint without it loads with it at 0, the head it was trained as.
LAST_FACT_KIND = "last_fact_kind"

#: The weight decay of ``copy_by_question`` (:meth:`~.facts.FactAttention.svi_defaults`): 3e-3 lets the copy
#: learn which field a question asks for (bAbI task 5: 91.8 at 1e-2, 96.0), and 1e-2 in the starts that hold
#: :data:`WORD_ORDER_TERMS` at 0, where at 3e-3 the start bAbI task 15 keeps falls into its trap at 10k (100 / 100 at
#: 1e-2, 49.6 / 20.7 at 3e-3; docs/facts.md, the copy's question terms).
COPY_DECAY = 3e-3
HELD_COPY_DECAY = 1e-2

#: The content table shared by every field pair, over the frame symbols (a table head only), and the buffer that
#: marks those symbols, added after checkpoints were first written: a checkpoint without them loads with the
#: table at 0 and no frame symbol, the head it was trained as.
FRAME_CONTENT, FRAME_SYMBOLS = "frame_content", "frame_symbols"

#: The weight decay of ``frame_content`` (:meth:`~.facts.FactAttention.svi_defaults`), and since it, of
#: ``copy_by_symbol`` too (:data:`COPY_DECAY`): bAbI task 14 at 1k, 89.4 / 90.6 without the table; with it at 3e-2
#: 92.5 / 95.1, at 1e-2 93.8 / 97.4, at 3e-3 95.3 / 99.5 (the misses now copies of a time word), and with the copy's
#: symbol weights at 3e-3 in place of 3e-2, 99.9 / 99.7 (docs/facts.md, the frame table).
FRAME_DECAY = 3e-3

#: Full-batch SVI steps of the head's ``svi_defaults``: a table head's fits were still moving at 300, where bAbI
#: task 13 at 1k gave 98.3 (the next "they" fact beaten by a later one the frame table liked); at 600, 100 / 100, and
#: task 2 95.0 / 94.8 to 96.6 / 96.6 (96.8 / 96.7 at 1000), task 3 97.8 / 96.7 to 98.4 / 97.0, tasks 9 and 10 to
#: 100 (docs/babi.md, "How the tables got here"). An embedded head keeps 300, where it was measured.
TABLE_STEPS, EMBEDDED_STEPS = 600, 300

#: The terms that read a fact's wording rather than its content: the question's pattern (where the question's words
#: stand in a fact) and the frame table (how the words around a fact's content follow each other). The pattern makes
#: bAbI task 4 (87.9 to 100) but, from every start of the command, traps tasks 9 and 15 (99.5 to 80.8, 100 to 55.6);
#: the frame table makes task 14 (89.4 to 99.9) and moves the start that task 15 keeps at 10k into the same trap
#: (100 / 100 to 73.5 / 54.8). So the head also offers starts with both held at 0
#: (:meth:`~.facts.FactAttention.start_variant`), for the held-out likelihood to choose (docs/facts.md, "Starts
#: without the word-order terms").
WORD_ORDER_TERMS = (QUESTION_PATTERN, FRAME_CONTENT)


def frame_symbols_of(obs, num_symbols: int) -> torch.Tensor:
    """``(S,)`` bool: the symbols that a fact of ``obs`` (:class:`~pyro_multihop.FactObservations`) holds and no
    question or answer of it names, the frame of its facts (time words, verbs) rather than the entities asked
    about and answered; a symbol ``obs`` never shows is none. A symbol ``>= num_symbols`` is refused by field
    (:meth:`~pyro_multihop.FactObservations.check_sizes`)."""
    obs.check_sizes(num_symbols)

    def occurs(symbols: torch.Tensor, real: torch.Tensor) -> torch.Tensor:
        seen = torch.zeros(num_symbols + 1, dtype=torch.bool)
        seen[symbols.masked_fill(~real, num_symbols).flatten()] = True
        return seen[:num_symbols]

    in_facts = occurs(obs.facts, obs.real_fields())
    named = occurs(obs.question, obs.real_tokens()) | occurs(obs.target, torch.ones_like(obs.target, dtype=torch.bool))
    return in_facts & ~named


def frame_symbols_mask(frame_symbols, num_symbols: int, embed_dim: Optional[int]) -> Optional[torch.Tensor]:
    """``frame_symbols`` checked (``TypeError``/``ValueError`` naming it) as the ``(S,)`` bool buffer of a table
    head (None: all False); None for an embedded head, which has no ``frame_content``."""
    if embed_dim is not None:
        if frame_symbols is not None:
            raise ValueError("frame_symbols needs a table head (embed_dim=None): an embedded head has no frame_content")
        return None
    if frame_symbols is None:
        return torch.zeros(num_symbols, dtype=torch.bool)
    return check_symbol_mask("frame_symbols", frame_symbols, num_symbols)


def frame_pairs(frame_symbols: torch.Tensor, eye: torch.Tensor) -> torch.Tensor:
    """``(S, S)``: 1 where both symbols are frame symbols and differ (the equality weights own the diagonal)."""
    frame = frame_symbols.to(eye.dtype)
    return frame[:, None] * frame[None, :] * (1 - eye)


def parameter_shapes(embed_dim: Optional[int] = None, embedding_posterior: str = "point") -> dict:
    """``{name: shape}`` of a :class:`FactAttention`'s parameters: :data:`PARAMETER_SHAPES` (``embed_dim=None``), or
    with its ``S x S`` tables replaced by :data:`~.symbol_embedding.EMBEDDING_SHAPES` (``D`` = ``embed_dim``).
    ``A`` is the number of answers the learnt parts of the emission can give (``answer_symbols``; ``S`` without).
    ``embedding_posterior="mean_field"``: ``symbol_embedding`` is a latent, its posterior's means and (unconstrained)
    standard deviations in its place (:mod:`.fact_variational`)."""
    if embed_dim is None:
        return dict(PARAMETER_SHAPES)
    kept = {name: spec for name, spec in PARAMETER_SHAPES.items() if name not in embedded.REPLACED_TABLES}
    shapes = {**kept, **embedded.EMBEDDING_SHAPES}
    if embedding_posterior == "mean_field":
        del shapes["symbol_embedding"]
        shapes.update({"embedding_guide.loc": "(S, D)", "embedding_guide.scale_unconstrained": "(S, D)"})
    return shapes


def shape_of(spec: str, L: int, F: int, S: int, P: int, D: int = 0, A: Optional[int] = None, R: int = 0) -> tuple:
    names = {"L": L, "L - 1": L - 1, "F": F, "S": S, "P": P, "2 F + 1": 2 * F + 1, "1": 1, "2": 2, "3": 3, "D": D,
             "A": S if A is None else A, "R": R}
    return tuple(names[part.strip()] for part in spec.strip("()").split(",") if part.strip())


def parameter_elements(n_hops: int, num_fields: int, num_symbols: int, max_question_len: int,
                       embed_dim: Optional[int] = None, num_answers: Optional[int] = None,
                       embedding_posterior: str = "point") -> dict:
    """``{name: number of entries}`` of every parameter of a :class:`FactAttention` of these sizes, computed
    before any is allocated (:func:`parameter_shapes`). With the tables (``embed_dim=None``), ``question_tables``,
    ``content_tables``, ``emission_tables`` and ``frame_content`` grow as ``S^2``, in all
    ``(L F + (L - 1) (F^2 + 1) + F) S^2``; with
    ``embed_dim=D``, the embeddings as ``2 S D``, the bilinear forms as ``(L F + (L - 1) F^2 + F) D^2``, the rest as
    ``S`` or not at all; ``num_answers``: ``A`` (default ``S``); ``embedding_posterior="mean_field"``: ``S D`` more
    (the posterior's standard deviations beside its means)."""
    sizes = {}
    for name, spec in parameter_shapes(embed_dim, embedding_posterior).items():
        count = 1
        for size in shape_of(spec, n_hops, num_fields, num_symbols, max_question_len, embed_dim or 0, num_answers):
            count *= size
        sizes[name] = count
    return sizes


def answer_symbols_tensor(answer_symbols, num_symbols: int) -> Optional[torch.Tensor]:
    """``(A,)`` int64 from ``answer_symbols`` (None stays None), checked: distinct symbols in ``[0, S)``."""
    if answer_symbols is None:
        return None
    answers = torch.as_tensor(answer_symbols)
    if answers.dtype.is_floating_point or answers.dtype == torch.bool or answers.dim() != 1 or not len(answers):
        raise TypeError(f"answer_symbols must be a non-empty 1-D sequence of integer symbols, got "
                        f"{answers.dtype} of shape {tuple(answers.shape)}")
    answers = answers.long()
    bad = answers[(answers < 0) | (answers >= num_symbols)]
    if len(bad):
        raise ValueError(f"answer_symbols must lie in [0, num_symbols = {num_symbols}), got {int(bad[0])}")
    if len(answers.unique()) != len(answers):
        raise ValueError("answer_symbols must be distinct, got a repeated symbol")
    return answers


def mix_logits(probs: torch.Tensor, num_fields: int) -> torch.Tensor:
    """``emission_mix`` from probabilities: ``2 F + 1`` of them, or ``2 F`` (the comparison switched off)."""
    size = 2 * num_fields + 1
    if probs.shape == (size - 1,):
        probs = torch.cat([probs, probs.new_zeros(1)])
    if probs.shape != (size,) or (probs < 0).any() or abs(float(probs.sum()) - 1) > 1e-6:
        raise ValueError(f"emission_mix_probs must be {size} (or {size - 1}, the comparison off) non-negative numbers "
                         f"summing to 1, got {probs.tolist()}")
    return torch.where(probs > 0, probs.log(), torch.full_like(probs, MASKED_LOGIT))


def initial_value(name: str, value, shape: tuple, spec: str, dtype) -> torch.Tensor:
    value = torch.as_tensor(value)
    if not value.dtype.is_floating_point:
        raise TypeError(f"init[{name!r}] must be a floating-point tensor, got dtype {value.dtype}")
    if tuple(value.shape) != shape:
        raise ValueError(f"init[{name!r}] must have shape {spec} = {shape}, got {tuple(value.shape)}")
    if name != "emission_mix" and not torch.isfinite(value).all():
        raise ValueError(f"init[{name!r}] must be finite, got a NaN or inf entry")
    return value.detach().clone().to(dtype)
