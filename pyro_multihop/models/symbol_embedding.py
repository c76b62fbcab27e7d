"""The symbol-embedded terms of the structured-facts head (:class:`~pyro_multihop.models.facts.FactAttention` with
``embed_dim=D``): every symbol-indexed ``S x S`` table becomes a function of one shared embedding, so that the
parameters grow as ``S D`` and no ``S x S`` tensor is ever formed.

With ``E = [symbol_embedding; 0]`` ``(S + 1, D)`` (the row of symbol ``S``, padding, zero) and ``e_s`` its row ``s``::

    question_tables[l, b][q, s]  ->  e_q^T question_bilinear[l, b] e_s                  # (L, F, D, D)
    content_tables[l, a, b][r, s] -> e_r^T content_bilinear[l, a, b] e_s                # (L - 1, F, F, D, D)
    emission_tables[a][s, t]     ->  e_s^T emission_bilinear[a] o_t + answer_bias[t]    # (F, D, D), o_t row t of
                                                                                        # output_embedding (S, D)

The equality weights stay beside the bilinear forms (they carry over to symbols never seen in training); the
``O(S)`` per-symbol vectors of the table head stay as they are. Each term below takes what a chunk reads
(:class:`~pyro_multihop.models.fact_features.FactFeatures`) and returns what the table head's term returns:

- :func:`question_term` ``(c, N)``: the question's embedding ``u = sum_m w_m e_{q_m}`` against each field, plus the
  equality matches of ``(c, M, N, F)``;
- :func:`pair_term` ``(c, N, N)``: the facts' embeddings ``X (c, N, F D)`` in one batched product ``X C X^T`` with
  the ``(F D, F D)`` block matrix of the content forms, plus the ``F^2`` equality matches, one field pair at a time
  (no ``(c, N, N, F, F)`` tensor);
- :func:`table_log_probs` ``(c, N, F)``: the table part of the emission at each row's target, with its normaliser
  over the ``A`` answers from :class:`LogNormaliser` (column blocks under the engine's memory budget, recomputed in
  the backward: ``O(R D + A D)`` memory for ``R`` distinct (field, symbol) pairs), each computed once per chunk or
  per query (:class:`FieldNormalisers`);
- :func:`table_probs` ``(c, N, A)``: the table part of the emission for every answer (predictions).

:func:`frequent_symbols` says which symbols a head gives a row of ``E`` of their own (``embedded_symbols``): those of
at least ``min_count`` training rows.
"""

from __future__ import annotations

import torch

from ..checks import check_positive_int
from ..engine import get_memory_budget

__all__ = ["EMBEDDING_SHAPES", "REPLACED_TABLES", "RANDOM_START", "LogNormaliser", "FieldNormalisers", "chunk_vectors",
           "frequent_symbols", "question_term", "pair_term", "table_log_probs", "table_probs"]

#: Shapes of the parameters that replace the ``S x S`` tables (``D`` = ``embed_dim``).
EMBEDDING_SHAPES = {
    "symbol_embedding": "(S, D)",
    "question_bilinear": "(L, F, D, D)",
    "content_bilinear": "(L - 1, F, F, D, D)",
    "emission_bilinear": "(F, D, D)",
    "output_embedding": "(A, D)",
    "answer_bias": "(A,)",
}

#: The table head's parameters that the embedded head has not (``frame_content`` and ``last_fact_kind``: no frame
#: symbols, whose weights alone these are).
REPLACED_TABLES = ("question_tables", "content_tables", "emission_tables", "frame_content", "last_fact_kind")

#: Parameters drawn at random at the start (standard deviation ``1 / sqrt(D)``, rows of about unit length): at
#: zero every gradient of a bilinear form would be zero. The bilinear forms and the bias start at zero, so the
#: head starts attending uniformly and emitting uniformly, as the table head does.
RANDOM_START = ("symbol_embedding", "output_embedding")


def frequent_symbols(obs, num_symbols: int, min_count: int) -> torch.Tensor:
    """``(S,)`` bool: the symbols that occur in at least ``min_count`` rows of ``obs``
    (:class:`~pyro_multihop.data.FactObservations`), in a real field of a real fact, a real question token or the
    target; a row counts once however often it holds the symbol. ``min_count = 1``: every symbol of the rows."""
    check_positive_int("min_count", min_count)
    if len(obs) == 0:
        raise ValueError("obs has no rows: the symbols' counts need training rows")
    obs.check_sizes(num_symbols)
    rows = torch.arange(len(obs), device=obs.facts.device)
    pairs = torch.cat([
        (rows[:, None, None] * num_symbols + obs.facts)[obs.real_fields()],
        (rows[:, None] * num_symbols + obs.question)[obs.real_tokens()],
        rows * num_symbols + obs.target,
    ]).unique()  # (row, symbol) pairs, each once
    return torch.bincount(pairs % num_symbols, minlength=num_symbols) >= min_count


def chunk_vectors(embedding: torch.Tensor, question: torch.Tensor, fields: torch.Tensor):
    """``(question (c, M, D), facts (c, N, F, D))``: the embedding rows of a chunk's symbols (``S``, padding: zero
    rows), gathered through the chunk's distinct symbols, so that the backward of every term adds into a table of
    those alone and only this gather's backward into the whole ``(S, D)`` embedding."""
    S = embedding.shape[0]
    symbols, inverse = torch.unique(torch.cat([question.flatten(), fields.flatten()]), return_inverse=True)
    rows = embedding[symbols.clamp(max=S - 1)] * (symbols < S).unsqueeze(-1).to(embedding.dtype)  # (U, D)
    vectors = rows[inverse]
    return vectors[:question.numel()].view(*question.shape, -1), vectors[question.numel():].view(*fields.shape, -1)


def question_term(weights, question, fields, real_fields, asked, facts, equality, bilinear) -> torch.Tensor:
    """``(c, N)``: ``sum_m w[m] sum_b (equality[b] [q_m == f_j^b] + e_{q_m}^T bilinear[b] e_{f_j^b})``.

    :param weights: ``(c, M)`` the hop's soft choice of tokens. :param question: ``(c, M)``.
    :param fields: ``(c, N, F)``. :param real_fields: ``(c, N, F)`` bool. :param asked: ``(c, M, D)`` and
    :param facts: ``(c, N, F, D)``, their embeddings (:func:`chunk_vectors`, zero at padding).
    :param equality: ``(F,)``. :param bilinear: ``(F, D, D)``.
    """
    match = (question[:, :, None, None] == fields[:, None]) & real_fields[:, None]  # (c, M, N, F)
    matched = torch.einsum("cm,cmnf->cnf", weights, match.to(weights.dtype))  # (c, N, F)
    asked = torch.einsum("cm,cmd->cd", weights, asked)  # (c, D): u = sum_m w_m e_{q_m}
    read = torch.einsum("cd,fde->cfe", asked, bilinear)  # (c, F, D)
    return matched @ equality + torch.einsum("cfe,cnfe->cn", read, facts)


def pair_term(fields, real_fields, facts, equality, bilinear) -> torch.Tensor:
    """``(c, N, N)``: ``sum_{a, b} equality[a, b] [f_i^a == f_j^b] + e_{f_i^a}^T bilinear[a, b] e_{f_j^b}``.

    :param fields: ``(c, N, F)``.
    :param real_fields: ``(c, N, F)`` bool.
    :param facts: ``(c, N, F, D)`` their embeddings (zero at padding).
    :param equality: ``(F, F)``.
    :param bilinear: ``(F, F, D, D)``.
    """
    c, N, F, D = facts.shape
    facts = facts.reshape(c, N, F * D)  # padded fields are zero rows
    blocks = bilinear.transpose(1, 2).reshape(F * D, F * D)  # [(a, d), (b, e)] = bilinear[a, b, d, e]
    term = torch.bmm(facts @ blocks, facts.transpose(1, 2))
    # A padded field matches nothing: it is -1 on the previous fact's side and -2 on the candidate's.
    left, right = fields.masked_fill(~real_fields, -1), fields.masked_fill(~real_fields, -2)
    for a in range(F):
        for b in range(F):
            same = left[..., a].unsqueeze(-1) == right[..., b].unsqueeze(-2)  # (c, N, N)
            term = term + equality[a, b] * same.to(term.dtype)
    return term


def _columns_per_block(rows: int, dtype: torch.dtype) -> int:
    """Answers a block of the normaliser holds: the logits of ``rows`` rows and their exponentials within a quarter
    of the engine's memory budget."""
    itemsize = torch.finfo(dtype).bits // 8
    return max(1, get_memory_budget() // (4 * itemsize * max(rows, 1)))


class LogNormaliser(torch.autograd.Function):
    """``(R,)``: ``log sum_t exp(hidden_r . output_t + bias_t)`` for ``hidden (R, D)``, ``output (S, D)``, ``bias (S,)``,
    over blocks of answers (:func:`_columns_per_block`): no ``(R, S)`` tensor is kept; the backward recomputes each
    block's softmax ``p`` and returns ``p @ output``, ``p^T hidden`` and ``p``'s column sums, each weighted by the
    incoming gradient."""

    @staticmethod
    def forward(ctx, hidden, output, bias):
        S = output.shape[0]
        block = _columns_per_block(hidden.shape[0], hidden.dtype)
        parts = [torch.logsumexp(torch.addmm(bias[s:s + block], hidden, output[s:s + block].t()), -1)
                 for s in range(0, S, block)]
        log_norm = torch.logsumexp(torch.stack(parts, -1), -1)
        ctx.save_for_backward(hidden, output, bias, log_norm)
        ctx.block = block
        return log_norm

    @staticmethod
    def backward(ctx, grad):
        hidden, output, bias, log_norm = ctx.saved_tensors
        grad_hidden = torch.zeros_like(hidden)
        grad_output = torch.empty_like(output)
        grad_bias = torch.empty_like(bias)
        for s in range(0, output.shape[0], ctx.block):
            columns = slice(s, s + ctx.block)
            logits = torch.addmm(bias[columns], hidden, output[columns].t())
            weighted = logits.sub_(log_norm.unsqueeze(-1)).exp_().mul_(grad.unsqueeze(-1))  # (R, block): g_r p_rt
            grad_hidden.addmm_(weighted, output[columns])
            torch.mm(weighted.t(), hidden, out=grad_output[columns])
            torch.sum(weighted, 0, out=grad_bias[columns])
        return grad_hidden, grad_output, grad_bias


def _hidden(fields, embedding, bilinear, a: int) -> torch.Tensor:
    return embedding[fields[..., a]] @ bilinear[a]  # (c, N, D): e_{f_i^a}^T W[a]


class FieldNormalisers:
    """The normalisers of :func:`table_log_probs` of one chunk or one query, over all its chunks: ``log sum_t exp(e_s^T
    bilinear[a] o_t + bias_t)`` for each distinct (field ``a``, symbol ``s``), computed once the first time a chunk
    holds the pair and gathered from then on. A symbol repeats across the chunks of a data set (an entity in many
    questions), so a query computes ``O(R A D)`` for the ``R`` distinct pairs of all its rows, not of each chunk.

    The normalisers are reused while the parameters they read keep their versions (an optimiser step starts anew)
    and grad mode is unchanged; a head makes one a query (``FactAttention.hop_factors``)."""

    def __init__(self, embedding, bilinear, output, bias, embedded_symbols=None):
        self.tensors = (embedding, bilinear, output, bias)
        self.key = None
        # A symbol without a row of its own reads e_s = 0, as padding does, so they all share padding's normaliser:
        # with few symbols embedded (a knowledge base's rare entities) that is most of the normaliser's work saved.
        self.shared = None
        if embedded_symbols is not None and not bool(embedded_symbols.all()):
            self.shared = torch.cat([~embedded_symbols, embedded_symbols.new_ones(1)])  # (S + 1,): slot S is padding's

    def _reset(self, key, fields) -> None:
        self.key = key
        self.position = torch.full((fields.shape[-1], self.tensors[0].shape[0] + 1), -1, dtype=torch.long,
                                   device=fields.device)
        self.parts, self.count = [], 0

    def __call__(self, fields) -> torch.Tensor:
        """``(c, N, F)`` the normaliser of each fact field of ``fields`` ``(c, N, F)``."""
        embedding, bilinear, output, bias = self.tensors
        key = (torch.is_grad_enabled(), *(tensor._version for tensor in self.tensors))
        if key != self.key:
            self._reset(key, fields)
        fields = fields.clamp(min=-1)  # padding (-1 or S) has a slot of its own at the end of each row
        if self.shared is not None:
            fields = fields.masked_fill(self.shared[fields], -1)
        new = []
        for a in range(fields.shape[-1]):
            symbols = torch.unique(fields[..., a])
            missing = symbols[self.position[a, symbols] < 0]
            if len(missing):
                self.position[a, missing] = torch.arange(self.count, self.count + len(missing), device=fields.device)
                self.count += len(missing)
                new.append((a, missing))
        if new:  # symbol -1 (padding, and every symbol without a row) reads e = 0
            padded = torch.nn.functional.pad(embedding, (0, 0, 0, 1))
            hidden = torch.cat([padded[missing] @ bilinear[a] for a, missing in new])
            self.parts.append(LogNormaliser.apply(hidden, output, bias))
        norms = self.parts[0] if len(self.parts) == 1 else torch.cat(self.parts)
        columns = torch.arange(fields.shape[-1], device=fields.device)
        return norms[self.position[columns, fields]]


def table_log_probs(fields, target, embedding, bilinear, output, bias, normalisers) -> torch.Tensor:
    """``(c, N, F)``: ``log softmax_t(e_{f_i^a}^T bilinear[a] o_t + bias_t)`` at each row's ``target`` ``(c,)``, the
    normaliser of each (field, symbol) from ``normalisers`` (a :class:`FieldNormalisers`: computed once per distinct
    pair, by :class:`LogNormaliser`)."""
    c, N, F = fields.shape
    hidden = torch.stack([_hidden(fields, embedding, bilinear, a) for a in range(F)], -2)  # (c, N, F, D)
    logits = (hidden * output[target].view(c, 1, 1, -1)).sum(-1) + bias[target].view(c, 1, 1)
    return logits - normalisers(fields)


def table_probs(fields, embedding, bilinear, output, bias, weights) -> torch.Tensor:
    """``(c, N, S)``: ``sum_a weights[..., a] softmax_t(e_{f_i^a}^T bilinear[a] o_t + bias_t)`` (``weights``
    ``(c, N, F)``), one field at a time."""
    probs = 0.0
    for a in range(fields.shape[-1]):
        logits = torch.addmm(bias, _hidden(fields, embedding, bilinear, a).flatten(0, 1), output.t())
        probs = probs + weights[..., a, None] * logits.softmax(-1).view(*fields.shape[:2], -1)
    return probs

