"""A composition of two facts in the structured-facts head's emission (``FactAttention``'s ``composition``): a yes /
no answer from what two facts state together ("is A left of B?" after "A is above C" and "C is left of B"; "does A fit
in B?" after "A fits inside C" and "B is bigger than C").

Generative story for one row (``N`` facts of ``F`` fields, question tokens ``q_1..q_M``, ``D`` dimensions, ``A``
answers of the learnt emission)::

    (i, j) ~ Uniform(ordered pairs of distinct real facts)     # the fact with itself where a row has one fact
    d(i) = sum_a composition_relation[f_i^a]                    # (D,): what fact i states
    u = sum_m composition_question[q_m]                         # (D,): what the question asks
    r(i | j) = tanh(3 sum_{m, b} composition_gate[q_m] x_m composition_side[b] [q_m == f_i^b] [q_m in no field of j])
    a(i, j) = r(i | j) <d(i), u> + r(j | i) <d(j), u>
    target ~ Categorical(softmax_t(composition_bias[t] + composition_out[t] a(i, j)))

``r(i | j)`` says on which side of fact ``i``'s relation the thing the question names (and fact ``j`` does not)
stands, and on which side of the question: ``x_m = 1 - 2 min(m, P - 1) / (P - 1)`` is a fixed ramp over the
question's positions (+1 at the first, -1 at the last), ``composition_side`` a learnt weight per field. With
``A - C = r d(i)`` and ``C - B = r d(j)``, ``A - B`` is their sum and the answer is its component along the
question's relation: bAbI tasks 17 and 18 follow that rule in all 2000 questions of each (docs/babi.md).

Why the pair is latent and uniform, not the hops': the component then does not depend on the hop path, so it is
the same factor at every attended fact and every query of the engine stays exact and unchanged (as with the held-set
register, :mod:`.fact_register`); ``p(target) = mean over pairs`` is exact, ``O(N^2 (M + A))`` a row. Why the
question's side is a fixed ramp: learnt (a weight per position) it did not leave the start in a prototype on task 17
(52-72 % of the test answers), held at the ramp 97-98 % (docs/babi.md). The ramp reads no word; the fields' sides,
which words relate and what the question asks are learnt. In the head's several starts, starts 1-3 are the
composition alone, from three draws of its vectors, and the head's own starts follow without it
(:meth:`PairComposition.composition_variants`).
"""

from __future__ import annotations

import torch

from ..engine.log_space import MASKED_LOGIT, log_mixture
from .fact_features import padded, padded_rows
from .fact_parameters import shape_of

__all__ = ["COMPOSITION_SHAPES", "COMPOSITION_ALONE_STARTS", "COMPOSITION_EXTRA_STARTS", "symbol_vectors",
           "question_sides", "pair_scores",
           "composition_answer_log_probs", "composition_target_log_probs", "PairComposition"]

#: Shapes of the composition's parameters (only in a head given ``composition=D``).
COMPOSITION_SHAPES = {"composition_gate": "(S,)", "composition_side": "(F,)", "composition_relation": "(S, D)",
                      "composition_question": "(S, D)", "composition_bias": "(A,)", "composition_out": "(A,)",
                      "composition_mix": "(1,)"}

#: The scale of the symbol vectors' random start (a start at 0 is a saddle: ``a`` is a product of them). Measured on
#: bAbI task 17, 1k, the composition alone: a draw falls into a trap (70-78 % of the answers, training log-likelihood
#: about -0.33 against -0.02) at 0.1 four times in nine and at 0.5 three times in ten, on the task and on its
#: relabelled copy, and not always the same draws (at 1.0 one of two); hence several draws
#: (:data:`COMPOSITION_ALONE_STARTS`; docs/facts.md, "A composition of two facts").
VECTOR_START_SCALE = 0.5

#: Where ``composition_mix`` starts: ``kappa = sigmoid(3) = 0.95``, so that the composition learns before the other
#: components explain the answers' frequencies (from 0, bAbI task 17's fits drove ``kappa`` to 0.01 and answered
#: 81.8 %).
MIX_START = 3.0

#: ``composition_mix`` in the start of the composition alone: the other components' share ``sigmoid(-30)``.
ALONE_START = 30.0

#: How many starts of the composition alone ``fit_svi(starts=K)`` has, from as many draws of its symbol vectors
#: (:meth:`PairComposition.composition_variants`): a draw can fall into a trap (:data:`VECTOR_START_SCALE`; the
#: relabelled task, whose symbols take other rows of the same draw, can fall where the task did not), and the
#: held-out likelihood tells a trap apart (training log-likelihood about -0.33 against -0.02 on bAbI task 17).
COMPOSITION_ALONE_STARTS = 3

#: How many more starts ``fit_svi(starts=K)`` has where the composition is on: the composition alone
#: (:data:`COMPOSITION_ALONE_STARTS`) and the head's own start without it.
COMPOSITION_EXTRA_STARTS = COMPOSITION_ALONE_STARTS + 1

#: The sharpness of a role: ``r = tanh(ROLE_SHARPNESS * score)``, about +-1 once one token matches.
ROLE_SHARPNESS = 3.0


def symbol_vectors(num_symbols: int, dim: int, draw: int, dtype=None):
    """``(relation, question)``, each ``(S, D)``: the random start of ``composition_relation`` and
    ``composition_question`` (scale :data:`VECTOR_START_SCALE`), draw number ``draw`` (0: the head's own)."""
    generator = torch.Generator().manual_seed(draw)
    return tuple(VECTOR_START_SCALE * torch.randn(num_symbols, dim, generator=generator, dtype=dtype)
                 for _ in range(2))


def question_sides(question_len: int, num_positions: int, dtype=None, device=None) -> torch.Tensor:
    """``(M,)``: ``x_m``, the fixed ramp from +1 at the first question position to -1 at the ``P``-th; positions past
    it share the last."""
    ramp = torch.linspace(1, -1, num_positions, dtype=dtype, device=device) if num_positions > 1 else \
        torch.ones(1, dtype=dtype, device=device)
    return ramp[torch.arange(question_len, device=device).clamp(max=num_positions - 1)]


def pair_scores(fields, real_fields, question, real_tokens, gate, side, relation, question_relation,
                num_positions: int):
    """``(a (c, N, N), pairs (c, N, N) bool)``: the score ``a(i, j)`` of every ordered pair and which pairs are
    drawn (distinct real facts; the diagonal of a row with one real fact). ``fields`` ``(c, N, F)`` and ``question``
    ``(c, M)`` with padding mapped to ``S``, ``real_fields``, ``real_tokens`` their masks; ``gate`` ``(S,)``,
    ``side`` ``(F,)``, ``relation`` and ``question_relation`` ``(S, D)``."""
    c, N, F = fields.shape
    M = question.shape[1]
    dtype = relation.dtype
    match = (question[:, None, :, None] == fields[:, :, None, :]) & real_tokens[:, None, :, None] \
        & real_fields[:, :, None, :]  # (c, N, M, F)
    inside = match.any(-1)  # (c, N, M): q_m in some field of the fact
    token_weight = padded(gate, 1)[question] * question_sides(M, num_positions, dtype, fields.device)  # (c, M)
    sided = (match.to(dtype) * side).sum(-1) * token_weight[:, None, :]  # (c, N, M)
    role = torch.tanh(ROLE_SHARPNESS * torch.einsum("cim,cjm->cij", sided, (~inside).to(dtype)))  # r(i | j)
    stated = (padded_rows(relation)[fields] * real_fields.unsqueeze(-1)).sum(-2)  # (c, N, D)
    asked = (padded_rows(question_relation)[question] * real_tokens.unsqueeze(-1)).sum(-2)  # (c, D)
    along = (stated * asked.unsqueeze(1)).sum(-1)  # (c, N): <d(i), u>
    a = role * along.unsqueeze(-1) + role.transpose(1, 2) * along.unsqueeze(1)
    real_facts = real_fields.any(-1)
    eye = torch.eye(N, dtype=torch.bool, device=fields.device)
    pairs = real_facts.unsqueeze(-1) & real_facts.unsqueeze(1) & ~eye
    single = ~pairs.flatten(1).any(-1)
    pairs = pairs | (single.view(c, 1, 1) & eye & real_facts.unsqueeze(-1))
    return a, pairs


def _pair_log_weights(pairs: torch.Tensor, dtype) -> torch.Tensor:
    """``(c, N N)``: ``log 1 / #pairs`` at the drawn pairs, ``MASKED_LOGIT`` elsewhere."""
    flat = pairs.flatten(1)
    count = flat.sum(-1, keepdim=True).to(dtype)
    return torch.where(flat, -count.log(), torch.full_like(count, MASKED_LOGIT))


def composition_answer_log_probs(a, pairs, bias, out, answer_symbols, num_symbols: int) -> torch.Tensor:
    """``(c, S)``: ``log p(target = t)`` of the composition for every symbol (``MASKED_LOGIT`` outside the
    ``A`` answers ``answer_symbols``, None: all ``S``)."""
    c = a.shape[0]
    per_pair = (bias + out * a.flatten(1).unsqueeze(-1)).log_softmax(-1)  # (c, N N, A)
    log_probs = (per_pair + _pair_log_weights(pairs, a.dtype).unsqueeze(-1)).logsumexp(1)  # (c, A)
    if answer_symbols is None:
        return log_probs
    return log_probs.new_full((c, num_symbols), MASKED_LOGIT).scatter(-1, answer_symbols.expand(c, -1), log_probs)


def composition_target_log_probs(a, pairs, bias, out, answer) -> torch.Tensor:
    """``(c,)``: :func:`composition_answer_log_probs` at each row's target alone; ``answer`` ``(c,)`` its answer
    number (-1 where the learnt emission has none: ``MASKED_LOGIT``)."""
    per_pair = (bias + out * a.flatten(1).unsqueeze(-1)).log_softmax(-1)  # (c, N N, A)
    at = per_pair.gather(-1, answer.clamp(min=0).view(-1, 1, 1).expand(-1, per_pair.shape[1], 1)).squeeze(-1)
    log_probs = (at + _pair_log_weights(pairs, a.dtype)).logsumexp(-1)
    return torch.where(answer >= 0, log_probs, torch.full_like(log_probs, MASKED_LOGIT))


class PairComposition:
    """The composition's methods of :class:`~pyro_multihop.models.facts.FactAttention` (module docstring): its
    parameters (:data:`COMPOSITION_SHAPES`) exist only where ``composition=D`` is given. The emission becomes
    ``(1 - kappa) p(t | fact z_L) + kappa p_composition(t)``, ``kappa = sigmoid(composition_mix)`` (with a
    register, mixed into the emission with it): the same at every fact, so the chain and its queries are
    unchanged."""

    def _composition_option(self, composition, dtype) -> None:
        self.composition_dim = None
        if composition is None:
            return
        if isinstance(composition, bool) or not isinstance(composition, int) or composition < 1:
            raise ValueError(f"composition must be a positive int (the relation vectors' dimension) or None, got "
                             f"{composition!r}")
        if self.per_hop_answers:
            raise ValueError("composition and answer_parts cannot both be given: an answer per hop has no emission "
                             "at the last fact to mix the composition into")
        self.composition_dim = composition
        vectors = dict(zip(("composition_relation", "composition_question"),
                           symbol_vectors(self.num_symbols, composition, 0, dtype)))
        for name, spec in COMPOSITION_SHAPES.items():
            shape = shape_of(spec, self.n_hops, self.num_fields, self.num_symbols, self.max_question_len,
                             D=composition, A=self.num_answers)
            if name == "composition_gate":
                value = torch.ones(shape, dtype=dtype)
            elif name == "composition_side":
                value = torch.linspace(1, -1, self.num_fields, dtype=dtype)
            elif name == "composition_mix":
                value = torch.full(shape, MIX_START, dtype=dtype)
            elif name in vectors:
                value = vectors[name]
            else:
                value = torch.zeros(shape, dtype=dtype)
            setattr(self, name, torch.nn.Parameter(value))

    @property
    def uses_composition(self) -> bool:
        return self.composition_dim is not None

    def composition_variants(self, variants: tuple) -> tuple:
        """The head's start variants (``FactAttention.start_variant``, starts 1, 2, ...) where the composition is on:
        starts 1 to :data:`COMPOSITION_ALONE_STARTS` the composition alone (start 1 from the head's own symbol
        vectors, the others from draws 1, 2, ... of :func:`symbol_vectors`), then the head's own start without it,
        then the head's ``variants`` without it (:data:`COMPOSITION_EXTRA_STARTS` more starts than the head has
        without a composition; start 0 mixes both).
        Why both: in a mixture the other components explain the answers' frequencies before the composition learns,
        and its weight falls (bAbI task 17: ``kappa`` 0.18, 75.4 % of the test answers; the composition alone
        97.3 %), while on the tasks it cannot answer the head's own starts stay as they were without it (their
        likelihood is exactly the head's), so the held-out likelihood chooses between them."""
        if not self.uses_composition:
            return variants
        alone = (("alone",),) + tuple(("alone", draw) for draw in range(1, COMPOSITION_ALONE_STARTS))
        return alone + (("without",),) + tuple(("without",) + variant for variant in variants)

    def composition_start(self, variant: tuple) -> list:
        """Set ``variant``'s part of a start in place: the composition alone (``composition_mix`` at
        :data:`ALONE_START`, the other components' share ``exp(-30)`` and their gradients with it; its symbol
        vectors from another draw of :func:`symbol_vectors` where the variant names one) or the emission
        without it (at ``MASKED_LOGIT``: its share and every gradient of its parameters exactly 0); what it did, in
        words."""
        said = []
        with torch.no_grad():
            if "alone" in variant:
                self.composition_mix.fill_(ALONE_START)
                said.append("the composition alone")
            for draw in (part for part in variant if isinstance(part, int)):  # another draw of the vectors
                for parameter, value in zip((self.composition_relation, self.composition_question),
                                            symbol_vectors(self.num_symbols, self.composition_dim, draw,
                                                           self.composition_relation.dtype)):
                    parameter.copy_(value)
                said.append(f"its symbol vectors from draw {draw}")
            if "without" in variant:
                self.composition_mix.fill_(MASKED_LOGIT)
                said.append("the emission without its composition")
        return said

    def _composition_scores(self, obs):
        chunk = self._chunk(obs)
        return pair_scores(chunk.fields, chunk.real_fields, chunk.question, chunk.real_tokens, self.composition_gate,
                           self.composition_side, self.composition_relation, self.composition_question,
                           self.max_question_len)

    def with_composition(self, log_probs: torch.Tensor, composition_log_probs) -> torch.Tensor:
        """``log((1 - kappa) exp(log_probs) + kappa exp(composition_log_probs()))``: the emission's log-probabilities
        ``(c, N, ...)`` with the composition's ``(c, ...)`` mixed in (``log_probs`` itself without it)."""
        if not self.uses_composition:
            return log_probs
        return log_mixture(log_probs, self.composition_mix[0], composition_log_probs().unsqueeze(1))

    def composition_answer_log_probs(self, obs) -> torch.Tensor:
        """``(c, S)``: the composition's ``log p(t)`` of every symbol."""
        a, pairs = self._composition_scores(obs)
        return composition_answer_log_probs(a, pairs, self.composition_bias, self.composition_out,
                                            self.answer_symbols, self.num_symbols)

    def composition_target_log_probs(self, obs) -> torch.Tensor:
        """``(c,)``: the composition's ``log p(target)``."""
        a, pairs = self._composition_scores(obs)
        return composition_target_log_probs(a, pairs, self.composition_bias, self.composition_out,
                                            self.answer_index[obs.target])

    def composition_elements(self, N: int) -> float:
        """Working memory per row of the composition, in elements (0 without it)."""
        if not self.uses_composition:
            return 0.0
        return N * self.max_question_len * (self.num_fields + 3) + N * N * (self.num_answers + 4)
