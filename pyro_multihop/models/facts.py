"""The structured-facts head: exact multi-hop attention over facts of several fields, reading the whole question.

Generative story for one row (``N`` facts of ``F`` fields, a question of ``M`` tokens, ``L`` hops, one
vocabulary of ``S`` symbols for facts, question and answer)::

    w_l = softmax_m(choice[l, q_m] + choice_position[l, min(m, P)])      # (M,) hop l's soft pick of question tokens
    z_1 ~ Categorical(softmax_j(s_1(j)))                                 # over real facts j
    for l = 2..L:
        z_l ~ Categorical(softmax_{j != z_{l-1}}(s_l(z_{l-1}, j)))        # reads every field of fact z_{l-1}
    target ~ Categorical(emission(fact z_L))                             # (S,): a table of a field, or a copy

    question ──> z_1 ──> z_2 ──> ... ──> z_L ──> target
                  │        │               │
            (facts (N, F), observed; every hop also reads the question)

(``path_normalised=True``: one softmax over whole paths in place of one per hop; ``answer_parts``: the target said
one part per hop, :mod:`.fact_hop_answers`; mixed into the emission, ``register``: the count or the set the question's
person holds, :mod:`.fact_register`, and ``composition``: a yes / no from two facts composed, :mod:`.fact_composition`.)

The score of candidate fact ``j`` at hop ``l``, given the fact ``i`` the previous hop attended, is a sum of
learned terms (each a small function below; ``f_i^a`` is field ``a`` of fact ``i``, ``[.]`` an indicator,
``U`` = :data:`~pyro_multihop.models.chained.DISTANCE_UNIT`)::

    s_l(i, j) = sum_m w_l[m] sum_b (question_equality[l, b] [q_m == f_j^b] + question_tables[l, b][q_m, f_j^b])
              + sum_{m, b, m', b'} question_pattern[l, m, b, m', b'] [q_m == f_j^b] [q_m' == f_j^b']
              + sum_{a, b} (field_equality[l, a, b] [f_i^a == f_j^b] + content_tables[l, a, b][f_i^a, f_j^b]
                            + [f_i^a != f_j^b both frame symbols] frame_content[l][f_i^a, f_j^b])
              + (age_slopes[l] + sum_a age_by_symbol[l, a, f_i^a]) min(age_j, D) / U
              + min(mention_slopes[l], 0) sum_m w_l[m] mention_age_j(q_m)   # recency among the facts naming q_m
              + [l = L] sum_a [f_j^a a frame symbol] last_fact_kind[f_j^a]  # a table head's last hop's
              + (offset_slopes[l] + sum_a offset_by_symbol[l, a, f_i^a]) min(|rank_j - rank_i|, D) / U
              + (direction_logits[l] + sum_a direction_by_symbol[l, a, f_i^a]) [rank_j > rank_i]
              + adjacent_logits[l, 0] [rank_j = rank_i - 1] + adjacent_logits[l, 1] [rank_j = rank_i + 1]
              + sum_{d, a} (nearest_weights[l, d, a] + sum_c nearest_by_symbol[l, d, c, f_i^c]) [j = near_d^a(i)]

A hop never attends the fact the hop before it attended (``revisit=False``, the default; the row's only real fact
excepted), so that no hop can idle by repeating its predecessor; ``revisit=True`` lets it (the chained head's rule).
Hop 1 has only the question, mention and age terms (and the fact kind where ``L = 1``); the previous-fact terms belong
to hops 2..L, so their parameters have ``L - 1`` rows (hop ``l``'s is row ``l - 2``; the formula writes ``l`` for
short). Question positions ``m`` count from 1; those past ``P`` (``max_question_len``) share the ``P``-th's logit (and
its ``question_pattern`` entries). The question pattern reads *where* the question's tokens stand in a candidate, two
at a time: "what is D of X" and "what is X D of" ask for facts that match the direction word and the place in opposite
arrangements, an exclusive or that no sum of single matches expresses (:meth:`FactAttention.pattern_term`).
``frame_content`` is one table for every field pair, over the *frame symbols* (``frame_symbols``: those that no
training question and no training answer names, e.g. the time words of a story): what a pair of them says wherever the
sentences put them; the entities that questions ask about and answers give stay out of it, so it cannot memorise them
(:meth:`FactAttention.pair_term`); ``last_fact_kind`` weighs them alone in the last hop's candidate: the kind of fact
an answer is read from (a move, not a pick-up). ``age_j`` counts the real facts after ``j``, ``rank_j`` those before
it; ``mention_age_j(q)`` the real facts after ``j`` that name ``q`` where ``j`` names it, 0 otherwise ("is X in Y?"
asks about X's latest fact, not an older one that names Y too, docs/facts.md); ``adjacent_logits``: the fact right
before or right after the previous one, which the linear offset term cannot single out ("then they went ..." follows
the fact that names them); ``near_before^a(i)`` (``near_after^a(i)``) is the nearest real fact before (after) ``i``
whose field ``a`` equals ``f_i^a``. Padded facts get zero attention; padded fields and padded question tokens enter no
term. The emission mixes, over the
real fields ``a`` of the last fact, a learned table and a copy, and a comparison of question tokens with the fact's
fields (:mod:`.fact_comparison`)::

    p(t | fact i) ∝ sum_a [real field a of i] (mix[0, a] softmax(emission_tables[a][f_i^a])[t]
                                              + mix[1, a] exp(copy_logit(i, a)) [t == f_i^a])
                    + mix[2 F] exp(sum_a compare_by_symbol[f_i^a]) p_compare(t | i)
    p_compare(t | i) = softmax_t(compare_bias[t] + sum_b match_b(i) (compare_logits[b, t]
                                  + sum_a compare_flip[f_i^a] compare_flip_logits[b, t])),
    match_b(i) = sum_m w_E[m] [q_m == f_i^b],   w_E = softmax_m(compare_choice[q_m] + compare_position[min(m, P)])

with ``mix = softmax(emission_mix)`` over the ``2 F + 1`` components: how much a field's copy weighs depends on the
symbol it would copy (a place, not a time word) and on the question (whether the question names that symbol, which
field its words ask for: ``copy_logit`` in :mod:`.fact_copy`), how much the comparison weighs on the fact's symbols.
Every term depends on the previous hop only through its fact ``i``, so the hop latents form a Markov chain over facts:
the likelihood, marginals, MAP and k-best paths, samples and entropy are exact (the engine's dense route, ``O(L N^2)``
per row). ``ChainedAttention`` is the special case ``F = 2`` (key, value), ``M = 1``, hop 1's ``question_tables[0,
0]`` = its first score table, ``content_tables[l, 1, 0]`` = the later ones, the emission the value field's table.

Memory: a chunk of ``c`` rows holds ``O(c N^2)`` numbers (field pair by field pair: never a ``(c, N, N, F, F)`` float
tensor) beside its ``(F, F, c, N, N)`` int32 pair indices, shared by its hops and the backward; the emission holds
``(c, N, S)``. The engine sizes chunks under its memory budget counting all of these. Symbol embeddings
(``embed_dim=D``): the three ``S x S`` tables become bilinear forms of one shared embedding (:mod:`.symbol_embedding`,
``O(S D + L F^2 D^2)`` parameters, no ``S x S`` tensor); every other term is as above.
"""

from __future__ import annotations

import functools
from typing import Optional

import pyro
import pyro.distributions as dist
import torch
from pyro.infer import config_enumerate
from pyro.nn import pyro_method
from pyro.ops.indexing import Vindex

from .. import engine
from ..distributions import CollapsedHopChain, GateCategorical
from ..data import FactObservations
from ..gate_ops import flat_gather, log_normalize
from ..engine.log_space import MASKED_LOGIT, HopChain, path_normalised_logits
from ..engine.moved_names import deprecated_aliases
from . import symbol_embedding as embedded
from .base import HopAttentionHead, check_positive_int
from . import fact_checkpoints, fact_comparison as comparison
from .fact_comparison import FLIP_START
from .fact_emission import FactEmission
from .fact_hop_answers import HopAnswers
from .fact_composition import PairComposition
from .fact_register import HeldRegister
from .fact_variational import EmbeddingPosterior
from .fact_features import FactFeatures, FieldPairs, nearest_sharing, padded
from .fact_parameters import (COPY_DECAY, EMBEDDED_STEPS, EQUALITY_START, EQUALITY_WEIGHTS, FRAME_DECAY, FRAME_SYMBOLS,
                              HELD_COPY_DECAY, ORDER_BY_SYMBOL, PARAMETER_SHAPES, TABLE_STEPS, WORD_ORDER_TERMS,
                              answer_symbols_tensor, frame_pairs, frame_symbols_mask, initial_value, mix_logits,
                              parameter_elements, parameter_shapes, shape_of)

__all__ = ["FactAttention", "nearest_sharing", "parameter_elements", "parameter_shapes",
           "PARAMETER_SHAPES", "EM_REFUSAL", "ORDER_BY_SYMBOL"]

#: Why :class:`FactAttention` has no EM: every term sits inside a hop's softmax normaliser (the emission's mix
#: inside its own), so the expected complete-data log-likelihood has no closed-form maximiser.
EM_REFUSAL = ("FactAttention has no closed-form EM: its equality weights, tables and order terms all sit inside each "
              "hop's softmax normaliser, so the M-step has no closed form; fit it by SVI (fit_svi)")

class FactAttention(HopAnswers, HeldRegister, PairComposition, FactEmission, EmbeddingPosterior, HopAttentionHead):
    """L-hop exact attention over facts of ``F`` fields that reads every field and the whole question.

    The generative story and the terms of the score are in the module docstring; every parameter is an
    unconstrained ``torch.nn.Parameter`` named as in :data:`PARAMETER_SHAPES`, 0 at the start (``emission_tables``
    and ``emission_mix`` uniform at 0 too) except the equality weights ``question_equality`` and ``field_equality``,
    at :data:`~.fact_parameters.EQUALITY_START`: the head starts out attending the facts that share symbols with
    the question and the previous fact (at 0, a chain of hops is a saddle that training does not leave; docs/facts.md,
    "Where training starts"). A ``register``'s and a ``composition``'s parameters start as their modules say.

    :param int n_hops: ``L``.
    :param int num_fields: ``F``, fields per fact.
    :param int num_symbols: ``S``, the one vocabulary of facts, questions and answers (so ``num_targets = S``).
    :param int max_question_len: ``P``, the question positions with a ``question_position`` logit of their own (the
        longest training question); a longer question is read, its tokens past the ``P``-th sharing the ``P``-th's logit
        (their own content still enters through ``question_choice`` and the tables).
    :param int max_distance: ``D``, where age and offset are clipped.
    :param dtype: dtype of the parameters (default: torch's default).
    :param dict init: optional initial values ``{name: tensor}`` (shapes as in :func:`parameter_shapes`);
        ``emission_mix`` may be given as probabilities under the name ``"emission_mix_probs"`` (zeros allowed: a
        component switched off exactly; ``2 F`` of them: the tables and copies, the comparison switched off).
    :param int embed_dim: None (default): the ``S x S`` tables. ``D``: symbol embeddings of ``D`` dimensions in their
        place (:mod:`.symbol_embedding`: ``O(S D)`` parameters and memory, for large vocabularies); ``symbol_embedding``
        and ``output_embedding`` start random (seeded by ``seed``), everything else at 0.
    :param int seed: seed of the random start of the embeddings (``embed_dim`` only; None: 0).
    :param str embedding_posterior: ``"point"`` (default): ``E`` a parameter; ``"mean_field"`` (needs ``embed_dim``):
        ``E`` a latent ``e_s ~ Normal(0, I)`` with a mean-field posterior and an annealed KL, the tied head's
        (:mod:`.fact_variational`; ``init`` may hold its means as ``symbol_embedding`` and its standard deviations as
        ``symbol_embedding_scale``).
    :param annealing: the KL weight's schedule under ``"mean_field"`` (default ``LinearAnnealing()``).
    :param bool comparison: whether the emission's comparison component is on (:mod:`.fact_comparison`: yes / no / maybe
        answers from matches of question tokens with the fact's fields). Off (the default), its mixture logit starts at
        ``MASKED_LOGIT``, where its weight and its gradient are exactly 0, so the head is the tables-and-copies head of
        earlier releases; an ``init`` of ``emission_mix`` overrides it.
    :param bool revisit: whether hop ``l`` may attend the fact hop ``l - 1`` attended (default False: it may not, unless
        the row has one real fact; checkpoints written before this option load with True, as they were trained).
    :param answer_symbols: None (default): the learnt parts of the emission (its tables and its comparison) put mass on
        every one of the ``S`` symbols. A sequence of ``A`` distinct symbols: on those alone (e.g. the training
        answers), so that their parameters are ``(.., A)`` and their normalisers cost ``O(A)``, not ``O(S)``; a target
        outside them is emitted by a copy or not at all (``pyro-multihop qa --embed-dim`` passes the training answers).
    :param embedded_symbols: ``embed_dim`` only. None (default): every symbol owns a row of ``E``. A bool sequence
        ``(S,)``: the symbols that do; the others' rows are 0 (:mod:`.fact_variational`), so that they enter the scores
        only through the equality terms, the copy and their ``O(S)`` vectors (``pyro-multihop qa --embed-dim`` passes
        the symbols of at least ``--embed-min-count`` training questions: :func:`.symbol_embedding.frequent_symbols`).
    :param frame_symbols: a table head only. None (default): no symbol is a frame symbol, and ``frame_content`` and
        ``last_fact_kind`` add nothing. A bool sequence ``(S,)``: the symbols whose pairs ``frame_content`` weighs, and
        ``last_fact_kind`` one at a time (``pyro-multihop qa`` passes those that no training question and no training
        answer names: :func:`.fact_parameters.frame_symbols_of`).
    :param answer_parts: None (default): the answer is emitted from the last hop's fact. ``{answer symbol: L part
        numbers}``: an answer per hop, part ``l`` said by hop ``l``'s fact from the side the path enters it
        (:mod:`.fact_hop_answers`; ``pyro-multihop qa`` passes it where every training answer has ``L`` parts).
    :param bool path_normalised: False (default): a softmax per hop (the story above). True: one softmax over whole
        paths of the summed scores (:func:`~pyro_multihop.engine.log_space.path_normalised_logits`, a CRF over the hops;
        still a Markov chain, every query exact): a hop-1 fact with no good way on loses its share.
    :param register: ``{"counts": R, "lists": [[answer symbol, [part symbols]], ...]}``: a held-set register in the
        emission, the count or the set that the question's person holds (:mod:`.fact_register`; default None: none).
    :param composition: ``D``: a composition of two facts in the emission, a yes / no from what they state together
        (:mod:`.fact_composition`; default None: none).

    Example::

        >>> from pyro_multihop import FactAttention, fact_chain_task
        >>> obs = fact_chain_task(50, seed=0)
        >>> head = FactAttention(2, 3, obs.num_symbols)
        >>> head.log_likelihood(obs).shape
        torch.Size([50])
    """

    def __init__(self, n_hops: int, num_fields: int, num_symbols: int, max_question_len: int = 8,
                 max_distance: int = 100, *, dtype=None, init: Optional[dict] = None,
                 embed_dim: Optional[int] = None, seed: Optional[int] = None, comparison: bool = False,
                 answer_symbols=None, embedding_posterior: str = "point", annealing=None, revisit: bool = False,
                 embedded_symbols=None, frame_symbols=None, answer_parts=None, path_normalised: bool = False,
                 register=None, composition: Optional[int] = None):
        super().__init__()
        self.comparison = bool(comparison)
        # False while a start holds the word-order terms at 0 (start_variant): left out of the scores, so they
        # get no gradient and stay 0, the same function as a head with them on at 0 (what its checkpoint loads as)
        self.word_order = True
        for name, value in (("revisit", revisit), ("path_normalised", path_normalised)):
            if not isinstance(value, bool):
                raise TypeError(f"{name} must be a bool, got {value!r}")
        self.revisit, self.path_normalised = revisit, path_normalised
        self.n_hops = check_positive_int("n_hops", n_hops)
        self.num_fields = check_positive_int("num_fields", num_fields)
        self.num_symbols = self.num_targets = check_positive_int("num_symbols", num_symbols)
        self.max_question_len = check_positive_int("max_question_len", max_question_len)
        self.max_distance = check_positive_int("max_distance", max_distance)
        self.embed_dim = None if embed_dim is None else check_positive_int("embed_dim", embed_dim)
        answers = answer_symbols_tensor(answer_symbols, self.num_symbols)
        self.num_answers = self.num_symbols if answers is None else len(answers)
        # answer_index[s]: the answer number of symbol s (padding: S), -1 where the learnt parts cannot emit it
        index = torch.arange(self.num_symbols + 1) if answers is None else torch.full((self.num_symbols + 1,), -1)
        if answers is not None:
            index[answers] = torch.arange(len(answers))
        self.register_buffer("answer_symbols", answers, persistent=False)
        self.register_buffer("answer_index", index, persistent=False)
        dtype = torch.get_default_dtype() if dtype is None else dtype
        init = dict(init or {})
        initial_scale = self._posterior_options(embedding_posterior, annealing, init)
        self._embedded_symbols_option(embedded_symbols, self.num_symbols)
        frame = frame_symbols_mask(frame_symbols, self.num_symbols, self.embed_dim)
        if frame is not None:
            self.register_buffer(FRAME_SYMBOLS, frame)
        probs = init.pop("emission_mix_probs", None)
        if probs is not None:
            init["emission_mix"] = mix_logits(torch.as_tensor(probs, dtype=dtype), num_fields)
        shapes = parameter_shapes(self.embed_dim)
        unknown = sorted(set(init) - set(shapes))
        if unknown:
            raise ValueError(f"init names unknown parameters {unknown}; known are {sorted(shapes)}")
        generator = torch.Generator().manual_seed(0 if seed is None else int(seed))
        for name, spec in shapes.items():
            shape = shape_of(spec, n_hops, num_fields, num_symbols, max_question_len, self.embed_dim or 0,
                           self.num_answers)
            if name in init:
                value = initial_value(name, init[name], shape, spec, dtype)
            elif name == "emission_mix" and not self.comparison:
                value = torch.zeros(shape, dtype=dtype)
                value[-1] = MASKED_LOGIT  # the comparison component off: weight and gradient exactly 0
            elif name in embedded.RANDOM_START:
                value = torch.randn(shape, generator=generator, dtype=dtype) / self.embed_dim ** 0.5
            elif name in EQUALITY_WEIGHTS:
                value = torch.full(shape, EQUALITY_START, dtype=dtype)
            elif name == "compare_flip":
                value = torch.full(shape, FLIP_START, dtype=dtype)
            else:
                value = torch.zeros(shape, dtype=dtype)
            self._set_parameter(name, value, initial_scale)
        self._answer_parts_option(answer_parts, dtype)
        self._register_option(register, dtype)
        self._composition_option(composition, dtype)

    def start_variant(self, start: int) -> Optional[str]:
        """Start ``start`` of ``fit_svi(starts=K)``, set in place: the head's other starts, so that the held-out
        likelihood chooses among them; its description, or None (start 0, or past them: the fit perturbs it).

        - With the comparison on, start 1 is the emission without it (its mixture logit at ``MASKED_LOGIT``,
          weight and gradient exactly 0: the comparison can answer before the hops have found their facts, bAbI
          task 15), start 2 the equality weights at 0, start 3 both.
        - Without it, start 1 is the equality weights at 0.
        - Then the same starts again (the head's own first) with the word-order terms held at 0
          (:data:`~.fact_parameters.WORD_ORDER_TERMS`: the question's pattern and the frame table): starts 4-7
          with the comparison on, 2-3 without it.
        - With a ``composition``: starts 1-3 the composition alone, 4.. the above without it (:mod:`.fact_composition`).

        The equality start is the default because at 0 a chain of hops can idle (bAbI tasks 3 and 15), but from it a
        hop can settle on a fact that merely shares symbols with the question (bAbI tasks 6 and 9; docs/facts.md,
        "Where training starts"). The word-order terms let a hop read where the question's words stand (task 4) and
        how frame words follow each other (task 14); they trap tasks 9 and 15 from every start, and the frame table
        task 15 at 10k. Those starts fit ``copy_by_question`` under the stronger prior :data:`HELD_COPY_DECAY`."""
        self.word_order = True
        plain = (("comparison",), ("zero",), ("zero", "comparison")) if self._comparison_weighs() else (("zero",),)
        variants = self.composition_variants(plain + tuple(("held",) + variant for variant in ((),) + plain))
        if not 1 <= start <= len(variants):
            return None
        said = self.composition_start(variants[start - 1])
        with torch.no_grad():
            if "held" in variants[start - 1]:
                self.word_order = False
                for name in WORD_ORDER_TERMS:
                    if hasattr(self, name):  # an embedded head has no frame table
                        getattr(self, name).zero_()
                said.append("the word-order terms held at 0")
            if "zero" in variants[start - 1]:
                for name in EQUALITY_WEIGHTS:
                    getattr(self, name).zero_()
                said.append("the equality weights at 0")
            if "comparison" in variants[start - 1]:
                self.emission_mix[-1] = MASKED_LOGIT
                said.append("the emission without its comparison component")
        return " and ".join(said)

    def config(self) -> dict:
        """The constructor's arguments, the optional ones only where set (:meth:`config_from_checkpoint` reads older ones)."""
        config = {"n_hops": self.n_hops, "num_fields": self.num_fields, "num_symbols": self.num_symbols,
                  "max_question_len": self.max_question_len, "max_distance": self.max_distance}
        config = config if self.embed_dim is None else {**config, "embed_dim": self.embed_dim}
        config = {**config, "revisit": self.revisit, **({"path_normalised": True} if self.path_normalised else {})}
        config = config if self.answer_symbols is None else {**config, "answer_symbols": self.answer_symbols.tolist()}
        config = {**config, **self._posterior_config()}
        config = {**config, "answer_parts": self.answer_parts_config()} if self.per_hop_answers else config
        config = {**config, "register": self.register_config()} if self.uses_register else config
        config = {**config, "composition": self.composition_dim} if self.uses_composition else config
        return {**config, "comparison": True} if self.comparison else config

    # what a checkpoint written by an earlier release means, and why one of the other kind cannot load
    config_from_checkpoint = staticmethod(fact_checkpoints.config_from_checkpoint)
    state_from_checkpoint = staticmethod(fact_checkpoints.state_from_checkpoint)

    def kind(self) -> str:
        """Which parameters this head has, in words: its ``S x S`` tables or its symbol embeddings."""
        return "a table head (embed_dim=None: S x S tables)" if self.embed_dim is None else \
            f"an embedded head (embed_dim={self.embed_dim}: symbol embeddings)"

    def checkpoint_mismatch(self, config: dict, state_dict: dict) -> Optional[str]:
        """Why a checkpoint cannot load into this head, with what to do, or None (:func:`.fact_checkpoints`'s)."""
        return fact_checkpoints.checkpoint_mismatch(self, config, state_dict)

    def svi_defaults(self) -> dict:
        """One set of :func:`~pyro_multihop.train.fit_svi` settings for every task: full-batch steps, 600 in a table
        head and 300 in an embedded one (:data:`~.fact_parameters.TABLE_STEPS`, :data:`~.fact_parameters.EMBEDDED_STEPS`),
        lr 0.1 decaying to 0.01, and weight decay 3e-2 on the symbol-indexed tables of the scores and on
        ``compare_choice``, ``compare_by_symbol``, ``compare_flip`` and ``question_pattern``, 3e-3 on
        ``copy_by_question`` (:data:`COPY_DECAY`; 1e-2, :data:`HELD_COPY_DECAY`, in a start that holds the word-order
        terms at 0: :meth:`start_variant`), and in a table head 3e-3 on ``copy_by_symbol`` (3e-2 in an embedded
        head), on ``frame_content`` (:data:`FRAME_DECAY`), ``last_fact_kind`` and the order terms by the previous
        fact's symbols (:data:`ORDER_BY_SYMBOL`) (a Gaussian prior of precision ``n`` times the decay; docs/facts.md, the
        copy's question terms, the frame table and the order terms' decay). Adam steps every table entry as far as a
        shared weight, so without the prior the tables memorise the training symbols as fast as the equality weights
        learn the rule; the prior pulls an entry back in proportion to how rarely it is used, and leaves the equality,
        order and mixing weights, which carry over to symbols never seen, free; a weaker decay lets the tables
        memorise entities and fail on unseen ones (the default's held-out accuracy on unseen entities:
        ``benchmarks/results/facts_learning.md``). The emission tables are not decayed: where the answer's form
        never occurs in a fact (a language that inflects nouns) only they can produce it, and a decay there pulls
        that mapping back towards uniform (bAbI through this head: ``benchmarks/results/babi_facts.md``). An embedded
        head decays its ``symbol_embedding`` and the question and content forms in place of the tables, at 2e-3
        (measured on entities training never showed, 2e-2 and 3e-2 beside: docs/facts.md, "Symbol embeddings"). A
        symbol that training never showed has a gradient of the decay alone, so its row is pulled to 0."""
        tables = ("question_tables", "content_tables", "question_choice", "age_by_symbol", "offset_by_symbol",
                  "direction_by_symbol", "nearest_by_symbol", "copy_by_symbol", "compare_choice", "compare_by_symbol",
                  "compare_flip")
        decay = {name: 3e-2 for name in tables}
        if self.embed_dim is not None:  # the embedding rows are the per-symbol entries, the forms what memorises
            decay = {**{name: 2e-3 for name in ("symbol_embedding", "question_bilinear", "content_bilinear")},
                     **{name: 3e-2 for name in tables[2:]}}
        else:  # measured on bAbI: docs/facts.md, the order terms' decay and the frame table
            decay.update({name: 3e-3 for name in ORDER_BY_SYMBOL + ("last_fact_kind",)}, frame_content=FRAME_DECAY,
                         copy_by_symbol=COPY_DECAY)
        # measured on bAbI: docs/facts.md, the copy's question terms (the stronger prior in a start that holds the
        # word-order terms at 0)
        decay["copy_by_question"] = COPY_DECAY if self.word_order else HELD_COPY_DECAY
        decay["question_pattern"] = 3e-2  # measured on bAbI: docs/facts.md, the question pattern
        steps = TABLE_STEPS if self.embed_dim is None else EMBEDDED_STEPS
        return {"num_steps": steps, "lr": 0.1, "lr_decay": 0.1, "batch_size": None,
                "weight_decay": self._posterior_decay(decay)}

    def check_observations(self, obs, name: str = "obs") -> FactObservations:
        """Raise ``TypeError``/``ValueError`` naming the field if ``obs`` does not fit this head."""
        if not isinstance(obs, FactObservations):
            raise TypeError(f"{name} must be pyro_multihop.FactObservations, got {type(obs).__name__}")
        if obs.num_fields != self.num_fields:
            raise ValueError(f"{name}.facts must have num_fields = {self.num_fields} fields, got {obs.num_fields}")
        obs.check_sizes(self.num_symbols)
        return obs

    # -- the terms of the score ------------------------------------------------------------------------------
    def _chunk(self, obs: FactObservations) -> FactFeatures:
        return FactFeatures(obs, self.num_symbols, self.max_distance, self.age_slopes.dtype)

    def question_weights(self, hop: int, chunk: FactFeatures) -> torch.Tensor:
        """``(c, M)``: hop ``hop``'s soft choice among the question's real tokens (rows on the simplex)."""
        # Positions past the P-th share its logit (a question longer than the training ones is read, not refused).
        return comparison.token_weights(padded(self.question_choice[hop], 1), self.question_position[hop],
                                        chunk.question, chunk.real_tokens)

    def question_term(self, hop: int, chunk: FactFeatures) -> torch.Tensor:
        """``(c, N)``: ``sum_m w[m] (sum_b (question_equality[hop, b] [q_m == f_j^b] + question_tables[hop, b][q_m, f_j^b])
        + min(mention_slopes[hop], 0) mention_age_j(q_m))`` (:meth:`FactFeatures.mention_ages`): one ``(c, M, F, N)``
        gather from the tables at :meth:`FactFeatures.question_index` (embedded: :func:`.symbol_embedding.question_term`)."""
        weights = self.question_weights(hop, chunk)  # (c, M)
        slope = self.mention_slopes[hop].clamp(max=0)  # the latest mention preferred, never the oldest
        mentions = slope * (weights.unsqueeze(-1) * chunk.mention_ages()).sum(1)  # (c, N)
        if self.embed_dim is not None:
            return mentions + embedded.question_term(weights, chunk.question, chunk.fields, chunk.real_fields,
                                                     *self.symbol_vectors(chunk), self.question_equality[hop],
                                                     self.question_bilinear[hop])
        S = self.num_symbols
        eye = torch.eye(S, dtype=weights.dtype, device=weights.device)
        tables = padded(self.question_tables[hop] + self.question_equality[hop, :, None, None] * eye, 2)  # (F, S+1, S+1)
        match = flat_gather(tables, chunk.question_index())  # (c, M, F, N)
        return mentions + (weights[..., None, None] * match).sum((1, 2))

    def candidate_term(self, hop: int, chunk: FactFeatures) -> torch.Tensor:
        """``(c, N)``: candidate ``j``'s own terms: the question's, the pattern's, the last hop's ``last_fact_kind``."""
        about = self.question_term(hop, chunk) + self.pattern_term(hop, chunk)
        if self.embed_dim is not None or hop != self.n_hops - 1:
            return about
        kind = self.last_fact_kind * self.frame_symbols.to(self.last_fact_kind.dtype)
        return about + padded(kind, 1)[chunk.fields].sum(-1)  # padding's entry 0

    def pattern_term(self, hop: int, chunk: FactFeatures) -> torch.Tensor:
        """``(c, N)``: ``u_j^T question_pattern[hop] u_j``, with ``u_j`` ``(P F,)`` the counts of question tokens at
        each position equal to each real field of fact ``j`` (:meth:`FactFeatures.question_matches`): a weight for
        every pair of (position, field) matches, so a match can count for or against a candidate depending on
        another. ``O(c N (P F)^2)``, no symbol table: the same for the embedded head."""
        if not self.word_order:  # held at 0 by a start (start_variant): no counts to build
            return chunk.age.new_zeros(chunk.real.shape)
        matches = chunk.question_matches(self.max_question_len)  # (c, N, P F)
        K = matches.shape[-1]
        return (matches @ self.question_pattern[hop].reshape(K, K) * matches).sum(-1)

    def pair_term(self, hop: int, chunk: FactFeatures) -> torch.Tensor:
        """``(c, N, N)``: ``sum_{a, b} field_equality[hop - 1, a, b] [f_i^a == f_j^b] + content_tables[hop - 1, a, b][f_i^a, f_j^b]``
        ``+ frame_content[hop - 1][f_i^a, f_j^b]`` (the last where both are distinct frame symbols).

        The equality weight and the frame table are folded into each pair's table (``+ w I + frame``). While
        ``2 (S + 1) <= F N`` (:attr:`FactFeatures.by_rows`), for each candidate field ``b`` the rows ``sum_a T_ab[f_i^a]`` ``(c, N, S + 1)`` are formed and gathered at
        ``f_j^b`` (``F`` gathers of ``(c, N, N)``); otherwise each field pair is one gather from its flat table
        at a ``(c, N, N)`` index, summed in place (the faster of the two below that size: the row sums cost
        ``O(c N F^2 S)``, the flat gathers ``O(c N^2 F^2)``; ``benchmarks/results/facts.md``). Either way no
        ``(c, N, N, F, F)`` tensor. Embedded: :func:`.symbol_embedding.pair_term`."""
        S, F = self.num_symbols, self.num_fields
        if self.embed_dim is not None:
            return embedded.pair_term(chunk.fields, chunk.real_fields, self.symbol_vectors(chunk)[1],
                                      self.field_equality[hop - 1], self.content_bilinear[hop - 1])
        eye = torch.eye(S, dtype=self.content_tables.dtype, device=self.content_tables.device)
        tables = self.content_tables[hop - 1] + self.field_equality[hop - 1, ..., None, None] * eye
        if self.word_order:  # held at 0 by a start (start_variant): out of the scores, no gradient
            tables = tables + self.frame_content[hop - 1] * frame_pairs(self.frame_symbols, eye)
        tables = padded(tables, 2)
        if chunk.by_rows:
            # unbind, not tables[a, b]: each select's backward would fill a zero tensor of all the tables
            by_pair = [row.unbind(0) for row in tables.unbind(0)]  # by_pair[a][b]: (S + 1, S + 1)
            term = 0.0
            c, N, _ = chunk.fields.shape
            for b in range(F):
                rows = sum(torch.nn.functional.embedding(chunk.fields[..., a], by_pair[a][b]) for a in range(F))
                term = term + rows.gather(-1, chunk.fields[..., b].unsqueeze(-2).expand(c, N, N))
            return term
        return FieldPairs.apply(tables, chunk.pair_index())

    def symbol_vectors(self, chunk: FactFeatures):
        """``(question (c, M, D), facts (c, N, F, D))`` rows of the symbol embedding (zero at padding), gathered once
        a chunk (:func:`.symbol_embedding.chunk_vectors`)."""
        if chunk.vectors is None:
            chunk.vectors = embedded.chunk_vectors(self.embedding_matrix(), chunk.question, chunk.fields)
        return chunk.vectors

    def _by_previous(self, name: str, hop: int, chunk: FactFeatures) -> torch.Tensor:
        """``(c, N)``: ``sum_a name[hop - 1, a, f_i^a]``, a weight that depends on the previous fact's fields."""
        table = padded(getattr(self, name)[hop - 1], 1)  # (F, S + 1)
        return table.gather(1, chunk.fields.flatten(0, 1).t()).t().reshape(chunk.fields.shape).sum(-1)

    def add_order_term(self, hop: int, chunk: FactFeatures, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` ``(c, N, N)`` plus, in place, age, offset and direction, with slopes that depend on the
        previous fact ``i``, and the weights of the facts right before and right after ``i``."""
        k = hop - 1
        distance, later, just_before, just_after = chunk.order_features()
        age = (self.age_slopes[hop] + self._by_previous("age_by_symbol", hop, chunk)).unsqueeze(-1)
        offset = (self.offset_slopes[k] + self._by_previous("offset_by_symbol", hop, chunk)).unsqueeze(-1)
        forward = (self.direction_logits[k] + self._by_previous("direction_by_symbol", hop, chunk)).unsqueeze(-1)
        logits = logits.addcmul_(age, chunk.age.unsqueeze(-2)).addcmul_(offset, distance).addcmul_(forward, later)
        return logits.addcmul_(self.adjacent_logits[k, 0], just_before).addcmul_(self.adjacent_logits[k, 1], just_after)

    def add_nearest_term(self, hop: int, chunk: FactFeatures, logits: torch.Tensor) -> torch.Tensor:
        """``logits`` plus, in place, ``(nearest_weights[hop - 1, d, a] + sum_c nearest_by_symbol[hop - 1, d, c, f_i^c])`` at
        ``j = near_d^a(i)``: a scatter of ``2 F`` numbers per row ``i``, no ``(N, N)`` feature tensor."""
        index, found = chunk.nearest_facts()  # (c, N, 2 F) each
        c, N, F = chunk.fields.shape
        by_symbol = padded(self.nearest_by_symbol[hop - 1], 1)  # (2, F, S + 1)
        fields = chunk.fields.reshape(c * N, F)
        depends = sum(by_symbol[:, a].index_select(1, fields[:, a]) for a in range(F))  # (2, c N)
        # (2, F, c N): broadcasting over a last dim of c N, several times faster than over one of F
        weights = self.nearest_weights[hop - 1].unsqueeze(-1) + depends.unsqueeze(1)
        weights = weights.view(2 * F, c, N).permute(1, 2, 0) * found  # (c, N, 2 F)
        return logits.scatter_add_(-1, index, weights)

    def hop_logits(self, obs: FactObservations, chunk: Optional[FactFeatures] = None):
        """Unnormalised gate logits, padded facts (and, without ``revisit``, the previous hop's fact) at
        ``MASKED_LOGIT``: ``(first (c, N), [later (c, N, N)] * (L - 1))``, ``later[l - 2][r, i, j] = s_l(i, j)`` (with
        ``path_normalised``, shifted by :func:`~pyro_multihop.engine.log_space.path_normalised_logits`)."""
        chunk = self._chunk(obs) if chunk is None else chunk
        blocked = ~chunk.real.unsqueeze(-2)  # (c, 1, N): padded candidates
        if not self.revisit:  # nor the previous hop's fact, unless it is the row's only real fact
            stay = torch.eye(chunk.real.shape[-1], dtype=torch.bool, device=blocked.device)
            blocked = blocked | (stay & (chunk.real.sum(-1) > 1).view(-1, 1, 1))  # (c, N, N)
        first = self.candidate_term(0, chunk) + self.age_slopes[0] * chunk.age
        first = first.masked_fill(~chunk.real, MASKED_LOGIT)
        later = []
        for hop in range(1, self.n_hops):
            # Every term is added in place into the fresh pair term: none of these ops keeps its input.
            logits = self.pair_term(hop, chunk).add_(self.candidate_term(hop, chunk).unsqueeze(-2))
            logits = self.add_nearest_term(hop, chunk, self.add_order_term(hop, chunk, logits))
            later.append(logits.masked_fill_(blocked, MASKED_LOGIT))
        return path_normalised_logits(first, later) if self.path_normalised else (first, later)

    def hop_chain(self, obs: FactObservations) -> HopChain:
        """Dense log factors of the hop chain of a chunk (``init (c, N)``, ``trans (L - 1, c, N, N)``)."""
        first, later = self.hop_logits(obs)
        c, N = first.shape
        trans = torch.stack([log_normalize(x) for x in later]) if later else first.new_zeros(0, c, N, N)
        return HopChain(log_normalize(first), trans)

    def hop_factors(self) -> engine.HopFactors:
        """The dense factors and the per-fact emission as the engine takes them."""
        F, L, S, P = self.num_fields, self.n_hops, self.num_symbols, self.max_question_len

        def extra_elements(N: int) -> float:
            # the chunk's pair indices (F^2 N^2, int32, kept for every hop) and a gather, the order terms of a hop and
            # the two neighbour masks, the emission's logaddexps, the question's (M, F, N) index and matches and
            # mention ages, the pattern's (P F) counts and their product with it; an answer per hop, a register
            return ((2 * F * F + 6 * max(L - 1, 1) + 2 * F + 2) * N * N + 6 * N * S + P * N * (5 * F + 3)
                    + self.part_elements(N) + self.register_elements(N) + self.composition_elements(N))

        def embedded_elements(N: int) -> float:
            # the F^2 equality matches kept for the backward and the pair product, the order terms of a hop and
            # the two neighbour masks, the question's (M, N, F) matches and mention ages, the facts' embeddings and
            # their products with the forms, the (c, N, A) tables of predictions over the answers (the engine counts
            # the (c, N, S) emission of predict_proba itself; the normaliser's blocks take a quarter of the budget)
            D, A = self.embed_dim, self.num_answers
            return ((2 * F * F + 6 * max(L - 1, 1) + 4) * N * N + 4 * N * A + P * N * (5 * F + 3) + 4 * L * N * F * D
                    + self.part_elements(N) + self.register_elements(N) + self.composition_elements(N))

        position_target = self.target_log_probs
        if self.embed_dim is not None:  # the emission's normalisers once per (field, symbol) of the query
            position_target = functools.partial(self.target_log_probs, normalisers=self.field_normalisers())
        # a draw of E fixed now (the model's) is the one the engine's later calls read
        chain, emission, target, mixture = map(self._at_this_embedding, (self.hop_chain, self.emission_log_probs,
                                                                         position_target, self.emission_mixture))
        target_chain = None
        if self.per_hop_answers:  # the target's factors along the chain, none at its end (fact_hop_answers)
            def target(chunk):  # 0 at every position: the target's last factor is in the chain
                return self.age_slopes.new_zeros(len(chunk), chunk.context_len)
            target_chain, mixture = self.target_chain, None
        return engine.HopFactors(None, chain, L, position_emission=emission, position_target=target,
                                 position_mixture=mixture, target_chain=target_chain,
                                 extra_elements=extra_elements if self.embed_dim is None else embedded_elements,
                                 num_symbols=S, num_targets=self.num_targets,
                                 dtype=self.age_slopes.dtype, device=self.age_slopes.device)

    # -- Pyro models ---------------------------------------------------------------------------------------------
    @pyro_method
    @config_enumerate
    def model(self, obs: FactObservations, subsample_size: Optional[int] = None, kl_weight=1.0) -> None:
        """Enumerated model: plate ``observations`` (dim -1), hop sites ``z_1..z_L`` (enumerated in parallel) and
        the observed ``target``, sampled inside the last hop's ``pyro.markov`` iteration (with ``answer_parts``, the
        observed ``answer_part_l`` inside hop ``l``'s, in its place). ``Trace.format_shapes()``
        (L = 2, n = 4, N = 6): ``z_1`` value ``(6, 1)``, ``z_2`` value ``(6, 1, 1)``, ``target`` dist ``(6, 1, 4)``. A
        mean-field ``E`` is the site ``symbol_embedding`` first, under ``scale_kl(kl_weight)`` (:mod:`.fact_variational`)."""
        self.check_observations(obs)
        with self.drawn_embedding(kl_weight), \
                pyro.plate("observations", len(obs), subsample_size=subsample_size, dim=-1) as index:
            batch = _rows(obs, index, subsample_size)
            chunk = self._chunk(batch)
            first, later = self.hop_logits(batch, chunk)
            log_emission = None if self.per_hop_answers else self.emission_log_probs(batch)  # (c, N, S)
            rows = torch.arange(len(batch), device=batch.device)
            position = None
            for hop in pyro.markov(range(self.n_hops)):
                logits = first if hop == 0 else Vindex(later[hop - 1])[rows, position]  # (..., c, N)
                previous, position = position, pyro.sample(f"z_{hop + 1}", GateCategorical(logits),
                                                           infer={"enumerate": "parallel"})
                if self.per_hop_answers:  # an answer per hop: a site at every hop (fact_hop_answers)
                    self.observe_answer_part(hop, chunk, batch.target, rows, previous, position)
                elif hop == self.n_hops - 1:
                    pyro.sample("target", dist.Categorical(logits=Vindex(log_emission)[rows, position]), obs=batch.target)

    @pyro_method
    def collapsed_model(self, obs: FactObservations, subsample_size: Optional[int] = None, kl_weight=1.0) -> None:
        """The model with the hop path summed out by the engine: one site ``target ~ CollapsedHopChain`` (after
        ``symbol_embedding``, as in :meth:`model`, under a mean-field ``E``)."""
        self.check_observations(obs)
        with self.drawn_embedding(kl_weight), \
                pyro.plate("observations", len(obs), subsample_size=subsample_size, dim=-1) as index:
            batch = _rows(obs, index, subsample_size)
            pyro.sample("target", CollapsedHopChain(self.hop_factors(), batch), obs=batch.target)

    # ``guide`` (:class:`.fact_variational.EmbeddingPosterior`): empty for a point estimate, the posterior of ``E`` else.

    def em_refusal(self) -> str:
        """Why this head has no EM (:data:`EM_REFUSAL`); ``ChainedEM`` raises it when handed this head or its data."""
        return EM_REFUSAL

    def extra_repr(self) -> str:
        return (f"n_hops={self.n_hops}, num_fields={self.num_fields}, num_symbols={self.num_symbols}, "
                f"max_question_len={self.max_question_len}, max_distance={self.max_distance}"
                + ("" if self.embed_dim is None else f", embed_dim={self.embed_dim}")
                + ("" if self.answer_symbols is None else f", num_answers={self.num_answers}")
                + (f", register_counts={self.num_counts}" if self.uses_register else "")
                + (f", composition={self.composition_dim}" if self.uses_composition else ""))


# Moved to fact_truth (the generating structure of fact_chain_task); the old path is kept for one release.
__getattr__ = deprecated_aliases(__name__, {"fact_chain_truth": (f"{__package__}.fact_truth", "fact_chain_truth")})


def _rows(obs: FactObservations, index: torch.Tensor, subsample_size: Optional[int]) -> FactObservations:
    """The plate's mini-batch of ``obs`` (all of it without subsampling)."""
    return obs if subsample_size is None or subsample_size >= len(obs) else obs[index]
