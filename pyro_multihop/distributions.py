"""Distributions used by the models' Pyro sites."""

from __future__ import annotations

import pyro.distributions as dist
import torch
from pyro.distributions import TorchDistribution, constraints

from .gates import log_normalize, table_gather

__all__ = ["GateCategorical", "TableCategorical", "CollapsedHopChain"]


class GateCategorical(dist.Categorical):
    """``Categorical(logits=logits)`` over context positions, normalised by :func:`~pyro_multihop.gates.log_normalize`.

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
    tables), so a model with one site ``target ~ CollapsedHopChain(gates, context)`` has the enumerated
    model's exact loss and gradient without enumeration (``Trace_ELBO`` suffices).

    :param gates: :class:`~pyro_multihop.engine.HopGates` of a head (``head.hop_gates()``).
    :param context: :class:`~pyro_multihop.data.Observations` of ``n`` rows (their targets are ignored
        except when ``log_prob`` is given that very tensor); the batch shape is ``(n,)``.
    :param budget: the engine's working-memory budget per chunk, in bytes (None: the default).
    """

    arg_constraints = {}

    def __init__(self, gates, context, budget=None, validate_args=None):
        self.gates = gates
        self.context = context
        self.budget = budget
        super().__init__(batch_shape=torch.Size([len(context)]), event_shape=torch.Size(), validate_args=validate_args)

    @constraints.dependent_property(is_discrete=True, event_dim=0)
    def support(self):
        return constraints.integer_interval(0, self.gates.log_emission.shape[-1] - 1)

    def expand(self, batch_shape, _instance=None):
        if torch.Size(batch_shape) != self.batch_shape:
            raise NotImplementedError(f"CollapsedHopChain cannot expand {tuple(self.batch_shape)} to {tuple(batch_shape)}")
        return self

    def _with_target(self, value: torch.Tensor):
        from .data import Observations

        context = self.context
        if value is context.target:
            return context
        if not isinstance(context, Observations):  # another data class (FactObservations) swaps its own target
            return context.with_target(value)
        return Observations(context.keys, context.values, context.query, value, context.mask)

    def log_prob(self, value: torch.Tensor) -> torch.Tensor:
        from . import engine

        if self._validate_args:
            self._validate_sample(value)
        return engine.log_likelihood(self.gates, self._with_target(value), self.budget)

    def sample(self, sample_shape=torch.Size()) -> torch.Tensor:
        from . import engine

        with torch.no_grad():
            probs = engine.predict_proba(self.gates, self.context, self.budget)
        return torch.distributions.Categorical(probs=probs).sample(sample_shape)
