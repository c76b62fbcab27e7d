"""Distributions used by the models' Pyro sites."""

from __future__ import annotations

import functools
import itertools
import math

import pyro.distributions as dist
import torch
from pyro.distributions import TorchDistribution, constraints

from .gate_ops import log_normalize, table_gather

__all__ = ["GateCategorical", "TableCategorical", "CollapsedHopChain"]


class GateCategorical(dist.Categorical):
    """``Categorical(logits=logits)`` over context positions, normalised by :func:`~pyro_multihop.gate_ops.log_normalize`.

    A plain ``Categorical`` normalises as ``logits - logits.logsumexp(-1)``; the gate of an enumerated hop
    is ``(N, n, N)``, and for ``N >= 16`` positions one ``log_softmax`` kernel does the same in half the
    time. Everything else (enumeration, Pyro's fast ``log_prob`` of an enumerated support) is Pyro's
    ``Categorical``. Arguments are not validated: the logits are computed from validated observations.

    :param logits: ``(..., N)`` unnormalised log attention; the batch shape is ``logits.shape[:-1]``.
    """

    def __init__(self, logits: torch.Tensor, validate_args=False):
        log_probs = log_normalize(logits)
        self.logits = log_probs
        self._param = log_probs
        self._num_events = log_probs.shape[-1]
        torch.distributions.Distribution.__init__(self, log_probs.shape[:-1], validate_args=validate_args)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(GateCategorical, _instance)
        return super().expand(batch_shape, _instance=new)


class TableCategorical(TorchDistribution):
    """``Categorical(logits=log_table[index])`` without materialising the ``(..., T)`` rows.

    The target of an attention head is emitted from the table row of the attended value symbol. Under
    enumeration the attended symbol has shape ``(N, n)``, so a plain ``Categorical`` would build and
    renormalise an ``(N, n, T)`` tensor; here ``log_prob`` is a single gather from the ``(S, T)`` table.

    :param log_table: ``(S, T)`` normalised log-probabilities (each row logsumexps to 0).
    :param index: LongTensor of row indices; its shape is the batch shape.
    """

    arg_constraints = {}
    has_enumerate_support = True

    def __init__(self, log_table: torch.Tensor, index: torch.Tensor, validate_args=None):
        self.log_table = log_table
        self.index = index
        super().__init__(batch_shape=index.shape, event_shape=torch.Size(), validate_args=validate_args)

    @constraints.dependent_property(is_discrete=True, event_dim=0)
    def support(self):
        return constraints.integer_interval(0, self.log_table.shape[-1] - 1)

    def expand(self, batch_shape, _instance=None):
        new = self._get_checked_instance(TableCategorical, _instance)
        batch_shape = torch.Size(batch_shape)
        new.log_table = self.log_table
        new.index = self.index.expand(batch_shape)
        super(TableCategorical, new).__init__(batch_shape, torch.Size(), validate_args=False)
        new._validate_args = self._validate_args
        return new

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        if self._validate_args:
            self._validate_sample(value)
        return table_gather(self.log_table, self.index, value.long())

    def sample(self, sample_shape=torch.Size()) -> torch.Tensor:
        probs = self.log_table[self.index].exp()
        return torch.distributions.Categorical(probs=probs).sample(sample_shape)

    def enumerate_support(self, expand: bool = True) -> torch.Tensor:
        values = torch.arange(self.log_table.shape[-1], device=self.index.device)
        values = values.reshape((-1,) + (1,) * len(self.batch_shape))
        return values.expand((-1,) + self.batch_shape) if expand else values


class CollapsedHopChain(TorchDistribution):
    """``p(target | context)`` with the hop path summed out exactly by the engine: the collapsed counterpart of
    the enumerated hop sites, as Pyro's ``DiscreteHMM`` is of an enumerated HMM.

    ``log_prob`` is :func:`pyro_multihop.engine.log_likelihood` (differentiable in the gate and emission
    tables), so a model with one site ``target ~ CollapsedHopChain(factors, context)`` has the enumerated
    model's exact loss and gradient without enumeration (``Trace_ELBO`` suffices).

    Shapes. The rows of the context are the rightmost batch dim. The factors may carry batch dims of their own
    to the left of their tables, aligned from the right with the batch shape, the last of them 1 (one gate is
    shared by every row): score tables ``(*G, 1, L, S, S)`` and a log emission ``(S, T)`` or
    ``(*G, 1, S, T)``, e.g. one set of tables per vectorised particle (``G = (K,)``). Then::

        batch_shape = broadcast(G + (1,), (n,))          # (n,) for one gate; (K, n) for K particles
        event_shape = ()                                 # a target symbol in 0 .. T - 1

    :meth:`expand` only records a larger batch shape (an extra plate, vectorised particles): ``log_prob``
    runs the engine once per distinct gate and distinct row of targets and broadcasts the result, so a
    distribution expanded to ``(K, n)`` costs one pass over the ``n`` rows. Batched factors need score tables
    (a gate with position terms, ``scores = None``, has no batch dims).

    :param factors: :class:`~pyro_multihop.engine.HopFactors` of a head (``head.hop_factors()``), possibly batched
        as above.
    :param context: :class:`~pyro_multihop.data.Observations` of ``n`` rows (their targets are ignored
        except when ``log_prob`` is given that very tensor).
    :param budget: the engine's working-memory budget per chunk, in bytes (None: the default).

    Example::

        >>> import torch
        >>> from pyro_multihop import ChainedAttention, transitive_task
        >>> obs = transitive_task(5, num_symbols=8, pairs=2, seed=0)
        >>> head = ChainedAttention(2, 8, 8, init="random", seed=0)
        >>> d = CollapsedHopChain(head.hop_factors(), obs)
        >>> d.batch_shape, d.expand((3, 5)).log_prob(obs.target).shape
        (torch.Size([5]), torch.Size([3, 5]))
    """

    arg_constraints = {}
    has_enumerate_support = True

    def __init__(self, factors, context, budget=None, validate_args=None):
        self.factors = factors
        self.context = context
        self.budget = budget
        self.factors_shape = _factors_batch_shape(factors)
        n = len(context)
        batch_shape = torch.Size([n]) if not self.factors_shape else torch.broadcast_shapes(self.factors_shape, (n,))
        self._factors_list = None
        super().__init__(batch_shape=batch_shape, event_shape=torch.Size(), validate_args=validate_args)

    @constraints.dependent_property(is_discrete=True, event_dim=0)
    def support(self):
        return constraints.integer_interval(0, self.factors.num_targets - 1)

    def expand(self, batch_shape, _instance=None):
        batch_shape = torch.Size(batch_shape)
        n = len(self.context)
        if not batch_shape or batch_shape[-1] != n or torch.broadcast_shapes(self.batch_shape, batch_shape) != batch_shape:
            raise ValueError(f"CollapsedHopChain of batch shape {tuple(self.batch_shape)} cannot expand to "
                             f"{tuple(batch_shape)}: the rightmost dim holds the {n} rows of the context")
        new = self._get_checked_instance(CollapsedHopChain, _instance)
        new.factors, new.context, new.budget = self.factors, self.context, self.budget
        new.factors_shape, new._factors_list = self.factors_shape, self._factors_list
        super(CollapsedHopChain, new).__init__(batch_shape, torch.Size(), validate_args=False)
        new._validate_args = self._validate_args
        return new

    def _factors_at(self):
        """The factors as a flat list over ``factors_shape[:-1]`` (C order); one entry for unbatched factors."""
        if self._factors_list is None:
            self._factors_list = _split_factors(self.factors, self.factors_shape)
        return self._factors_list

    def _gate_index(self, lead: torch.Size) -> list:
        """For every index of ``lead`` (C order), the position of its gate in :meth:`_gates_at`."""
        groups = self.factors_shape[:-1]
        index = torch.arange(max(1, math.prod(groups))).reshape(groups)
        return index.expand(lead).reshape(-1).tolist()

    def _with_target(self, value: torch.Tensor):
        from .data import Observations

        context = self.context
        if value is context.target:
            return context
        if not isinstance(context, Observations):  # another data class (FactObservations) swaps its own target
            return context.with_target(value)
        # The context was validated when it was built; ``log_prob`` checks ``value`` against the support when
        # validation is on. No second validation (and no host synchronisation) per call.
        return Observations.trusted(context.keys, context.values, context.query, value.long(), context.mask)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        """``broadcast(value.shape, batch_shape)`` exact log-likelihoods of the targets ``value``."""
        from . import engine

        if self._validate_args:
            self._validate_sample(value)
        shape = torch.broadcast_shapes(value.shape, self.batch_shape)
        n = len(self.context)
        value_lead = value.shape[:-1] if value.dim() else torch.Size()
        lead = torch.broadcast_shapes(value_lead, self.factors_shape[:-1])  # what the result varies over
        factors = self._factors_at()
        if not lead:  # one gate and one row of targets (the common case: no copy of the targets)
            target = value if value.shape == (n,) else value.expand(n)
            return engine.log_likelihood(factors[0], self._with_target(target), self.budget).expand(shape)
        targets = value.expand(lead + (n,)).reshape(-1, n)
        rows = [engine.log_likelihood(factors[g], self._with_target(target), self.budget)
                for g, target in zip(self._gate_index(lead), targets)]
        return torch.stack(rows).reshape(lead + (n,)).expand(shape)

    def predictive_probs(self) -> torch.Tensor:
        """``(*gates_shape[:-1], n, T)`` predictive target distribution of every row for every gate (no grad)."""
        from . import engine

        with torch.no_grad():
            probs = [engine.predict_proba(factors, self.context, self.budget) for factors in self._factors_at()]
        return torch.stack(probs).reshape(self.factors_shape[:-1] + probs[0].shape)

    def sample(self, sample_shape=torch.Size()) -> torch.Tensor:
        """``sample_shape + batch_shape`` targets drawn from the predictive (one engine forward per gate)."""
        probs = self.predictive_probs().expand(self.batch_shape + (self.factors.num_targets,))
        return torch.distributions.Categorical(probs=probs).sample(torch.Size(sample_shape))

    def enumerate_support(self, expand: bool = True) -> torch.Tensor:
        """``(T, *batch_shape)`` (or ``(T, 1, ..., 1)``): every target symbol. Its ``log_prob`` costs ``T``
        engine passes."""
        values = torch.arange(self.factors.num_targets, device=self.context.keys.device)
        values = values.reshape((-1,) + (1,) * len(self.batch_shape))
        return values.expand((-1,) + self.batch_shape) if expand else values


def _factors_batch_shape(factors) -> torch.Size:
    """``G``: the batch dims of the gate's tables (empty for an unbatched gate); checked (last dim 1)."""
    emission_dims = torch.Size() if factors.log_emission is None else factors.log_emission.shape[:-2]
    score_dims = torch.Size() if factors.score_tables is None else factors.score_tables.batch_shape
    if factors.score_tables is None and emission_dims:
        raise ValueError(f"batched factors need score tables: log_emission has batch dims {tuple(emission_dims)} "
                         "but the gate has position terms (scores is None)")
    shape = torch.broadcast_shapes(score_dims, emission_dims)
    if shape and shape[-1] != 1:
        raise ValueError(f"the factors' batch shape must end in 1 (one gate shared by the rows), got {tuple(shape)}")
    return shape


def _split_factors(factors, shape: torch.Size) -> list:
    """One unbatched :class:`~pyro_multihop.engine.HopFactors` per index of ``shape[:-1]`` (C order)."""
    from . import engine

    if not shape:
        return [factors]
    scores = factors.scores.expand(shape + factors.scores.shape[-3:])  # views: a tied table keeps its stride 0
    emissions = factors.log_emission.expand(shape + factors.log_emission.shape[-2:])
    split = []
    for index in itertools.product(*map(range, shape[:-1])):
        table = scores[index + (0,)]
        split.append(factors.replace(scores=table, log_emission=emissions[index + (0,)],
                                   dense_chain=functools.partial(engine.chain_from_scores, table)))
    return split
