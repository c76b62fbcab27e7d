"""The held-set register of the structured-facts head (:class:`~pyro_multihop.models.facts.FactAttention`'s
``register``): what the question's person holds after a story of pick-ups, drops and hand-overs, read as a count
("how many ...": *none*, *one*, *two*) or as the set itself ("what is X carrying": *nothing*, *milk*,
*football,apple*).

Generative story for one row (``N`` facts of ``F`` fields, question tokens ``q_1..q_M``, ``R`` counts)::

    m ~ Categorical(softmax_m(register_position[min(m, P)]))        # the question token the register follows
    for every fact i naming q_m (in the fields f with f_i^f == q_m), in story order,
      and every other real field g of it, o = f_i^g:                  # a candidate object
        e_ig ~ Categorical(softmax_k(sum_a register_by_fact_symbol[f_i^a, k] + register_by_object[o, k]
                                     + sum_f [f_i^f == q_m] register_by_field_pair[f, g, k]))   # k: set, clear, keep
    held_o = [o's last event that is not keep is a set]             # one bit per symbol o of the story
    r = min(sum_o held_o, R - 1)
    target ~ mu_r p_set(.) + (1 - mu_r) softmax(count_logits[r])     # mu_r = sigmoid(set_logits[r]), mu_0 = 0

``p_set(a)`` is the held set conditioned on being one an answer can say: one symbol, or a list answer (``register``'s
``lists``: its part symbols) whose parts are held and are said in the order of their first candidate occurrence,
``p_set(a) = P(held = parts(a)) / Z`` (bAbI's lists follow that order in every training and test answer of task 8).
A count is a learnt table of ``r``; *nothing* is ``count_logits[0]``'s.

Why a register, and why this one: a count or a set is a function of every fact that names the person, not of one
attended fact, so no emission of the hop path can give it (bAbI tasks 7 and 8 with 8 hops: 86 to 89 % with their
*one* for *none*). The events ``e_ig`` are independent given ``m``, so each symbol's bit is exact from its own
occurrences (the last non-keep event decides: ``P(held_o) = sum_j P(e_j = set) prod_{j' after j} P(e_j' = keep)``),
the bits are independent, and the count is their exact convolution (``O(NF R^2)``); nothing is sampled or
relaxed, and the component does not depend on the hop path, so every query of the engine stays exact with it
(its probability is the same at every attended fact). Nothing reads a word: which symbols pick up, drop or hand
over, which fields hold giver and receiver, and which symbols are objects are all learnt.

Memory: ``O(c M N F R)`` for a chunk of ``c`` rows; no ``(N F) x (N F)`` tensor (the occurrences of a symbol are
found by one sort per row).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from ..engine.log_space import MASKED_LOGIT, floored_log, log_mixture
from .fact_features import padded_rows
from .fact_parameters import shape_of

__all__ = ["RegisterState", "occurrence_log_probs", "held_bits", "count_probs", "register_state",
           "register_answer_log_probs", "register_target_log_probs", "SET", "CLEAR", "KEEP"]

SET, CLEAR, KEEP = 0, 1, 2


def occurrence_log_probs(fields, real_fields, question, real_tokens, by_fact_symbol, by_object, by_field_pair):
    """``(log P(e = set), log P(e = clear), log P(e = keep), candidate)``, each ``(c, M, N F)``, of every occurrence
    (fact ``i``, field ``g``) flattened as ``i F + g`` (story order), for the register following question token ``m``:
    a ``candidate`` (its fact names ``q_m`` elsewhere) has the module's softmax, anything else keeps
    (``MASKED_LOGIT``, ``MASKED_LOGIT``, 0).

    ``fields`` ``(c, N, F)`` and ``question`` ``(c, M)`` with padding as ``S``; ``real_fields`` ``(c, N, F)``,
    ``real_tokens`` ``(c, M)`` bool; ``by_fact_symbol``, ``by_object`` ``(S, 3)``; ``by_field_pair`` ``(F, F, 3)``."""
    c, N, F = fields.shape
    person = ((fields.unsqueeze(1) == question[:, :, None, None]) & real_fields.unsqueeze(1)
              & real_tokens[:, :, None, None])  # (c, M, N, F)
    candidate = real_fields.unsqueeze(1) & ~person & person.any(-1, keepdim=True)
    fact_logits = (padded_rows(by_fact_symbol)[fields] * real_fields.unsqueeze(-1)).sum(-2)  # (c, N, 3)
    logits = (fact_logits[:, None, :, None] + padded_rows(by_object)[fields].unsqueeze(1)
              + torch.einsum("cmnf,fgk->cmngk", person.to(by_field_pair.dtype), by_field_pair))
    log_probs = logits.log_softmax(-1).flatten(2, 3)  # (c, M, N F, 3)
    candidate = candidate.flatten(2)
    masked = torch.full_like(log_probs[..., 0], MASKED_LOGIT)
    return (torch.where(candidate, log_probs[..., SET], masked), torch.where(candidate, log_probs[..., CLEAR], masked),
            torch.where(candidate, log_probs[..., KEEP], torch.zeros_like(masked)), candidate)


def symbol_slots(fields: torch.Tensor, num_symbols: int):
    """``(order, ids, first, symbol_of_id)``: the occurrences ``(c, N F)`` sorted by symbol (story order kept among
    a symbol's), each sorted occurrence's symbol number in its row (``ids``, ``(c, N F)``, from 0), whether it is its
    symbol's first (``first``) and each number's symbol (``symbol_of_id`` ``(c, N F)``, ``S`` where unused)."""
    flat = fields.flatten(1)
    sorted_symbols, order = torch.sort(flat, dim=-1, stable=True)
    first = torch.ones_like(sorted_symbols, dtype=torch.bool)
    first[:, 1:] = sorted_symbols[:, 1:] != sorted_symbols[:, :-1]
    ids = first.long().cumsum(-1) - 1
    symbol_of_id = torch.full_like(flat, num_symbols).scatter(-1, ids, sorted_symbols)
    return order, ids, first, symbol_of_id


def held_bits(log_set, log_clear, log_keep, candidate, order, ids, first):
    """``(log P(held = 1), log P(held = 0), movable)``, each ``(c, M, N F)`` by symbol number (``ids``): a symbol's
    bit from its occurrences' events, exactly (the last event that is not keep decides; none: 0). ``movable``:
    whether the symbol has an occurrence that can change it (a ``candidate`` one)."""
    c, M, NF = log_set.shape
    sort = order.unsqueeze(1).expand(c, M, NF)
    slot_ids = ids.unsqueeze(1).expand(c, M, NF)
    # sums of log P(keep) over each symbol's later occurrences, in float64: a cumulative sum over a row's occurrences
    keep = log_keep.gather(-1, sort).double()
    running = keep.cumsum(-1)
    zeros = torch.zeros_like(running)
    start = zeros.scatter_add(-1, slot_ids, (running - keep) * first.unsqueeze(1))
    total = zeros.scatter_add(-1, slot_ids, keep)
    later = (total.gather(-1, slot_ids) - (running - start.gather(-1, slot_ids))).to(log_set.dtype)
    set_last = (log_set.gather(-1, sort) + later).exp()  # this occurrence is the last event, and sets
    clear_last = (log_clear.gather(-1, sort) + later).exp()
    held = torch.zeros_like(set_last).scatter_add(-1, slot_ids, set_last)
    free = torch.zeros_like(set_last).scatter_add(-1, slot_ids, clear_last) + total.to(log_set.dtype).exp()
    movable = torch.zeros_like(set_last).scatter_add(-1, slot_ids, candidate.gather(-1, sort).to(set_last.dtype))
    return floored_log(held), floored_log(free), movable > 0


def count_probs(log_held, log_free, num_counts: int) -> torch.Tensor:
    """``(c, M, R)``: ``P(min(sum_o held_o, R - 1) = r)`` of independent bits, by a tree of truncated convolutions."""
    dist = log_held.new_zeros(*log_held.shape, num_counts)
    dist[..., 0] = log_free.exp()
    if num_counts > 1:
        dist[..., 1] = log_held.exp()
    else:
        dist[..., 0] = dist[..., 0] + log_held.exp()
    while dist.shape[-2] > 1:
        if dist.shape[-2] % 2:
            identity = torch.zeros_like(dist[..., :1, :])
            identity[..., 0] = 1
            dist = torch.cat([dist, identity], -2)
        left, right = dist[..., 0::2, :], dist[..., 1::2, :]
        out = torch.zeros_like(left)
        for count in range(num_counts):  # out[r] = sum_{i + j = r} left[i] right[j], the tail at R - 1
            out[..., count:] = out[..., count:] + left[..., count:count + 1] * right[..., :num_counts - count]
            if count:
                out[..., -1] = out[..., -1] + left[..., count] * right[..., num_counts - count:].sum(-1)
        dist = out
    return dist.squeeze(-2)


class RegisterState(NamedTuple):
    """What the answers read (:func:`register_state`): ``token_log_weights`` ``(c, M)``, ``log_counts`` ``(c, M, R)``,
    ``log_odds`` ``(c, M, N F)`` a held symbol's ``log P(held) - log P(not held)`` by symbol number (``MASKED_LOGIT``
    where it cannot be held), ``symbol_of_id`` ``(c, N F)``, ``list_log_odds`` ``(c, M, H)`` each list answer's (its
    parts' sum; ``MASKED_LOGIT`` where a part is missing or out of order), ``log_z`` ``(c, M)`` the sayable sets'
    total."""
    token_log_weights: torch.Tensor
    log_counts: torch.Tensor
    log_odds: torch.Tensor
    symbol_of_id: torch.Tensor
    list_log_odds: torch.Tensor
    log_z: torch.Tensor


def register_state(fields, real_fields, question, real_tokens, token_logits, by_fact_symbol, by_object,
                   by_field_pair, num_counts: int, list_parts) -> RegisterState:
    """The register of a chunk (module docstring): ``token_logits`` ``(c, M)`` (``register_position`` at each real
    token, ``MASKED_LOGIT`` at padding), ``list_parts`` ``(H, K)`` the part symbols of each list answer in the order
    it says them (padding ``-1`` after them); the other arguments as :func:`occurrence_log_probs`."""
    order, ids, first, symbol_of_id = symbol_slots(fields, by_fact_symbol.shape[0])
    log_set, log_clear, log_keep, candidate = occurrence_log_probs(fields, real_fields, question, real_tokens,
                                                                   by_fact_symbol, by_object, by_field_pair)
    log_held, log_free, movable = held_bits(log_set, log_clear, log_keep, candidate, order, ids, first)
    # the count reads the symbols that can be held alone (a few a row, of N F numbers): the others' bits are 0
    width = max(1, int(movable.sum(-1).max()))
    kept = movable.to(torch.int8).topk(width, dim=-1, sorted=False).indices
    counts = count_probs(torch.where(movable, log_held, torch.full_like(log_held, MASKED_LOGIT)).gather(-1, kept),
                         torch.where(movable, log_free, torch.zeros_like(log_free)).gather(-1, kept), num_counts)
    log_odds = torch.where(movable, log_held - log_free, torch.full_like(log_held, MASKED_LOGIT))
    # each symbol's first occurrence that can change it: a list says its parts in that order
    c, M, NF = log_set.shape
    slot_ids = torch.empty_like(ids).scatter_(-1, order, ids).unsqueeze(1).expand(c, M, NF)
    times = torch.arange(NF, device=fields.device).expand(c, M, NF)
    first_time = torch.full_like(times, NF).scatter_reduce(
        -1, slot_ids, torch.where(candidate, times, torch.full_like(times, NF)), "amin")
    # a list answer's parts in each row: the symbol number holding each part (all found, or the list is not sayable)
    H, K = list_parts.shape
    if H:
        found = symbol_of_id[:, None, None, :] == list_parts[None, :, :, None]  # (c, H, K, N F)
        part_ids = found.long().argmax(-1)  # (c, H, K)
        part_odds = log_odds.gather(-1, part_ids.flatten(1).unsqueeze(1).expand(-1, log_odds.shape[1], -1))
        part_odds = part_odds.view(*log_odds.shape[:2], H, K)
        real_part = (list_parts >= 0)[None, None]
        present = found.any(-1).unsqueeze(1) | ~real_part
        summed = (part_odds * real_part).sum(-1)
        part_times = first_time.gather(-1, part_ids.flatten(1).unsqueeze(1).expand(-1, M, -1)).view(c, M, H, K)
        in_order = ((part_times[..., :-1] < part_times[..., 1:]) | ~real_part[..., 1:]).all(-1)
        sayable = present.all(-1) & (part_odds > MASKED_LOGIT / 2).logical_or(~real_part).all(-1) & in_order
        list_log_odds = torch.where(sayable, summed, torch.full_like(summed, MASKED_LOGIT))
    else:
        list_log_odds = log_odds.new_zeros(*log_odds.shape[:2], 0)
    log_z = torch.cat([log_odds, list_log_odds], -1).logsumexp(-1)  # (c, M)
    return RegisterState(token_logits.log_softmax(-1), floored_log(counts), log_odds, symbol_of_id, list_log_odds,
                         log_z)


def _mixture_log_weights(state: RegisterState, set_logits: torch.Tensor):
    """``(log w_set (c, M), log w_count (c, M, R))``: the set's share ``sum_r P(r) mu_r`` and each count's
    ``P(r) (1 - mu_r)``, with ``mu_0 = 0``; the set's share is 0 where no set can be said."""
    log_mu = torch.nn.functional.logsigmoid(set_logits).clone()
    log_not_mu = torch.nn.functional.logsigmoid(-set_logits).clone()
    log_mu[0], log_not_mu[0] = MASKED_LOGIT, 0.0
    log_set = (state.log_counts + log_mu).logsumexp(-1)
    sayable = state.log_z > MASKED_LOGIT / 2
    return torch.where(sayable, log_set, torch.full_like(log_set, MASKED_LOGIT)), state.log_counts + log_not_mu


def register_answer_log_probs(state: RegisterState, count_logits, set_logits, list_answers, answer_symbols,
                              num_symbols: int) -> torch.Tensor:
    """``(c, S)``: ``log p(target = a)`` of the register for every symbol ``a``, over the token it follows.
    ``count_logits`` ``(R, A)`` over the learnt emission's answers (``answer_symbols`` ``(A,)``, None: all ``S``),
    ``list_answers`` ``(H,)`` each list answer's symbol."""
    log_w_set, log_w_count = _mixture_log_weights(state, set_logits)
    counted = (log_w_count.unsqueeze(-1) + count_logits.log_softmax(-1)).logsumexp(-2)  # (c, M, A)
    if answer_symbols is not None:
        counted = counted.new_full((*counted.shape[:-1], num_symbols), MASKED_LOGIT).scatter(
            -1, answer_symbols.expand(*counted.shape[:-1], -1), counted)
    c, M, NF = state.log_odds.shape
    said = counted.new_zeros(c, M, num_symbols + 1).scatter_add(-1, state.symbol_of_id.unsqueeze(1).expand(c, M, NF),
                                  (state.log_odds - state.log_z.unsqueeze(-1)).exp())
    if len(list_answers):
        said = said.scatter_add(-1, list_answers.expand(c, M, -1),
                                (state.list_log_odds - state.log_z.unsqueeze(-1)).exp())
    said = floored_log(said[..., :num_symbols])
    per_token = torch.logaddexp(log_w_set.unsqueeze(-1) + said, counted)
    return (state.token_log_weights.unsqueeze(-1) + per_token).logsumexp(-2)


def register_target_log_probs(state: RegisterState, target, count_logits, set_logits, list_answers,
                              answer_index) -> torch.Tensor:
    """``(c,)``: :func:`register_answer_log_probs` at each row's ``target`` alone; ``answer_index`` ``(S + 1,)``: each
    symbol's answer number (-1 where ``count_logits`` has none)."""
    log_w_set, log_w_count = _mixture_log_weights(state, set_logits)
    answer = answer_index[target]
    table = count_logits.log_softmax(-1)[:, answer.clamp(min=0)].T  # (c, R)
    counted = (log_w_count + table.unsqueeze(1)).logsumexp(-1)
    counted = torch.where((answer >= 0).unsqueeze(-1), counted, torch.full_like(counted, MASKED_LOGIT))
    is_target = (state.symbol_of_id == target.unsqueeze(-1)).unsqueeze(1)  # (c, 1, N F)
    odds = torch.where(is_target, state.log_odds, torch.full_like(state.log_odds, MASKED_LOGIT))
    if len(list_answers):
        is_list = (list_answers == target.unsqueeze(-1)).unsqueeze(1)  # (c, 1, H)
        odds = torch.cat([odds, torch.where(is_list, state.list_log_odds,
                                            torch.full_like(state.list_log_odds, MASKED_LOGIT))], -1)
    said = odds.logsumexp(-1) - state.log_z
    per_token = torch.logaddexp(log_w_set + said, counted)
    return (state.token_log_weights + per_token).logsumexp(-1)


#: Shapes of the register's parameters (only in a head given ``register``): ``P`` question positions, ``R`` counts,
#: ``A`` the learnt emission's answers.
REGISTER_SHAPES = {"register_position": "(P,)", "register_by_fact_symbol": "(S, 3)", "register_by_object": "(S, 3)",
                   "register_by_field_pair": "(F, F, 3)", "count_logits": "(R, A)", "set_logits": "(R,)",
                   "register_mix": "(1,)"}

#: Where ``register_by_field_pair``'s keep logit starts: ``P(keep) = 0.9`` at each occurrence, so that a story starts
#: with few held symbols (bAbI task 8, 1k, the register alone after 150 steps: 97.2 % from 3, before lists were
#: ordered).
KEEP_START = 3.0


def register_lists(register, num_symbols: int):
    """``(counts, list_answers (H,), list_parts (H, K))`` of ``register`` = ``{"counts": R, "lists": [[answer
    symbol, [part symbols]], ...]}`` (a list answer's parts in the order it says them), checked."""
    if not isinstance(register, dict) or set(register) != {"counts", "lists"}:
        raise ValueError(f"register must be a dict with keys 'counts' and 'lists', got {register!r}")
    counts = register["counts"]
    if isinstance(counts, bool) or not isinstance(counts, int) or counts < 1:
        raise ValueError(f"register['counts'] must be a positive integer, got {counts!r}")
    answers, parts = [], []
    for pair in register["lists"]:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise ValueError(f"register['lists'] must pair each list answer with its part symbols, got {pair!r}")
        symbol, said = pair[0], list(pair[1])
        for value in [symbol, *said]:
            if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < num_symbols:
                raise ValueError(f"register['lists'] names symbol {value!r}, outside 0 .. {num_symbols - 1}")
        if len(said) < 2 or len(set(said)) != len(said):
            raise ValueError(f"register['lists'][{symbol}] must have two or more distinct parts, got {said!r}")
        answers.append(symbol)
        parts.append(said)
    if len(set(answers)) != len(answers):
        raise ValueError(f"register['lists'] names an answer symbol twice: {answers!r}")
    width = max((len(said) for said in parts), default=2)
    table = torch.full((len(parts), width), -1, dtype=torch.long)
    for row, said in enumerate(parts):
        table[row, :len(said)] = torch.tensor(said)
    return counts, torch.tensor(answers, dtype=torch.long), table


class HeldRegister:
    """The register's methods of :class:`~pyro_multihop.models.facts.FactAttention` (module docstring): its
    parameters (:data:`REGISTER_SHAPES`) and buffers exist only where ``register`` is given. The emission becomes
    ``(1 - rho) p(t | fact z_L) + rho p_register(t)``, ``rho = sigmoid(register_mix)``: the same at every fact, so
    the chain and its queries are unchanged."""

    def _register_option(self, register, dtype) -> None:
        self.uses_register = register is not None
        if not self.uses_register:
            return
        if self.per_hop_answers:
            raise ValueError("register and answer_parts cannot both be given: an answer per hop has no emission at "
                             "the last fact to mix the register into")
        counts, answers, parts = register_lists(register, self.num_symbols)
        self.num_counts = counts
        self.register_buffer("list_answers", answers, persistent=False)
        self.register_buffer("list_parts", parts, persistent=False)
        for name, spec in REGISTER_SHAPES.items():
            shape = shape_of(spec, self.n_hops, self.num_fields, self.num_symbols, self.max_question_len,
                             A=self.num_answers, R=counts)
            value = torch.zeros(shape, dtype=dtype)
            if name == "register_by_field_pair":
                value[..., KEEP] = KEEP_START
            setattr(self, name, torch.nn.Parameter(value))

    def register_config(self) -> dict:
        """``register`` as the config stores it (JSON)."""
        lists = [[int(symbol), [int(p) for p in said if p >= 0]] for symbol, said in zip(self.list_answers,
                                                                                          self.list_parts)]
        return {"counts": self.num_counts, "lists": lists}

    def register_state(self, chunk) -> RegisterState:
        """The :class:`RegisterState` of a chunk's :class:`~.fact_features.FactFeatures`."""
        M, P = chunk.question.shape[1], self.max_question_len
        positions = self.register_position[torch.arange(M, device=chunk.question.device).clamp(max=P - 1)]
        token_logits = positions.expand(chunk.question.shape).masked_fill(~chunk.real_tokens, MASKED_LOGIT)
        return register_state(chunk.fields, chunk.real_fields, chunk.question, chunk.real_tokens, token_logits,
                              self.register_by_fact_symbol, self.register_by_object, self.register_by_field_pair,
                              self.num_counts, self.list_parts)

    def with_register(self, log_probs: torch.Tensor, register_log_probs) -> torch.Tensor:
        """``log((1 - rho) exp(log_probs) + rho exp(register_log_probs()))``: the emission's log-probabilities
        ``(c, N, ...)`` with the register's ``(c, ...)`` mixed in (``log_probs`` itself without a register)."""
        if not self.uses_register:
            return log_probs
        return log_mixture(log_probs, self.register_mix[0], register_log_probs().unsqueeze(1))

    def register_answer_log_probs(self, obs) -> torch.Tensor:
        """``(c, S)``: the register's ``log p_register(t)`` of every symbol."""
        return register_answer_log_probs(self.register_state(self._chunk(obs)), self.count_logits, self.set_logits,
                                         self.list_answers, self.answer_symbols, self.num_symbols)

    def register_target_log_probs(self, obs) -> torch.Tensor:
        """``(c,)``: the register's ``log p_register(target)``."""
        return register_target_log_probs(self.register_state(self._chunk(obs)), obs.target, self.count_logits,
                                         self.set_logits, self.list_answers, self.answer_index)

    def register_elements(self, N: int) -> float:
        """Working memory per row of the register, in elements (0 without it)."""
        if not self.uses_register:
            return 0.0
        return self.max_question_len * N * self.num_fields * (16 + 2 * self.num_counts) + 2 * self.num_symbols
