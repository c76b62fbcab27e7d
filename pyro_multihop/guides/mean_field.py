"""A mean-field normal guide for one tensor-valued sample site, as a :class:`~pyro.nn.PyroModule`.

It plays the role of ``AutoNormal`` restricted to one site: ``q(x) = prod_k Normal(x_k | loc_k, scale_k)``
over every entry of the site's value, drawn as a single site with all dims as event dims, under the
KL weight of :func:`~pyro_multihop.guides.annealing.scale_kl`. Enumerated sites of the model are simply
not in it (``AutoNormal`` would need ``poutine.block`` to hide them).

Why not ``AutoNormal`` itself: an autoguide builds its parameters lazily from a prototype trace of the
model on the first call, so a fresh head would own no guide parameters (``module.parameters()`` seen by
an optimiser built before the first step, and the ``state_dict`` a checkpoint loads into, would both
miss them), it would keep a reference to the model's bound method, and the KL weight would have to be
wrapped around it from outside. This module owns ``loc`` and ``scale`` from construction, as the
submodule ``guide`` of the head.

Example::

    >>> import torch
    >>> from pyro import poutine
    >>> from pyro_multihop.guides import MeanFieldNormalGuide
    >>> guide = MeanFieldNormalGuide("embeddings", torch.zeros(3, 2), torch.full((3, 2), 0.1))
    >>> trace = poutine.trace(guide).get_trace(kl_weight=0.5)
    >>> trace.nodes["embeddings"]["value"].shape, trace.nodes["embeddings"]["scale"]
    (torch.Size([3, 2]), 0.5)
"""

from __future__ import annotations

from typing import Optional

import pyro
import pyro.distributions as dist
import torch
from pyro.distributions import constraints
from pyro.nn import PyroModule, PyroParam

from .annealing import scale_kl

__all__ = ["MeanFieldNormalGuide"]


class MeanFieldNormalGuide(PyroModule):
    """Diagonal normal posterior over the site ``site``, with parameters ``loc`` and ``scale``.

    :param str site: name of the model's sample site it approximates.
    :param loc: initial means, any shape (the site's value shape).
    :param scale: initial standard deviations, the shape of ``loc``, positive. Stored through a softplus
        (``constraints.softplus_positive``, as ``AutoNormal`` does).

    ``named_parameters()``: ``loc`` and ``scale_unconstrained`` (the stored, unconstrained value;
    ``guide.scale`` is its softplus).

    Called with the model's arguments (ignored) and a keyword ``kl_weight``, it draws the site (by
    reparameterisation) with its log-density multiplied by ``kl_weight``, and returns the draw.
    """

    def __init__(self, site: str, loc: torch.Tensor, scale: torch.Tensor):
        super().__init__()
        if not isinstance(site, str) or not site:
            raise ValueError(f"site must be a non-empty string, got {site!r}")
        loc = torch.as_tensor(loc)
        scale = torch.as_tensor(scale, dtype=loc.dtype)
        if not loc.dtype.is_floating_point:
            raise TypeError(f"loc must be a floating-point tensor, got dtype {loc.dtype}")
        if scale.shape != loc.shape:
            raise ValueError(f"scale must have the shape of loc {tuple(loc.shape)}, got {tuple(scale.shape)}")
        if not torch.isfinite(loc).all():
            raise ValueError("loc must be finite, got a NaN or inf entry")
        if not torch.isfinite(scale).all() or (scale <= 0).any():
            raise ValueError("scale must be positive and finite")
        self.site = site
        # loc is unconstrained, a plain nn.Parameter named "loc"; scale is positive, a PyroParam that Pyro
        # stores as "scale_unconstrained" (the softplus inverse) and reads back constrained as self.scale.
        self.loc = torch.nn.Parameter(loc.detach().clone())
        self.scale = PyroParam(scale.detach().clone(), constraint=constraints.softplus_positive)

    def distribution(self) -> dist.TorchDistribution:
        """``q`` as one distribution whose event is the whole site (``Normal(loc, scale).to_event(loc.dim())``)."""
        return dist.Normal(self.loc, self.scale).to_event(self.loc.dim())

    def forward(self, *args, kl_weight=1.0, **kwargs) -> torch.Tensor:
        with scale_kl(kl_weight):
            return pyro.sample(self.site, self.distribution())

    @torch.no_grad()
    def draw(self, num_samples: int, seed: Optional[int] = None) -> torch.Tensor:
        """``(num_samples, *loc.shape)`` independent draws ``loc + scale * eps`` (no Pyro site, no gradient).

        :param seed: seed of a private ``torch.Generator``; None uses a fresh random seed.
        """
        if isinstance(num_samples, bool) or not isinstance(num_samples, int) or num_samples < 1:
            raise ValueError(f"num_samples must be a positive integer, got {num_samples!r}")
        generator = torch.Generator(device=self.loc.device)
        if seed is None:
            generator.seed()
        else:
            generator.manual_seed(int(seed))
        noise = torch.randn((num_samples,) + tuple(self.loc.shape), generator=generator, dtype=self.loc.dtype,
                            device=self.loc.device)
        return self.loc + self.scale * noise

    def kl_to_standard_normal(self) -> torch.Tensor:
        """Analytic ``KL(q || Normal(0, 1))`` summed over the site, differentiable."""
        loc, scale = self.loc, self.scale
        return (0.5 * (loc.pow(2) + scale.pow(2) - 1.0) - scale.log()).sum()

    def extra_repr(self) -> str:
        return f"site={self.site!r}, shape={tuple(self.loc.shape)}"
