"""The loss :func:`~pyro_multihop.fit_svi` minimises: :class:`SviLoss`, the per-observation negative ELBO.

With the hop latents enumerated by ``TraceEnum_ELBO`` (or summed out by the engine under ``Trace_ELBO``,
``collapsed=True``) it is the exact negative log-likelihood per observation of the chained head. The module
also holds what shapes that loss: the scale of a process group's shard (:func:`backward_over_ranks` sums the
shards' gradients), and the grouping of rows by context length.
"""

from __future__ import annotations

from typing import Optional

import torch
from pyro import poutine
from pyro.infer import JitTrace_ELBO, JitTraceEnum_ELBO, Trace_ELBO, TraceEnum_ELBO

from .. import distributed
from .jit_fields import JitFields

__all__ = ["SviLoss", "backward_over_ranks"]


class SviLoss:
    """Per-observation negative ELBO of ``model`` on ``obs``: a training estimate and the full-data value.

    Under a process group ``obs`` is this rank's shard of ``total`` rows (``largest_shard`` in the biggest
    shard): the loss is this shard's share of the loss on the union of the shards, divided by ``total``,
    so that the shares (and their gradients) sum to the single-process loss. Sites inside the observations
    plate keep their plate scale (``shard / batch`` with mini-batches); sites outside every plate, the
    global latents and their KL term, are scaled by ``shard / total``, so that they count once in the sum.

    ``collapsed``: the model is ``model.collapsed_model`` (the hop path summed out by the engine, no
    enumerated site) under ``Trace_ELBO``; otherwise ``model.model`` under ``TraceEnum_ELBO``.

    ``group_lengths``: rows are grouped by context length (rounded up to this many positions) and each group
    is cut to its own width (:class:`_LengthGroups`) before the loss, which sums the groups' shares.
    """

    def __init__(self, model, obs, batch_size: Optional[int], jit: bool,
                 total: Optional[int] = None, largest_shard: Optional[int] = None, collapsed: bool = False,
                 group_lengths: Optional[int] = None):
        self.model = model
        self.obs = obs
        self.n = len(obs) if total is None else int(total)
        largest = len(obs) if largest_shard is None else int(largest_shard)
        self.full_batch = batch_size is None or batch_size >= largest  # the same decision on every rank
        self.subsample_size = None if self.full_batch or batch_size >= len(obs) else batch_size
        self.base_model, self.base_guide = (model.collapsed_model if collapsed else model.model), model.guide
        self.model_fn, self.guide_fn = self.base_model, self.base_guide
        if 0 < len(obs) < self.n:
            share = _GlobalSiteScale(len(obs) / self.n)
            self.model_fn, self.guide_fn = share(self.model_fn), share(model.guide)
        self.exact_elbo = Trace_ELBO() if collapsed else TraceEnum_ELBO(max_plate_nesting=1)
        self.groups = None if group_lengths is None or len(obs) == 0 else _LengthGroups(obs, group_lengths)
        self.jit = jit
        if jit:
            if collapsed:
                self.train_elbo = JitTrace_ELBO(ignore_jit_warnings=True)
            else:
                self.train_elbo = JitTraceEnum_ELBO(max_plate_nesting=1, ignore_jit_warnings=True)
            self.fields = JitFields(obs)
            self._jit_model, self._jit_guide = self.fields.wrap(self.model_fn), self.fields.wrap(self.guide_fn)
        else:
            self.train_elbo = self.exact_elbo

    def train(self, step: int) -> torch.Tensor:
        """Differentiable per-observation loss of step ``step`` (a mini-batch estimate with ``batch_size``);
        a constant 0 on an empty shard."""
        if len(self.obs) == 0:
            return torch.zeros(())
        kwargs = dict(self.model.svi_kwargs(step))
        if self.groups is not None:
            rows = None if self.subsample_size is None else torch.randperm(len(self.obs), device=self.obs.device)[: self.subsample_size]
            return self._grouped(self.train_elbo.differentiable_loss, rows, kwargs)
        if self.subsample_size is not None:
            kwargs["subsample_size"] = self.subsample_size
        if not self.jit:
            return self.train_elbo.differentiable_loss(self.model_fn, self.guide_fn, self.obs, **kwargs) / self.n
        args, static = self.fields.arguments(self.obs, kwargs)
        return self.train_elbo.differentiable_loss(self._jit_model, self._jit_guide, *args, **static) / self.n

    @torch.no_grad()
    def full(self, step: int) -> float:
        """Per-observation loss on all of ``obs`` (all shards' under a process group), without gradients."""
        if len(self.obs) == 0:
            return self.reduce(0.0)
        kwargs = self.model.svi_kwargs(step)
        if self.groups is not None:
            return self.reduce(float(self._grouped(self.exact_elbo.loss, None, kwargs)))
        return self.reduce(float(self.exact_elbo.loss(self.model_fn, self.guide_fn, self.obs, **kwargs)) / self.n)

    def _grouped(self, loss_fn, rows, kwargs):
        """Sum over length groups of the loss of ``rows`` (None: all rows of the shard), per observation of the
        whole data: plate sites scaled by ``shard / batch``, global sites by each group's share of them."""
        m = len(self.obs)
        batch = m if rows is None else len(rows)
        total = 0.0
        for group in self.groups.batches(rows):
            # (m / batch) on every site, and global sites by a further group / n: summed over the groups,
            # the global sites count m / n (the shard's share), the plate sites m / batch.
            share = _GlobalSiteScale(len(group) / self.n)
            model_fn = poutine.scale(share(self.base_model), m / batch)
            guide_fn = poutine.scale(share(self.base_guide), m / batch)
            total = total + loss_fn(model_fn, guide_fn, group, **kwargs) / self.n
        return total

    @staticmethod
    def reduce(value: float) -> float:
        """Sum of a loss share over ranks (``value`` itself in one process)."""
        return distributed.all_reduce_sum(value)[0]


class _LengthGroups:
    """Rows grouped by context length (rounded up to ``granularity`` positions), each group cut to its width.

    Exact (padding is never attended) and, where most contexts are much shorter than the longest, several
    times faster, since the loss costs ``O(N^2)`` per row in the context length ``N``; the speed-up on bAbI,
    with the enumerated and the collapsed loss, is measured in ``benchmarks/results/length_groups.md``. Needs
    a data type with ``context_lengths()`` and ``truncate_context(width)``."""

    def __init__(self, obs, granularity: int):
        lengths = obs.context_lengths()
        self.obs = obs
        self.width = ((lengths + granularity - 1) // granularity * granularity).clamp(max=obs.context_len)
        self.widths = self.width.unique().tolist()

    def batches(self, rows: Optional[torch.Tensor] = None):
        """The groups of ``rows`` (None: every row), each cut to its width."""
        widths = self.width if rows is None else self.width[rows]
        for width in self.widths:
            chosen = (widths == width).nonzero().squeeze(-1)
            if rows is not None:
                chosen = rows[chosen]
            if len(chosen):
                yield self.obs[chosen].truncate_context(int(width))


class _GlobalSiteScale(poutine.messenger.Messenger):
    """Multiply the scale of every sample site outside all plates by ``scale`` (a shard's share)."""

    def __init__(self, scale: float):
        super().__init__()
        self.scale = scale

    def _process_message(self, msg):
        if msg["type"] == "sample" and not msg["cond_indep_stack"]:
            msg["scale"] = msg["scale"] * self.scale


def backward_over_ranks(training_loss: torch.Tensor, model) -> None:
    """Gradients of this rank's loss share, summed over ranks: the gradient of the whole data's loss."""
    if training_loss.requires_grad:
        training_loss.backward()
    distributed.all_reduce_gradients(model.parameters())
